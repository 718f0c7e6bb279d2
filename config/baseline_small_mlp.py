# Baseline attention with a narrower MLP, 3.5 x n_embd (2688 at n_embd 768):
# 117,295,872 parameters, the reduced model's count, to separate "fewer parameters" from "no W_Q".
out_dir = 'out-baseline-small-mlp'
weight_decay = 0.1
mlp_ratio = 3.5  # model.py makes the width from the final n_embd
