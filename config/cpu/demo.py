# A first run on a laptop CPU: the CPU base of config/cpu/small.py (the embedded 'pydocs' corpus,
# byte-level, 4 layers of 128) with the paper's reduced model (W_Q = I). Train and val loss fall
# from ~5.7 to ~1.6 in 1200 steps; then `python sample.py --out_dir=out-demo`.
include = 'small.py'  # as if `config/cpu/small.py` came first on the command line

out_dir = 'out-demo'
query = 'identity'
weight_decay = 2 ** -5
eval_interval = 250
eval_iters = 20
log_interval = 50
