# The follow-up's nonlinear query (Karbevski, arXiv 2603.13381): W_Q replaced by a residual
# bottleneck MLP at W_Q's budget, q = (x + f(x))/2 with f(x) = LN(GELU(RMSNorm(x) W1) W2),
# W1: 768 x 384, W2: 384 x 768 (r = d/2). K and V stay linear. 124,392,192 parameters: the
# baseline's plus the two norms' 2 x 768 weights per layer. --query_mix=1.0 is the x + f(x) of
# the follow-up's published code. Scale 1/sqrt(64) and weight decay 0.1, the baseline's.
out_dir = 'out-nonlinear'
wandb_run_name = 'nonlinear'
query = 'nonlinear'
weight_decay = 0.1
