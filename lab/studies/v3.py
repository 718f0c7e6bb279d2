"""Experiment v3: the paper's four claims at GPT-2 small's init geometry (docs/experiments.md).

Each arm's peak LR is chosen on three selection seeds (the lowest mean full val loss on a
sqrt(2) grid, bracketed); its weight decay is the paper's for its family. Then the primary pair
on 20 fresh paired seeds and each secondary arm on the first 10 of them, the primary pair at
twice the budget on 4 of them, the baseline in bf16 autocast on 4 of them (the dtype check), and
a climb above the grid until a seed diverges (claim iii). The design is the docs'; change it
there first.
"""
name = 'v3'
docs = 'docs/experiments.md'
base = ('config/small.py', 'config/repro.py', 'config/gpt2_init.py', 'config/repro_v3.py')
# weight decay per arm, not tuned: the paper's 0.1 for the baselines, 2^-5 for W_Q = I
GRID = (2e-3, 2.83e-3, 4e-3, 5.66e-3)
arms = dict(
    baseline=dict(weight_decay=0.1, grid=GRID),
    reduced=dict(weight_decay=2 ** -5, grid=GRID),
    reduced_mlp=dict(weight_decay=2 ** -5, grid=GRID),
    baseline_small_mlp=dict(weight_decay=0.1, grid=GRID),
)
tuning = dict(seeds=(201, 202, 203), step=2 ** 0.5, extend=3)
TEST = tuple(range(301, 321))  # fresh: no earlier experiment and no tuning used them
PRIMARY, SECONDARY = ('baseline', 'reduced'), ('reduced_mlp', 'baseline_small_mlp')
# the primary pair's test and longer budget as soon as it is tuned, then the secondaries' tuning
phases = [
    dict(name='test', kind='at', arms=PRIMARY, seeds=TEST),
    dict(name='test', kind='at', arms=SECONDARY, seeds=TEST[:10]),
    dict(name='longer', kind='at', arms=PRIMARY, seeds=TEST[:4], budget=2.0),
    dict(name='tuning', kind='tune', arms=tuple(arms)),
    dict(name='dtype', kind='at', arms=('baseline',), seeds=TEST[:4], dtype='bfloat16'),
    dict(name='stability', kind='climb', arms=PRIMARY, seeds=tuning['seeds'], above=max(GRID),
         steps=4),
]
