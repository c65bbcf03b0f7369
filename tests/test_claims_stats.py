"""The claims' statistics against numbers worked out by hand.

Three seeds give t-statistics with 2 degrees of freedom, whose tail has a closed form:
P(T2 > c) = (1 - c / sqrt(c^2 + 2)) / 2. With a noncentrality delta it still has one (Z ~ N(0, 1),
E = chi2_2 / 2 ~ Exp(1), so P(Z + delta > c sqrt(E)) integrates in closed form):
P(T2(delta) > c) = Phi(delta) - exp(-delta^2 (a - 1) / (2 a)) Phi(delta / sqrt(a)) / sqrt(a),
a = 1 + 2 / c^2 (delta = 0 gives the central tail above). The quantiles: t(0.975, 2) =
0.95 / sqrt(2 x 0.975 x 0.025) = 4.302653, t(0.95, 2) = 0.9 / sqrt(2 x 0.95 x 0.05) = 2.919986.
"""

import math

import numpy as np
import pytest

from fedtune_app.claims import stats as cs


def tail2(c: float, delta: float = 0.0) -> float:
    """P(T > c) for a noncentral t with 2 degrees of freedom (the closed form above)."""
    phi = lambda x: 0.5 * (1 + math.erf(x / math.sqrt(2)))  # noqa: E731
    a = 1 + 2 / c ** 2
    return phi(delta) - math.exp(-delta ** 2 * (a - 1) / (2 * a)) * phi(delta / math.sqrt(a)) \
        / math.sqrt(a)


T975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T95 = 0.9 / math.sqrt(2 * 0.95 * 0.05)


def test_closed_forms_agree_with_the_central_t():
    assert T975 == pytest.approx(4.302653, abs=1e-6) and T95 == pytest.approx(2.919986, abs=1e-6)
    assert tail2(T975) == pytest.approx(0.025, abs=1e-12)  # the quantile's own tail
    assert tail2(2.0) == pytest.approx((1 - 2 / math.sqrt(6)) / 2, abs=1e-12)


def test_primary_metric_is_the_mean_of_the_last_three_evaluations():
    assert cs.primary([10, 20, 30, 40]) == pytest.approx(30.0)  # (20 + 30 + 40) / 3
    assert cs.primary([7, 9]) == pytest.approx(8.0)  # fewer than three: all of them
    with pytest.raises(ValueError, match="no primary"):
        cs.primary([])


def test_greater_is_a_two_sided_t_test():
    # [1, 2, 3]: mean 2, s 1, se 1 / sqrt(3), t = 2 sqrt(3), t^2 = 12:
    # one tail (1 - sqrt(12 / 14)) / 2 = 0.0370901, two-sided 0.0741801
    assert cs.p_value([1, 2, 3], "greater") == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-9)
    # [4, 5, 6]: t = 5 sqrt(3), t^2 = 75: two-sided 1 - sqrt(75 / 77) = 0.0130719
    assert cs.p_value([4, 5, 6], "greater") == pytest.approx(1 - math.sqrt(75 / 77), rel=1e-9)
    assert cs.p_value([-4, -5, -6], "greater") == pytest.approx(1 - math.sqrt(75 / 77), rel=1e-9)
    assert cs.decide([4, 5, 6], "greater", 0, 0.0131) == cs.REPRODUCED
    assert cs.decide([-4, -5, -6], "greater", 0, 0.0131) == cs.REFUTED
    assert cs.decide([1, 2, 3], "greater", 0, 0.0742) == cs.INCONCLUSIVE


