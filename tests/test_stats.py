"""lab/stats.py: the paired-seed statistics and the decision rule, against independent
computations."""
import itertools
import math
import random

import numpy as np
import pytest

from lab import stats


def t_pdf(x, df):
    return (math.exp(math.lgamma((df + 1) / 2) - math.lgamma(df / 2)) / math.sqrt(df * math.pi)
            * (1 + x * x / df) ** (-(df + 1) / 2))


def t_cdf_by_quadrature(t, df, n=4000):
    """An independent P(T <= t): Simpson's rule on the density from 0 to |t|."""
    h, x = abs(t) / n, abs(t)
    inner = sum((4 if i % 2 else 2) * t_pdf(i * h, df) for i in range(1, n))
    area = (t_pdf(0, df) + t_pdf(x, df) + inner) * h / 3
    return 0.5 + math.copysign(area, t)


def test_sign_flip_p_counts_the_patterns():
    # only all-plus and all-minus reach |sum| 21
    assert stats.sign_flip_p([1, 2, 3, 4, 5, 6]) == 2 / 64
    assert stats.sign_flip_p([3, 1, 1]) == 2 / 8  # sums 5, 3, 3, 1, -1, -3, -3, -5
    # observed |sum| 3: every pattern but (+1, +1) flipped pairs
    assert stats.sign_flip_p([3, -1, 1]) == 6 / 8
    assert stats.sign_flip_p([1, -1, 1, -1]) == 1.0


def test_sign_flip_p_equals_counting_every_pattern_one_by_one():
    """The meet-in-the-middle count against the 2^n patterns enumerated, ties included."""
    rng = random.Random(0)

    def by_enumeration(gaps):
        observed = abs(sum(gaps))
        patterns = itertools.product((1, -1), repeat=len(gaps))
        hits = sum(abs(sum(g * s for g, s in zip(gaps, signs))) >= observed - 1e-12
                   for signs in patterns)
        return hits / 2 ** len(gaps)
    for n in range(1, 13):
        for gaps in ([round(rng.gauss(0.5, 1), 1) for _ in range(n)],  # ties are common
                     [rng.gauss(0.5, 1) for _ in range(n)], [0.0] * n):
            assert stats.sign_flip_p(gaps) == by_enumeration(gaps), gaps


