# W_V = I (the theory lets any one of the three go): 117,295,872 parameters, like the reduced
# model. The logits keep both W_Q and W_K, so the scale stays 1/sqrt(64); weight decay 2^-5.
out_dir = 'out-value-identity'
value_identity = True
weight_decay = 2 ** -5
