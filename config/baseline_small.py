# A baseline shrunk everywhere: n_embd 744 (head size 62, scale 1/sqrt(62)), MLP 2976 = 4 x 744:
# 117,915,816 parameters, the closest standard GPT to the reduced model's count.
out_dir = 'out-baseline-small'
wandb_run_name = 'baseline-small'
weight_decay = 0.1
n_embd = 744
mlp_hidden = 2976
