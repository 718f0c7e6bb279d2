# GPT-2 small's init geometry at any width (model.py applies it at the final n_embd):
#   python train.py config/cpu/small.py config/gpt2_init.py config/reduced.py
# GPT-2 draws every weight with std 0.02 at n_embd 768, so a unit-variance input leaves a
# projection with RMS 0.02 * sqrt(768) = 0.55 per coordinate. Keeping that product, not the
# std, keeps the attention logits' starting size: at n_embd 128 the std is 0.049, and there the
# reduced model's logits start about as large as the baseline's (at 0.02 they start 2.3x larger).
init_width = 768  # model.py sets init_std = 0.02 * sqrt(768 / n_embd) at the final n_embd
