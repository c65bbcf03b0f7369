"""Update screening, robust masked aggregators, client-level DP and the state guard: small
tensors worked out by hand, then whole in-process runs with one hostile client."""

import json

import numpy as np
import pytest
from scipy.optimize import brentq
from scipy.stats import norm as gaussian

from fedtune_app.config import ConfigError
from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.robust import (
    combine,
    dp_combine,
    dp_epsilon,
    dp_noise_entropy,
    largest_updates,
    rms,
    screen,
    state_problem,
)
from fedtune_app.methods import resolve_config
from runs import assert_same_tensors, final_state, run

CFG = resolve_config({})
f32 = lambda *v: np.array(v, dtype=np.float32)  # noqa: E731


def cfg(**keys):
    """The robustness part of the default run config with ``keys`` changed."""
    return CFG.replace(**keys).robust


# 5 holders of 'a' (its state 0), one holder of 'b' (its state 1)
STATE = {"a": f32(0, 0), "b": f32(1)}
UPDATES = [ClientUpdate("1", {"a": f32(1, 10)}, 1), ClientUpdate("2", {"a": f32(2, -10)}, 1),
           ClientUpdate("3", {"a": f32(6, 4), "b": f32(3)}, 2),
           ClientUpdate("4", {"a": f32(100, 0)}, 1), ClientUpdate("5", {"a": f32(-50, 7)}, 1)]


def test_masked_median_and_trimmed_mean_by_hand():
    # coordinate 0 sorted: -50 1 2 6 100; coordinate 1 sorted: -10 0 4 7 10
    median = combine(STATE, UPDATES, cfg(aggregator="median"))
    np.testing.assert_array_equal(median["a"], f32(2, 4))
    np.testing.assert_array_equal(median["b"], f32(3))  # one holder: its own value
    # beta 0.2 of 5 holders cuts int(1.0) = 1 value per tail: mean(1, 2, 6), mean(0, 4, 7)
    trimmed = combine(STATE, UPDATES, cfg(aggregator="trimmed-mean", **{"trim-beta": 0.2}))
    np.testing.assert_allclose(trimmed["a"], f32(3, 11 / 3), rtol=1e-6)
    np.testing.assert_array_equal(trimmed["b"], f32(3))
    # 0.19 x 5 < 1: nothing is cut, the unweighted mean (1+2+6+100-50)/5, (10-10+4+0+7)/5
    untrimmed = combine(STATE, UPDATES, cfg(aggregator="trimmed-mean", **{"trim-beta": 0.19}))
    np.testing.assert_allclose(untrimmed["a"], f32(59 / 5, 11 / 5), rtol=1e-6)
    # the mean is Eq. 2: example counts 1 1 2 1 1 (6 in all), (1+2+12+100-50)/6 and
    # (10-10+8+0+7)/6; the integer sums are exact in float64, so one rounding to float32 each
    mean = combine(STATE, UPDATES, cfg(aggregator="mean"))
    np.testing.assert_array_equal(mean["a"], f32(65 / 6, 15 / 6))
    np.testing.assert_array_equal(mean["b"], f32(3))


def test_masked_clipped_mean_by_hand():
    state = {"a": f32(1, 1), "b": f32(0)}
    # updates (3,4) norm 5, (0,1) norm 1, (30,40) norm 50: median norm 5 clips the last to (3,4)
    updates = [ClientUpdate("1", {"a": f32(4, 5)}, 1), ClientUpdate("2", {"a": f32(1, 2)}, 1),
               ClientUpdate("3", {"a": f32(31, 41), "b": f32(-7)}, 2)]
    new = combine(state, updates, cfg(aggregator="clipped-mean"))
    # example counts 1, 1, 2 capped at their median 1: ((3,4) + (0,1) + (3,4)) / 3 = (2, 3)
    np.testing.assert_allclose(new["a"], f32(1 + 2, 1 + 3), rtol=1e-6)
    # one holder and no other block of its role: the median is its own norm
    np.testing.assert_array_equal(new["b"], f32(-7))


def test_clipped_mean_bounds_a_tensor_with_few_holders_by_its_role_in_other_blocks():
    # block 0 held by 3 clients (update norms 1, 2, 4); blocks 1-3 by client 3 alone (norms
    # 40, 50, 60): the median of one norm is its own, so they are clipped by their role: the
    # median over clients 1, 2, 3 of each one's median norm on blocks.*.lora_B, (1, 2,
    # median(4, 40, 50, 60) = 45) -> 2 (the tensors of client 3 are 4 of the role's 6 norms,
    # but it has one vote)
    state = {f"blocks.{b}.lora_B": f32(0, 0) for b in range(4)}
    updates = [ClientUpdate("1", {"blocks.0.lora_B": f32(1, 0)}, 1),
               ClientUpdate("2", {"blocks.0.lora_B": f32(2, 0)}, 1),
               ClientUpdate("3", {"blocks.0.lora_B": f32(4, 0), "blocks.1.lora_B": f32(0, 40),
                                  "blocks.2.lora_B": f32(0, 50), "blocks.3.lora_B": f32(0, 60)},
                            1)]
    new = combine(state, updates, cfg(aggregator="clipped-mean"))
    for b in (1, 2, 3):
        np.testing.assert_allclose(new[f"blocks.{b}.lora_B"], f32(0, 2), rtol=1e-6)
    # block 0, 3 holders: its own median 2 clips (4, 0) to (2, 0): (1 + 2 + 2) / 3
    np.testing.assert_allclose(new["blocks.0.lora_B"], f32(5 / 3, 0), rtol=1e-6)


def test_a_tensor_with_three_holders_keeps_its_own_median():
    # blocks.0: 3 holders, norms 1, 2, 3: its own median 2 clips (3, 0): (1 + 2 + 2) / 3; the
    # role's median would be 3 (client 1: median(1, 10) = 5.5, clients 2 and 3: 2, 3), which
    # clips blocks.1 (one holder, (10, 0)) to (3, 0)
    state = {"blocks.0.w": f32(0, 0), "blocks.1.w": f32(0, 0)}
    updates = [ClientUpdate("1", {"blocks.0.w": f32(1, 0), "blocks.1.w": f32(10, 0)}, 1),
               ClientUpdate("2", {"blocks.0.w": f32(2, 0)}, 1),
               ClientUpdate("3", {"blocks.0.w": f32(3, 0)}, 1)]
    new = combine(state, updates, cfg(aggregator="clipped-mean"))
    np.testing.assert_allclose(new["blocks.0.w"], f32(5 / 3, 0), rtol=1e-6)
    np.testing.assert_allclose(new["blocks.1.w"], f32(3, 0), rtol=1e-6)