def test_tost_equivalence_with_its_90_percent_interval():
    # [0.5, 1, 1.5]: mean 1, s 0.5, se 0.5 / sqrt(3) = 0.288675. Margin 3:
    #   lower test (mu > -3): t = 4 / se = 13.8564, t^2 = 192: p = (1 - sqrt(192/194)) / 2
    #   upper test (mu < 3):  t = -2 / se = -6.9282, t^2 = 48: p = (1 - sqrt(48/50)) / 2 = 0.0101
    # TOST's p is the larger: 0.0101 < 0.05, equivalent; the 90% interval 1 ± 2.919986 x se =
    # (0.1571, 1.8429) lies inside (-3, 3), the same decision.
    d = [0.5, 1.0, 1.5]
    assert cs.p_value(d, "similar", 3.0) == pytest.approx((1 - math.sqrt(48 / 50)) / 2, rel=1e-9)
    ci = cs.t_interval(d, cs.interval_for("similar"))
    assert ci.low == pytest.approx(1 - T95 * 0.5 / math.sqrt(3), rel=1e-9)  # 0.157073
    assert cs.decide(d, "similar", 3.0, 0.0102) == cs.REPRODUCED
    # margin 1.5: upper t = -0.5 / se = -1.7321, t^2 = 3: p = (1 - sqrt(3/5)) / 2 = 0.112702
    assert cs.p_value(d, "similar", 1.5) == pytest.approx((1 - math.sqrt(3 / 5)) / 2, rel=1e-9)
    # [5, 6, 7] beyond margin 3: the one-sided test of mu > 3: t = 3 / (1 / sqrt(3)), t^2 = 27
    assert cs.p_value([5, 6, 7], "similar", 3.0) == pytest.approx((1 - math.sqrt(27 / 29)) / 2)
    assert cs.decide([5, 6, 7], "similar", 3.0, 0.0175) == cs.REFUTED


def test_within_is_one_sided_non_inferiority():
    # [-1, -2, -3], margin 5: mean -2, se 1 / sqrt(3): t = 3 sqrt(3), t^2 = 27:
    # p = (1 - sqrt(27 / 29)) / 2 = 0.0175495 (one-sided: H1 mu > -5)
    assert cs.p_value([-1, -2, -3], "within", 5.0) == pytest.approx(
        (1 - math.sqrt(27 / 29)) / 2, rel=1e-9)
    # [-9, -10, -11]: mean -10 below -5: the test of mu < -5, t = -5 sqrt(3), t^2 = 75
    assert cs.p_value([-9, -10, -11], "within", 5.0) == pytest.approx(
        (1 - math.sqrt(75 / 77)) / 2, rel=1e-9)
    assert cs.decide([-9, -10, -11], "within", 5.0, 0.0066) == cs.REFUTED
    with pytest.raises(ValueError, match="margin"):
        cs.check_margin("similar", 0.0)


def test_holm_step_down():
    # sorted: d 0.005 x 4 = 0.02, a 0.01 x 3 = 0.03, c 0.03 x 2 = 0.06, b 0.04 x 1 = 0.04 ->
    # running maximum 0.06; e (NaN: no verdict yet) stays outside the family
    adjusted = cs.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": math.nan})
    assert adjusted["d"] == pytest.approx(0.02) and adjusted["a"] == pytest.approx(0.03)
    assert adjusted["c"] == pytest.approx(0.06) and adjusted["b"] == pytest.approx(0.06)
    assert math.isnan(adjusted["e"])
    assert cs.holm({"x": 0.6, "y": 0.7}) == {"x": pytest.approx(1.0), "y": pytest.approx(1.0)}


@pytest.mark.parametrize("effect", [0.5, 2.0, 3.0])
def test_power_is_the_exact_noncentral_t(effect):
    # n = 3, std 1: noncentrality effect x sqrt(3); two-sided at 5%: both tails of T2(delta)
    # beyond 4.302653, the lower one P(T2(delta) < -c) = P(T2(-delta) > c)
    delta = effect * math.sqrt(3)
    expected = tail2(T975, delta) + tail2(T975, -delta)
    assert cs.power(effect, 1.0, 3) == pytest.approx(expected, abs=1e-9)
    assert cs.power(effect, 1.0, 3, sides=1) == pytest.approx(tail2(T95, delta), abs=1e-9)
    # e.g. effect 3: delta 5.196152, upper tail 0.745268 (+ 3e-6 below): power 0.74527


