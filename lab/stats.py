"""
The statistics of paired seeds, and the decision rule of docs/experiments.md: a variant is
"better" or "worse" when its paired t test rejects after Holm's correction across a family of
comparisons, "matches" when two one-sided tests put the gap within +-margin %, else "could not
tell". scipy.stats gives the t distribution and tests; the exact sign-flip p and Holm's
step-down (which scipy does not have) are here.
"""
import bisect
import math
import statistics

MARGIN = 0.3  # % of loss: the smallest effect of interest; "matches" means within it
ALPHA = 0.05


def t_dist():
    try:
        from scipy import stats
    except ImportError:
        from kvgpt.errors import UserError
        raise UserError("the experiments' statistics need scipy: `pip install scipy` (it is in "
                        "requirements-dev.txt)") from None
    return stats.t


def paired_gaps(losses, ref):
    """{seed: 100 (L - L_ref) / L_ref} for the seeds both {seed: loss} maps have a loss on: the
    one pairing by seed that the report and the study tables use."""
    return {seed: 100 * (loss - ref[seed]) / ref[seed] for seed, loss in losses.items()
            if loss is not None and ref.get(seed) is not None}


def mean_sd(values):
    values = list(values)
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else float('nan'))


def interval95(values):
    """(mean, low, high): the mean of values and its 95% t interval."""
    m, sd = mean_sd(values)
    half = t_dist().ppf(0.975, len(values) - 1) * sd / len(values) ** 0.5
    return m, m - half, m + half


def fisher_interval(r, n, level=0.95):
    """The interval of a Pearson correlation r over n points, by Fisher's z."""
    from scipy import stats
    z, half = math.atanh(max(min(r, 1 - 1e-12), -1 + 1e-12)), stats.norm.ppf(
        0.5 + level / 2) / math.sqrt(n - 3)
    return math.tanh(z - half), math.tanh(z + half)


def slope(xs, ys):
    """The least-squares slope of ys against xs (scipy's linregress)."""
    from scipy.stats import linregress
    return float(linregress(xs, ys).slope)


def signed_sums(values):
    """The sum of values under each of the 2^n patterns of signs."""
    sums = [0.0]
    for v in values:
        sums = [s + v for s in sums] + [s - v for s in sums]
    return sums


def sign_flip_p(gaps):
    """The exact two-sided permutation p of a mean paired gap: the share of the 2^n patterns of
    signs whose |mean| is at least the observed one (the observed pattern among them). Counted
    meet-in-the-middle, each half's 2^(n/2) signed sums against the other's sorted ones, so 20
    seeds cost a millisecond rather than a million sums."""
    threshold = abs(sum(gaps)) - 1e-12
    if threshold <= 0:
        return 1.0
    half = len(gaps) // 2
    firsts, seconds = signed_sums(gaps[:half]), sorted(signed_sums(gaps[half:]))
    hits = sum(len(seconds) - bisect.bisect_left(seconds, threshold - a)  # a + b >= threshold
               + bisect.bisect_right(seconds, -threshold - a)  # a + b <= -threshold
               for a in firsts)
    return hits / 2 ** len(gaps)


EXACT_PAIRINGS = 12  # points up to which spearman_p counts every pairing (2^12 arrays, 90 MB)
DRAWS = 10 ** 6  # above, the random pairings it draws: a standard error of at most 0.0005


