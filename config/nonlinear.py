# The follow-up's nonlinear query (Karbevski, arXiv 2603.13381) with the follow-up's own protocol.
# W_Q is replaced by a residual bottleneck MLP at W_Q's budget: q = x + f(x), f(x) =
# LN(GELU(RMSNorm(x) W1) W2), W1: 768 x 384, W2: 384 x 768 (r = d/2); K and V stay linear.
# 124,392,192 parameters: the baseline's plus the two norms' 2 x 768 weights per layer.
# Every number below is from the follow-up's published config
#   github.com/MarkoKarbevski/beyond_query_linearity, commit 1bf4bd1,
#   configs/configs_tied/config_tiedw_residual_gelu_2-5wd_2_4e-3lr_3e-5.py
# (the follow-up's query_mode 'residual_gelu' is kvgpt's query='nonlinear', not kvgpt's own
# 'residual_gelu', x + GELU(x W_Q)); config/baseline_followup.py is its baseline.
out_dir = 'out-nonlinear'
query = 'nonlinear'
query_mix = 1.0  # "scale": q = x + f(x), not (x + f(x))/2 ...
attn_scale_factor = 0.5  # ... with the halved scale 1/(2 sqrt(64)): the same logits
learning_rate = 2.4e-3  # "learning_rate": 2.4e-3 (the baseline's 6e-4 x 4)
weight_decay = 2 ** -5  # "weight_decay": 2**-5
min_lr = 3e-5  # "min_lr": 3e-5
warmup_iters = 2000  # "warmup_iters": 2000
max_iters = 60002  # "max_iters": 60002, about 29.5B tokens at 491,520 tokens per step
# "lr_decay_iters": 60002, max_iters: a full cosine to min_lr at max_iters, not the first paper's
# 600k horizon
lr_decay_iters = None
keep_checkpoints = (50000,)  # "save_checkpoint_steps": the steps of it inside the run