def test_detectable_effect_and_margins_reach_80_percent_power():
    # greater, n = 3, std 2: the effect e with power 0.8, checked by the closed form
    e = cs.detectable(2.0, 3, "greater")
    delta = e * math.sqrt(3) / 2
    assert tail2(T975, delta) + tail2(T975, -delta) == pytest.approx(0.8, abs=1e-9)
    # at std 1 an effect of 3 has power 0.745 and one of 3.5 more than 0.8 (closed form):
    # at std 2 the effect lies between 6 and 7
    d35 = 3.5 * math.sqrt(3)
    assert tail2(T975, d35) + tail2(T975, -d35) > 0.8 and 6.0 < e < 7.0
    # within: one-sided at 5%; similar: each side at power 0.9
    m = cs.detectable(2.0, 3, "within")
    assert tail2(T95, m * math.sqrt(3) / 2) == pytest.approx(0.8, abs=1e-9)
    m2 = cs.detectable(2.0, 3, "similar")
    assert tail2(T95, m2 * math.sqrt(3) / 2) == pytest.approx(0.9, abs=1e-9)
    assert math.isnan(cs.detectable(2.0, 1))  # one seed: nothing
    # the effect scales with the std: twice the spread, twice the detectable difference
    assert cs.detectable(4.0, 10) == pytest.approx(2 * cs.detectable(2.0, 10), rel=1e-9)


def test_effect_position_against_our_interval():
    ours = cs.Interval(2.0, 1.0, 3.0, 5, 1.0)
    assert cs.effect_position(5.84, ours) == cs.OURS_SMALLER  # the paper's above ours
    assert cs.effect_position(2.5, ours) == cs.CONSISTENT
    assert cs.effect_position(0.5, ours) == cs.OURS_LARGER


def _curve(values, every=4):
    return [(every * (i + 1), v) for i, v in enumerate(values)]


def test_gate_convergence_window_means():
    # rounds 4..40: last 20% = rounds 33-40 (36, 40), the 20% before = rounds 25-32 (28, 32)
    c = _curve([10, 20, 30, 40, 50, 60, 70, 80.0, 80.5, 80.7])
    assert cs.window_gain(c) == pytest.approx((80.5 + 80.7) / 2 - (70 + 80.0) / 2)  # 5.6
    # gains 0.2, 0.4, 0.6: mean 0.4, s 0.2, upper end 0.4 + 4.302653 x 0.2 / sqrt(3) = 0.8968
    flat = [_curve([50] * 6 + [70, 70, 70 + g, 70 + g]) for g in (0.2, 0.4, 0.6)]
    ok, gains = cs.arm_convergence(flat)
    assert ok and gains.high == pytest.approx(0.4 + T975 * 0.2 / math.sqrt(3))
    # gains 0.5, 0.7, 0.9: upper end 1.1968 >= 1: not shown converged
    rising = [_curve([50] * 6 + [70, 70, 70 + g, 70 + g]) for g in (0.5, 0.7, 0.9)]
    assert cs.arm_convergence(rising)[0] is False
    assert cs.arm_convergence(flat[:1])[0] is None  # one seed: no interval yet
    with pytest.raises(ValueError, match="windows"):
        cs.window_gain([(40, 1.0)])


def test_gate_discrimination_and_the_findings():
    gap = cs.Interval(20.0, 15.0, 25.0, 10, 7.0)
    assert cs.discriminates(gap, 3.0) is True and cs.discriminates(gap, 16.0) is False
    # validation finals 80, 82 against bests 86, 88: -6 on average, beyond 5: collapsed
    assert cs.collapsed_on_validation([80.0, 82.0], [86.0, 88.0]) == pytest.approx(-6.0)
    assert cs.collapsed_on_validation([80.0, 82.0], [84.0, 86.0]) is None  # -4
    assert cs.below_small(cs.t_interval([-1.0, 1.0])) is True  # mean 0: no better
    assert cs.below_small(cs.t_interval([0.5, 1.0])) is False


# s = sqrt(3) / 2 over three seeds: s^2 / n = 0.25, and a test-set error of 0.5 adds 0.25:
# se = sqrt(0.5) = 0.707107 on the seeds' 2 degrees of freedom, t(0.975, 2) = 4.302653
# (tables): half-width 3.042436 (the seeds' alone: 4.302653 x 0.5 = 2.151327)
S3 = math.sqrt(3) / 2
HALF = 3.042436


