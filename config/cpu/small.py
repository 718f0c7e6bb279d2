# The CPU base that config/cpu/demo.py, config/lab/theory.py and config/lab/repro.py build on:
# 4 layers, 4 heads, n_embd 128 (head size 32) on the embedded 'pydocs' corpus, byte-level, 1200
# steps of 32 x 128 tokens (4.9M tokens, about two passes over the 2.26M training tokens). Every
# run sees the same batches (data_seed) and starts from the same seed.
dataset = 'pydocs'
device = 'cpu'
compile = False
dtype = 'float32'
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 32
gradient_accumulation_steps = 1
learning_rate = 2e-3
min_lr = 2e-4
max_iters = 1200
lr_decay_iters = None  # the cosine ends at max_iters, wherever a later file or --max_iters sets it
warmup_iters = 100
eval_interval = 200
eval_iters = 50
log_interval = 20