def test_centred_clip_radius_of_few_holders_is_the_roles_distance_to_its_centres():
    # centres: blocks.1 (1, 0) from the previous round; blocks.0 and blocks.2 none yet (0).
    # Distances to the centres: client 1 blocks.0 1; client 2 blocks.0 100; client 3 blocks.1
    # |(1, 4) - (1, 0)| = 4 and blocks.2 20, its median 12. The role's radius: median(1, 100,
    # 12) = 12 for every block (each has fewer than 3 holders)
    state = {f"blocks.{b}.w": f32(0, 0) for b in range(3)}
    memory = {"blocks.1.w": np.array([1.0, 0.0])}
    updates = [ClientUpdate("1", {"blocks.0.w": f32(1, 0)}, 1),
               ClientUpdate("2", {"blocks.0.w": f32(100, 0)}, 1),
               ClientUpdate("3", {"blocks.1.w": f32(1, 4), "blocks.2.w": f32(0, 20)}, 1)]
    new = combine(state, updates, cfg(aggregator="centred-clip"), memory=memory)
    # blocks.0: gaps (1, 0), (100, 0) -> (12, 0): mean (6.5, 0); blocks.1: gap (0, 4) within
    # 12: v = (1, 4); blocks.2: gap (0, 20) -> (0, 12)
    np.testing.assert_allclose(new["blocks.0.w"], f32(6.5, 0), rtol=1e-6)
    np.testing.assert_allclose(new["blocks.1.w"], f32(1, 4), rtol=1e-6)
    np.testing.assert_allclose(new["blocks.2.w"], f32(0, 12), rtol=1e-6)
    np.testing.assert_allclose(memory["blocks.2.w"], [0, 12], rtol=1e-12)


def test_fltrust_clip_median_bounds_few_holders_by_role_and_keeps_zero_updates():
    # server update (1, 0) on blocks.0 and (4, 0) on blocks.1: clients 1-3 have trust 1
    # (client 3's (0.2, 0, 0.8, 0) is 0.2 x the server's), client 4 (a zero update) trust 0.
    # blocks.0: 4 holders, norms 0.3, 0.1, 0.2, 0: median 0.15 clips the first and third:
    # (0.15 + 0.1 + 0.15) / 3 (client 4 weighs 0); blocks.1: client 3 alone, its role's bound
    # median over clients (0.3, 0.1, median(0.2, 0.8) = 0.5, 0) = 0.2: (0.8, 0) -> (0.2, 0)
    state = {"blocks.0.w": f32(0, 0), "blocks.1.w": f32(0, 0)}
    server = {"blocks.0.w": np.array([1.0, 0.0]), "blocks.1.w": np.array([4.0, 0.0])}
    updates = [ClientUpdate("1", {"blocks.0.w": f32(0.3, 0)}, 1),
               ClientUpdate("2", {"blocks.0.w": f32(0.1, 0)}, 1),
               ClientUpdate("3", {"blocks.0.w": f32(0.2, 0), "blocks.1.w": f32(0.8, 0)}, 1),
               ClientUpdate("4", {"blocks.0.w": f32(0, 0)}, 1)]
    new = combine(state, updates, cfg(aggregator="fltrust", **{"fltrust-scale": "clip-median"}),
                  reference=server)
    np.testing.assert_allclose(new["blocks.0.w"], f32(0.4 / 3, 0), rtol=1e-6)
    np.testing.assert_allclose(new["blocks.1.w"], f32(0.2, 0), rtol=1e-6)


def test_clipped_mean_caps_a_claimed_example_count_at_the_rounds_median():
    # the liar (client 3) claims 100 examples against 10 and 20: capped at the median 20, its
    # update (-1) weighs 20 against 10 + 20 honest (+1): (10 + 20 - 20) / 50 = 0.2, not the
    # (30 - 100) / 130 = -0.54 that the claim alone would buy
    state = {"a": f32(0)}
    updates = [ClientUpdate("1", {"a": f32(1)}, 10), ClientUpdate("2", {"a": f32(1)}, 20),
               ClientUpdate("3", {"a": f32(-1)}, 100)]
    new = combine(state, updates, cfg(aggregator="clipped-mean"))
    np.testing.assert_allclose(new["a"], f32(0.2), rtol=1e-6)


def test_keyed_median_shares_one_value():
    state = {"x.0": f32(0), "x.1": f32(0), "y": f32(5)}
    keys = {"x.0": "x", "x.1": "x", "y": "y"}
    updates = [ClientUpdate("1", {"x.0": f32(1)}, 1), ClientUpdate("2", {"x.1": f32(9)}, 1),
               ClientUpdate("3", {"x.0": f32(4)}, 1)]
    new = combine(state, updates, cfg(aggregator="median"), keys)
    assert new["x.0"] == new["x.1"] == f32(4) and new["y"] == f32(5)


def test_screening_rules_by_hand():
    sent = {c: {"a": f32(0, 0, 0, 0), "h": f32(1, 1, 1, 1)} for c in "1234"}
    c = cfg(**{"screen-peer-ratio": 10.0, "screen-max-growth": 5.0, "screen-rms-floor": 0.1})
    up = lambda client, a, h=f32(1, 1, 1, 1): ClientUpdate(client, {"a": a, "h": h}, 1)  # noqa
    honest = [up("1", f32(.1, .1, .1, .1)), up("2", f32(.2, .2, .2, .2)),
              up("3", f32(.15, .15, .15, .15))]
    assert screen(honest, sent, c) == {}
    # a client that breaks only the peer rule:
    peer = honest + [up("4", f32(.1, .1, .1, .1), h=f32(1, 1, 1, 1) + 0.8)]
    # 'h': deltas 0, 0, 0, 0.8 (rms 0.8 > floor 0.1; growth bound 5 x 1 = 5 holds); the median
    # norm of 'h' over its 4 holders is 0 -> 1.6 > 10 x 0
    assert set(screen(peer, sent, c)) == {"4"}
    assert "median" in screen(peer, sent, c)["4"]
    # below the floor nothing is judged against peers: rms 0.05 < 0.1
    quiet = honest + [up("4", f32(.1, .1, .1, .1), h=f32(1, 1, 1, 1) + 0.05)]
    assert screen(quiet, sent, c) == {}
    # the growth bound, with a single holder: rms 0.6 > 5 x max(rms 0, 0.1)
    alone = [up("1", f32(.6, -.6, .6, -.6))]
    assert "rms 0.6 > 5 x max" in screen(alone, sent, c)["1"]
    assert screen([up("1", f32(.4, -.4, .4, -.4))], sent, c) == {}
    assert screen(peer, sent, c, peers=False) == {}  # under DP: the growth bound only


