# Reduced model with the saved weights given back to a wider MLP: 4.5 x n_embd hidden units
# (3456 at n_embd 768, the paper's), 124,373,760 parameters like the baseline, which it beats
# in the paper. A ratio, so it stays parameter-matched at any width.
out_dir = 'out-reduced-mlp'
query = 'identity'  # the halved scale 1/(2 sqrt(head size)): model.py picks it
weight_decay = 2 ** -5
mlp_ratio = 4.5  # model.py makes the width from the final n_embd
