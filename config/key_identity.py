# W_K = I instead of W_Q (the theory lets any one of the three go): 117,295,872 parameters,
# like the reduced model. The logits again hold one learned matrix, so the scale is halved
# to 1/16 as for W_Q = I; weight decay 2^-5, the reduced model's.
out_dir = 'out-key-identity'
key_identity = True
weight_decay = 2 ** -5