def test_screening_keeps_an_honest_head_leaving_a_zero_global_head():
    """A client whose data holds few classes moves a near-zero head much further than the
    head's own size: with 3 or more holders only its peers judge it. Numbers of round 1 of the
    default job, seed 0, Dirichlet 0.1 (head.bias rms 0.72 against 5 x max(0.000, 0.1) = 0.5)."""
    c = cfg(**{"screen-peer-ratio": 10.0, "screen-max-growth": 5.0, "screen-rms-floor": 0.1})
    sent = {k: {"head.bias": np.zeros(4, np.float32)} for k in "123"}
    # rms 0.72, 0.2, 0.15; norms 1.44, 0.4, 0.3; the median norm 0.4 -> 1.44 < 10 x 0.4
    heads = [ClientUpdate("1", {"head.bias": f32(.72, -.72, .72, -.72)}, 1),
             ClientUpdate("2", {"head.bias": f32(.2, -.2, .2, .2)}, 1),
             ClientUpdate("3", {"head.bias": f32(.15, .15, -.15, .15)}, 1)]
    assert screen(heads, sent, c) == {}
    # the same update from a client holding the head alone or with one peer: the growth bound
    assert "rms 0.72 > 5 x max" in screen(heads[:2], sent, c)["1"]
    # a head update 10 x its peers' median still goes: norm 4.1 > 10 x 0.4
    loud = [ClientUpdate("1", {"head.bias": f32(2.05, -2.05, 2.05, -2.05)}, 1)] + heads[1:]
    assert "> 10 x the median 0.4 of its 3 holders" in screen(loud, sent, c)["1"]
    # under DP every tensor is judged against the global tensor only
    assert set(screen(heads, sent, c, peers=False)) == {"1"}


def test_state_guard():
    old = {"a": f32(1, -1), "b": f32(0, 0)}
    c = cfg(**{"screen-max-growth": 5.0, "screen-rms-floor": 0.1})
    assert state_problem(old, {"a": f32(2, -3), "b": old["b"]}, c) is None  # rms 1.58 < 5
    assert "moved by rms 6" in state_problem(old, {"a": f32(7, -7), "b": old["b"]}, c)
    assert "NaN" in state_problem(old, {"a": old["a"], "b": f32(np.nan, 0)}, c)
    assert state_problem(old, {"a": f32(7, -7), "b": old["b"]}, c, check_jump=False) is None
    # a move as large as an update screening accepted is no jump: rms 6 <= the accepted 6.5
    assert state_problem(old, {"a": f32(7, -7), "b": old["b"]}, c, accepted={"a": 6.5}) is None
    assert "largest accepted update's rms 5.9" in state_problem(
        old, {"a": f32(7, -7), "b": old["b"]}, c, accepted={"a": 5.9})


def test_dp_clipping_noise_and_epsilon():
    state = {"a": np.zeros(2, np.float32), "b": np.zeros(1, np.float32)}
    updates = [ClientUpdate("1", {"a": f32(3, 0), "b": f32(4)}, 7),  # whole norm 5 -> x 0.2
               ClientUpdate("2", {"a": f32(0, .5)}, 1)]  # norm 0.5 < 1: kept
    seed = np.array([1, 2, 3, 4], np.uint32)
    c = cfg(**{"dp-noise-multiplier": 0.0, "dp-clip-norm": 1.0})
    new = dp_combine(state, updates, c, seed, 1)
    np.testing.assert_allclose(new["a"], f32(0.3, 0.25), rtol=1e-6)  # unweighted over 2
    np.testing.assert_allclose(new["b"], f32(0.8), rtol=1e-6)  # one holder
    # the noise: N(0, (sigma C)^2) on the sum, divided by the 2 holders
    big = {"a": np.zeros(20_000, np.float32)}
    noisy = dp_combine(big, [ClientUpdate(str(i), {"a": big["a"]}, 1) for i in (1, 2)],
                       cfg(**{"dp-noise-multiplier": 1.5, "dp-clip-norm": 2.0}), seed, 3)
    # std 1.5 x 2 / 2 = 1.5; the sample std of 20000 normals is within 2% (> 10 standard errors)
    assert abs(noisy["a"].std() / 1.5 - 1) < 0.02
    again = dp_combine(big, [ClientUpdate(str(i), {"a": big["a"]}, 1) for i in (1, 2)],
                       cfg(**{"dp-noise-multiplier": 1.5, "dp-clip-norm": 2.0}), seed, 3)
    assert noisy["a"].tobytes() == again["a"].tobytes()  # (seed, round) decide the noise
    # one round of the Gaussian mechanism, sigma 1, every client: the RDP accountant's epsilon
    # lies between the exact one (Balle & Wang 2018, Thm. 8) and the classic RDP conversion
    # min over alpha of alpha / (2 sigma^2) + log(1/delta) / (alpha - 1) (Mironov 2017)
    delta, sigma = 1e-5, 1.0
    exact = brentq(lambda e: gaussian.cdf(-e * sigma + 1 / (2 * sigma)) - np.exp(e)
                   * gaussian.cdf(-e * sigma - 1 / (2 * sigma)) - delta, 0.01, 50)
    classic = min(a / (2 * sigma**2) + np.log(1 / delta) / (a - 1)
                  for a in np.linspace(1.01, 100, 10_000))
    eps = dp_epsilon(cfg(**{"dp-noise-multiplier": sigma, "dp-delta": delta}), 1, 1.0)
    assert exact <= eps <= classic
    assert dp_epsilon(cfg(**{"dp-noise-multiplier": sigma}), 4, 1.0) > eps  # it accumulates


def test_dp_config_is_checked():
    with pytest.raises(ConfigError, match="'aggregator' = 'median' with key 'dp-noise"):
        resolve_config({"dp-noise-multiplier": 1.0, "aggregator": "median"})
    with pytest.raises(ConfigError, match="method 'inclusivefl'.*methods with DP: .*fedra"):
        resolve_config({"dp-noise-multiplier": 1.0, "method": "inclusivefl"})
    with pytest.raises(ConfigError, match="'aggregator' = 'krum' is not allowed"):
        resolve_config({"aggregator": "krum"})



# -- the edges of each rule, worked out by hand ----------------------------------------------
def test_rms_in_float64_and_of_an_empty_tensor():
    # squares above float32's largest 3.4e38 must not overflow: sqrt(x^2) is x exactly
    assert rms(f32(1e20, -1e20)) == float(np.float32(1e20))
    assert rms(np.zeros(0, np.float32)) == 0.0


def test_keyed_mean_and_median_keep_the_state_dtype():
    state = {"x.0": f32(0), "x.1": f32(0), "y": f32(5)}
    keys = {"x.0": "x", "x.1": "x", "y": "y"}
    updates = [ClientUpdate("1", {"x.0": f32(1)}, 1), ClientUpdate("2", {"x.1": f32(9)}, 3)]
    # (1 x 1 + 3 x 9) / 4 = 7 under both names of key x; y was sent by nobody
    mean = combine(state, updates, cfg(aggregator="mean"), keys)
    assert mean == {"x.0": f32(7), "x.1": f32(7), "y": f32(5)}
    median = combine(state, updates, cfg(aggregator="median"), keys)
    assert median["x.0"] == median["x.1"] == f32(5)  # the median of 1 and 9, unweighted
    assert all(v.dtype == np.float32 for v in [*mean.values(), *median.values()])