def test_combined_interval_adds_the_test_sets_error_to_the_seeds():
    values = [2 - S3, 2.0, 2 + S3]
    ci = cs.combined_interval(values, 0.5)
    assert ci.std == pytest.approx(S3, rel=1e-12) and ci.test_se == 0.5
    assert (ci.low, ci.high) == pytest.approx((2 - HALF, 2 + HALF), abs=2e-6)
    assert cs.t_interval(values).half_width == pytest.approx(2.151327, abs=2e-6)
    # without the test set's part (0, or unknown: NaN) it is the seeds' t interval
    for none in (0.0, math.nan):
        assert cs.combined_interval(values, none) == cs.t_interval(values)
    # the interval and the test agree: a mean at the half-width gives p = 0.05
    at_edge = [x - 2 + HALF for x in values]
    assert cs.p_value(at_edge, "greater", 0.0, 0.5) == pytest.approx(0.05, abs=1e-6)
    # the same differences with the seeds' error alone: a smaller p (t = 6.08 on 2 df)
    assert cs.p_value(at_edge, "greater") < 0.05


def test_bootstrap_over_digits_resamples_a_digits_renderings_together():
    """Two domains that render the same 400 digits, scored alike (a run right on a digit in one
    rendering is right in the other): the headline is then one domain's accuracy, whose
    bootstrap variance is p (1 - p) / n = 0.25 / 400 (SE 2.5 points). Resampling each domain on
    its own averages two independent draws instead: SE 2.5 / sqrt(2) = 1.768, too small."""
    right = np.tile([1, 0], 200)
    run = [[(1.0, [{"0": {"plain": right, "rotated": right.copy()}}])]]
    # Monte Carlo error of a standard deviation from B = 20000 replicates: 0.5% relative
    assert cs.bootstrap_se(run, 20000, clustered=True) == pytest.approx(2.5, rel=0.03)
    assert cs.bootstrap_se(run, 20000) == pytest.approx(2.5 / math.sqrt(2), rel=0.03)
    # renderings scored oppositely: the headline is 0.5 whatever digits are drawn
    opposite = [[(1.0, [{"0": {"plain": right, "rotated": 1 - right}}])]]
    assert cs.bootstrap_se(opposite, 2000, clustered=True) < 1e-10
    with pytest.raises(ValueError, match="different sizes"):
        cs.bootstrap_se([[(1.0, [{"0": {"a": right, "b": right[:10]}}])]], clustered=True)


def _interval(mean, low, high):
    return cs.Interval(mean, low, high, 10, 1.0)


def test_a_verdict_stands_only_on_a_stable_difference():
    """The registry's verdict rule, each case worked by hand."""
    at = [_interval(2.0, 0.5, 3.5)] * 3  # above 0 at each of the last three evaluations
    primary = _interval(2.0, 1.0, 3.0)
    # the difference fell by at most 0.5 over the last window: low 1.0 - 0.5 = 0.5 > 0
    assert cs.stable(cs.REPRODUCED, "greater", 0.0, primary, at, _interval(-0.1, -0.5, 0.3))
    assert cs.stable(cs.REPRODUCED, "greater", 0.0, primary, at,
                     _interval(0.5, 0.2, 0.8)) == (True, "")  # rising away from 0: no move
    # it may have fallen by 1.5: low 1.0 - 1.5 = -0.5 crosses 0
    ok, why = cs.stable(cs.REPRODUCED, "greater", 0.0, primary, at, _interval(-1, -1.5, -0.5))
    assert not ok and "(-0.50, 3.00)" in why
    # one of the last evaluations across 0
    ok, why = cs.stable(cs.REPRODUCED, "greater", 0.0, primary,
                        at[:2] + [_interval(0.5, -0.2, 1.2)], _interval(0, -0.1, 0.1))
    assert not ok and "at 1 of the last 3 evaluations" in why
    # refuted (below 0): only a rise moves it towards the null
    below = [_interval(-2.0, -3.5, -0.5)] * 3
    primary = _interval(-2.0, -3.0, -1.0)
    assert cs.stable(cs.REFUTED, "greater", 0.0, primary, below, _interval(0, -2, 0.5))[0]
    assert not cs.stable(cs.REFUTED, "greater", 0.0, primary, below, _interval(1, 0.5, 1.5))[0]
    # equivalence within 2: both ends may move; (-1, 1) moved by (-0.5, 0.5) stays inside
    inside = [_interval(0.0, -1.5, 1.5)] * 3
    primary = _interval(0.0, -1.0, 1.0)
    assert cs.stable(cs.REPRODUCED, "similar", 2.0, primary, inside, _interval(0, -0.5, 0.5))[0]
    assert not cs.stable(cs.REPRODUCED, "similar", 2.0, primary, inside,
                         _interval(-0.5, -1.2, 0.1))[0]  # low -1 - 1.2 = -2.2 leaves


