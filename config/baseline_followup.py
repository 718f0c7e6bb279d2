# The baseline of the follow-up (arXiv 2603.13381) under its own protocol, for config/nonlinear.py.
# GPT-2 small: 124,373,760 parameters. Every number below is from the follow-up's published config
#   github.com/MarkoKarbevski/beyond_query_linearity, commit 1bf4bd1,
#   configs/configs_tied/config_tiedw_original.py
out_dir = 'out-baseline-followup'
learning_rate = 6e-4  # "learning_rate": 6e-4
weight_decay = 0.1  # "weight_decay": 0.1
min_lr = 6e-5  # "min_lr": 6e-5
warmup_iters = 2000  # "warmup_iters": 2000
max_iters = 60002  # "max_iters": 60002
lr_decay_iters = None  # "lr_decay_iters": 60002, max_iters: a full cosine to min_lr at max_iters
keep_checkpoints = (50000,)  # "save_checkpoint_steps": the steps of it inside the run
