# The scaled-down setting of docs/experiments.md, stacked on config/cpu/small.py:
#   python train.py config/cpu/small.py config/lab/repro.py --query=identity --weight_decay=0.03125
stacked_on = '../cpu/small.py'  # alone it would train OpenWebText with 2 heads of 384: refused
# What it keeps from the paper's setting (the design says why each matters):
# - head size 64 (2 heads of n_embd 128), the size for which the paper chose the 1/(2 sqrt(hd))
#   scale;
# - the schedule's shape: warmup for 2% of the run, and a cosine horizon 5.72x the run, so the
#   run ends at 93.6% of the peak LR, where the authors' 105k-step runs on a 600k cosine end.
# 1200 steps of 16 x 128 byte tokens = 2.46M tokens, 1.09 passes over pydocs' training split.
# Evaluations are sparse (every 300 steps on 20 batches): the verdict uses the full val loss
# of the final evaluation, so the ones on the way only draw the curves.
n_head = 2
batch_size = 16
max_iters = 1200
warmup_iters = 24
lr_decay_iters = 6860
eval_interval = 300
eval_iters = 20
log_interval = 25
probe = 'lab.probes'  # the lab's attention probes at every evaluation