def test_the_differences_trend_over_the_last_window():
    # a difference growing 0.1 points a round, evaluated every 5 rounds to 60: the last 20%
    # (rounds 50-60, mean 5.5) minus the 20% before (40-45, mean 4.25) = 1.25 on each seed
    curve = [(r, 0.1 * r) for r in range(5, 65, 5)]
    trend = cs.difference_trend([curve, curve])
    assert trend.mean == pytest.approx(1.25) and trend.std == pytest.approx(0.0, abs=1e-12)


def test_binomial_standard_error():
    # p = 0.75 on n = 4: sqrt(0.75 x 0.25 / 4) = 0.216506 -> 21.65 points
    assert cs.binomial_se([0.75], [1.0], 4) == pytest.approx(21.6506, abs=1e-4)
    # a difference of 0.75 and 0.5 on 100 examples: sqrt((0.1875 + 0.25) / 100) = 6.6144 points
    assert cs.binomial_se([0.75, 0.5], [1.0, -1.0], 100) == pytest.approx(6.6144, abs=1e-4)


def test_bootstrap_over_test_examples():
    """The bootstrap's SE of a paired difference of accuracies is the plug-in standard error
    of the mean of d_i = a_i - b_i: sqrt(mean((d - mean d)^2) / n)."""
    a, b = np.array([1, 1, 0, 0]), np.array([1, 0, 0, 1])
    # d = 0, 1, 0, -1: mean 0, population variance 2 / 4 = 0.5: SE sqrt(0.5 / 4) = 0.353553
    run = [[(1.0, [{"0": {"all": a}}]), (-1.0, [{"0": {"all": b}}])]]
    # Monte Carlo error of a standard deviation from B replicates: about 1 / sqrt(2 B) relative
    # (0.5% at B = 20000); 3% is six of those
    se = cs.bootstrap_se(run, replicates=20000)
    assert se == pytest.approx(35.3553, rel=0.03)
    # the test set is the same for every seed: ten identical seeds keep the same error
    assert cs.bootstrap_se(run * 10, replicates=20000) == pytest.approx(35.3553, rel=0.03)
    # two domains, the headline their mean: domain x = [1, 1, 1, 0] (p 0.75, n 4), domain y =
    # [1, 0] (p 0.5, n 2): SE = sqrt(0.1875 / 4 + 0.25 / 2) / 2 = sqrt(0.171875) / 2 = 0.207289
    two = [[(1.0, [{"0": {"x": np.array([1, 1, 1, 0]), "y": np.array([1, 0])}}])]]
    assert cs.bootstrap_se(two, replicates=20000) == pytest.approx(20.7289, rel=0.03)
    # a window of three evaluations: their mean; identical evaluations: the same error
    three = [[(1.0, [{"0": {"all": a}}] * 3), (-1.0, [{"0": {"all": b}}] * 3)]]
    assert cs.bootstrap_se(three, replicates=20000) == pytest.approx(35.3553, rel=0.03)
    with pytest.raises(ValueError, match="different test sets"):
        cs.bootstrap_se([[(1.0, [{"0": {"all": a}}]), (-1.0, [{"0": {"all": b[:3]}}])]])


def test_power_where_scipys_noncentral_t_returns_nan():
    # two seeds (df 1) and a large effect: scipy's nct.cdf(-12.7, 1, 100) is NaN; that tail
    # lies opposite the noncentrality and holds nothing, the other everything: power 1
    assert cs.power(100.0, 1.0, 2) == pytest.approx(1.0)
    assert math.isfinite(cs.detectable(1.0, 2))


