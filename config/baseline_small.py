# A baseline shrunk everywhere to about the reduced model's parameter count: the width scaled by
# 31/32 and rounded down to a multiple of n_head, MLP 4x the new width. At GPT-2 small that is
# n_embd 744 (head size 62, scale 1/sqrt(62)), MLP 2976: 117,915,816 parameters against the
# reduced model's 117,295,872 (+0.5%), the closest standard GPT. At other sizes the ratio is kept,
# not the count: the embeddings' share of the parameters differs (n_embd 128, vocab 320:
# 794,716 against 779,392, +2.0%).
out_dir = 'out-baseline-small'
weight_decay = 0.1
# the width so far, scaled: a later --n_embd replaces it, and the MLP (model.py's 4 x n_embd)
# follows the final width
n_embd = n_embd * 31 // 32 // n_head * n_head
