# The scaled-down setting of experiment v3 (docs/experiments.md), stacked on config/cpu/small.py,
# config/lab/repro.py and config/gpt2_init.py:
#   python train.py config/cpu/small.py config/lab/repro.py config/gpt2_init.py \
#       config/lab/repro_v3.py
stacked_on = ('../cpu/small.py', 'repro.py', '../gpt2_init.py')
# It changes what repro.py sets in three ways:
# - data: 'pysource', the standard library's own source (11.5M train bytes), so that even the
#   2x runs (4.9M tokens) see no token twice in expectation; pydocs (2.26M) would repeat;
# - an evaluation every 100 steps on 10 fixed batches (the trajectory of the gap, the induction
#   probe), the full val split once at the end as before;
# - a log line every 10 steps, each with the gradient norm before clipping (instability shows).
dataset = 'pysource'
eval_interval = 100
eval_iters = 10
log_interval = 10
