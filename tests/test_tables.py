"""lab/tables.py's step lag on curves with known answers: the delay v4 measures."""
import math

import pytest

from lab import stats, tables


def curve(delay, evals=range(0, 1300, 100)):
    """A loss falling 1 nat per 1000 steps from 3.0 after `delay` steps, evaluated every 100
    steps: linear between the evaluations around each crossing, so interpolation is exact."""
    return {t: 3.0 - max(t - delay, 0) / 1000 for t in evals}


class Logs:
    """Just enough of a study's Context for seed_lags: each (arm, seed) has a log and a loss."""

    def __init__(self, delays, unfinished=()):
        self.delays, self.unfinished = delays, unfinished

    def at(self, arm, seed, budget):
        return (arm, seed)

    def loss(self, run):
        return None if run in self.unfinished or run not in self.delays else 1.2

    def log(self, run):
        return [dict(iter=t, val_loss=v) for t, v in curve(self.delays[run]).items()]


def test_a_crossing_is_interpolated_between_the_evaluations_around_it():
    series = {0: 3.0, 100: 2.0, 200: 1.5, 300: 1.6, 400: 1.0}
    assert tables.crossing(series, 2.5) == 50
    assert tables.crossing(series, 1.75) == 150
    assert tables.crossing(series, 1.55) == pytest.approx(190)  # the first time, not 300-400
    assert tables.crossing(series, 0.9) is None


def test_the_lag_is_the_steps_the_arm_needs_beyond_its_reference_seed_by_seed():
    ctx = Logs({('arm', 1): 30, ('ref', 1): 0, ('arm', 2): 50, ('ref', 2): 0})
    c = dict(arm='arm', ref='ref', seeds=(1, 2))
    lags = tables.seed_lags(ctx, c, (2.5, 2.0, 1.5))
    assert sorted(lags) == [2.0, 2.5]  # neither reaches 1.5 (the baseline ends at 1.8)
    for level in lags:
        assert lags[level] == pytest.approx({1: 30.0, 2: 50.0})
    assert tables.mean_lags(lags, (2.0, 1.5)) == pytest.approx({1: 30.0, 2: 50.0})


def test_a_level_only_one_arm_reaches_and_an_unfinished_seed_are_left_out():
    ctx = Logs({('arm', 1): 900, ('ref', 1): 0, ('arm', 2): 10, ('ref', 2): 0},
               unfinished={('arm', 2)})
    c = dict(arm='arm', ref='ref', seeds=(1, 2))
    lags = tables.seed_lags(ctx, c, (2.9, 2.5))
    assert lags == {2.9: pytest.approx({1: 900.0})}  # the arm ends at 2.7: 2.5 is left out


def test_the_lag_table_gives_the_mean_and_its_interval_and_waits_for_missing_seeds():
    ctx = Logs({('arm', 1): 30, ('ref', 1): 0, ('arm', 2): 50, ('ref', 2): 0})
    c = dict(label='1', arm='arm', ref='ref', seeds=(1, 2))
    text = tables.lag_table(ctx, [c], (2.5, 2.0, 1.0))
    # mean 40, sd 14.1 over 2 seeds: t(0.975, 1) = 12.71, so ±127
    assert "| 1 arm − ref | +40 [-87, +167] | +40 [-87, +167] | not reached | +40 [-87, +167] |" \
        in text
    waiting = tables.lag_table(ctx, [dict(c, seeds=(1, 2, 3))], (2.5, 2.0))
    assert waiting == "Not yet: arm − ref.\n"


class Budgets:
    """Enough of a Context for budgets_table: known paired gaps per (arm, ref)."""

    def __init__(self, gaps):
        self.gaps_of = gaps
        self.s = type('Study', (), dict(base=(), arm=lambda self, arm: {}))()
        self.plan = type('Plan', (), dict(chosen=dict(a=(2e-3, 0.1), b=(1e-3, 0.1),
                                                      c=(2e-3, 0.1), d=(1e-3, 0.1))))()

    def gaps(self, arm, ref, seeds):
        return {s: g for s, g in self.gaps_of.get((arm, ref), {}).items() if s in seeds}


def test_an_annealed_budget_whose_family_waits_is_shown_unadjusted_and_marked():
    one = dict(label='one', arm='a', ref='b', seeds=(1, 2, 3), family='anneal')
    other = dict(label='other', arm='c', ref='d', seeds=(1, 2, 3), family='anneal')
    ctx = Budgets({('a', 'b'): {1: 1.0, 2: 1.2, 3: 0.8}})  # the other has no seeds yet
    rows = tables.budgets_table(ctx, [one, other], [], params=1000).splitlines()
    assert rows[2].startswith('| one |') and '+1.00% ± 0.20%' in rows[2]
    assert rows[2].endswith('(unadjusted: its family waits) |')
    assert rows[3] == '| other | | | | | not yet | | | | |'
    ctx.gaps_of[('c', 'd')] = {1: 0.1, 2: -0.1, 3: 0.0}
    rows = tables.budgets_table(ctx, [one, other], [], params=1000).splitlines()
    assert 'unadjusted' not in '\n'.join(rows) and '| one |' in rows[2]


