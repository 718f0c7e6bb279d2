# The paper's exact setting for W_Q elimination in every layer (theorem 4.2): no LayerNorm,
# skip connections around the attention only. A standard (full W_Q) model on the embedded
# corpus, a few minutes on 2 CPU cores; then `python convert.py --in_dir=out-theory` rewrites it
# with W_Q = I and identical outputs. Untied embeddings: a non-orthogonal change of basis
# cannot keep the LM head tied to the token embedding.
out_dir = 'out-theory'
dataset = 'pydocs'
device = 'cpu'
compile = False
dtype = 'float32'
norm = False
mlp_residual = False
tie_weights = False
n_layer = 4
n_head = 4
n_embd = 128
block_size = 128
batch_size = 32
gradient_accumulation_steps = 1
learning_rate = 1e-3
min_lr = 1e-4
max_iters = 600
lr_decay_iters = 600
warmup_iters = 100
eval_interval = 200
eval_iters = 20
log_interval = 50