def test_clipped_mean_with_updates_shorter_than_one():
    # update norms 0.3, 0.4, 0.5 (3-4-5 triangles / 10): the median 0.4 scales the last by 0.8
    state = {"a": f32(1, 1)}
    updates = [ClientUpdate(c, {"a": f32(1 + dx, 1 + dy)}, 1)
               for c, (dx, dy) in zip("123", [(.3, 0), (0, .4), (.3, .4)])]
    new = combine(state, updates, cfg(aggregator="clipped-mean"))
    # ((0.3, 0) + (0, 0.4) + 0.8 (0.3, 0.4)) / 3 = (0.54, 0.72) / 3 = (0.18, 0.24)
    np.testing.assert_allclose(new["a"], f32(1.18, 1.24), rtol=1e-6)


def test_screening_bounds_are_strict():
    c = cfg(**{"screen-peer-ratio": 2.0, "screen-max-growth": 4.0, "screen-rms-floor": 0.125})
    sent = {k: {"a": np.zeros(4, np.float32)} for k in "123"}
    up = lambda client, v: ClientUpdate(client, {"a": f32(v, -v, v, -v)}, 1)  # noqa: E731
    # peer rule: norm 2 = 2 x the median norm 1 exactly (rms 1 > floor): not above, kept
    assert screen([up("1", 1.0), up("2", .5), up("3", .5)], sent, c) == {}
    # rms exactly the floor 0.5 (its norm 1 > 2 x the median 0 of the others): kept
    loose = cfg(**{"screen-peer-ratio": 2.0, "screen-max-growth": 4.0, "screen-rms-floor": 0.5})
    assert screen([up("1", .5), up("2", 0.0), up("3", 0.0)], sent, loose) == {}
    # growth rule with one holder: rms 0.5 = 4 x max(0, 0.125) exactly: kept; a little more goes
    assert screen([up("1", .5)], sent, c) == {}
    assert set(screen([up("1", .5625)], sent, c)) == {"1"}


def test_state_guard_edges():
    c = cfg(**{"screen-max-growth": 5.0, "screen-rms-floor": 0.1})
    old = {"a": f32(2, -2), "b": f32(1, -1), "z": f32(0, 0), "mask": f32(-np.inf, 0)}
    same = dict(old)
    # the bound grows with the tensor: rms 6 <= 5 x rms 2 = 10
    assert state_problem(old, same | {"a": f32(8, -8)}, c) is None
    # a move of exactly the bound is allowed: rms 5 = 5 x rms 1
    assert state_problem(old, same | {"b": f32(6, -6)}, c) is None
    # a zero tensor may move 5 x the floor 0.1 = 0.5, not 0.8 (nothing accepted to excuse it)
    assert state_problem(old, same | {"z": f32(.8, -.8)}, c) == (
        "'z' moved by rms 0.8 > max(5 x max(rms before 0, 0.1), the largest accepted "
        "update's rms 0)")
    # a tensor the round did not touch is not judged (a buffer may hold -inf)
    assert state_problem(old, same, c) is None
    # a NaN passes neither with the jump check off nor in a tensor exempt from it
    assert "NaN" in state_problem(old, same | {"z": f32(np.nan, 0)}, c, check_jump=False)
    assert "NaN" in state_problem(old, same | {"z": f32(0, np.inf)}, c, skip_jump=("z",))
    assert state_problem(old, same | {"z": f32(9, 9)}, c, skip_jump=("z",)) is None


def test_largest_accepted_update_per_tensor():
    state = {"a": f32(1, 1), "b": f32(0), "c": f32(1)}
    updates = [ClientUpdate("1", {"a": f32(4, 5), "c": f32(1.5)}, 1),  # a: (3, 4), rms sqrt(12.5)
               ClientUpdate("2", {"a": f32(1, 2), "b": f32(-2), "gone": f32(9)}, 1)]
    assert largest_updates(updates, state) == pytest.approx(
        {"a": 12.5 ** .5, "b": 2.0, "c": 0.5}, rel=1e-15)


def test_dp_clips_the_update_not_the_tensor_and_shares_keyed_values():
    state = {"x.0": f32(1, 1), "x.1": f32(3, 3), "y": f32(10)}
    keys = {"x.0": "x", "x.1": "x", "y": "y"}
    c = cfg(**{"dp-noise-multiplier": 0.0, "dp-clip-norm": 0.25})
    seed = np.array([1, 2, 3, 4], np.uint32)
    # client 1: delta (0.3, 0.4) on x.0 (norm 0.5 -> x 0.5 = (0.15, 0.2)); client 2: delta
    # (0.2, 0) on x.1 and 0 on y (norm 0.2 < 0.25, kept). Key x: (0.35, 0.2) / 2 holders
    updates = [ClientUpdate("1", {"x.0": f32(1.3, 1.4)}, 5),
               ClientUpdate("2", {"x.1": f32(3.2, 3), "y": f32(10)}, 1)]
    new = dp_combine(state, updates, c, seed, 1, keys)
    # each name moves by the key's mean (0.175, 0.1) from its own value (float32 inputs: 1e-6)
    np.testing.assert_allclose(new["x.0"], f32(1.175, 1.1), rtol=1e-6)
    np.testing.assert_allclose(new["x.1"], f32(3.175, 3.1), rtol=1e-6)
    assert new["y"] == f32(10) and new["x.0"].dtype == np.float32


def test_dp_noise_seed_words():
    seed = (1 << 127) | (7 << 32) | 5
    words = dp_noise_entropy(cfg(**{"dp-noise-seed": seed}))
    assert words.tolist() == [5, 7, 0, 1 << 31] and words.dtype == np.uint32
    fresh = [dp_noise_entropy(cfg(**{"dp-noise-seed": 0})) for _ in range(2)]
    assert fresh[0].shape == (4,) and fresh[0].tolist() != fresh[1].tolist()  # 2^-128 to fail

# -- whole runs: the real ClientApp over the in-process grid ----------------------------------
ATTACKS = ("huge", "flip", "noise", "diverge")
ATTACKER = 0  # capacity 4 of the smoke preset: the only holder of some blocks in some rounds
TWO_ROUNDS = {"num-server-rounds": 2}


def records(folder):
    return json.loads((folder / "metrics.json").read_text())


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    from flwr.app import MessageType

    tmp = tmp_path_factory.mktemp("robust")
    drop = {ATTACKER: lambda msg, reply: None if msg.metadata.message_type ==
            MessageType.TRAIN else reply}
    return run(tmp / "honest", **TWO_ROUNDS), run(tmp / "dropped", faults=drop, **TWO_ROUNDS)