def test_the_budgets_table_gives_how_far_the_gap_moves_between_schedules_on_shared_seeds():
    one = dict(label='one', arm='a', ref='b', seeds=(1, 2, 3), family='anneal')
    other = dict(label='other', arm='c', ref='d', seeds=(1, 2), family='anneal')
    ctx = Budgets({('a', 'b'): {1: 1.0, 2: 1.2, 3: 0.8}})
    assert 'change of the paired gap' not in tables.budgets_table(ctx, [one, other], [], 1000)
    ctx.gaps_of[('c', 'd')] = {1: 3.0, 2: 4.2}  # moves +2.0 and +3.0 on seeds 1 and 2 only
    text = tables.budgets_table(ctx, [one, other], [], params=1000)
    # mean 2.5, sd 0.707 over 2 seeds: t(0.975, 1) 12.71 x 0.5 = 6.35; t = 5, p = 0.126
    assert "| other − one | 1–2 | +2.50% [-3.85%, +8.85%] | 0.126 | 2 of 2 |" in text


def test_the_lag_table_can_give_how_the_mean_lag_moves_from_one_comparison_to_the_next():
    ctx = Logs({('arm', 1): 30, ('ref', 1): 0, ('arm', 2): 50, ('ref', 2): 0,
                ('arm2', 1): 10, ('arm2', 2): 40})
    one = dict(label='one', arm='arm', ref='ref', seeds=(1, 2))
    two = dict(label='two', arm='arm2', ref='ref', seeds=(1, 2))
    assert 'change of the mean lag' not in tables.lag_table(ctx, [one, two], (2.5, 2.0, 1.0))
    text = tables.lag_table(ctx, [one, two], (2.5, 2.0, 1.0), changes=True)
    # lags 30, 50 then 10, 40 at level 2.0 (1.0 not reached): moves -20, -10, mean -15, sd 7.07
    assert "| two − one | 2–2 | 1–2 | -15 [-79, +49] | 0.205 | 2 of 2 |" in text


def test_the_trajectory_table_can_show_every_nth_step_and_keeps_the_slope_over_all():
    ctx = Logs({('arm', 1): 100, ('ref', 1): 0, ('arm', 2): 100, ('ref', 2): 0})
    c = dict(label='1', arm='arm', ref='ref', seeds=(1, 2))
    every = tables.trajectory_table(ctx, [c], every=400).splitlines()
    assert [row.split(' |')[0] for row in every[2:-1]] == ['| 400', '| 800', '| 1200']
    assert every[-1] == tables.trajectory_table(ctx, [c]).splitlines()[-1]
    # a fixed 100-step delay on a line falling 0.1 per 100 steps: the gap at step 400 is
    # (2.7 - 2.6) / 2.6
    assert every[2] == "| 400 | +3.85% [+3.85%, +3.85%] |"
    assert '![' not in '\n'.join(every)


class Scales:
    """Enough of a Context for learned_scale_table: runs whose evaluations log learned scales."""

    def __init__(self, scales, seeds=(1, 2)):
        self.scales, self.runs = scales, [type('Run', (), dict(seed=s))() for s in seeds]

    def done(self, arm, seeds):
        return [r for r in self.runs if r.seed in seeds]

    def log(self, run):
        return [dict(iter=k, diagnostics=dict(scale=v)) for k, v in self.scales[run.seed].items()]


def test_the_learned_scale_table_gives_each_layers_mean_and_extremes_over_seeds_and_heads():
    ctx = Scales({1: {0: [[1 / 16, 1 / 16]], 300: [[1 / 8, 1 / 16]]},
                  2: {0: [[1 / 16, 1 / 16]], 300: [[1 / 10, 1 / 4]]}})
    rows = tables.learned_scale_table(ctx, 'arm', (1, 2), (0, 300)).splitlines()
    # at 300 the mean of 1/8, 1/16, 1/10, 1/4 is 0.134375 = 1/7.44
    assert rows[2] == "| 0 | 1/16.0 [1/16.0, 1/16.0] | 1/7.4 [1/16.0, 1/4.0] |"
    assert tables.learned_scale_table(ctx, 'arm', (1, 2, 3), (0,)) == \
        "Not yet: arm has 2 of 3 seeds.\n"
    assert tables.learned_scale_table(ctx, 'arm', (1, 2), (0, 100)).startswith("Not logged:")


def test_a_lag_can_compare_two_arms_at_named_lrs_instead_of_their_selected_ones():
    """lrs: the tuning runs at those LRs, named as the runner names them."""
    from lab.plan import Run
    ctx = Logs({Run('arm', 2e-3, 0.5, 1): 30, Run('ref', 2e-3, 0.1, 1): 0,
                Run('arm', 2e-3, 0.5, 2): 50, Run('ref', 2e-3, 0.1, 2): 0,
                Run('arm', 4e-3, 0.5, 1): 0, Run('arm', 4e-3, 0.5, 2): 0})
    ctx.s = type('Study', (), dict(arm=lambda self, arm: dict(weight_decay=dict(
        arm=0.5, ref=0.1)[arm])))()
    c = dict(label='1', arm='arm', ref='ref', seeds=(1, 2), lrs=(2e-3, 2e-3))
    assert tables.seed_lags(ctx, c, (2.5,)) == {2.5: pytest.approx({1: 30.0, 2: 50.0})}
    text = tables.lag_table(ctx, [c, dict(c, ref='arm', lrs=(2e-3, 4e-3))], (2.5, 2.0))
    assert "| 1 arm at 0.002 − ref at 0.002 | +40 [-87, +167] |" in text
    assert "| 1 arm at 0.002 − arm at 0.004 | +40 [-87, +167] |" in text


