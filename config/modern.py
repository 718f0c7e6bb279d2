# The modern block, stacked onto any variant: rotary positions (RoPE, no learned position table)
# and QK-norm (RMSNorm of each head's q and k, with a learned gain, before the rotation):
#   python train.py config/reduced.py config/modern.py --out_dir=out-reduced-modern
# With RoPE, W_Q = I is still exact by a change of basis (the rotation acts after the
# projections); with QK-norm it is not: the identity query normalises raw slices of the stream.
pos = 'rope'
qk_norm = True