@pytest.mark.parametrize("attack", ATTACKS)
def test_one_hostile_client_changes_nothing_under_default_screening(attack, reference_runs,
                                                                    tmp_path):
    honest, dropped = reference_runs
    folder = run(tmp_path, **TWO_ROUNDS | {"fault-injection": f"{attack}={ATTACKER}"})
    for record in records(folder):
        # the attacker is rejected by screening in every round, nobody else ever
        assert list(record["rejected"]) == [str(ATTACKER)], record["rejected"]
        assert record["rejected"][str(ATTACKER)].startswith("screening:")
        assert record["state-updated"] is True
    # a reply rejected before aggregation is exactly a reply that never came: the bound on the
    # distance to the run without the attacker's replies is 0, bit for bit
    assert_same_tensors(final_state(folder), final_state(dropped))
    assert records(folder)[-1]["accuracy"] == records(dropped)[-1]["accuracy"]
    # the honest run itself never rejects anyone
    assert all(not r["rejected"] for r in records(honest))


def test_without_screening_the_attacks_do_poison_the_mean(reference_runs, tmp_path):
    """The threat is real (the reason screening is on by default): the same huge attack with
    screening off drives the state far away and the honest clients' next round to NaN."""
    _, dropped = reference_runs
    folder = run(tmp_path, **TWO_ROUNDS | {"fault-injection": f"huge={ATTACKER}",
                                           "screen-updates": False})
    second = records(folder)[1]
    assert {"1", "2"} <= set(second["rejected"])  # honest clients, diverged
    state, ref = final_state(folder), final_state(dropped)
    assert max(float(np.abs(state[n].astype(np.float64) - ref[n]).max()) for n in ref) > 1e20


@pytest.mark.parametrize("aggregator", ["median", "trimmed-mean", "clipped-mean", "dp"])
def test_same_seed_same_run_with_each_aggregator(aggregator, tmp_path):
    keys = ({"dp-noise-multiplier": 0.5, "dp-noise-seed": 11} if aggregator == "dp" else
            {"aggregator": aggregator}) | TWO_ROUNDS
    a, b = run(tmp_path / "a", **keys), run(tmp_path / "b", **keys)
    assert_same_tensors(final_state(a), final_state(b))
    if aggregator == "dp":
        eps = [r["dp-epsilon"] for r in records(a)]
        assert 0 < eps[0] < eps[1] and eps == [r["dp-epsilon"] for r in records(b)]


@pytest.mark.parametrize("method", ["inclusivefl", "depthfl", "all-small"])
def test_every_method_screens_before_its_own_aggregation(method, tmp_path):
    folder = run(tmp_path, method=method, aggregator="median",
                 **TWO_ROUNDS | {"fault-injection": f"diverge={ATTACKER}"})
    for record in records(folder):
        assert list(record["rejected"]) == [str(ATTACKER)], record["rejected"]
    assert all(np.isfinite(v).all() for v in final_state(folder).values())


# -- the defences against in-bound attackers, by hand ----------------------------------------
def test_fltrust_trust_scores_and_rescaling_by_hand():
    state = {"a": f32(0, 0), "b": f32(0), "c": f32(5)}
    server = {"a": np.array([3.0, 4.0]), "b": np.array([2.0]), "c": np.array([1.0])}
    updates = [ClientUpdate("1", {"a": f32(6, 8)}, 1),  # cos 1 with (3, 4): trust 1
               ClientUpdate("2", {"a": f32(-3, -4), "c": f32(9)}, 1),  # cos over (a, c) < 0: 0
               # (4, -3) is orthogonal to (3, 4); over (a, b): dot 0 + 2 x 2 = 4, norms^2 25 + 4
               # and 25 + 4: cos 4 / 29
               ClientUpdate("3", {"a": f32(4, -3), "b": f32(2)}, 1)]
    from fedtune_app.federated.robust import trust_scores

    scores = trust_scores(updates, state, server)
    assert scores["1"] == pytest.approx(1.0, rel=1e-12)
    assert scores["2"] == 0.0 and scores["3"] == pytest.approx(4 / 29, rel=1e-12)
    new = combine(state, updates, cfg(aggregator="fltrust"), reference=server)
    # 'a': each update rescaled to ||(3, 4)|| = 5: (3, 4) and (4, -3); weights 1 and 4/29:
    # (3 + 16/29, 4 - 12/29) / (33/29) = (103/33, 104/33)
    np.testing.assert_allclose(new["a"], f32(103 / 33, 104 / 33), rtol=1e-6)
    np.testing.assert_allclose(new["b"], f32(2), rtol=1e-6)  # rescaled to ||2|| = 2, one holder
    assert new["c"] == f32(5)  # its only holder is untrusted: no step
    # clip-median: 'a' updates (6, 8), (-3, -4), (4, -3) of norms 10, 5, 5: clipped to the
    # median 5: (3, 4), (-3, -4), (4, -3); trust 1, 0, 4/29 as above: (103/33, 104/33) again;
    # 'b': one holder and no role: its own norm, unclipped (2)
    clipped = combine(state, updates, cfg(aggregator="fltrust", **{"fltrust-scale": "clip-median"}),
                      reference=server)
    np.testing.assert_allclose(clipped["a"], f32(103 / 33, 104 / 33), rtol=1e-6)
    np.testing.assert_allclose(clipped["b"], f32(2), rtol=1e-6)
    # and where the server's norm and the median differ: the server's update / 10 (the same
    # trust scores): FLTrust rescales to norm 0.5, a tenth of the above; clip-median does not
    small = {name: value / 10 for name, value in server.items()}
    assert combine(state, updates, cfg(aggregator="fltrust"), reference=small)["a"] == \
        pytest.approx(np.array([103, 104]) / 330, rel=1e-6)
    assert combine(state, updates, cfg(aggregator="fltrust", **{"fltrust-scale": "clip-median"}),
                   reference=small)["a"] == pytest.approx(np.array([103, 104]) / 33, rel=1e-6)


def test_centred_clipping_by_hand():
    from fedtune_app.federated.robust import centred_clip

    deltas = np.array([[1.0, 0.0], [0.0, 1.0], [10.0, 0.0]])
    # tau 1: (10, 0) is clipped to (1, 0); mean of (1, 0), (0, 1), (1, 0) = (2/3, 1/3)
    np.testing.assert_allclose(centred_clip(deltas, np.zeros(2), 1.0, 1), [2 / 3, 1 / 3])
    # tau 0: the median distance {1, 1, 10} = 1, the same
    np.testing.assert_allclose(centred_clip(deltas, np.zeros(2), 0.0, 1), [2 / 3, 1 / 3])
    # a second iteration from v = (2/3, 1/3): gaps (1/3, -1/3), (-2/3, 2/3) unclipped,
    # (28/3, -1/3) of norm sqrt(785)/3 clipped to norm 1
    far = np.array([28 / 3, -1 / 3]) / (np.sqrt(785) / 3)
    step = (np.array([1 / 3, -1 / 3]) + np.array([-2 / 3, 2 / 3]) + far) / 3
    np.testing.assert_allclose(centred_clip(deltas, np.zeros(2), 1.0, 2),
                               np.array([2 / 3, 1 / 3]) + step, rtol=1e-12)
    # the centre is the previous round's aggregate: combine keeps it per key
    state = {"a": f32(1, 1)}
    ups = [ClientUpdate(str(i), {"a": state["a"] + f32(*d)}, 1) for i, d in enumerate(deltas)]
    centres = {}
    new = combine(state, ups, cfg(aggregator="centred-clip", **{"cc-tau": 1.0}), memory=centres)
    np.testing.assert_allclose(new["a"], f32(1 + 2 / 3, 1 + 1 / 3), rtol=1e-6)
    np.testing.assert_allclose(centres["a"], [2 / 3, 1 / 3])
    # next round, the same updates, centred on (2/3, 1/3): the two-iteration result above
    again = combine(state, ups, cfg(aggregator="centred-clip", **{"cc-tau": 1.0}),
                    memory=centres)
    np.testing.assert_allclose(again["a"], f32(*(1 + np.array([2 / 3, 1 / 3]) + step)),
                               rtol=1e-6)


