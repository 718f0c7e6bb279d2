"""Experiment v5: does W_Q = I by itself cost anything at the standard softmax scale, annealed,
at each weight decay (docs/experiments.md)?

A 2x2 of W_Q (learned, = I) by weight decay (0.1, 2^-5) at scale 1/8, on v4's annealed schedule
(warmup 2% of the run, a cosine to min_lr at its last step). v4's annealed baseline (W_Q, 1/8,
lambda 0.1) on seeds 301-310 is the reference, reused by name; the three new arms are each tuned on
selection seeds 201-203 and tested on 301-310. The 4x arms joined by a dated amendment once the 1x
test had named the weight decay they run at (lambda 0.1, by the docs' rule): W_Q = I at 4x against
v4's 4x baseline, read unpaired. Claim (ii) joined by a second amendment: W_Q = I with the saved
weights in a wider MLP (parameter-matched) at 1x, lambda 0.1. The design is the docs'; change it
there first.
"""
name = 'v5'
docs = 'docs/experiments.md'
base = ('config/cpu/small.py', 'config/lab/repro.py', 'config/gpt2_init.py',
        'config/lab/repro_v3.py')
reuse = ('v4',)  # v4's baseline_anneal and baseline_anneal4x runs: the same commands and names
FULL = dict(attn_scale_factor=1.0)  # the standard 1/sqrt(d_head) = 1/8, not the paper's 1/16
ANNEAL = dict(warmup_iters=24, lr_decay_iters=1200)  # 2% warmup, the cosine ends at the last step
ANNEAL_4X = dict(max_iters=4800, warmup_iters=96, lr_decay_iters=4800)  # 9.8M tokens
LOW = 2 ** -5  # the paper's weight decay
arms = {
    # v4's selection (its tuning table): the reference, not tuned again
    'baseline_anneal': dict(variant='baseline', weight_decay=0.1, lr=2.83e-3, settings=ANNEAL),
    # the three new cells of the 2x2; W_Q = I was selected a sqrt(2) step above the baseline
    # unannealed (v4: 2e-3 against 1.41e-3), so its grid is centred a step above 2.83e-3
    'baseline_anneal_wd0.03125': dict(variant='baseline', weight_decay=LOW, settings=ANNEAL,
                                      grid=(2e-3, 2.83e-3, 4e-3)),
    'identity_anneal_wd0.1': dict(variant='reduced', weight_decay=0.1,
                                  settings=dict(ANNEAL, **FULL), grid=(2.83e-3, 4e-3, 5.66e-3)),
    'identity_anneal_wd0.03125': dict(variant='reduced', weight_decay=LOW,
                                      settings=dict(ANNEAL, **FULL),
                                      grid=(2.83e-3, 4e-3, 5.66e-3)),
    # v4's 4x baseline, on its grid, with the selection seed 203 it lacked
    'baseline_anneal4x': dict(variant='baseline', weight_decay=0.1, settings=ANNEAL_4X,
                              grid=(2e-3, 2.83e-3, 4e-3)),
    # the 4x arms (amended 2026-12-02 once the 1x test named lambda* = 0.1): around their 1x
    # selections, on the three selection seeds
    'identity_anneal4x_wd0.1': dict(variant='reduced', weight_decay=0.1,
                                  settings=dict(ANNEAL_4X, **FULL),
                                  grid=dict(around='identity_anneal_wd0.1')),
    # v4's annealed recipe (W_Q = I at the halved scale, lambda 2^-5) at its selections, read
    # beside the standard scale's gap against tokens; no phase runs them: they are v4's runs
    'reduced_anneal': dict(variant='reduced', weight_decay=LOW, lr=4e-3, settings=ANNEAL),
    'reduced_anneal4x': dict(variant='reduced', weight_decay=LOW, lr=4e-3, settings=ANNEAL_4X),
    # claim (ii) (amended 2026-12-02): W_Q = I's saved n_embd^2 per layer in the MLP (4.5 n_embd
    # hidden: the baseline's parameter count), at lambda* and the standard scale, around W_Q = I's
    # 1x selection
    'identity_mlp_anneal_wd0.1': dict(variant='reduced_mlp', weight_decay=0.1,
                                      settings=dict(ANNEAL, **FULL),
                                      grid=dict(around='identity_anneal_wd0.1')),
}
tuning = dict(seeds=(201, 202, 203), step=2 ** 0.5, extend=3, anchor=2e-3)
TEST = tuple(range(301, 311))  # v4's test seeds: its annealed baseline there is the reference
NEW = ('baseline_anneal_wd0.03125', 'identity_anneal_wd0.1', 'identity_anneal_wd0.03125')
ARMS_4X = ('baseline_anneal4x', 'identity_anneal4x_wd0.1')  # lambda* = 0.1 (the amendment)
# in this order, so that a partial result is still an answer
phases = [
    dict(name='check', kind='at', arms=('baseline_anneal',), seeds=TEST[:1], tag='rerun'),
    # the same check on the CPU the 4x W_Q = I arm's runs began on (the amendment)
    dict(name='check epyc', kind='at', arms=('baseline_anneal',), seeds=TEST[:1],
         tag='rerun_epyc'),
    dict(name='tuning', kind='tune', arms=NEW),
    dict(name='test', kind='at', arms=('baseline_anneal', *NEW), seeds=TEST),
    dict(name='tuning 4x', kind='tune', arms=ARMS_4X),
    dict(name='test 4x', kind='at', arms=ARMS_4X, seeds=TEST),
    dict(name='tuning mlp', kind='tune', arms=('identity_mlp_anneal_wd0.1',)),
    dict(name='test mlp', kind='at', arms=('identity_mlp_anneal_wd0.1',), seeds=TEST),
]

