"""The statistics behind a claim's verdict: paired Student-t intervals over seeds, the verdict
rule, the smallest detectable difference, and the convergence gate of a setting.

Every method of a claim runs on the same seeds, and a seed fixes partition, allocation draws,
sampling and initial adapters for all of them, so a claim's evidence is one difference per seed
(paired). Its 95% interval is Student's t over the seeds (``scipy.stats.t``): mean ± t(0.975,
n-1) x s / sqrt(n), s the sample std (ddof 1). The verdict compares that interval with the
paper's direction:

  greater   (A > B)             reproduced: low > 0;       refuted: high < 0
  within    (A - B >= -margin)  reproduced: low > -margin; refuted: high < -margin
  similar   (|A - B| <= margin) reproduced: -margin < low and high < margin;
                                refuted: low > margin or high < -margin
  otherwise inconclusive, with the smallest true difference this many seeds would detect with
  80% power in a two-sided 5% paired t-test: (t(0.975, n-1) + t(0.80, n-1)) x s / sqrt(n).

No verdict is drawn from an untrained setting (``gate``): its reference (AllLarge, or the
largest model group) must have flattened, i.e. gained less than ``FLAT_POINTS`` accuracy points
over the last 20% of rounds (mean curve over seeds), and beaten AllSmall by a paired interval
that excludes 0. Otherwise every claim of the setting reads "setting too short".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95
POWER = 0.80
FLAT_POINTS = 1.0  # the reference may gain less than this (accuracy points) over the last 20%
FLAT_FRACTION = 0.2

REPRODUCED, REFUTED, INCONCLUSIVE, TOO_SHORT, NOT_RUN = (
    "reproduced", "refuted", "inconclusive", "setting too short", "not run")
DIRECTIONS = ("greater", "within", "similar")


@dataclass(frozen=True)
class Interval:
    """Mean of n per-seed values with its two-sided Student-t interval (NaN bounds for n < 2)."""

    mean: float
    low: float
    high: float
    n: int
    std: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def t_interval(values, confidence: float = CONFIDENCE) -> Interval:
    """mean ± t((1 + confidence) / 2, n - 1) x s / sqrt(n) over the given per-seed values."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or len(x) == 0 or not np.isfinite(x).all():
        raise ValueError(f"expected a non-empty list of finite per-seed numbers, got {values!r}")
    n, mean = len(x), float(x.mean())
    if n < 2:
        return Interval(mean, math.nan, math.nan, n, math.nan)
    std = float(x.std(ddof=1))
    half = float(stats.t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, std)


def detectable_difference(std: float, n: int, confidence: float = CONFIDENCE,
                          power: float = POWER) -> float:
    """The smallest true paired difference a two-sided t-test at 1 - confidence over n seeds
    detects with the given power (normal shift approximation of the noncentral t)."""
    if n < 2 or not math.isfinite(std):
        return math.nan
    return (float(stats.t.ppf((1 + confidence) / 2, n - 1))
            + float(stats.t.ppf(power, n - 1))) * std / math.sqrt(n)


@dataclass(frozen=True)
class Verdict:
    verdict: str
    difference: Interval | None = None
    detectable: float = math.nan  # smallest detectable difference (inconclusive)
    reason: str = ""


def verdict(differences, direction: str = "greater", margin: float = 0.0) -> Verdict:
    """The verdict of a claim from its per-seed paired differences (claimed side minus other
    side, in accuracy points), the paper's direction and its margin (see the module text)."""
    if direction not in DIRECTIONS:
        raise ValueError(f"direction {direction!r}: expected one of {', '.join(DIRECTIONS)}")
    if margin < 0 or (direction != "greater" and margin == 0):
        raise ValueError(f"margin {margin}: expected > 0 for 'within'/'similar', >= 0 otherwise")
    ci = t_interval(differences)
    if ci.n < 2:
        return Verdict(INCONCLUSIVE, ci, reason="one seed: no interval")
    lo, hi = ci.low, ci.high
    if direction == "greater":
        decided = REPRODUCED if lo > 0 else REFUTED if hi < 0 else None
    elif direction == "within":
        decided = REPRODUCED if lo > -margin else REFUTED if hi < -margin else None
    else:
        decided = (REPRODUCED if -margin < lo and hi < margin
                   else REFUTED if lo > margin or hi < -margin else None)
    if decided is not None:
        return Verdict(decided, ci)
    return Verdict(INCONCLUSIVE, ci, detectable_difference(ci.std, ci.n),
                   reason="the interval spans the decision boundary")


@dataclass(frozen=True)
class Gate:
    """A setting's convergence gate: decided on its reference and AllSmall alone."""

    passed: bool
    reference_final: Interval  # accuracy points
    gain_last: float  # mean-curve gain over the last FLAT_FRACTION of rounds, points
    from_round: int
    last_round: int
    over_small: Interval  # paired reference - AllSmall, points
    reason: str = ""


def mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    """Mean over seeds of (round, value) curves evaluated at the same rounds."""
    rounds = [r for r, _ in curves[0]]
    if any([r for r, _ in c] != rounds for c in curves):
        raise ValueError("curves of one method evaluated at different rounds")
    values = np.array([[v for _, v in c] for c in curves], dtype=float)
    return list(zip(rounds, values.mean(0).tolist()))


def gate(reference_curves: list[list[tuple[int, float]]], small_finals: list[float],
         flat_points: float = FLAT_POINTS) -> Gate:
    """``reference_curves``: per seed, (round, accuracy in points) of the reference;
    ``small_finals``: AllSmall's final accuracy (points) on the same seeds, in the same order."""
    if len(reference_curves) != len(small_finals) or not reference_curves:
        raise ValueError("the gate needs the reference and AllSmall on the same seeds")
    curve = mean_curve(reference_curves)
    last_round, last = curve[-1]
    start = last_round - FLAT_FRACTION * last_round
    # the latest evaluated round at or before 80% of the run (the curve's own points)
    from_round, from_value = max(((r, v) for r, v in curve if r <= start), default=curve[0])
    gain = last - from_value
    finals = [c[-1][1] for c in reference_curves]
    over = t_interval(np.subtract(finals, small_finals))
    reasons = []
    if gain >= flat_points:
        reasons.append(f"the reference gained {gain:.2f} points from round {from_round} to "
                       f"{last_round} (>= {flat_points:g}): not flattened")
    if over.n < 2 or not over.low > 0:
        reasons.append("reference - AllSmall: the interval does not exclude 0"
                       if over.n >= 2 else "reference - AllSmall: one seed, no interval")
    return Gate(not reasons, t_interval(finals), gain, from_round, last_round, over,
                "; ".join(reasons))
