"""The statistics behind a claim's verdict, fixed before any run (``registry`` holds the
plan: seeds, margins and their reasons, the learning-rate grid).

Every method of a claim runs on the same seeds, and a seed fixes partition, training subset,
allocation draws, sampling and initial adapters for all of them, so a claim's evidence is one
paired difference per seed: the sum of ``coefficient x primary metric`` over the claim's terms.

Primary metric (``primary``): the mean of a run's last ``LAST_EVALUATIONS`` evaluations, so a
lucky or unlucky last round does not decide; the final round and a round chosen on the
validation split are shown beside it, never the best round on the test set.

Tests (scipy; ``ALPHA`` = 0.05 for each, then Holm over a tier's claims):

  greater   (A > B)              two-sided paired t-test of 0 with its 95% interval:
                                 reproduced when significant and above 0, refuted when below
  within    (A - B > -margin)    non-inferiority, one-sided at ALPHA, 90% interval (TOST's
                                 convention): reproduced when the interval lies above -margin,
                                 refuted when it lies wholly below -margin
  similar   (|A - B| < margin)   equivalence by two one-sided tests (TOST), 90% interval:
                                 reproduced inside (-margin, margin), refuted wholly outside

Each claim's p is the p of the test that would decide it (for 'within' / 'similar': the
one-sided test on the side the mean lies); ``holm`` adjusts the p-values of a tier's claims
(step-down: the i-th smallest times k - i + 1, made monotone, capped at 1) and a verdict needs
the adjusted p below ALPHA. Otherwise: inconclusive, with the smallest effect (for 'similar' /
'within': the smallest margin) the seeds can establish with 80% power, from the exact
noncentral t (``scipy.stats.nct``) at the observed spread and the claim's fixed seed count.

Effect size: whether the paper's difference lies inside our interval ("consistent"), above it
("ours smaller") or below it ("ours larger"); and the difference over the setting's AllLarge -
AllSmall gap beside the paper's same ratio.

The gate of a claim, in three parts (``arm_convergence``, ``discriminates``, ``collapse``):
every arm converged (per seed, the mean over the last 20% of rounds minus the mean over the
20% before; the upper end of its 95% interval over seeds below ``FLAT_POINTS``); the setting
discriminates (AllLarge - AllSmall, its 95% interval's lower end above the claim's detectable
difference); no arm collapses (final below AllSmall's, or more than ``COLLAPSE_POINTS`` under
its own best evaluation: the verdict is flagged, not withheld).

Test-set sampling error: a seed redraws the training data, not the test set, so the seeds'
spread does not contain the test set's own sampling error. ``bootstrap_se`` resamples test
examples (within each domain) from the per-example correctness a run records; for runs that do
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
FLAT_POINTS = 1.0  # converged: the gain over the last 20% of rounds is below this
FLAT_FRACTION = 0.2
COLLAPSE_POINTS = 5.0  # an arm more than this under its own best evaluation collapsed
AGAINST_SMALL, UNDER_BEST = "against AllSmall", "under its own best"  # collapse's parts

REPRODUCED, REFUTED, INCONCLUSIVE = "reproduced", "refuted", "inconclusive"
RUNNING, NOT_RUN = "running", "no records yet"
NOT_CONVERGED, NOT_DISCRIMINATIVE = "not converged", "setting not discriminative"
COLLAPSING = "driven by a collapsing baseline"
DIRECTIONS = ("greater", "within", "similar")
CONSISTENT, OURS_SMALLER, OURS_LARGER = "consistent", "ours smaller", "ours larger"


@dataclass(frozen=True)
class Interval:
    """Mean of n per-seed values with its two-sided Student-t interval (NaN bounds for n < 2)."""

    mean: float
    low: float
    high: float
    n: int
    std: float
    confidence: float = 0.95

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


def p_value(differences, direction: str, margin: float = 0.0) -> float:
    """The p of the test that decides the claim from its per-seed paired differences (see the
    module text): 'greater' two-sided of 0; 'within' and 'similar' one-sided, on the side of
    the boundary the mean lies (for 'similar' inside the margins: TOST's max of the two)."""
    x = np.asarray(differences, dtype=float)
    n = len(x)
    if n < 2:
        return math.nan
    mean, se = float(x.mean()), float(x.std(ddof=1)) / math.sqrt(n)
    if se == 0:  # identical differences: the test is decided by the mean alone
        se = 1e-300
    df = n - 1
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
    the family): sorted ascending, p_(i) x (k - i + 1), a running maximum, capped at 1."""
    family = sorted((p, name) for name, p in p_values.items() if math.isfinite(p))
    k, running, out = len(family), 0.0, {name: math.nan for name in p_values}
    for i, (p, name) in enumerate(family):
        running = max(running, min(1.0, (k - i) * p))
        out[name] = running
    return out


def power(effect: float, std: float, n: int, sides: int = 2) -> float:
    """Exact power of a paired t-test over n seeds at level ALPHA when the true mean difference
    is ``effect`` beyond the tested boundary and the differences' std is ``std``: the
    noncentral t with n - 1 degrees of freedom and noncentrality effect x sqrt(n) / std."""
    df, nc = n - 1, effect * math.sqrt(n) / std
    crit = float(stats.t.ppf(1 - ALPHA / sides, df))
    up = _tail(float(stats.nct.sf(crit, df, nc)), nc > crit)
    return up + _tail(float(stats.nct.cdf(-crit, df, nc)), nc < -crit) if sides == 2 else up


def _tail(p: float, centre_inside: bool) -> float:
    """scipy's noncentral t returns NaN for a few far tails (e.g. cdf(-12.7, 1, 100)): there
    the tail holds all of the mass (1) when the noncentrality lies inside it, else none (0)."""
    return (1.0 if centre_inside else 0.0) if math.isnan(p) else p


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


def window_gain(curve: list[tuple[int, float]], fraction: float = FLAT_FRACTION) -> float:
    """One run's (round, value) curve: the mean over its last ``fraction`` of rounds minus the
    mean over the ``fraction`` before (each window: the evaluations whose round falls in it)."""
    last = curve[-1][0]
    edge, before = last - fraction * last, last - 2 * fraction * last
    late = [v for r, v in curve if r > edge]
    early = [v for r, v in curve if before < r <= edge]
    if not late or not early:
        raise ValueError(f"curve evaluated at rounds {[r for r, _ in curve]}: the windows "
                         f"({before:g}, {edge:g}] and ({edge:g}, {last}] need an evaluation each")
    return float(np.mean(late) - np.mean(early))


def arm_convergence(curves: list[list[tuple[int, float]]]) -> tuple[bool | None, Interval]:
    """Converged (True/False; None with one seed: no interval yet) and the per-seed window gains'
    95% interval: converged when its upper end is below ``FLAT_POINTS``."""
    gains = t_interval([window_gain(c) for c in curves])
    if gains.n < 2:
        return None, gains
    return gains.high < FLAT_POINTS, gains


def discriminates(large_minus_small: Interval, needed: float) -> bool | None:
    """AllLarge - AllSmall (paired, 95% interval) against the claim's detectable difference:
    True when its lower end exceeds it (None while either is unknown)."""
    if large_minus_small.n < 2 or not math.isfinite(needed):
        return None
    return large_minus_small.low > needed


def collapse(finals: list[float], bests: list[float], small_finals: list[float]) -> str:
    """Why an arm collapsed ('' when it did not): per-seed means of its final evaluation below
    AllSmall's, or more than COLLAPSE_POINTS under its own best evaluation."""
    under_small = float(np.mean(np.subtract(finals, small_finals)))
    under_best = float(np.mean(np.subtract(finals, bests)))
    why = []
    if under_small < 0:
        why.append(f"final {under_small:+.2f} points {AGAINST_SMALL}")
    if under_best < -COLLAPSE_POINTS:
        why.append(f"final {under_best:+.2f} points {UNDER_BEST}")
    return "; ".join(why)


