"""The statistics behind a claim's verdict (``registry`` holds the plan: seeds, margins and
their reasons, the learning-rate grid, and the two verdict rules with their dates: the
exploratory ``VERDICT_RULE``, written after most of the runs it judges, and ``RULE_V3``, written
before the confirmatory seeds; the functions of rule v3 are at the end of this module).

Every method of a claim runs on the same seeds, and a seed fixes partition, training subset,
allocation draws, sampling and initial adapters for all of them, so a claim's evidence is one
paired difference per seed: the sum of ``coefficient x primary metric`` over the claim's terms.

Primary metric (``primary``): the mean of a run's last ``LAST_EVALUATIONS`` evaluations, so a
lucky or unlucky last round does not decide; the final round and a round chosen on the
validation split are shown beside it, never the best round on the test set.

Tests (``ALPHA`` = 0.05 for each, then Holm over a tier's claims; each on the seeds' spread
plus the test set's error, ``combined_interval``):

  greater   (A > B)              two-sided paired t-test of 0 with its 95% interval:
                                 reproduced when significant and above 0, refuted when below
  within    (A - B > -margin)    non-inferiority, one-sided at ALPHA, 90% interval (TOST's
                                 convention): reproduced when the interval lies above -margin,
                                 refuted when it lies wholly below -margin
  similar   (|A - B| < margin)   equivalence by two one-sided tests (TOST), 90% interval:
                                 reproduced inside (-margin, margin), refuted wholly outside

Each claim's p is the p of the test that would decide it (for 'within' / 'similar': the
one-sided test on the side the mean lies); ``holm`` adjusts the p-values of a tier's claims
(statsmodels; step-down: the i-th smallest times k - i + 1, made monotone, capped at 1) and a
verdict needs the adjusted p below ALPHA. Otherwise: inconclusive, with the smallest effect
(for 'similar' / 'within': the smallest margin) the seeds can establish with 80% power, from
the exact noncentral t (statsmodels' ``TTestPower``) at the observed spread and the claim's
fixed seed count.

Effect size: whether the paper's difference lies inside our interval ("consistent"), above it
("ours smaller") or below it ("ours larger"); and the difference over the setting's AllLarge -
AllSmall gap beside the paper's same ratio.

The verdict rule (``VERDICT_RULE`` in the registry, with its date): the setting must
discriminate (AllLarge - AllSmall, its 95% interval's lower end above the claim's detectable
difference: ``discriminates``); the test reads ``combined_interval`` (the seeds' spread and the
test set's error); a decided claim must be stable (``stable``: the difference keeps its side at
each of the last evaluations, and the primary interval moved by the difference's own trend over
the last window, ``difference_trend``, still does), else unstable. Each arm's gain over the last
window (``arm_convergence``) is a description, not a gate. Two findings, each under its own
name: an arm that collapsed on its validation curves (``collapsed_on_validation``), and an arm
no better than the smallest model on every client (``below_small``).

Test-set sampling error: a seed redraws the training data, not the test set, so the seeds'
spread does not contain the test set's own sampling error. ``bootstrap_se`` resamples test
examples (within each domain, or a digit's renderings together where the domains render the same
digits) from the per-example correctness a run records; for runs that do
not record it, ``binomial_se`` gives the normal standard error of an accuracy p on n examples,
sqrt(p (1 - p) / n), summed over the terms as if they were independent (an upper bound: two
methods on the same examples err together).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import optimize, stats

ALPHA = 0.05  # each claim's test; Holm keeps the tier's family-wise error at ALPHA
POWER = 0.80
LAST_EVALUATIONS = 3  # the primary metric's window
FLAT_POINTS = 1.0  # described as flat: the gain over the last 20% of rounds is below this
FLAT_FRACTION = 0.2
COLLAPSE_POINTS = 5.0  # an arm more than this under its own best evaluation collapsed

REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted", "inconclusive"
RUNNING, NOT_RUN = "running", "no records yet"
NOT_DISCRIMINATIVE = "setting not discriminative"
UNSTABLE = "unstable"  # decided at the primary metric, but the difference still moves
COLLAPSED = "collapsed on validation"
NO_BETTER_THAN_SMALL = "no better than the smallest model on every client"
DIRECTIONS = ("greater", "within", "similar")
CONSISTENT, OURS_SMALLER, OURS_LARGER = "consistent", "ours smaller", "ours larger"


@dataclass(frozen=True)
class Interval:
    """Mean of n per-seed values with its two-sided Student-t interval (NaN bounds for n < 2);
    ``test_se``: the test set's standard error the interval also holds (0: the seeds' alone)."""

    mean: float
    low: float
    high: float
    n: int
    std: float
    confidence: float = 0.95
    test_se: float = 0.0

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def t_interval(values, confidence: float = 0.95) -> Interval:
    """mean ± t((1 + confidence) / 2, n - 1) x s / sqrt(n) over the given per-seed values."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) == 0 or not np.isfinite(x).all():
        raise ValueError(f"expected a non-empty list of finite per-seed numbers, got {values!r}")
    n, mean = len(x), float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, math.nan, confidence)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, std, confidence)