def test_multi_krum_and_bulyan_with_holder_masks_by_hand():
    from fedtune_app.federated.robust import bulyan, krum_scores, multi_krum

    five = np.array([[0.0], [1.0], [2.0], [3.0], [100.0]])
    # f = 1: each score sums the squared distances to the n - f - 2 = 2 nearest others
    np.testing.assert_array_equal(krum_scores(five, 1), [5, 2, 2, 5, 9409 + 9604])
    np.testing.assert_array_equal(multi_krum(five, 1), [1.5])  # the 4 best: 0, 1, 2, 3
    # Bulyan, f = 1, n = 7: Krum picks 2 (score 10), 1 (14, tie with 3: the first), 3, 0, 4;
    # then the
    # beta = 5 - 2 = 3 values nearest the median 2 of each coordinate: 1, 2, 3
    seven = np.array([[0.0], [1.0], [2.0], [3.0], [4.0], [50.0], [-60.0]])
    np.testing.assert_array_equal(bulyan(seven, 1), [2.0])
    np.testing.assert_array_equal(bulyan(five, 1), [2.0])  # 5 < 4f + 3: the median
    # per tensor over its holders: 'a' has the five holders, 'b' two (< 2f + 3: their median)
    state = {"a": f32(0), "b": f32(0)}
    ups = [ClientUpdate(str(i), {"a": f32(v)} | ({"b": f32(10 * (i + 1))} if i in (0, 4) else {}),
                        1) for i, v in enumerate((0, 1, 2, 3, 100))]
    new = combine(state, ups, cfg(aggregator="multi-krum", **{"krum-f": 1}))
    assert new["a"] == f32(1.5) and new["b"] == f32(30)


# -- the adaptive attacks stay inside the bounds they target ----------------------------------
def adaptive_round():
    """Six clients: 'h' held by all (a head, global value 0), 'pair' by clients 0 and 5,
    'alone' by client 0 only (a fresh LoRA B: zeros); honest updates N(0.3, 0.05^2)."""
    rng = np.random.default_rng(3)
    sent, updates = {}, {}
    for c in map(str, range(6)):
        sent[c] = {"h": np.zeros(8, np.float32)}
        if c in "05":
            sent[c]["pair"] = np.full(4, 0.5, np.float32)
        if c == "0":
            sent[c]["alone"] = np.zeros(4, np.float32)
        updates[c] = {n: rng.normal(0.3, 0.05, v.shape) for n, v in sent[c].items()}
    return sent, updates


@pytest.mark.parametrize("attackers", [["0"], ["0", "1"]])
@pytest.mark.parametrize("attack", ["alie", "ipm", "min-max", "min-sum", "flip-in-bound",
                                    "fewest", "lie"])
def test_each_adaptive_attack_stays_inside_screening(attack, attackers):
    from fedtune_app.tools.attacks import craft_round

    sent, updates = adaptive_round()
    c = cfg(**{"screen-peer-ratio": 10.0, "screen-max-growth": 5.0, "screen-rms-floor": 0.1})
    crafted = craft_round(attack, attackers, updates, sent, c)
    honest = [ClientUpdate(k, {n: sent[k][n] + d for n, d in t.items()}, 1)
              for k, t in updates.items() if k not in attackers]
    sent_all = [ClientUpdate(a, {n: sent[a][n] + d for n, d in t.items()}, 1)
                for a, t in crafted.items()]
    assert screen(honest + sent_all, sent, c) == {}  # nobody rejected, attackers included
    assert all(crafted[a].keys() == updates[a].keys() for a in attackers)
    ref = np.stack([updates[k]["h"] for k in updates if k not in attackers])
    mu, sigma = ref.mean(axis=0), ref.std(axis=0)
    h = crafted[attackers[0]]["h"]
    if attack == "alie":  # mu - 1.5 sigma: 1.5 std below the mean in every coordinate
        np.testing.assert_allclose(h, mu - 1.5 * sigma)
    if attack == "ipm":
        np.testing.assert_allclose(h, -2.0 * mu)
    if attack in ("min-max", "min-sum"):
        # the largest step along -mu that keeps the distance statistic within the honest one
        dist = lambda x: (max(np.linalg.norm(x - d) for d in ref) if attack == "min-max"  # noqa
                          else sum(np.linalg.norm(x - d) ** 2 for d in ref))
        limit = (max(np.linalg.norm(a - b) for a in ref for b in ref) if attack == "min-max"
                 else max(sum(np.linalg.norm(a - b) ** 2 for b in ref) for a in ref))
        p = -mu / np.linalg.norm(mu)
        gamma = float((h - mu) @ p)
        np.testing.assert_allclose(h, mu + gamma * p, atol=1e-12)
        assert dist(h) <= limit * (1 + 1e-12) and dist(mu + 1.001 * gamma * p) > limit
    if attack in ("flip-in-bound", "lie", "fewest"):
        # sign-flipped (fewest: only where the fewest hold it), as far as screening allows:
        # 1.25 x further on any such tensor and the attacker is rejected
        a = attackers[0]
        flipped = ["alone", "pair"] if attack == "fewest" else list(crafted[a])
        for name in crafted[a]:
            if name not in flipped:
                np.testing.assert_array_equal(crafted[a][name], updates[a][name])
                continue
            # fewest flips the honest holders' mean (its own update where it holds alone)
            others = [updates[k][name] for k in updates if k not in attackers and name in
                      updates[k]] or [updates[a][name]]
            direction = np.mean(others, axis=0) if attack == "fewest" else updates[a][name]
            assert float(crafted[a][name] @ direction) < 0
            louder = {k: dict(t) for k, t in crafted.items()}
            louder[a][name] = crafted[a][name] * 1.25
            ups = [ClientUpdate(k, {n: sent[k][n] + d for n, d in t.items()}, 1)
                   for k, t in louder.items()]
            assert a in screen(honest + ups, sent, c)