def test_a_climb_row_gives_its_state_its_rises_and_its_gradient_ratio_on_one_footing():
    """The state from the fixed-window loss at the end over step 100; every rise listed; the
    gradient ratio over every 10th step, and over every step where the run logged every step."""
    from lab.plan import Run
    norms = {t: 10.0 if t == 55 else 3.0 if t == 60 else 1.0 for t in range(1, 301)}
    log = [dict(iter=t, loss=2.0, grad_norm=g) for t, g in norms.items()]
    log += [dict(iter=100, val_loss=2.0), dict(iter=200, val_loss=2.1),
            dict(iter=300, val_loss=1.9)]
    ctx = type('Ctx', (), dict(log=lambda self, run: log))()
    row = tables.climb_row(ctx, Run('arm', 8e-3, 0.1, 201), 1.95, 24, 0.8)
    assert row == ("| arm | 0.1 | 0.008 | 201 | 1.9500 | 0.95 | stalled | 200: +5.00% | "
                   "3.0 (10.0) |")
    every10 = [e for e in log if 'loss' not in e or e['iter'] % 10 == 0]
    ctx.log = lambda run: every10
    assert tables.climb_row(ctx, Run('arm', 8e-3, 0.1, 201), 1.95, 24, 0.8).endswith("| 3.0 |")


class Pairs(Budgets):
    """Enough of a Context for decisions_table: known paired gaps, no arms' means."""

    def __init__(self, gaps):
        super().__init__(gaps)
        self.s.arms = {}


def test_the_decisions_table_builds_contrasts_seed_by_seed_and_waits_for_every_seed():
    a = dict(label='a', arm='x', ref='y', seeds=(1, 2, 3))
    b = dict(label='b', arm='z', ref='w', seeds=(1, 2, 3))
    d = dict(label='d', combine=dict(a=0.5, b=0.5), name='d: (a + b)/2', seeds=(1, 2, 3))
    e = dict(label='e', combine=dict(b=1, a=-1), name='e: b − a', seeds=(1, 2, 3))
    ctx = Pairs({('x', 'y'): {1: 1.0, 2: 1.2, 3: 0.8}, ('z', 'w'): {1: 0.0, 2: 0.4}})
    gaps = tables.decision_gaps(ctx, [a, b, d, e])
    assert gaps['d'] == pytest.approx({1: 0.5, 2: 0.8}) and gaps['e'] == pytest.approx(
        {1: -1.0, 2: -0.8})
    assert tables.decisions_table(ctx, [a, b, d, e], family=6, margin=0.5) == (
        "Not yet: paired seeds so far b 2 of 3, d 2 of 3, e 2 of 3.\n")
    ctx.gaps_of[('z', 'w')][3] = 0.2
    text = tables.decisions_table(ctx, [a, b, d, e], family=6, margin=0.5)
    rows = [line for line in text.splitlines() if line.startswith('| d: ')]
    assert len(rows) == 1 and '+0.60% ± 0.17%' in rows[0]  # (a + b)/2 = 0.5, 0.8, 0.5
    assert "the 2 not in yet count as p = 1" in text and "0.05/6" in text


class Losses(Pairs):
    """A Context with each (arm, seed)'s final loss: pairs and unpaired groups both read it."""

    def __init__(self, losses):
        super().__init__({})
        self.losses = losses

    def at(self, arm, seed):
        return (arm, seed)

    def loss(self, run):
        return self.losses.get(run)

    def gaps(self, arm, ref, seeds):
        return {s: 100 * (self.losses[(arm, s)] - self.losses[(ref, s)]) / self.losses[(ref, s)]
                for s in seeds if (arm, s) in self.losses and (ref, s) in self.losses}


def test_an_unpaired_comparison_is_read_by_welch_with_the_paired_reading_beside_it():
    arm = {1: 1.20, 2: 1.25, 3: 1.22, 4: 1.30}
    ref = {1: 1.10, 2: 1.12, 3: 1.09, 4: 1.15}
    ctx = Losses({**{('x', s): v for s, v in arm.items()},
                  **{('y', s): v for s, v in ref.items()}})
    c = dict(label='f', arm='x', ref='y', seeds=(1, 2, 3, 4), unpaired=True)
    beside = [dict(c, label="f'")]  # declared unpaired beside the family: read unpaired too
    rows = tables.decisions_table(ctx, [c], family=1, margin=0.5, beside=beside).splitlines()
    welch = next(line for line in rows if line.startswith('| f x − y, unpaired |'))
    gap = 100 * (sum(arm.values()) - sum(ref.values())) / sum(ref.values())
    assert welch.split(' | ')[1] == '4 + 4' and f"{gap:+.2f}% (se " in welch
    assert welch.endswith('| **worse** |')  # the family's verdict, in bold
    paired = next(line for line in rows
                  if line.startswith('| f x − y, paired (outside the family, unadjusted) |'))
    outside = next(line for line in rows
                   if line.startswith("| f' x − y, unpaired (outside the family, unadjusted) |"))
    assert outside.split(' | ')[1:3] == welch.split(' | ')[1:3]  # Welch's gap, as declared
    # no verdict word outside the family, bold or plain
    assert paired.endswith('| – (outside the family) |') and \
        outside.endswith('| – (outside the family) |')


