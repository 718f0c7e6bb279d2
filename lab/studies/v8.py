"""Experiment v8: does W_Q = I's 4x cost belong to AdamW? The 4x pair under Muon, paired by seed
with AdamW's (docs/experiments.md).

v5's 4x pair (4 layers of 128, scale 1/8, lambda 0.1, the annealed cosine over 4,800 steps) trained
with Muon on the blocks' matrices (each projection on its own) and AdamW on the rest, one LR for
both (muon_scale='match_rms_adamw'), each arm's LR tuned on selection seeds 201-203. The AdamW
pair is v4's and v5's runs, reused by name and extended to the same 20 test seeds, 301-320, with
the same commands. The design is the docs'; change it there first.
"""
name = 'v8'
docs = 'docs/experiments.md'
base = ('config/cpu/small.py', 'config/lab/repro.py', 'config/gpt2_init.py',
        'config/lab/repro_v3.py')
reuse = ('v5', 'v4')  # the AdamW 4x pair: v4's baseline (301-308), v5's (309, 310) and W_Q = I
FULL = dict(attn_scale_factor=1.0)  # the standard 1/sqrt(d_head) = 1/8, as v5
ANNEAL_4X = dict(max_iters=4800, warmup_iters=96, lr_decay_iters=4800)  # 9.83M tokens
MUON = dict(ANNEAL_4X, optimizer='muon')  # muon_lr None, muon_scale match_rms_adamw: one LR
arms = {
    # AdamW: v4's and v5's 4x pair at their selections (v5's 4x tuning table), not tuned again
    'baseline_anneal4x': dict(variant='baseline', weight_decay=0.1, lr=2.83e-3,
                              settings=ANNEAL_4X),
    'identity_anneal4x_wd0.1': dict(variant='reduced', weight_decay=0.1, lr=4e-3,
                                    settings=dict(ANNEAL_4X, **FULL)),
    # Muon: each arm's grid centred on its AdamW selection (Muon's update matched to AdamW's RMS)
    'baseline_muon4x': dict(variant='baseline', weight_decay=0.1, settings=MUON,
                            grid=(2e-3, 2.83e-3, 4e-3)),
    'identity_muon4x': dict(variant='reduced', weight_decay=0.1, settings=dict(MUON, **FULL),
                            grid=(2.83e-3, 4e-3, 5.66e-3)),
}
tuning = dict(seeds=(201, 202, 203), step=2 ** 0.5, extend=3, anchor=2e-3)
TEST = tuple(range(301, 321))
NEW = TEST[10:]  # the AdamW pair's seeds beyond v4's and v5's ten
ADAMW = ('baseline_anneal4x', 'identity_anneal4x_wd0.1')
MUONS = ('baseline_muon4x', 'identity_muon4x')
phases = [
    # this machine against a committed AdamW 4x run: what a CPU's float32 moves
    dict(name='check', kind='at', arms=ADAMW[:1], seeds=TEST[:1], tag='rerun_v8'),
    dict(name='tuning', kind='tune', arms=MUONS),
    dict(name='test adamw', kind='at', arms=ADAMW, seeds=NEW),
    dict(name='test muon', kind='at', arms=MUONS, seeds=TEST),
]

# the write-up: docs/experiments.md's generated blocks
B, I, BM, IM = *ADAMW, *MUONS
FAMILY = 2  # a and b: Holm over two, every interval at 97.5%
A = dict(label='a', arm=IM, ref=BM, seeds=TEST)  # the gap under Muon
F = dict(label='f', arm=I, ref=B, seeds=TEST)  # the gap under AdamW (v5's f, on 20 seeds)
INTERACTION = dict(label='b', combine=dict(a=1, f=-1),
                   name='b: the gap under Muon − under AdamW, per seed', seeds=TEST)
BESIDE = [F,  # outside the family, unadjusted: what b is made of, and what Muon does to each arm
          dict(label='baseline', arm=BM, ref=B, seeds=TEST),
          dict(label='W_Q = I', arm=IM, ref=I, seeds=TEST)]
THRESHOLDS = (0.05, 0.03, 0.1)  # v6's induction onset, then its sensitivity checks
tables = dict(
    v8_check=dict(kind='rerun', arms=ADAMW[:1], seed=TEST[0], tag='rerun_v8'),
    v8_tuning=dict(kind='tuning', arms=MUONS),
    v8_family=dict(kind='decisions', comparisons=[A, INTERACTION], family=FAMILY, margin=0.5,
                   beside=BESIDE, one_level=True),
    v8_onsets=dict(kind='onsets', pairs=[A, F], thresholds=THRESHOLDS),
    v8_gaps=dict(kind='trajectory', comparisons=[A, F], every=400, figure='assets/v8_gaps.png'),
)
figures = {
    'v8_gaps.png': dict(kind='trajectory', comparisons=[A, F]),
}
