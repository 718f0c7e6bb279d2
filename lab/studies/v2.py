"""Experiment v2 ("verdict"): three arms against the baseline at init std 0.02
(docs/experiments.md).

Tuning on one selection seed: weight decay first at the starting LR, then LR at the best weight
decay, each optimum bracketed. Then every arm on 6 fresh paired seeds, the trend over budgets,
the init-geometry check, and each arm's selected LR over and times sqrt(2) on the selection
seed.
"""
name = 'verdict'
docs = 'docs/experiments.md'
base = ('config/cpu/small.py', 'config/lab/repro.py')
ARMS = ('baseline', 'reduced', 'reduced_mlp', 'nonlinear')  # config/<arm>.py, the reference first
arms = {arm: dict(grid=(1e-3, 2e-3, 4e-3)) for arm in ARMS}  # weight decay tuned (None)
tuning = dict(seeds=(100,), step=2.0, extend=3, wd_grid=(0.0, 2 ** -5, 0.1), wd_step=10 ** 0.5,
              lr_start=2e-3)
TEST = (101, 102, 103, 104, 105, 106)  # never used for tuning, nor by an earlier experiment
PAIR = ('baseline', 'reduced')
GEOMETRY_STD = 0.049  # sigma * sqrt(d) of GPT-2 small at d = 128: 0.02 * sqrt(768 / 128)
phases = [
    dict(name='tuning', kind='tune', arms=ARMS),
    dict(name='test', kind='at', arms=ARMS, seeds=TEST),
    dict(name='trend', kind='at', arms=PAIR, seeds=TEST[:4], budget=0.25),
    dict(name='trend', kind='at', arms=PAIR, seeds=TEST[:4], budget=0.5),
    dict(name='geometry', kind='at', arms=PAIR, seeds=TEST[:4], init_std=GEOMETRY_STD),
    # the LR grid's resolution: the selected LR over and times sqrt(2)
    dict(name='refine', kind='at', arms=ARMS, seeds=(100,), lr_factors=(2 ** -0.5, 2 ** 0.5)),
]

# the write-up: docs/experiments.md's generated blocks and docs/assets/ figures
GEOMETRY = dict(pair=PAIR, seeds=TEST[:4], init_std=GEOMETRY_STD)
TREND = dict(pair=PAIR, budgets=(0.25, 0.5), seeds=TEST[:4])
tables = dict(
    tuning=dict(kind='wd_lr_tuning', arms=ARMS),
    verdict=dict(kind='arm_verdicts', arms=ARMS, seeds=TEST),
    trend=dict(kind='trend', figure='assets/trend.png', **TREND),
    geometry=dict(kind='geometry', figure='assets/geometry.png', **GEOMETRY),
    refine=dict(kind='refine', arms=ARMS, seed=100, factors=(2 ** -0.5, 2 ** 0.5)),
    diagnostics=dict(kind='diagnostics_note', arms=ARMS, seed=TEST[0],
                     figure='assets/diagnostics.png'),
)
figures = {
    'trend.png': dict(kind='trend', **TREND),
    'geometry.png': dict(kind='geometry', **GEOMETRY),
    'diagnostics.png': dict(kind='diagnostics', arms=ARMS, seed=TEST[0]),
}
