"""Experiment v4: which of the reduced recipe's three changes costs its 1%, and whether training
to the end of an annealed schedule closes it (docs/experiments.md).

At v3's 1x setting exactly, so that v3's baseline and reduced runs on seeds 301-310 are the
references: three arms that each change one thing of a recipe (the scale, or the weight decay),
each tuned on three selection seeds and tested on 10 paired seeds. Then the primary pair with an
annealed schedule (warmup 2% of the run, a cosine to min_lr at its last step) at 1x and 4x, the
LR tuned at each budget. Then claim (iii) in its weight-decay form. The design is the docs';
change it there first.
"""
name = 'v4'
docs = 'docs/experiments.md'
base = ('config/small.py', 'config/repro.py', 'config/gpt2_init.py', 'config/repro_v3.py')
reuse = ('v3',)  # v3's baseline and reduced runs: the same commands, so the same names
HD = 128 // 2  # head size at this geometry (n_embd 128, 2 heads): 1/sqrt(HD) = 1/8
ANNEAL = dict(warmup_iters=24, lr_decay_iters=1200)  # 2% warmup, the cosine ends at the last step
ANNEAL_4X = dict(max_iters=4800, warmup_iters=96, lr_decay_iters=4800)  # 9.8M tokens
arms = {
    # v3's selections (its tuning tables): not tuned again
    'baseline': dict(weight_decay=0.1, lr=1.41e-3),  # W_Q, scale 1/8
    'reduced': dict(weight_decay=2 ** -5, lr=2e-3),  # W_Q = I, scale 1/16
    # one change each; the starting grid centred on the LR of the recipe it changes
    'reduced_full_scale': dict(variant='reduced', weight_decay=2 ** -5,
                               settings=dict(attn_scale=HD ** -0.5), grid=(1.41e-3, 2e-3, 2.83e-3)),
    'reduced_wd0.1': dict(variant='reduced', weight_decay=0.1, grid=(1.41e-3, 2e-3, 2.83e-3)),
    'baseline_half_scale': dict(variant='baseline', weight_decay=0.1,
                                settings=dict(attn_scale=0.5 * HD ** -0.5), grid=(1e-3, 1.41e-3, 2e-3)),
    # the annealed schedule, tuned at each budget; 4x on two seeds, around its 1x selection
    'baseline_anneal': dict(variant='baseline', weight_decay=0.1, settings=ANNEAL,
                            grid=(1e-3, 1.41e-3, 2e-3)),
    'reduced_anneal': dict(variant='reduced', weight_decay=2 ** -5, settings=ANNEAL,
                           grid=(1.41e-3, 2e-3, 2.83e-3)),
    'baseline_anneal4x': dict(variant='baseline', weight_decay=0.1, settings=ANNEAL_4X,
                              grid=dict(around='baseline_anneal'), tuning=dict(seeds=(201, 202))),
    'reduced_anneal4x': dict(variant='reduced', weight_decay=2 ** -5, settings=ANNEAL_4X,
                             grid=dict(around='reduced_anneal'), tuning=dict(seeds=(201, 202))),
    # claim (iii) in its weight-decay form: the baseline at the reduced model's weight decay
    'baseline_wd0.03125': dict(variant='baseline', weight_decay=2 ** -5),
}
tuning = dict(seeds=(201, 202, 203), step=2 ** 0.5, extend=3, anchor=2e-3)
TEST = tuple(range(301, 311))  # v3's test seeds: its runs there are the references
ABLATIONS = ('reduced_full_scale', 'reduced_wd0.1', 'baseline_half_scale')
# in this order, so that a partial result is still an answer (the runner fills a free slot with
# the next phase's runs while a tuning waits for its last one)
phases = [
    dict(name='check', kind='at', arms=('baseline', 'reduced'), seeds=TEST[:1], tag='rerun'),
    dict(name='reference', kind='at', arms=('baseline', 'reduced'), seeds=TEST),
    *(dict(name=phase, kind=kind, arms=(arm,), seeds=TEST)
      for arm in ABLATIONS for phase, kind in (('tuning', 'tune'), ('test', 'at'))),
    dict(name='tuning', kind='tune', arms=('baseline_anneal', 'reduced_anneal')),
    dict(name='anneal', kind='at', arms=('baseline_anneal', 'reduced_anneal'), seeds=TEST),
    dict(name='tuning', kind='tune', arms=('baseline_anneal4x', 'reduced_anneal4x')),
    dict(name='anneal', kind='at', arms=('baseline_anneal4x', 'reduced_anneal4x'),
         seeds=TEST[:8]),
    # above v3's grid, 8e-3 to 2.26e-2, until a seed diverges; the gradient norm at every step
    dict(name='climb', kind='climb', arms=('baseline_wd0.03125', 'reduced_wd0.1'),
         seeds=tuning['seeds'], above=5.66e-3, steps=4, settings=dict(log_interval=1)),
]
