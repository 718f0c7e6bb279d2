# The authors' code's 'residual_gelu' query: q = x + GELU(x W_Q), a first nonlinear query.
# 124,373,760 parameters, like the baseline. Scale 1/sqrt(64) and weight decay 0.1, the baseline's.
out_dir = 'out-residual-gelu'
query = 'residual_gelu'
weight_decay = 0.1