def test_the_tokens_table_gives_each_budgets_paired_and_unpaired_gap_and_waits_for_seeds():
    from scipy import stats as st
    arm = {1: 1.20, 2: 1.25, 3: 1.22, 4: 1.30}
    ref = {1: 1.10, 2: 1.12, 3: 1.09, 4: 1.15}
    ctx = Losses({**{('x', s): v for s, v in arm.items()},
                  **{('y', s): v for s, v in ref.items()}, ('z', 1): 1.0, ('y4', 1): 1.0})
    ctx.s = Budgets({}).s  # train.py's defaults as the schedule: 105,002 steps of 491,520 tokens
    one = dict(label='one', arm='x', ref='y', seeds=(1, 2, 3, 4))
    other = dict(label='other', arm='z', ref='y4', seeds=(1, 2))
    rows = tables.tokens_gaps_table(ctx, [one, other], params=10 ** 9).splitlines()
    gaps = [100 * (arm[s] - ref[s]) / ref[s] for s in arm]
    m, half = sum(gaps) / 4, st.t.ppf(0.975, 3) * st.tstd(gaps) / 2
    mean = 100 * (sum(arm.values()) - sum(ref.values())) / sum(ref.values())
    va, vr = st.tvar(list(arm.values())) / 4, st.tvar(list(ref.values())) / 4
    df = (va + vr) ** 2 / (va ** 2 / 3 + vr ** 2 / 3)
    welch = st.t.ppf(0.975, df) * 100 * (va + vr) ** 0.5 / (sum(ref.values()) / 4)
    assert rows[2] == (f"| one | 105002 | 51610.58M | 51.6 | 1–4 | {m:+.2f}% [{m - half:+.2f}%, "
                       f"{m + half:+.2f}%] | {mean:+.2f}% [{mean - welch:+.2f}%, "
                       f"{mean + welch:+.2f}%] |")
    assert rows[3] == "| other | 105002 | 51610.58M | 51.6 | 1–2 | not yet (1 of 2 seeds) | |"
    assert "~440 GPT-2 BPE tokens per parameter" in rows[-1] and "Tokens are bytes" in rows[-1]


class Onsets:
    """Enough of a Context for the onset tables: each (arm, seed) run has an induction curve that
    jumps from 0.01 to `peak` at `on` (None: never), a full val loss, and val losses and attention
    diagnostics at each evaluation."""

    def __init__(self, runs, evals=range(0, 1100, 100)):
        self.runs, self.evals = runs, evals  # {(arm, seed): (onset, peak, final loss)}

    def at(self, arm, seed, budget=1.0):
        return (arm, seed)

    def loss(self, run):
        return self.runs[run][2] if run in self.runs else None

    def log(self, run):
        on, peak, final = self.runs[run]
        return [dict(iter=t, val_loss=final + (1000 - t) / 1000, induction=[[0.01, 0.0], [
            peak if on is not None and t >= on else 0.01, 0.0]], repeat_loss=1.0,
            diagnostics=dict(logit_std=[1.0 + (run[0] == 'arm') * t / 1000],
                             entropy=[2.0])) for t in self.evals]

    def gaps(self, arm, ref, seeds):
        return {s: 100 * (self.loss((arm, s)) - self.loss((ref, s))) / self.loss((ref, s))
                for s in seeds if (arm, s) in self.runs and (ref, s) in self.runs}


def onsets_ctx(never_seed=True):
    runs = {}
    for seed, (ref_on, arm_on, gap) in {1: (200, 300, 1.0), 2: (200, 500, 3.0), 3: (300, 300, 0.0),
                                        4: (200, 400, 2.0), 5: (400, None, 7.0)}.items():
        runs[('ref', seed)] = (ref_on, 0.2, 1.0)
        runs[('arm', seed)] = (arm_on if never_seed or seed != 5 else 900, 0.1, 1 + gap / 100)
    runs[('ref', 6)], runs[('arm', 6)] = (None, 0.02, 1.0), (None, 0.02, 1.01)
    return Onsets(runs)


def test_the_onset_table_gives_each_seeds_delay_counting_a_never_as_a_lower_bound():
    c = dict(label='4×', arm='arm', ref='ref', seeds=(1, 2, 3, 4, 5, 6))
    text = tables.onsets_table(onsets_ctx(), [c], (0.05,))
    assert "| 4× | 2 | +3.00% | 1.0000, 1.0300 | 200, 500 | +300 | 0.200, 0.100 |" in text
    # never: the last evaluation (1000) plus one interval, 1100 - 400 = +700
    assert "| 4× | 5 | +7.00% | 1.0000, 1.0700 | 400, never | +700 | 0.200, 0.010 |" in text
    assert "| 4× | 6 | +1.00% | 1.0000, 1.0100 | never, never | – | 0.010, 0.010 |" in text
    # delays 100, 300, 0, 200, 700 against gaps 1, 3, 0, 2, 7: an exact line, r = +1; the arm
    # later on 4 seeds, the same on 1 (sign test 2/16); rho +1 in 2 of the 120 pairings; every
    # reference loss the same, so no correlation within it
    assert ("| 4× | 0.05 | 5 of 6 | 4, 1, 0 (0.125) | +260 | +1.00 [+1.00, +1.00] (0e+00) | "
            "+1.00 (0.017) | - | - |") in text
    # a threshold nobody reaches: no seed has a delay, no correlation
    assert "| 4× | 0.5 | 0 of 6 | – | – | - | - | - | - |" in tables.onsets_table(
        onsets_ctx(), [c], (0.5,))