# the write-up: docs/experiments.md's generated blocks
B1, B2, I1, I2 = 'baseline_anneal', 'baseline_anneal_wd0.03125', *NEW[1:]
DECISIONS = [dict(c, seeds=TEST) for c in (  # the design's family, the 1x part of it
    dict(label='a', arm=I1, ref=B1),  # W_Q = I alone at lambda 0.1
    dict(label='b', arm=I2, ref=B2),  # W_Q = I alone at lambda 2^-5
    dict(label='c', arm=I2, ref=B1),  # the recipe at scale 1/8
    dict(label='d', combine=dict(a=0.5, b=0.5), name='d: the main effect of W_Q = I, (a + b)/2'),
    dict(label='e', combine=dict(b=1, a=-1), name='e: the interaction, b − a'))]
FAMILY = 8  # a-e at 1x, f and h at 4x, i: claim (ii) at 1x (the design and its amendments)
I4 = 'identity_anneal4x_wd0.1'
FOURX = [dict(c, seeds=TEST) for c in (  # read unpaired (Welch): the amendment
    dict(label='f', arm=I4, ref='baseline_anneal4x', unpaired=True),  # W_Q = I alone at 4x
    dict(label='h', combine=dict(f=1, a=-1),
         name='h: W_Q = I alone, 4x gap − 1x gap, per seed'))]
MLP = [dict(label='i', arm='identity_mlp_anneal_wd0.1', ref=B1, seeds=TEST)]  # claim (ii)
LAMBDA = dict(label='λ', arm=B2, ref=B1, seeds=TEST)  # the baseline's weight decay alone
PARAMS = 844_928  # the baseline's parameters: tokens per parameter, as v4's
TOKENS = [  # the gap against tokens (the design's item): W_Q = I alone, beside v4's recipe
    dict(label='W_Q = I at 1/8, λ 0.1: 1× (a)', arm=I1, ref=B1, seeds=TEST),
    dict(label='W_Q = I at 1/8, λ 0.1: 4× (f)', arm=I4, ref='baseline_anneal4x', seeds=TEST),
    dict(label="v4's recipe (1/16, λ 2⁻⁵): 1×", arm='reduced_anneal', ref=B1, seeds=TEST),
    dict(label="v4's recipe (1/16, λ 2⁻⁵): 4×", arm='reduced_anneal4x', ref='baseline_anneal4x',
         seeds=TEST[:8])]
tables = dict(
    v5_check=dict(kind='rerun', arms=('baseline_anneal',), seed=TEST[0], tag='rerun'),
    v5_check_epyc=dict(kind='rerun', arms=('baseline_anneal',), seed=TEST[0], tag='rerun_epyc'),
    v5_tuning=dict(kind='tuning', arms=NEW),
    v5_tuning_4x=dict(kind='tuning', arms=ARMS_4X),
    v5_tuning_mlp=dict(kind='tuning', arms=('identity_mlp_anneal_wd0.1',)),
    v5_verdict=dict(kind='decisions', comparisons=DECISIONS, family=FAMILY, margin=0.5,
                    beside=[LAMBDA]),
    # every interval and margin at Bonferroni's 0.05/8 (v6's correction: Holm's levels mixed)
    v5_family=dict(kind='decisions', comparisons=DECISIONS + FOURX + MLP, family=FAMILY,
                   margin=0.5, one_level=True),
    v5_tokens=dict(kind='tokens_gaps', comparisons=TOKENS, params=PARAMS),
)
figures = {
    'v5_tokens.png': dict(kind='budgets', comparisons=TOKENS[:2], references=TOKENS[2:],
                          params=PARAMS),
}