def test_spearmans_exact_p_counts_every_pairing_ties_included():
    """Against the n! pairings enumerated, each one's rho the Pearson correlation of mid-ranks
    (scipy's spearmanr on the observed pairing and a few others); and by hand: four points in
    order reach |rho| = 1 only in their order and its reverse, 2 of 24."""
    from scipy.stats import rankdata, spearmanr
    rng = random.Random(0)
    assert stats.spearman_p([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(2 / 24)
    for n in range(4, 8):
        for xs in ([rng.choice((0, 100, 200)) for _ in range(n)],  # ties, as onset steps have
                   [rng.gauss(0, 1) for _ in range(n)]):
            ys = [round(rng.gauss(0, 1), 1) for _ in range(n)]
            if len(set(xs)) < 2 or len(set(ys)) < 2:
                continue
            observed = abs(spearmanr(xs, ys)[0])
            rx, ry = rankdata(xs), rankdata(ys)[list(itertools.permutations(range(n)))]
            rx, ry = rx - rx.mean(), ry - ry.mean(axis=1, keepdims=True)
            rhos = np.abs(ry @ rx / np.sqrt((ry ** 2).sum(axis=1) * (rx ** 2).sum()))
            for k in (0, 1, len(rhos) - 1):  # numpy's rho is scipy's
                pairing = list(itertools.permutations(range(n)))[k]
                assert rhos[k] == pytest.approx(abs(spearmanr(xs, [ys[i] for i in pairing])[0]))
            hits = int((rhos >= observed - 1e-9).sum())
            assert stats.spearman_p(xs, ys) == pytest.approx(hits / len(rhos)), (xs, ys)


def test_spearmans_p_above_twelve_points_draws_pairings_from_a_fixed_seed():
    """Where counting every pairing would not fit (2^n arrays), a fixed seed's random pairings:
    close to the exact p where both can be had, the same p every time, and at 20 points in order
    (|rho| 1: 2 of 20! pairings) no draw reaches it, so p is 1 / (draws + 1)."""
    rng = random.Random(1)
    xs = [rng.choice((0, 100, 200, 300)) for _ in range(9)]
    ys = [round(rng.gauss(0, 1), 1) for _ in range(9)]
    exact = stats.spearman_p(xs, ys)
    drawn = stats.spearman_p(xs, ys, exact_up_to=8)
    assert 0.05 < exact < 0.95 and abs(drawn - exact) < 4 * (exact * (1 - exact) / 1e6) ** 0.5
    xs, ys = list(range(20)), [rng.gauss(0, 1) for _ in range(20)]
    assert stats.spearman_p(xs, ys) == stats.spearman_p(xs, ys)  # the same draws
    assert stats.spearman_p(xs, xs) == stats.spearman_p(xs, xs[::-1]) == 1 / (stats.DRAWS + 1)


def test_resolution_is_the_gap_a_t_test_detects_with_80_percent_power():
    # simulated paired t tests at the returned gap: 80% of them reject (+-0.6% at 3 sigma)
    from scipy import stats as scipy_stats
    rng = np.random.default_rng(0)
    for sd, n, alpha in ((2.52, 8, 0.025), (0.43, 10, 0.05 / 8), (1.0, 4, 0.05)):
        gap = stats.resolution(sd / n ** 0.5, n - 1, alpha)
        x = gap + sd * rng.standard_normal((200_000, n))
        t = x.mean(1) / (x.std(1, ddof=1) / n ** 0.5)
        crit = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
        assert abs(np.mean(np.abs(t) > crit) - 0.8) < 0.006
        # the usual (t_crit + t_0.8) * se understates it
        assert gap > (crit + scipy_stats.t.ppf(0.8, n - 1)) * sd / n ** 0.5
    assert round(stats.resolution(2.52 / 8 ** 0.5, 7, 0.025), 2) == 3.37  # v4's 4x pair
    # two seeds at 0.05/5 (one df): the power needs a gap of about 81 standard errors
    gap = stats.resolution(1.0, 1, 0.01)
    crit = scipy_stats.t.ppf(0.995, 1)
    assert gap > 75
    assert scipy_stats.nct.sf(crit, 1, gap) + scipy_stats.nct.sf(crit, 1, -gap) == \
        pytest.approx(0.8)
    assert math.isnan(stats.resolution(0.1, 0, 0.05))


def test_holm_adjusts_step_down_and_stays_monotone():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert stats.holm([0.001, 0.5]) == pytest.approx([0.002, 0.5])
    # the second step cannot undercut the first
    assert stats.holm([0.02, 0.021, 0.5]) == pytest.approx([0.06, 0.06, 0.5])
    assert stats.holm([0.4, 0.9]) == pytest.approx([0.8, 0.9])


def test_two_one_sided_tests_against_quadrature():
    gaps = [0.1, -0.1, 0.05, 0.0, 0.02, -0.03]
    mean, sd = np.mean(gaps), np.std(gaps, ddof=1)
    se = sd / math.sqrt(6)
    upper = t_cdf_by_quadrature((mean - 0.3) / se, 5)  # H0: gap >= +0.3
    lower = 1 - t_cdf_by_quadrature((mean + 0.3) / se, 5)  # H0: gap <= -0.3
    assert stats.tost_p(gaps, 0.3) == pytest.approx(max(upper, lower), rel=1e-6)
    # centred on the margin: not within it
    assert stats.tost_p([0.25, 0.35, 0.3, 0.28, 0.32, 0.3], 0.3) > 0.4


def test_the_t_test_and_interval_against_quadrature():
    gaps = [0.3, 0.5, 0.1, 0.4, 0.2]
    mean, se = np.mean(gaps), np.std(gaps, ddof=1) / math.sqrt(5)
    p = 2 * (1 - t_cdf_by_quadrature(mean / se, 4))
    assert stats.tests(gaps, 0.3)['p_t'] == pytest.approx(p, rel=1e-6)
    m, lo, hi = stats.interval95(gaps)
    assert t_cdf_by_quadrature((hi - m) / se, 4) == pytest.approx(0.975, abs=1e-7)
    assert m - lo == pytest.approx(hi - m)


def test_decision_rule_with_holm_across_comparisons():
    better = [-0.3, -0.4, -0.35, -0.2, -0.5, -0.3]
    within = [0.1, -0.1, 0.05, 0.0, 0.02, -0.03]
    wide = [1.0, -1.0, 2.0, -2.0, 0.5, 0.1]
    r = stats.compare([better, within, wide])
    assert [x['verdict'] for x in r] == ['better', 'matches', 'could not tell']
    assert [x['level'] for x in r] == pytest.approx([1 - 0.05 / 3, 1 - 0.05 / 2, 0.95])
    se = np.std(better, ddof=1) / math.sqrt(6)
    assert t_cdf_by_quadrature(r[0]['half'] / se, 5) == pytest.approx(1 - 0.05 / 6, abs=1e-7)
    assert r[0]['p_perm'] == 2 / 64 and not r[0]['flag']
    assert stats.compare([[-x for x in better]])[0]['verdict'] == 'worse'
    # significant alone (p ~ 0.03), not after Holm across three with two that are far from it
    marginal = [-0.1, -0.25, -0.05, -0.3, -0.15, 0.0]
    alone = stats.compare([marginal])[0]
    assert alone['p_t'] == pytest.approx(0.0302, abs=1e-4) and alone['verdict'] == 'better'
    # the sign-flip test does not agree at 0.05: flagged
    assert alone['p_perm'] == 4 / 64 and alone['flag']
    assert stats.compare([marginal, wide, wide])[0]['verdict'] != 'better'


@pytest.mark.parametrize('gaps,word', [([1.0, 1.1, 0.9], 'worse'), ([-0.5, -0.6, -0.4], 'better'),
                                       ([0.1, -0.1, 0.05], 'matches'),
                                       ([2.0, -1.5, 0.3], 'could not tell'),
                                       ([0.2], 'could not tell'), ([0.1, 0.1, 0.1], 'worse')])
def test_decision_rule(gaps, word):
    assert stats.compare([gaps])[0]['verdict'] == word


def test_not_worse_is_a_one_sided_test_below_the_margin_with_the_margin_it_supports():
    # mean +0.05%, sd 0.13%: no difference resolved; within +-0.3% and below +0.5%, not +-0.1%
    gaps = [0.05, 0.25, -0.15, 0.15, -0.05, -0.1, 0.2, 0.05, 0.1, 0.0]
    r = stats.compare([gaps], margin=0.3, worse_margin=0.5)[0]
    mean, se = np.mean(gaps), np.std(gaps, ddof=1) / math.sqrt(10)
    assert r['p_ni'] == pytest.approx(t_cdf_by_quadrature((mean - 0.5) / se, 9), rel=1e-6)
    assert r['verdict'] == 'matches'  # +-0.3% holds here too: matches outranks not worse
    assert stats.compare([gaps], margin=0.1, worse_margin=0.5)[0]['verdict'] == 'not worse'
    # the smallest margins: at the bound, the test sits exactly at its level
    assert t_cdf_by_quadrature((r['ni_bound'] - mean) / se, 9) == pytest.approx(0.95, abs=1e-7)
    assert r['tost_bound'] == pytest.approx(r['ni_bound'])  # mean > 0: the same one-sided end
    mirrored = stats.compare([[-g for g in gaps]], 0.3, worse_margin=0.5)[0]
    assert mirrored['ni_bound'] == pytest.approx(r['ni_bound'] - 2 * mean)  # one-sided: signed
    assert mirrored['tost_bound'] == pytest.approx(r['tost_bound'])  # two-sided: by size


def test_a_family_not_all_in_yet_counts_the_missing_as_p_1():
    better = [-0.3, -0.4, -0.35, -0.2, -0.5, -0.3]
    wide = [1.0, -1.0, 2.0, -2.0, 0.5, 0.1]
    part = stats.compare([better, wide], worse_margin=0.5, family=5)
    whole = stats.compare([better, wide], worse_margin=0.5)
    p = [x['p_t'] for x in whole]
    assert [x['p_t_holm'] for x in part] == pytest.approx(stats.holm(p + [1, 1, 1])[:2])
    assert all(a['p_t_holm'] >= b['p_t_holm'] for a, b in zip(part, whole))  # an upper bound
    assert part[0]['level'] == pytest.approx(1 - 0.05 / 5)
    assert part[0]['mde'] > whole[0]['mde']  # at Holm's strictest level for five, 0.05/5


def test_welch_reads_two_unpaired_groups_with_welch_satterthwaite_degrees_of_freedom():
    from scipy import stats as scipy_stats
    arm, ref = [1.20, 1.25, 1.22, 1.30, 1.18], [1.10, 1.12, 1.09, 1.15, 1.11, 1.13]
    r = stats.welch_tests(arm, ref, 0.5)
    welch = scipy_stats.ttest_ind(arm, ref, equal_var=False)
    assert r['p_t'] == pytest.approx(welch.pvalue, rel=1e-9)
    assert r['mean'] == pytest.approx(100 * (np.mean(arm) - np.mean(ref)) / np.mean(ref))
    assert r['mean'] / r['se'] == pytest.approx(welch.statistic, rel=1e-9)
    found = stats.compare([r, [0.1, -0.1, 0.05]], 0.5, worse_margin=0.5)
    assert found[0]['verdict'] == 'worse' and found[0]['p_perm'] is None and not found[0]['flag']
    assert found[0]['mde'] == pytest.approx(stats.resolution(r['se'], r['df'], 0.05 / 2))


def test_one_level_puts_every_interval_and_margin_at_bonferronis_level():
    """v6's correction: Holm tests each comparison at its own step's level, so intervals quoted
    together would mix levels; one_level gives them all at alpha / family, the verdicts Holm's."""
    gaps = [[0.1, 0.5, -0.2, 0.4, 0.3], [1.0, 1.4, 0.8, 1.2, 1.6], [0.0, 0.2, -0.1, 0.1, 0.05]]
    holm = stats.compare(gaps, worse_margin=0.5, family=4)
    one = stats.compare(gaps, worse_margin=0.5, family=4, one_level=True)
    assert sorted(r['level'] for r in holm) == pytest.approx([1 - 0.05 / 2, 1 - 0.05 / 3,
                                                              1 - 0.05 / 4])
    assert all(r['level'] == pytest.approx(1 - 0.05 / 4) for r in one)
    assert [r['verdict'] for r in one] == [r['verdict'] for r in holm]
    t = stats.t_dist()
    for r in one:
        assert r['ni_bound'] == pytest.approx(r['mean'] + t.ppf(1 - 0.05 / 4, 4) * r['se'])
        assert r['half'] == pytest.approx(t.ppf(1 - 0.05 / 8, 4) * r['se'])
    # Fisher: r = 0 over 12 points is z = 0 +- 1.96/sqrt(9), back through tanh
    assert stats.fisher_interval(0.0, 12) == pytest.approx((-0.5739, 0.5739), abs=1e-4)