def combined_interval(values, test_se: float, confidence: float = 0.95) -> Interval:
    """The seed-mean with an interval that holds both errors of a claim's difference: the seeds'
    spread (s^2 / n: training randomness) and the test set's sampling error (``test_se``, a
    standard error in points; a seed redraws the training data, never the test set, so this
    part does not shrink with more seeds). Variance sum a + b, a = s^2 / n, b = test_se^2, and
    Student t with the seeds' n - 1 degrees of freedom: Welch-Satterthwaite would give more (the
    bootstrap's part counts as known), and so an interval that adding an error could make
    narrower than the seeds' alone; n - 1 never does. test_se = 0 gives ``t_interval``."""
    seeds = t_interval(values, confidence)
    if seeds.n < 2 or not math.isfinite(test_se) or test_se <= 0:
        return seeds
    a, b = seeds.std ** 2 / seeds.n, test_se ** 2
    half = float(stats.t.ppf((1 + confidence) / 2, seeds.n - 1)) * math.sqrt(a + b)
    return Interval(seeds.mean, seeds.mean - half, seeds.mean + half, seeds.n, seeds.std,
                    confidence, test_se)


def primary(values) -> float:
    """The primary metric of one run from its evaluations in round order: the mean of the last
    ``LAST_EVALUATIONS`` (all of them when there are fewer)."""
    x = np.asarray(values, dtype=float)
    if len(x) == 0:
        raise ValueError("a run without evaluations has no primary metric")
    return float(x[-LAST_EVALUATIONS:].mean())


# ---------------------------------------------------------------- tests and power

def interval_for(direction: str) -> float:
    """The confidence of the interval a direction's test reads: 95% two-sided for 'greater',
    90% (1 - 2 ALPHA) for the one-sided tests of 'within' and 'similar'."""
    return 1 - ALPHA if direction == "greater" else 1 - 2 * ALPHA


def p_value(differences, direction: str, margin: float = 0.0, test_se: float = 0.0) -> float:
    """The p of the test that decides the claim from its per-seed paired differences (see the
    module text): 'greater' two-sided of 0; 'within' and 'similar' one-sided, on the side of
    the boundary the mean lies (for 'similar' inside the margins: TOST's max of the two).
    ``test_se`` > 0: the standard error and degrees of freedom of ``combined_interval`` (the
    library t-tests take samples only, not a second variance component: written here)."""
    x = np.asarray(differences, dtype=float)
    n = len(x)
    if n < 2:
        return math.nan
    mean, a = float(x.mean()), float(x.var(ddof=1)) / n
    b = test_se ** 2 if math.isfinite(test_se) and test_se > 0 else 0.0
    se = math.sqrt(a + b)
    if se == 0:  # identical differences: the test is decided by the mean alone
        se = 1e-300
    df = n - 1  # as ``combined_interval``
    above = lambda bound: float(stats.t.sf((mean - bound) / se, df))  # H1: mu > bound # noqa: E731
    below = lambda bound: float(stats.t.cdf((mean - bound) / se, df))  # H1: mu < bound # noqa: E731
    if direction == "greater":
        return min(1.0, 2 * min(above(0.0), below(0.0)))
    if direction == "within":
        return above(-margin) if mean > -margin else below(-margin)
    if direction == "similar":
        if -margin < mean < margin:
            return max(above(-margin), below(margin))  # TOST
        return above(margin) if mean >= margin else below(-margin)
    raise ValueError(f"direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")


def holm(p_values: dict) -> dict:
    """Holm's step-down adjustment of a family of p-values (name -> p; NaN stays NaN, outside
    the family): sorted ascending, p_(i) x (k - i + 1), a running maximum, capped at 1
    (statsmodels' ``multipletests``)."""
    from statsmodels.stats.multitest import multipletests

    family = [name for name, p in p_values.items() if math.isfinite(p)]
    out = {name: math.nan for name in p_values}
    if family:
        adjusted = multipletests([p_values[n] for n in family], ALPHA, method="holm")[1]
        out |= {name: float(p) for name, p in zip(family, adjusted)}
    return out