def test_the_onset_confounds_are_each_arms_own_correlation_and_the_gap_at_equal_onset():
    # every loss 1 + onset / 10,000, the arm's 0.02 above: r = +1 within each arm, and at equal
    # onset the arm is 0.02 above, in % of the reference's mean loss 1.025
    rows = [(1 + r / 1e4, 1.02 + a / 1e4, r, a) for r, a in ((100, 200), (200, 300), (300, 500),
                                                              (400, 600))]
    assert tables.confound_cells(rows) == f"+1.00, +1.00 | {100 * 0.02 / 1.025:+.2f}%"
    assert tables.confound_cells(rows[:3]) == '- | -'  # under four seeds
    # later on 3 seeds, the same on 1, earlier on 1: 3 of 4 differing, p = 2 (4 + 1) / 16
    assert tables.sign_cell([100, 0, -50, 200, 300]) == "3, 1, 1 (0.625)"


def test_the_onset_table_of_twenty_seeds_gives_spearmans_p_from_random_pairings():
    """20 seeds' pairings are too many to count (the exact p's arrays would take 90 GiB): the p
    comes from a fixed seed's random pairings, and the header and the note say so."""
    runs = {}
    for seed in range(1, 21):  # delays 100 x seed, gaps 0.1 x seed: rho +1
        runs[('ref', seed)] = (100, 0.2, 1.0)
        runs[('arm', seed)] = (100 + 100 * seed, 0.1, 1 + seed / 1000)
    c = dict(label='4×', arm='arm', ref='ref', seeds=tuple(range(1, 21)))
    text = tables.onsets_table(Onsets(runs, evals=range(0, 3000, 100)), [c], (0.05,))
    assert '| Spearman ρ (permutation p) |' in text and 'ρ (exact p)' not in text
    assert "20 of 20 | 20, 0, 0 (2e-06) |" in text
    assert f"| +1.00 ({tables.fmt_p(1 / (stats.DRAWS + 1))}) |" in text  # no draw reaches it
    assert ("Spearman's p: over the pairings of the delays with the gaps, every one up to 12 "
            "seeds, above that 1,000,000 random ones from a fixed seed") in text


def test_the_onset_table_waits_for_every_seed_of_a_pair():
    c = dict(label='4×', arm='arm', ref='ref', seeds=(1, 7))
    assert tables.onsets_table(onsets_ctx(), [c], (0.05,)) == "Not yet: 4× arm − ref.\n"


def test_the_gap_steps_table_sets_pairs_side_by_side_at_the_steps_they_share(monkeypatch):
    ctx = onsets_ctx()
    ctx.s = None
    base = dict(max_iters=1000, batch_size=2, block_size=5, gradient_accumulation_steps=1)
    monkeypatch.setattr(tables.S, 'base_config', lambda s: base)  # 10 tokens a step
    a = dict(label='long', arm='arm', ref='ref', seeds=(1, 2))
    text = tables.gap_steps_table(ctx, [a], (100, 1000, 2000))
    # at step 1000 both arms' val loss is their final loss: the gaps +1% and +3%
    assert "| 1000 | 0.01M | +2.00% [" in text
    assert "| 100 |" in text and "| 2000 |" not in text  # no pair reaches 2000
    assert "| end, full val loss | | +2.00% [" in text


def test_the_attention_table_gives_the_arm_minus_its_reference_and_the_gap_before_the_onsets():
    c = dict(label='4×', arm='arm', ref='ref', seeds=(1, 2, 3, 4))
    text = tables.attention_lag_table(onsets_ctx(), c, (500, 1000), (0.05, 0.5))
    # the arm's logit std runs ahead by t/1000 on every seed: +0.5 at 500, +1 at 1000, on every
    # seed, so at any level; the entropy is the same in both arms
    assert ("| logit std | 0 | +0.500 [+0.500, +0.500] * | +1.000 [+1.000, +1.000] * |"
            in text)
    assert "| entropy (nats) | 0 | +0.000 [+0.000, +0.000] | +0.000 [+0.000, +0.000] |" in text
    assert "4 intervals, each unadjusted; * marks those whose interval at Bonferroni's 0.05/4" \
        in text
    # seed 1: onsets 200 and 300, one evaluation (100) before the earlier; its gap there is
    # 100 * ((1.01 + 0.9) - (1 + 0.9)) / 1.9. Nobody reaches 0.5: every evaluation counts
    every = [100 * 0.01 / (1 + (1000 - t) / 1000) for t in range(100, 1100, 100)]
    assert (f"| 1 | 200 (1) | {100 * 0.01 / 1.9:+.2f}% | never (10) | "
            f"{sum(every) / 10:+.2f}% |") in text
    # seed 3 has no gap: positive on the other three
    assert "At 0.05, over the 4 seeds with evaluations before an onset: +" in text
    assert "positive on 3 of 4.\n\nAt 0.5, over the 4 seeds" in text


class Schedules:
    """Enough of a Context for the tokens-against-schedule table: each (arm, seed) run has a full
    val loss, a cosine schedule from step 0 over its arm's steps (10,000 tokens a step), and a val
    loss falling linearly to that full val loss at its last step."""

    def __init__(self, finals, steps):
        self.finals, self.steps = finals, steps  # {(arm, seed): loss}, {arm: max_iters}

    def at(self, arm, seed, budget=1.0):
        return (arm, seed)

    def loss(self, run):
        return self.finals.get(run)

    def config(self, run):
        last = self.steps[run[0]]
        return dict(max_iters=last, batch_size=1, block_size=10_000, gradient_accumulation_steps=1,
                    learning_rate=1.0, min_lr=0.1, warmup_iters=0, lr_decay_iters=last,
                    decay_lr=True)

    def log(self, run):
        last = self.steps[run[0]]
        return [dict(iter=t, val_loss=self.finals[run] + (last - t) / last)
                for t in range(0, last + 1, 100)]

    def gaps(self, arm, ref, seeds):
        return {s: 100 * (self.finals[(arm, s)] - self.finals[(ref, s)]) / self.finals[(ref, s)]
                for s in seeds if (arm, s) in self.finals and (ref, s) in self.finals}