def test_interval_side_of_each_direction():
    ci = cs.t_interval([1.0, 2.0, 3.0])  # 2 ± 2.48: (-0.48, 4.48)
    assert cs.interval_side(ci, "greater") == "?"
    assert cs.interval_side(cs.t_interval([3.0, 4.0, 5.0]), "greater") == "+"
    assert cs.interval_side(cs.t_interval([-5.0, -4.0, -3.0]), "greater") == "-"
    # within 1 (non-inferiority): (-0.48, 4.48) lies above -1; within 0.1 it spans -0.1
    assert cs.interval_side(ci, "within", 1.0) == "+"
    assert cs.interval_side(ci, "within", 0.1) == "?"
    assert cs.interval_side(cs.t_interval([-5.0, -4.0, -3.0]), "within", 1.0) == "-"
    # similar within 5: inside (-5, 5); within 1: across 1; (5.52, 10.48) wholly outside 5
    assert cs.interval_side(ci, "similar", 5.0) == "+"
    assert cs.interval_side(ci, "similar", 1.0) == "?"
    assert cs.interval_side(cs.t_interval([7.0, 8.0, 9.0]), "similar", 5.0) == "-"


# ---------------------------------------------------------------- rule v3, part by part

def test_closed_form_test_set_error_of_a_paired_difference():
    """The difference of two accuracies on the same examples is linear in the examples'
    weights: its standard error is that of the mean of the per-example differences."""
    a, b = np.array([1, 1, 0, 1]), np.array([1, 0, 0, 0])
    # d = 0, 1, 0, 1: mean 0.5, sum of squared deviations 4 x 0.25 = 1, var(ddof=1) = 1/3:
    # se = sqrt(1/3 / 4) = 0.288675 -> 28.87 points (the plug-in, the bootstrap's limit:
    # sqrt(0.25 / 4) = 0.25, i.e. sqrt(3/4) of it)
    run = [[(1.0, [{"0": {"all": a}}]), (-1.0, [{"0": {"all": b}}])]]
    assert cs.paired_test_se(run) == pytest.approx(100 * math.sqrt(1 / 12), rel=1e-12)
    # the same test set on ten seeds with the same results: the same error (it does not shrink)
    assert cs.paired_test_se(run * 10) == pytest.approx(28.8675, abs=1e-4)
    # two domains, headline their mean: x = [1, 1, 1, 0] (var 0.25, n 4), y = [1, 0]
    # (var 0.5, n 2), each weighted 1/2: se^2 = (0.25 / 4 + 0.5 / 2) / 4 = 0.078125
    two = [[(1.0, [{"0": {"x": np.array([1, 1, 1, 0]), "y": np.array([1, 0])}}])]]
    assert cs.paired_test_se(two) == pytest.approx(100 * math.sqrt(0.078125), rel=1e-12)
    # two renderings of the same 4 digits drawn together: u = (x + x') / 2 per digit
    right = np.array([1, 0, 1, 1])  # scored alike: u = right, var 0.25, se^2 = 0.25 / 4
    alike = [[(1.0, [{"0": {"plain": right, "rotated": right}}])]]
    assert cs.paired_test_se(alike, clustered=True) == pytest.approx(25.0, rel=1e-12)
    # scored oppositely the headline is 0.5 whatever digits are drawn
    opposite = [[(1.0, [{"0": {"plain": right, "rotated": 1 - right}}])]]
    assert cs.paired_test_se(opposite, clustered=True) == pytest.approx(0.0, abs=1e-12)
    with pytest.raises(ValueError, match="different test sets"):
        cs.paired_test_se([[(1.0, [{"0": {"all": a}}]), (-1.0, [{"0": {"all": b[:3]}}])]])


def test_the_bootstrap_converges_to_the_closed_form():
    """On 200 examples the bootstrap's standard error is sqrt((n - 1) / n) of the closed form,
    within its Monte Carlo error (one SD of a SD from B replicates: se / sqrt(2 (B - 1));
    four of them, for every replicate seed tried)."""
    rng = np.random.default_rng(7)
    a, b = rng.integers(0, 2, 200), rng.integers(0, 2, 200)
    run = [[(1.0, [{"0": {"all": a}}]), (-1.0, [{"0": {"all": b}}])]]
    exact = cs.paired_test_se(run) * math.sqrt(199 / 200)
    bound = 4 * cs.bootstrap_mc_error(exact, 4000)
    assert cs.bootstrap_mc_error(1.0, 5001) == pytest.approx(0.01)  # 1 / sqrt(10000)
    for seed in range(3):
        assert abs(cs.bootstrap_se(run, 4000, seed) - exact) < bound