def spearman_p(xs, ys, exact_up_to=EXACT_PAIRINGS, draws=DRAWS):
    """The two-sided permutation p of Spearman's rho (mid-ranks for ties): the share of the
    pairings of ys with xs whose |rho| is at least the observed one. Up to exact_up_to points,
    exact: every one of the n! pairings, counted over subsets of ys (2^n arrays of rank-product
    sums, each pairing once), so 10 seeds cost milliseconds rather than 3.6 million correlations.
    Above, where 2^n arrays no longer fit (20 seeds: 90 GiB), `draws` random pairings from a
    fixed seed, (hits + 1) / (draws + 1): the same values give the same p. scipy's p is a t
    approximation, not exact at a few seeds."""
    import numpy as np
    from scipy.stats import rankdata
    n = len(xs)
    a, b = (np.rint(2 * rankdata(v)).astype(int) for v in (xs, ys))  # mid-ranks: halves
    centre = n * (n + 1) ** 2  # the sum of a_i b_pi(i) when rho is 0: n times (n + 1)^2
    observed = abs(int(a @ b) - centre)
    if n > exact_up_to:
        rng, hits = np.random.default_rng(0), 0
        for size in [10 ** 5] * (draws // 10 ** 5) + [draws % 10 ** 5]:
            pairings = rng.permuted(np.tile(b, (size, 1)), axis=1)
            hits += int((np.abs(pairings @ a - centre) >= observed).sum())
        return (hits + 1) / (draws + 1)
    top = int(np.sort(a) @ np.sort(b)) + 1
    counts = np.zeros((2 ** n, top), dtype=np.int64)  # [ys used][sum so far]: pairings
    counts[0, 0] = 1
    for used in range(2 ** n):  # xs paired in order: the next is x number popcount(used)
        if counts[used].any():
            k = bin(used).count('1')
            for j in range(n):
                if not used >> j & 1:
                    add = int(a[k] * b[j])
                    counts[used | 1 << j, add:] += counts[used, :top - add]
    sums = np.arange(top)
    return float(counts[-1][np.abs(sums - centre) >= observed].sum() / math.factorial(n))


def tost_p(gaps, margin):
    """Two one-sided t tests that the mean gap lies within +-margin: the larger of their p."""
    mean, sd = mean_sd(gaps)
    se, df = sd / len(gaps) ** 0.5, len(gaps) - 1
    t = t_dist()
    return max(t.sf((mean + margin) / se, df), t.cdf((mean - margin) / se, df))


def resolution(se, df, alpha, power=0.8):
    """The smallest true gap a two-sided t test at level alpha detects with this power, given the
    standard error se on df degrees of freedom: exact, from the noncentral t (the usual
    (t_crit + t_power) * se understates it by 1-2% at 10 seeds)."""
    if not df or not se > 0:
        return float('nan')
    from scipy import optimize, stats
    crit = stats.t.ppf(1 - alpha / 2, df)
    # nct.sf of the negated noncentrality is the lower tail (scipy's nct.cdf is NaN far out)
    reach = lambda gap: (stats.nct.sf(crit, df, gap / se) + stats.nct.sf(crit, df, -gap / se)
                         - power)
    top = (crit + stats.norm.ppf(power) + 10) * se
    while reach(top) < 0:  # two seeds at a Holm level: the power grows slowly, the gap is far out
        top *= 2
    return optimize.brentq(reach, 0.0, top)


def holm(pvalues):
    """Holm's step-down adjusted p values, in the input order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for step, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - step) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def tests(gaps, margin):
    """One comparison's n, mean, sd, se and its t, sign-flip and TOST p values."""
    mean, sd = mean_sd(gaps)
    df, se = len(gaps) - 1, sd / len(gaps) ** 0.5
    if df > 0 and se > 0:
        p_t, p_tost = 2 * t_dist().sf(abs(mean) / se, df), tost_p(gaps, margin)
    else:  # one seed is no evidence; identical gaps are certainty
        p_t, p_tost = (1.0, 1.0) if df == 0 else (float(mean == 0), float(abs(mean) >= margin))
    return dict(n=len(gaps), df=df, mean=mean, sd=sd, se=se, p_t=p_t,
                p_perm=sign_flip_p(gaps), p_tost=p_tost)


def welch_tests(arm, ref, margin):
    """Two unpaired groups of final losses (v5's 4x reading): the gap of their means in % of the
    reference's mean, its se (the reference mean taken as known) and Welch's t, with the
    Welch-Satterthwaite degrees of freedom; no sign-flip test (nothing pairs the runs)."""
    (ma, sa), (mr, sr) = mean_sd(arm), mean_sd(ref)
    va, vr = sa ** 2 / len(arm), sr ** 2 / len(ref)
    se, mean = 100 * (va + vr) ** 0.5 / mr, 100 * (ma - mr) / mr
    df = (va + vr) ** 2 / (va ** 2 / (len(arm) - 1) + vr ** 2 / (len(ref) - 1))
    t = t_dist()
    return dict(n=len(arm), n_ref=len(ref), df=df, mean=mean, sd=float('nan'), se=se,
                p_t=2 * t.sf(abs(mean) / se, df), p_perm=None, unpaired=True,
                p_tost=max(t.sf((mean + margin) / se, df), t.cdf((mean - margin) / se, df)))


def compare(gap_sets, margin=MARGIN, alpha=ALPHA, worse_margin=None, family=None,
            one_level=False):
    """The decision rule for each comparison's paired gaps (%), Holm-corrected across them: per
    comparison its tests, their Holm adjustments, the interval at its Holm level, the verdict, and
    the smallest gap its noise detects with 80% power at Holm's strictest level (mde). A set of
    gaps may instead be the tests of an unpaired comparison (welch_tests).

    worse_margin: also a one-sided test that the gap is below +worse_margin ("not worse", v5's
    rule), and the smallest margins the data support at the comparison's Holm level (ni_bound for
    "not worse", tost_bound for "matches"). family: the family's declared size when some of its
    comparisons are not in yet: they count as p = 1, so every adjusted p is an upper bound of
    its final value and a verdict reached stands. one_level: every interval and margin at
    Bonferroni's alpha / family instead of each comparison's Holm level, so that all of them
    hold together at alpha whatever Holm's step-down does (the verdicts stay Holm's)."""
    out = [dict(g) if isinstance(g, dict) else tests(g, margin) for g in gap_sets]
    t = t_dist()
    size = max(family or 0, len(out))
    keys = ('p_t', 'p_tost')
    if worse_margin is not None:
        for r in out:
            r['p_ni'] = t.cdf((r['mean'] - worse_margin) / r['se'], r['df']) \
                if r['df'] > 0 and r['se'] > 0 else float(r['mean'] >= worse_margin)
        keys += ('p_ni',)
    for key in keys:
        padded = [r[key] for r in out] + [1.0] * (size - len(out))
        for r, adjusted in zip(out, holm(padded)):
            r[key + '_holm'] = adjusted
        for step, i in enumerate(sorted(range(len(out)), key=lambda i: out[i][key])):
            out[i][key + '_alpha'] = alpha / (size - step)  # the level Holm tests it at
    by_p = sorted(range(len(out)), key=lambda i: out[i]['p_t'])
    for step, i in enumerate(by_p):  # the level at which Holm tests comparison i
        r = out[i]
        r['level'] = 1 - alpha / (size if one_level else size - step)
        df = r['df']
        r['half'] = t.ppf(1 - (1 - r['level']) / 2, df) * r['se'] if df else float('nan')
        r['verdict'] = ('worse' if r['mean'] > 0 else 'better') if r['p_t_holm'] < alpha else \
            'matches' if r['p_tost_holm'] < alpha else \
            'not worse' if r.get('p_ni_holm', 1.0) < alpha else 'could not tell'
        r['flag'] = r['p_perm'] is not None and (r['p_t'] < alpha) != (r['p_perm'] < alpha)
        r['mde'] = resolution(r['se'], df, alpha / size)
        if worse_margin is not None:  # each margin at the level Holm tests its test at
            level = lambda key: alpha / size if one_level else r[key + '_alpha']
            bound = lambda key: t.ppf(1 - level(key), df) * r['se'] if df else math.nan
            r['ni_bound'] = r['mean'] + bound('p_ni')
            r['tost_bound'] = abs(r['mean']) + bound('p_tost')
    return out