def budgets_ctx(long_gaps, short_gaps):
    finals = {}
    for (arm, ref), gaps in ((('a16', 'b16'), long_gaps), (('a4', 'b4'), short_gaps)):
        for seed, gap in gaps.items():
            finals[(ref, seed)], finals[(arm, seed)] = 1.0, 1.0 + gap / 100
    return Schedules(finals, dict(a16=1600, b16=1600, a4=400, b4=400))


def test_the_tokens_schedule_table_matches_tokens_or_the_point_of_the_schedule_seed_by_seed():
    ctx = budgets_ctx({1: 1.0, 2: 2.0, 3: 5.0}, {1: 3.0, 2: 3.0, 3: 3.0, 4: 9.0})
    long = dict(label='16×', arm='a16', ref='b16', seeds=(1, 2, 3))
    short = dict(label='4×', arm='a4', ref='b4', seeds=(1, 2, 4))  # shared: seeds 1 and 2
    text = tables.tokens_schedule_table(ctx, long, short,
                                        ((100, 100), (400, 400), (400, 100), ('end', 'end')))
    rows = text.splitlines()
    assert rows[0].startswith("| step (16×, 4×) | tokens (16×, 4×) | LR, % of peak (16×, 4×) |")
    # the same tokens, step 100 of each: 0.1 + 0.9 (1 + cos(pi t)) / 2 of the peak at t = 1/16
    # of the long run, 99.1%, and t = 1/4 of the short one, 86.8%
    assert rows[2].startswith("| 100, 100 | 1.00M, 1.00M | 99.1, 86.8 | tokens |")
    assert rows[3].startswith("| 400, 400 | 4.00M, 4.00M | 86.8, 10.0 | tokens |")
    # a quarter of each run: the same point of the cosine. The val loss is the full val loss
    # plus the share of the run still to go: 1.75 for each reference here, so the gaps are
    # 100 g / 175 % with g the final gap in %: 16× (1 + 2) / 2 / 1.75, 4× 3 / 1.75 on both seeds
    assert rows[4].startswith("| 400, 100 | 4.00M, 1.00M | 86.8, 86.8 | point of the schedule "
                              "| +0.86% [")
    assert "| +1.71% [+1.71%, +1.71%] | -0.86% [" in rows[4]
    # the ends: the full val loss on seeds 1 and 2 only; the 4× gap is +3% on both (seed 4's
    # +9% is not shared), and the 16× minus the 4× is -2 and -1 points
    assert rows[5].startswith("| end, end | 16.00M, 4.00M | 10.0, 10.0 | point of the schedule "
                              "| +1.50% [")
    assert "| +3.00% [+3.00%, +3.00%] | -1.50% [" in rows[5] and rows[5].endswith("| 0 of 2 |")
    assert "seeds 1–2" in text and "Post hoc" not in text
    # a table added after results were seen says so first
    late = tables.tokens_schedule_table(ctx, long, short, (('end', 'end'),),
                                        post_hoc="made after 1 of 3 seeds")
    assert "\n\nPost hoc: every row of this table was added by an amendment made after 1 of 3 " \
        "seeds. Paired gaps on seeds 1–2" in late


def test_the_tokens_schedule_table_waits_for_every_shared_seed_of_either_pair():
    long = dict(label='16×', arm='a16', ref='b16', seeds=(1, 2))
    short = dict(label='4×', arm='a4', ref='b4', seeds=(1, 2))
    ctx = budgets_ctx({1: 1.0}, {1: 3.0, 2: 3.0})
    assert tables.tokens_schedule_table(ctx, long, short, (('end', 'end'),)) == \
        "Not yet: 16× a16 − b16 at its end on every seed of 1–2.\n"
    ctx = budgets_ctx({1: 1.0, 2: 1.0}, {1: 3.0})
    assert tables.tokens_schedule_table(ctx, long, short, ((400, 100),)) == \
        "Not yet: 4× a4 − b4 at step 100 on every seed of 1–2.\n"


class Bracket:
    """A context whose arm was checked at 2e-3 and 2.83e-3 on seed 201, 2.83e-3 kept, and a later
    phase's run at 4e-3 (v6's 16x LRs bracketed after the check)."""

    def __init__(self, later_loss):
        from lab.plan import Run
        self.s = type('Study', (), dict(arms={'arm': {}}, arm=lambda self, a: dict(
            weight_decay=0.1, grid=(2e-3, 2.83e-3)), tuning_of=lambda self, a: dict(
            seeds=(201,))))()
        self.later = Run('arm', 4e-3, 0.1, 201)
        self.plan = type('Plan', (), dict(chosen={'arm': (2.83e-3, 0.1)},
                                          phases={'bracket': [self.later]}))()
        self.checked = [Run('arm', lr, 0.1, 201) for lr in (2e-3, 2.83e-3)]
        self.results = {self.checked[0].name: 1.0034, self.checked[1].name: 1.0032}
        if later_loss is not None:
            self.results[self.later.name] = later_loss

    def tuning_runs(self, arm):
        return self.checked


