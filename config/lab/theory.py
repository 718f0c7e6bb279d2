# The paper's exact setting for W_Q elimination in every layer (theorem 4.2), on the CPU base of
# config/cpu/small.py: no LayerNorm, skip connections around the attention only. A standard (full
# W_Q) model; then `python -m tools.convert --in_dir=out-theory` rewrites it with W_Q = I and
# identical outputs. Untied embeddings: a non-orthogonal change of basis cannot keep the LM head
# tied to the token embedding.
include = '../cpu/small.py'  # as if `config/cpu/small.py` came first on the command line

out_dir = 'out-theory'
norm = False
mlp_residual = False
tie_weights = False
learning_rate = 1e-3
min_lr = 1e-4
max_iters = 600
lr_decay_iters = None  # the cosine ends at max_iters
eval_iters = 20
log_interval = 50
