# Reduced model with the saved weights given back to a wider MLP: 3456 = 4.5 x 768 hidden
# units, 124,373,760 parameters like the baseline, which it beats in the paper.
out_dir = 'out-reduced-mlp'
wandb_run_name = 'reduced-mlp'
query_identity = True
attn_scale = 1 / 16
weight_decay = 2 ** -5
mlp_hidden = 3456