def test_an_adaptive_attacker_stays_within_its_training_reach():
    # screening judges 'h' by the attacker's training reach (0.05 here, far below the peer
    # rule's bound): the flip is shrunk x 0.8 at a time from -1000 x its update until within it
    from fedtune_app.tools.attacks import craft_round

    sent, updates = adaptive_round()
    c = cfg(**{"screen-peer-ratio": 10.0, "screen-max-growth": 5.0, "screen-rms-floor": 0.1})
    reach = {"0": {"h": 0.05}}
    crafted = craft_round("flip-in-bound", ["0"], updates, sent, c, reach=reach)
    h = crafted["0"]["h"]
    assert np.linalg.norm(h) <= 0.05 < 1.25 * np.linalg.norm(h)
    assert float(h @ updates["0"]["h"]) < 0
    ups = [ClientUpdate(k, {n: sent[k][n] + (crafted[k][n] if k in crafted else d)
                            for n, d in t.items()}, 1) for k, t in updates.items()]
    assert screen(ups, sent, c, reach=reach) == {}
    ups[0] = ClientUpdate("0", ups[0].tensors | {"h": sent["0"]["h"] + 1.25 * h}, 1)
    assert list(screen(ups, sent, c, reach=reach)) == ["0"]


# -- whole runs: an in-bound attacker against each defence -----------------------------------
def attack_grid(attack, attackers=(0,)):
    from fedtune_app.tools.attacks import AttackGrid

    return lambda app, nodes, rc, faults: AttackGrid(app, nodes, rc, resolve_config(rc),
                                                     attack, list(attackers))


def distance(a, b):
    return float(np.sqrt(sum(np.sum((a[n].astype(np.float64) - b[n]) ** 2) for n in b)))


# five clients with enough capacity for 3 holders of each of the 4 blocks (sum 14 >= 12)
COVERED = TWO_ROUNDS | {"capacities": "4,3,3,2,2", "min-holders": 3}


@pytest.mark.parametrize("defence", [
    {"aggregator": "fltrust"}, TWO_ROUNDS | {"aggregator": "clipped-mean"},
    TWO_ROUNDS | {"aggregator": "centred-clip"}, COVERED | {"aggregator": "centred-clip"},
    COVERED | {"aggregator": "multi-krum"}, COVERED | {"aggregator": "median"},
    COVERED | {"aggregator": "bulyan", "capacities": "4,3,3,2,2,2,2"}])
def test_an_in_bound_sign_flip_is_neutralised(defence, tmp_path):
    """Client 0 sends its update sign-flipped and scaled up to screening's bounds (never
    rejected): under the mean it drags the state far away; under each defence the state ends no
    further from the run without client 0's replies than the honest run does (the attacker
    weighs no more than an honest client). FLTrust gives it trust 0: exactly the dropped run."""
    from flwr.app import MessageType

    drop = {0: lambda msg, reply: None if msg.metadata.message_type == MessageType.TRAIN
            else reply}
    keys = TWO_ROUNDS | defence
    attacked = run(tmp_path / "a", grid_class=attack_grid("flip-in-bound"), **keys)
    assert all(not r["rejected"] for r in records(attacked))  # in bound: never rejected
    dropped = final_state(run(tmp_path / "d", faults=drop, **keys))
    honest = distance(final_state(run(tmp_path / "h", **keys)), dropped)
    undefended = distance(final_state(run(tmp_path / "m", grid_class=attack_grid(
        "flip-in-bound"), **keys | {"aggregator": "mean"})), dropped)
    got = distance(final_state(attacked), dropped)
    assert undefended > 5 * honest
    if defence["aggregator"] == "fltrust":
        assert got <= 1e-6 * honest
    else:
        assert got <= 1.5 * honest, (got, honest, undefended)


# -- Krum, Multi-Krum and Bulyan: selection, ties, f > 1 and several coordinates, by hand ------
# Seven 1-D updates; two far ones. Bulyan with f = 1 picks theta = 7 - 2 = 5 by Krum, one at a
# time over what is left (score = sum of squared distances to the len - 3 nearest others):
#   7 left (4 nearest): 3 -> 1 + 4 + 4 + 36 = 45 (to 2, 1, 5, 9), 5 -> 4 + 9 + 16 + 16 = 45:
#                       tie, the lower index (3 at index 5) is picked
#   6 left (3 nearest): 5 -> 9 + 16 + 16 = 41, 2 -> 1 + 9 + 49 = 59: 5
#   5 left (2 nearest): 2 -> 1 + 49 = 50, 1 -> 1 + 64 = 65, 9 -> 49 + 64 = 113: 2
#   4 left (1 nearest): 1 -> 64, 9 -> 64 (tie: index 2 before 4), 40 and -30 -> 31^2: 1
#   3 left (0 nearest): every score is 0: the first left, 40 (index 0)
# picked in index order (40, 1, 2, 3, 5), median 3, distances (37, 2, 1, 0, 2): the
# beta = 5 - 2 = 3 nearest are 3, 2 and, of the tie 1 / 5, the lower index 1 -> mean 2.
SEVEN = [40.0, -30.0, 1.0, 2.0, 9.0, 3.0, 5.0]


def test_bulyan_picks_by_krum_then_trims_per_coordinate():
    from fedtune_app.federated.robust import bulyan

    # second coordinate = 2 x the first: squared distances x 5, the same picks; each
    # coordinate trimmed on its own: (2, 4), not one median/mean over all values
    deltas = np.array([[v, 2 * v] for v in SEVEN])
    np.testing.assert_array_equal(bulyan(deltas, 1), [2.0, 4.0])
    # (the coordinate-wise median of all seven would be (3, 6), the mean of the picked 10.2)
    # f = 2 needs 4f + 3 = 11 holders: with 7, the coordinate-wise median; second coordinate
    # -v^2 sorted: -1600 -900 -81 -25 -9 -4 -1
    uneven = np.array([[v, -v * v] for v in SEVEN])
    np.testing.assert_array_equal(bulyan(uneven, 2), [3.0, -25.0])
    # f = 2, n = 11: nine values 0..8 and +-1000; theta = 7 picks (the central 1..7: every
    # pick's nearest neighbours are honest values), median 4, beta = 3 nearest: 3, 4, 5
    eleven = np.array([[v] for v in [*range(9), 1000.0, -1000.0]], dtype=np.float64)
    np.testing.assert_array_equal(bulyan(eleven, 2), [4.0])


def test_multi_krum_ties_keep_the_lower_index_and_f_two():
    from fedtune_app.federated.robust import krum_scores, multi_krum

    # 0..4 with f = 1: scores (1+4, 1+1, 1+1, 1+1, 1+4) = (5, 2, 2, 2, 5); keep n - f = 4: the
    # three 2s and, of the tie 5 / 5, index 0 -> values 0, 1, 2, 3; a second coordinate -x
    line = np.array([[v, -v] for v in range(5)], dtype=np.float64)
    np.testing.assert_array_equal(krum_scores(line, 1), [10, 4, 4, 4, 10])  # x (1 + 1)
    np.testing.assert_array_equal(multi_krum(line, 1), [1.5, -1.5])
    # f = 2 needs 2f + 3 = 7 holders: with 6 the coordinate-wise median
    # (Multi-Krum of the 4 best would give 2.75 in the second coordinate)
    six = np.array([[0, 6], [1, 4], [2, 0], [3, 1], [50, 2], [-9, 3]], dtype=np.float64)
    np.testing.assert_array_equal(multi_krum(six, 2), [1.5, 2.5])
    # fewer than f + 3 updates: no neighbours to sum, every score 0
    np.testing.assert_array_equal(krum_scores(line[:3], 1), [0, 0, 0])