def collapse_parts(why: str) -> str:
    """The parts of the gate a ``collapse`` reason tripped, without its numbers: a drift from an
    arm's own best is a collapse in time; an arm below AllSmall throughout (model groups whose
    models each see a few domains) is a weak arm, not a drift, and a reader should see which."""
    return " and ".join(part for phrase, part in ((AGAINST_SMALL, "below AllSmall"),
                                                 (UNDER_BEST, UNDER_BEST)) if phrase in why)


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
                 seed: int = 0) -> float:
    """Standard error (points) of a claim's seed-mean statistic from sampling the test set.

    ``runs``: per seed, the claim's terms as (coefficient, evaluations), each evaluation one
    ``{group: {stratum: 0/1 array}}`` of the primary metric's window. Every run of the claim
    scores the same test examples, so one replicate draws, per stratum, how often each example
    is taken (multinomial, n draws of n) and scores every evaluation of every run with it; the
    statistic is recomputed (mean over the window, sum over the terms, mean over the seeds) and
    its standard deviation over the replicates is the error."""
    rng = np.random.default_rng(seed)
    sizes = [{s: len(a) for g in ev.values() for s, a in g.items()}
             for seed_terms in runs for _, evaluations in seed_terms for ev in evaluations]
    if not sizes or any(z != sizes[0] for z in sizes):
        raise ValueError("runs scored on different test sets: no common bootstrap")
    weights = {s: rng.multinomial(n, np.full(n, 1.0 / n), size=replicates).astype(float)
               for s, n in sizes[0].items()}
    per_seed = [sum(c * np.mean([headline(ev, weights) for ev in evaluations], axis=0)
                    for c, evaluations in seed_terms) for seed_terms in runs]
    return 100 * float(np.std(np.mean(per_seed, axis=0), ddof=1))