def power(effect: float, std: float, n: int, sides: int = 2) -> float:
    """Exact power of a paired t-test over n seeds at level ALPHA when the true mean difference
    is ``effect`` beyond the tested boundary and the differences' std is ``std``: the
    noncentral t with n - 1 degrees of freedom and noncentrality effect x sqrt(n) / std."""
    from statsmodels.stats.power import TTestPower

    value = float(TTestPower().power(effect / std, n, ALPHA,
                                     alternative="two-sided" if sides == 2 else "larger"))
    # scipy's noncentral t (which statsmodels calls) returns NaN for a few far tails: there the
    # effect lies far beyond the critical value, and the test always finds it
    return (1.0 if effect > 0 or sides == 2 else 0.0) if math.isnan(value) else value


def detectable(std: float, n: int, direction: str = "greater", power_: float = POWER) -> float:
    """The smallest true effect this many seeds establish with ``power_`` at the observed std:
    'greater': the difference the two-sided test finds; 'within': the margin under which a
    true difference of 0 is shown non-inferior (one-sided); 'similar': the margin within which
    a true difference of 0 is shown equivalent by TOST, each one-sided test at power
    1 - (1 - power_) / 2 (both fail together rarely: the usual bound, TOST power >= power_)."""
    if n < 2 or not math.isfinite(std):
        return math.nan
    if std == 0:
        return 0.0
    sides, target = {"greater": (2, power_), "within": (1, power_),
                     "similar": (1, 1 - (1 - power_) / 2)}[direction]
    high = std
    while power(high, std, n, sides) < target:
        high *= 2
    return float(optimize.brentq(lambda e: power(e, std, n, sides) - target, 0.0, high,
                                 xtol=1e-12 * max(1.0, high)))


@dataclass(frozen=True)
class Verdict:
    verdict: str
    difference: Interval | None = None
    p: float = math.nan
    p_holm: float = math.nan
    detectable: float = math.nan  # smallest effect / margin the seeds establish (80% power)
    reason: str = ""
    flags: tuple = ()


def decide(differences, direction: str, margin: float, p_holm: float) -> str:
    """reproduced / refuted / inconclusive from the differences and the claim's Holm-adjusted
    p (the interval and the p agree: the interval is the test's)."""
    if not p_holm < ALPHA:
        return INCONCLUSIVE
    mean = float(np.mean(differences))
    if direction == "greater":
        return REPRODUCED if mean > 0 else REFUTED
    if direction == "within":
        return REPRODUCED if mean > -margin else REFUTED
    return REPRODUCED if -margin < mean < margin else REFUTED


def check_margin(direction: str, margin: float) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")
    if margin < 0 or (direction != "greater" and margin == 0):
        raise ValueError(f"margin {margin}: expected > 0 for 'within'/'similar', >= 0 otherwise")


def interval_side(ci: Interval, direction: str, margin: float = 0.0) -> str:
    """Which side of the claim's boundary an interval lies on, read without adjustment: the
    claim's side ("+"), the other ("-"), or across the boundary ("?")."""
    if direction == "greater":
        return "+" if ci.low > 0 else "-" if ci.high < 0 else "?"
    if direction == "within":
        return "+" if ci.low > -margin else "-" if ci.high < -margin else "?"
    if -margin < ci.low and ci.high < margin:
        return "+"
    return "-" if ci.high < -margin or ci.low > margin else "?"


def effect_position(paper: float, ours: Interval) -> str:
    """Where the paper's difference lies against our interval."""
    if not (math.isfinite(ours.low) and math.isfinite(ours.high)):
        return "-"
    return OURS_SMALLER if paper > ours.high else OURS_LARGER if paper < ours.low else CONSISTENT


# ---------------------------------------------------------------- the gate

def mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Mean over seeds of (round, value) curves evaluated at the same rounds."""
    rounds = [r for r, _ in curves[0]]
    if any([r for r, _ in c] != rounds for c in curves):
        raise ValueError("curves of one method evaluated at different rounds")
    values = np.array([[v for _, v in c] for c in curves], dtype=float)
    return list(zip(rounds, values.mean(0).tolist()))


def trend_windows(rounds: list[int], fraction: float = FLAT_FRACTION
                  ) -> tuple[list[int], list[int]]:
    """The evaluated rounds of the trend's two windows, (early, late): the last ``fraction`` of
    rounds and the ``fraction`` before it, each window the evaluations whose round falls in
    it. The one definition of the windows: the trend's value, the test-set error of it and
    which evaluations a record keeps example by example all read it."""
    if not rounds:
        raise ValueError("no evaluated rounds: no trend windows")
    last = rounds[-1]
    edge, before = last - fraction * last, last - 2 * fraction * last
    late = [r for r in rounds if r > edge]
    early = [r for r in rounds if before < r <= edge]
    if not late or not early:
        raise ValueError(f"curve evaluated at rounds {rounds}: the windows ({before:g}, "
                         f"{edge:g}] and ({edge:g}, {last}] need an evaluation each")
    return early, late


def window_gain(curve: list[tuple[int, float]], fraction: float = FLAT_FRACTION) -> float:
    """One run's (round, value) curve: the mean over its last ``fraction`` of rounds minus the
    mean over the ``fraction`` before (``trend_windows``)."""
    early, late = trend_windows([r for r, _ in curve], fraction)
    values = dict(curve)
    return float(np.mean([values[r] for r in late]) - np.mean([values[r] for r in early]))


def arm_convergence(curves: list[list[tuple[int, float]]]) -> tuple[bool | None, Interval]:
    """Flat (True/False; None with one seed: no interval yet) and the per-seed window gains'
    95% interval: flat when its upper end is below ``FLAT_POINTS`` (a description of the arm)."""
    gains = t_interval([window_gain(c) for c in curves])
    if gains.n < 2:
        return None, gains
    return gains.high < FLAT_POINTS, gains


def difference_trend(curves: list[list[tuple[int, float]]]) -> Interval:
    """The paired difference's own trend: per seed, ``window_gain`` of its difference curve (the
    mean over the last ``FLAT_FRACTION`` of rounds minus the mean over the fraction before),
    with its 95% interval over seeds: how far the difference moved in the last window."""
    return t_interval([window_gain(c) for c in curves])


def stable(verdict: str, direction: str, margin: float, primary_ci: Interval,
           at_rounds: list[Interval], trend: Interval) -> tuple[bool, str]:
    """Whether a reproduced / refuted verdict holds as the runs go on (the registry's
    ``VERDICT_RULE``): the difference's interval lies on the verdict's side at each of the last
    evaluations (``at_rounds``), and the primary interval, each end moved towards the null by
    the 95% bound of the difference's trend over the last window that points that way (an end
    only moves the way the trend could carry it), still lies there. (True, '') or (False, why)."""
    side = {REPRODUCED: "+", REFUTED: "-"}[verdict]
    off = [i for i, ci in enumerate(at_rounds) if interval_side(ci, direction, margin) != side]
    if off:
        return False, (f"the difference's interval leaves the verdict's side at {len(off)} of "
                       f"the last {len(at_rounds)} evaluations")
    moved = Interval(primary_ci.mean, primary_ci.low - max(0.0, -trend.low),
                     primary_ci.high + max(0.0, trend.high), primary_ci.n, primary_ci.std,
                     primary_ci.confidence, primary_ci.test_se)
    if interval_side(moved, direction, margin) != side:
        return False, (f"the difference moved {trend.mean:+.2f} points (95% CI {trend.low:+.2f} "
                       f"to {trend.high:+.2f}) over the last window; moved by it, the interval "
                       f"({moved.low:.2f}, {moved.high:.2f}) leaves the verdict's side")
    return True, ""


def below_small(arm_minus_small: Interval) -> bool:
    """A finding, not a gate: the arm is no better than the smallest model on every client
    (AllSmall) when its paired primary-metric difference to AllSmall is at most 0 on average."""
    return arm_minus_small.mean <= 0


def collapsed_on_validation(finals: list[float], bests: list[float]) -> float | None:
    """An arm's validation curves (the tuning runs at its chosen rate): the mean of final minus
    best evaluation when it is more than ``COLLAPSE_POINTS`` below 0 (it collapsed), else None.
    Read on validation, never on the test set."""
    drop = float(np.mean(np.subtract(finals, bests)))
    return drop if drop < -COLLAPSE_POINTS else None


def discriminates(large_minus_small: Interval, needed: float) -> bool | None:
    """AllLarge - AllSmall (paired, 95% interval) against the claim's detectable difference:
    True when its lower end exceeds it (None while either is unknown)."""
    if large_minus_small.n < 2 or not math.isfinite(needed):
        return None
    return large_minus_small.low > needed


# ---------------------------------------------------------------- the test set's error

def binomial_se(accuracies: list[float], coefficients: list[float], n: int) -> float:
    """Standard error (points) of sum c x accuracy from sampling n test examples, the terms taken
    as independent (an upper bound for methods scored on the same examples):
    sqrt(sum c^2 p (1 - p) / n), p in [0, 1] per term, x 100."""
    var = sum(c * c * p * (1 - p) / n for c, p in zip(coefficients, accuracies))
    return 100 * math.sqrt(var)


def headline(correct: dict, weights: dict | None = None):
    """A run's headline accuracy from per-example correctness ``{group: {stratum: 0/1 array}}``:
    the mean over groups of the mean over strata (domains) of each stratum's accuracy, as the
    evaluation computes it. ``weights``: per stratum, a (replicates x examples) matrix of how
    often a bootstrap replicate takes each example; then one headline per replicate."""
    per_group = []
    for strata in correct.values():
        per = [(weights[s] @ np.asarray(a, float)) / len(a) if weights is not None
               else float(np.mean(a)) for s, a in strata.items()]
        per_group.append(np.mean(per, axis=0))
    return np.mean(per_group, axis=0)


def bootstrap_se(runs: list[list[tuple[float, list[dict]]]], replicates: int = 1000,
                 seed: int = 0, clustered: bool = False) -> float:
    """Standard error (points) of a claim's seed-mean statistic from sampling the test set.

    ``runs``: per seed, the claim's terms as (coefficient, evaluations), each evaluation one
    ``{group: {stratum: 0/1 array}}`` of the primary metric's window. Every run of the claim
    scores the same test examples, so one replicate draws, per stratum, how often each example
    is taken (multinomial, n draws of n) and scores every evaluation of every run with it; the
    statistic is recomputed (mean over the window, sum over the terms, mean over the seeds) and
    its standard deviation over the replicates is the error.

    ``clustered``: the strata are renderings of the same examples in the same order (the
    ``mini`` tier's six domains render the same digits), so one draw of the example indices
    serves every stratum: a digit's renderings are resampled together, as the errors of a run
    on them are correlated (resampling each domain on its own understates the error)."""
    rng = np.random.default_rng(seed)
    sizes = [{s: len(a) for g in ev.values() for s, a in g.items()}
             for seed_terms in runs for _, evaluations in seed_terms for ev in evaluations]
    if not sizes or any(z != sizes[0] for z in sizes):
        raise ValueError("runs scored on different test sets: no common bootstrap")
    if clustered:
        if len(set(sizes[0].values())) != 1:
            raise ValueError(f"clustered bootstrap: strata of different sizes {sizes[0]} cannot "
                             "be renderings of the same examples")
        n = next(iter(sizes[0].values()))
        shared = rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(float)
        weights = {s: shared for s in sizes[0]}
    else:
        weights = {s: rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(float)
                   for s, n in sizes[0].items()}
    per_seed = [sum(c * np.mean([headline(ev, weights) for ev in evaluations], axis=0)
                    for c, evaluations in seed_terms) for seed_terms in runs]
    return 100 * float(np.std(np.mean(per_seed, axis=0), ddof=1))


# ---------------------------------------------------------------- rule v3 (registry ``RULE_V3``)

def paired_test_se(runs: list[list[tuple[float, list[dict]]]], clustered: bool = False) -> float:
    """Standard error (points) of a claim's seed-mean statistic from sampling the test set, in
    closed form (``runs`` as ``bootstrap_se``).

    The statistic is linear in the test examples: headline = mean over groups of mean over
    strata of mean over a stratum's n examples, then the mean over the window's evaluations,
    the sum over the terms with their coefficients and the mean over seeds. So it is
    sum over strata s of (1/n_s) sum_i u_si, where u_si collects every coefficient and weight
    that example i of stratum s carries (the per-example paired difference). Resampling each
    stratum's examples, the mean of u_s has variance var(u_s) / n_s; the strata are drawn
    independently, so the variances add: se^2 = sum_s var(u_s, ddof=1) / n_s. ``clustered``
    (a digit's renderings in every stratum, drawn together): one unit per digit,
    u_i = sum_s u_si, se^2 = var(u, ddof=1) / n. The bootstrap's ideal value (infinitely many
    replicates) is sqrt((n - 1) / n) of this, the plug-in variance; ddof = 1 is the unbiased
    one (at n = 359 they differ by 0.14%)."""
    units: dict = {}
    n_seeds = len(runs)
    for seed_terms in runs:
        for coefficient, evaluations in seed_terms:
            for ev in evaluations:
                for strata in ev.values():
                    weight = coefficient / (n_seeds * len(evaluations) * len(ev) * len(strata))
                    for s, a in strata.items():
                        key = "all" if clustered else s
                        a = np.asarray(a, float)
                        if key in units and len(units[key]) != len(a):
                            raise ValueError("runs scored on different test sets: no common "
                                             "per-example difference")
                        units[key] = units.get(key, np.zeros(len(a))) + weight * a
    if not units:
        raise ValueError("no per-example results: no closed-form test-set error")
    return 100 * math.sqrt(sum(float(u.var(ddof=1)) / len(u) for u in units.values()))


def bootstrap_mc_error(se: float, replicates: int) -> float:
    """The Monte Carlo standard error of a bootstrap standard error from ``replicates``
    replicates: se / sqrt(2 (B - 1)) (the sampling error of a standard deviation of B nearly
    normal values)."""
    return se / math.sqrt(2 * (replicates - 1))


def se_interval(mean: float, se: float, n: int, confidence: float = 0.95) -> Interval:
    """mean +- t((1 + confidence) / 2, n - 1) x se: an interval whose standard error already
    holds every error source (``combined_interval``'s, from its parts)."""
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * se
    return Interval(mean, mean - half, mean + half, n, math.nan, confidence)


def combined_se(values, test_se: float) -> float:
    """sqrt(s^2 / n + test_se^2): the seeds' spread and the test set's error together."""
    x = np.asarray(values, dtype=float)
    return math.sqrt(float(x.var(ddof=1)) / len(x) + (test_se if test_se > 0 else 0.0) ** 2)


def towards_null(mean: float, direction: str, margin: float = 0.0) -> int:
    """The sign of a movement of the difference towards the boundary its verdict is about:
    'greater' towards 0, 'within' towards -margin, 'similar' towards the nearer margin from
    inside (away from 0) and towards the inside from outside."""
    boundary = {"greater": 0.0, "within": -margin}.get(direction)
    if boundary is None:  # similar
        inside = -margin < mean < margin
        return (1 if mean >= 0 else -1) if inside else (-1 if mean >= margin else 1)
    return -1 if mean > boundary else 1


def drift_test(trends, test_se: float, sign: int) -> tuple[float, Interval]:
    """Rule v3's own test of 'unstable': per-seed trends of the difference (``window_gain`` of
    each seed's difference curve), with the test set's error of the trend; H1: the trend's mean
    moves the way ``sign`` (``towards_null``) points, one-sided t with n - 1 degrees of freedom.
    Returns (p, the trend's 95% interval with both errors)."""
    x = np.asarray(trends, dtype=float)
    n, mean = len(x), float(x.mean())
    se = combined_se(x, test_se) or 1e-300
    p = float(stats.t.sf(sign * mean / se, n - 1))
    return p, se_interval(mean, se, n)


def family_holm(members, p_values: dict) -> dict | None:
    """Rule v3's family rule: Holm over a family declared in advance, only when every member
    has its p (None while any is missing or NaN: the family is not reported, and no absent
    member counts as p = 1)."""
    ps = [p_values.get(m, math.nan) for m in members]
    if not members or not all(math.isfinite(p) for p in ps):
        return None
    return holm(dict(zip(members, ps)))


def change_word(change: Interval, p_holm: float, word_before: str, word_after: str,
                band: float) -> str:
    """Rule v3's robustness word from the paired change of a claim's difference between two
    conditions (same seeds; ``change``: its 95% interval with both errors, ``p_holm``: its
    two-sided test of 0, Holm over the check's family): a change that excludes 0 is never
    robust, and only such a change carries 'shifts' or 'sensitive'."""
    if p_holm < ALPHA:
        return "sensitive" if word_before != word_after else "shifts"
    if -band < change.low <= 0 <= change.high < band:
        return "robust"
    return "not separable"  # wide, or off 0 before Holm only: no word about the change


def gap_fraction(difference: float, gap: float | None) -> float:
    """A difference as a fraction of its setting's AllLarge - AllSmall (NaN without a gap)."""
    return difference / gap if gap else math.nan
