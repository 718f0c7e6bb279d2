# The authors' code's 'residual' query: q = x + x W_Q, a linear query written around the identity.
# 124,373,760 parameters, like the baseline. Scale 1/sqrt(64) and weight decay 0.1, the baseline's.
out_dir = 'out-residual'
query = 'residual'
weight_decay = 0.1