def test_combine_with_bulyan_median_and_centred_clip_per_tensor():
    # 'a' held by seven clients (state 1: the deltas are SEVEN), 'b' by client 0 only
    state = {"a": f32(1, 1), "b": f32(7)}
    ups = [ClientUpdate(str(i), {"a": f32(1 + v, 1 + 2 * v)} | ({"b": f32(8)} if i == 0 else {}),
                        1) for i, v in enumerate(SEVEN)]
    new = combine(state, ups, cfg(aggregator="bulyan", **{"krum-f": 1}))
    np.testing.assert_array_equal(new["a"], f32(3, 5))
    assert new["b"] == f32(8)  # one holder: the median of one update
    # the median rule is not Bulyan: the coordinate-wise median of the seven, 1 + (3, 6)
    new = combine(state, ups, cfg(aggregator="median"))
    np.testing.assert_array_equal(new["a"], f32(4, 7))
    new = combine(state, ups, cfg(aggregator="multi-krum", **{"krum-f": 1}))
    assert new["b"] == f32(8)
    # centred clipping of a tensor with one holder, with and without a memory of centres:
    # tau 0 -> radius = the median gap = its own gap, nothing clipped
    for memory in ({}, None):
        new = combine(state, ups, cfg(aggregator="centred-clip"), memory=memory)
        assert new["b"] == f32(8)


def test_fltrust_edges_by_hand():
    from fedtune_app.federated.robust import fltrust_step, trust_scores

    with pytest.raises(ValueError, match="^aggregator = fltrust needs the server's update on "
                                         "its root set$"):
        trust_scores(UPDATES, STATE, None)
    state = {"a": f32(1, 1), "z": f32(0, 0)}
    server = {"a": np.array([0.6, 0.8]), "z": np.array([0.0, 0.0])}
    ups = [ClientUpdate("1", {"a": f32(4, 5)}, 1),      # delta (3, 4) from the state: cos 1
           ClientUpdate("2", {"a": f32(1.3, 1.4)}, 1),  # delta (0.3, 0.4): |u|^2 |g|^2 = 1/4
           ClientUpdate("3", {"a": f32(1, 1)}, 1),      # no change: trust 0, no 0/0
           ClientUpdate("4", {"z": f32(1, 2)}, 1)]      # the server did not move 'z': trust 0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scores = trust_scores(ups, state, server)
    assert scores["1"] == pytest.approx(1.0, rel=1e-6)  # float32 inputs
    assert scores["2"] == pytest.approx(1.0, rel=1e-6)
    assert scores["3"] == 0.0 and scores["4"] == 0.0
    # rescaling to ||server|| = 10: (0.3, 0.4) of norm 1/2 -> (6, 8); a zero update stays zero
    deltas = np.array([[0.3, 0.4], [0.0, 0.0]])
    np.testing.assert_allclose(fltrust_step(deltas, [1.0, 1.0], np.array([6.0, 8.0])),
                               [3.0, 4.0], rtol=1e-12)
    # nobody trusted: a zero step of the tensor's shape and dtype
    step = fltrust_step(deltas, [0.0, 0.0], np.array([6.0, 8.0]))
    assert step.shape == (2,) and step.dtype == np.float64 and not step.any()


def test_centred_clip_clips_short_gaps_and_keeps_zero_gaps():
    from fedtune_app.federated.robust import centred_clip

    # tau 0.5: the gap (1, 0) of norm 1 is clipped to (0.5, 0); the two zero gaps stay zero
    deltas = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    np.testing.assert_allclose(centred_clip(deltas, np.zeros(2), 0.5, 1), [1 / 6, 0.0],
                               rtol=1e-12)


def test_ties_at_the_cut_keep_the_lower_index():
    """Multi-Krum and Bulyan sort with a stable sort: of two equal scores / distances at the
    cut, the update of the lower index is kept (a same-seed run must not depend on how an
    unstable sort happens to order ties)."""
    from fedtune_app.federated.robust import bulyan, krum_scores, multi_krum

    # (4, 2, 0, 3, 0), f = 1, the 2 nearest: 4 -> 1 + 4, 2 -> 1 + 4, 0 -> 0 + 4, 3 -> 1 + 1,
    # 0 -> 0 + 4; keep 4 of 5: the tie 5 / 5 drops index 1 -> mean(4, 0, 3, 0) = 7/4
    tied = np.array([[4.0], [2.0], [0.0], [3.0], [0.0]])
    np.testing.assert_array_equal(krum_scores(tied, 1), [5, 5, 4, 2, 4])
    np.testing.assert_array_equal(multi_krum(tied, 1), [1.75])
    # Bulyan of (5, 0, 6, 5, -2, -2, 3), f = 1, Krum picks (len - 3 nearest):
    #   7 left: 3 -> 4 + 4 + 9 + 9 = 26 (to 5, 5, 0, 6), the 5s -> 0 + 1 + 4 + 25 = 30: 3
    #   6 left: 5 (index 0) -> 0 + 1 + 25 = 26, tie with index 3: index 0
    #   5 left: -2 -> 0 + 4 = 4, tie with the other -2: index 4
    #   4 left: 6 -> 1 (to 5), 5 -> 1: tie, index 2
    #   3 left (0, 5, -2): every score 0, the first: 0 (index 1)
    # picked (5, 0, 6, -2, 3), median 3, distances (2, 3, 3, 5, 0): beta = 3 keeps 3, 5 and,
    # of the tie 0 / 6, index 1: 0 -> mean(5, 0, 3) = 8/3
    np.testing.assert_allclose(bulyan(np.array([[5.0], [0], [6], [5], [-2], [-2], [3]]), 1),
                               [8 / 3], rtol=1e-15)


def test_a_k_cover_that_a_sampled_round_could_miss_stops_before_round_one(tmp_path):
    """3 of the 5 clients a round: the weakest draw, capacities 2, 2, 3, holds 7 < 3 x 4 block
    copies, so the run is refused when the strategy starts, not half-way through."""
    with pytest.raises(ConfigError, match=r"'clients-per-round' = 3 can draw has capacities "
                                          r"\[2, 2, 3\] \(sum 7\)"):
        run(tmp_path, **(COVERED | {"aggregator": "median", "clients-per-round": 3}))
    assert not any(tmp_path.iterdir())  # no results folder: nothing had started