def test_a_later_phase_can_bracket_a_selection_and_the_table_says_whether_it_holds():
    def last(ctx, also=('bracket',)):
        return tables.tuning_table(ctx, also=also).splitlines()[-1]
    assert last(Bracket(1.0050), also=()) == "| arm | | 0.00283 |  |  | on the edge |"
    waiting = tables.tuning_table(Bracket(None), also=('bracket',))
    assert "| arm | 0.1 | 0.004 | - | - |  |" in waiting
    assert last(Bracket(None)) == "| arm | | 0.00283 |  |  | on the edge |"  # not finished yet
    assert last(Bracket(1.0050)) == "| arm | | 0.00283 |  |  | bracketed |"
    assert last(Bracket(1.0010)).endswith("| bracketed; another LR is lower |")
    assert "| arm | 0.1 | 0.004 | 1.0010 | 1.0010 |  |" in tables.tuning_table(
        Bracket(1.0010), also=('bracket',))


# -----------------------------------------------------------------------------
# v7's tables: budgets from one warmup-stable-decay run per seed, on known gaps

class Wsd:
    """Enough of a Context for v7's tables: full val losses and evaluation logs of wsd runs named
    by (arm, seed, steps), the reference's loss 1.0 and the arm's 1 + gap/100."""

    def __init__(self, gap, seeds, steps, stable_val=None):
        from lab import plan
        self.s = type('Study', (), dict(arm=lambda self, a: dict(
            weight_decay=0.1, settings=dict(max_iters=9600))))()
        self.plan = type('Plan', (), dict(chosen=dict(arm=(1e-3, 0.1), ref=(1e-3, 0.1))))()
        self.results, self.logs = {}, {}
        for seed in seeds:
            for n in steps:
                for a in ('arm', 'ref'):
                    run = plan.Run(a, 1e-3, 0.1, seed, steps=None if n == 9600 else n)
                    loss = 1.0 + (gap(seed, n) / 100 if a == 'arm' else 0.0)
                    self.results[run.name] = loss
                    stable = (stable_val or {}).get((a, seed, n), loss)
                    self.logs[run.name] = [dict(iter=k, val_loss=stable) for k in steps
                                           if k <= n] + [dict(iter=n, val_loss=loss)]

    def loss(self, run):
        return None if run is None else self.results.get(run.name)

    def log(self, run):
        return self.logs[run.name]

    def config(self, run):
        params = 800_000 if run.arm == 'arm' else 1_000_000
        return dict(params=params, max_iters=9600, batch_size=16, block_size=128,
                    gradient_accumulation_steps=1)


STEPS_1X = 1200
FIT = (4, 8, 16, 32)
ALL = [b * STEPS_1X for b in (2, *FIT)]


def test_the_wsd_trend_is_each_seeds_slope_per_doubling_and_its_crossing_extrapolated():
    """Each seed's gap falls 0.5, 0.6 or 0.4 points per doubling from +2% at 4x: the mean slope is
    -0.5, negative at 0.05 (closing); the mean gap line reaches 0 at 4 doublings past 4x, 64x:
    64 * 1200 * 2048 tokens over 800k and 1M parameters."""
    slopes = {1: -0.5, 2: -0.6, 3: -0.4}
    gap = lambda seed, n: 2.0 + slopes[seed] * (math.log2(n / STEPS_1X) - 2)
    ctx = Wsd(gap, (1, 2, 3), ALL)
    text = tables.wsd_trend_table(ctx, ('arm', 'ref'), (1, 2, 3), FIT, STEPS_1X, 0.25, 2)
    # sd 0.1 over 3 seeds: se 0.0577, t(0.975, 2) = 4.303: half-width 0.248
    assert "Mean slope -0.500 points per doubling [-0.748, -0.252] (95%, 3 seeds)" in text
    assert "By the design's rule: **closing**." in text
    tokens = 64 * STEPS_1X * 16 * 128
    assert f"reaches 0 at {tokens / 800_000:,.0f}, {tokens / 1_000_000:,.0f} byte tokens" in text
    assert "| 1 | +2.00% | +1.50% | +1.00% | +0.50% | -0.500 |" in text
    assert "Outside the fit, at 2×: +2.50% [+2.25%, +2.75%] (95%, 3 seeds)" in text
    flat = Wsd(lambda seed, n: 1.0 + 0.01 * (seed - 2) * math.log2(n), (1, 2, 3), ALL)
    text = tables.wsd_trend_table(flat, ('arm', 'ref'), (1, 2, 3), FIT, STEPS_1X, 0.25, 2)
    assert "**not closing**" in text and "never ahead" in text
    # with seeds still out the rule's word is an interim one, not a verdict
    text = tables.wsd_trend_table(ctx, ('arm', 'ref'), (1, 2, 3, 4), FIT, STEPS_1X, 0.25, 2)
    assert "Interim, 3 of 4 seeds: the design's rule is read at all of them (now: closing)." \
        in text and '**' not in text
    waiting = Wsd(gap, (1,), ALL)
    assert tables.wsd_trend_table(waiting, ('arm', 'ref'), (1, 2, 3), FIT, STEPS_1X, 0.25, 2) \
        == "Not yet: 1 of 3 seeds have every budget of the fit.\n"