def test_drift_towards_the_null_is_its_own_test():
    """Three seeds' trends -1, -2, -3 of a positive difference ('greater'): mean -2, s = 1,
    se = 1 / sqrt(3), t = -2 sqrt(3) on 2 df; P(T2 < -c) = (1 - c / sqrt(c^2 + 2)) / 2 =
    (1 - sqrt(12 / 14)) / 2 = 0.037089: significant, it moves towards 0."""
    sign = cs.towards_null(3.0, "greater")
    assert sign == -1
    p, trend = cs.drift_test([-1, -2, -3], 0.0, sign)
    assert p == pytest.approx((1 - math.sqrt(12 / 14)) / 2, rel=1e-9)
    assert trend.mean == -2 and trend.high == pytest.approx(-2 + T975 / math.sqrt(3))
    # the same trend away from 0 (a negative difference that falls): p = 1 - 0.037089
    assert cs.drift_test([-1, -2, -3], 0.0, cs.towards_null(-3.0, "greater"))[0] \
        == pytest.approx(1 - 0.037089, abs=1e-6)
    # a test-set error of the trend of 1 / sqrt(3) doubles the variance: t = -sqrt(6),
    # P(T2 < -sqrt 6) = (1 - sqrt(6 / 8)) / 2 = 0.066987: no longer significant
    p, trend = cs.drift_test([-1, -2, -3], 1 / math.sqrt(3), sign)
    assert p == pytest.approx((1 - math.sqrt(0.75)) / 2, rel=1e-9) and p > cs.ALPHA
    assert trend.high == pytest.approx(-2 + T975 * math.sqrt(2 / 3))
    # where the null lies for the other directions
    assert cs.towards_null(1.0, "within", 5.0) == -1 and cs.towards_null(-6, "within", 5) == 1
    assert cs.towards_null(0.5, "similar", 1.0) == 1 and cs.towards_null(-0.5, "similar", 1) == -1
    assert cs.towards_null(1.5, "similar", 1.0) == -1 and cs.towards_null(-2, "similar", 1) == 1


def test_robustness_words_rest_on_the_paired_change():
    """Four words: a change whose interval excludes 0 (Holm) shifts or is sensitive, never
    robust; one that includes 0 is robust only inside the band, else not separable."""
    def change(low, high):
        return cs.Interval((low + high) / 2, low, high, 10, 1.0)

    band = 2.56
    # fedra-t1-near-alllarge-like: the word holds but the difference moves 3 points (p 0.001)
    assert cs.change_word(change(-4.0, -2.0), 0.001, "refuted", "refuted", band) == "shifts"
    assert cs.change_word(change(-4.0, -2.0), 0.001, "reproduced", "refuted", band) \
        == "sensitive"
    # fedra-t5-mixed-like: the word "differs" in sign only and the change includes 0: robust
    # when its interval lies inside +-band, not separable when it reaches past it
    assert cs.change_word(change(-1.2, 0.2), 0.3, "inconclusive", "inconclusive", band) \
        == "robust"
    assert cs.change_word(change(-3.0, 1.0), 0.4, "reproduced", "inconclusive", band) \
        == "not separable"
    # off 0 before Holm but not after: no word about the change, and never robust
    assert cs.change_word(change(0.1, 1.0), 0.2, "reproduced", "reproduced", band) \
        == "not separable"


def test_a_family_is_reported_only_when_all_its_members_have_run():
    """Holm on 0.01, 0.04, 0.03: sorted 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 ->
    running maximum 0.06; an absent member withholds the family instead of counting p = 1."""
    members = ("a", "b", "c")
    assert cs.family_holm(members, {"a": 0.01, "b": 0.04}) is None
    assert cs.family_holm(members, {"a": 0.01, "b": 0.04, "c": math.nan}) is None
    adjusted = cs.family_holm(members, {"a": 0.01, "b": 0.04, "c": 0.03, "x": 0.5})
    assert adjusted == pytest.approx({"a": 0.03, "b": 0.06, "c": 0.06})
    assert cs.gap_fraction(3.0, 12.0) == 0.25 and math.isnan(cs.gap_fraction(3.0, None))