def test_the_v7_figures_line_is_the_trend_tables_over_the_seeds_with_every_budget(monkeypatch,
                                                                                  tmp_path):
    """Seeds 1 and 2 have every budget (slopes -0.5 and -0.6); seed 3 lacks 32x and sits 3 points
    higher. The figure draws seed 3 but fits its line as the table does, over seeds 1 and 2: a
    mean over whichever seeds each budget has would bend the line by seed 3's absence at 32x."""
    from lab import figures, report
    slopes = {1: -0.5, 2: -0.6, 3: -0.5}
    gap = lambda seed, n: 2.0 + 3.0 * (seed == 3) + slopes[seed] * (math.log2(n / STEPS_1X) - 2)
    ctx = Wsd(gap, (1, 2, 3), ALL)
    from lab import plan
    for a in ('arm', 'ref'):
        del ctx.results[plan.Run(a, 1e-3, 0.1, 3, steps=32 * STEPS_1X).name]
    drawn = {}
    monkeypatch.setattr(report, 'save_figure', lambda fig, path: drawn.update(fig=fig))
    assert figures.wsd_gaps_figure(ctx, str(tmp_path / 'f.png'), ('arm', 'ref'), (1, 2, 3),
                                   (2, *FIT), STEPS_1X, FIT)
    ax = drawn['fig'].axes[0]
    fitted = [line for line in ax.get_lines() if line.get_linestyle() == '--']
    assert [line.get_label() for line in fitted] == [
        "fitted over 4×–32× (2 seeds with every budget): -0.55 points per doubling"]
    # through the two seeds' mean: +2.00% at 4x, falling 0.55 a doubling
    assert [round(y, 6) for y in fitted[0].get_ydata()] == [2.0, 1.45, 0.9, 0.35]
    assert sum(1 for line in ax.get_lines() if line.get_color() == 'grey') == 3
    report.pyplot().close(drawn['fig'])


def test_a_line_crosses_zero_ahead_only_when_it_slopes_against_the_gaps_sign():
    assert tables.crossing_budget(2.0, 3.5, -0.5) == 7.5
    assert tables.crossing_budget(2.0, 3.5, 0.5) is None
    assert tables.crossing_budget(-1.0, 3.5, -0.5) is None and \
        tables.crossing_budget(2.0, 3.5, 0.0) is None
    assert tables.crossing_budget(-1.0, 3.5, 0.5) == 5.5


def test_the_wsd_budgets_family_is_holm_over_the_five_at_one_level():
    """A gap of 2% at 2x halving each doubling, with seed noise: every interval at 99%, and the
    first budget whose upper end is below +0.5% named."""
    noise = {1: -0.1, 2: 0.0, 3: 0.1}
    gap = lambda seed, n: 4.0 * STEPS_1X / n + noise[seed]
    ctx = Wsd(gap, (1, 2, 3), ALL)
    text = tables.wsd_budgets_table(ctx, ('arm', 'ref'), (1, 2, 3), (2, *FIT), STEPS_1X, 0.5, 0.5)
    rows = [line for line in text.splitlines() if line.startswith('| ') and '×' in line]
    assert [row.split(' | ')[0] for row in rows] == ['| 2×', '| 4×', '| 8×', '| 16×', '| 32×']
    assert all('(99.0%)' in row for row in rows)
    # at 32x the mean is 0.125 +- 0.1 sd: t(0.995, 2) = 9.925 gives an upper end of 0.70 > 0.5;
    # at 16x 0.25: 0.82; none below
    assert "The first budget whose interval's upper end is below +0.50%: none." in text
    quiet = Wsd(lambda seed, n: 4.0 * STEPS_1X / n + noise[seed] / 100, (1, 2, 3), ALL)
    text = tables.wsd_budgets_table(quiet, ('arm', 'ref'), (1, 2, 3), (2, *FIT), STEPS_1X, 0.5,
                                    0.5)
    assert "upper end is below +0.50%: 16×." in text  # 0.25 + 0.0099 * 5.73; 8x: 0.5 + ...


def test_the_wsd_check_applies_the_designs_rule():
    class Check(Wsd):
        def __init__(self, diff):
            super().__init__(lambda seed, n: 0.0, (201,), (4800,))
            from lab import plan
            self.results[plan.Run('cos', 1e-3, 0.1, 201).name] = 1.0 / (1 + diff / 100)
            self.s = type('Study', (), dict(arm=lambda self, a: dict(
                weight_decay=0.1, settings=dict(max_iters=9600))))()
    text = tables.wsd_check_table(Check(0.4), [('arm', 'cos', 4800)], 201, 1e-3, 0.5)
    assert "| arm | 4800 | 1.0000 | 0.9960 | +0.40% |" in text
    assert "WSD stands in for the cosine runs" in text
    assert "read on its own terms" in tables.wsd_check_table(Check(0.6), [('arm', 'cos', 4800)],
                                                              201, 1e-3, 0.5)


def test_the_cooldown_table_separates_the_stable_runs_gap_from_the_branches():
    """The stable runs' val loss at each step: 2.0 for the arm, 1.0 for the reference, a gap of
    +100%; the branches end at 1 + gap/100 (arm) and 1.0: the arm's cooldown gains -50%."""
    stable = 32 * STEPS_1X
    steps = ALL
    ctx = Wsd(lambda seed, n: 0.0, (1, 2), steps,
              stable_val={(a, seed, stable): 2.0 if a == 'arm' else 1.0 for a in ('arm', 'ref')
                          for seed in (1, 2)})
    text = tables.wsd_cooldown_table(ctx, ('arm', 'ref'), (1, 2), (2,), STEPS_1X, stable)
    assert "| 2× | 2400 | +100.00% [+100.00%, +100.00%] | +0.00% [+0.00%, +0.00%] | " \
           "-50.00% [-50.00%, -50.00%] | +0.00% [+0.00%, +0.00%] | 2 |" in text
