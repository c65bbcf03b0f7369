import numpy as np

from fedtune_app.federated.aggregation import (
    ClientUpdate,
    keyed_weighted_mean,
    masked_weighted_mean,
    reply_problem,
)


def f32(*v):
    return np.array(v, dtype=np.float32)


def test_weighted_mean_by_example_counts_and_untouched_layers_keep_their_value():
    state = {"blocks.0.a": f32(0, 0), "blocks.1.a": f32(5, 5), "head.w": f32(1)}
    updates = [
        ClientUpdate("a", {"blocks.0.a": f32(1, 2), "head.w": f32(3)}, 10),
        ClientUpdate("b", {"blocks.0.a": f32(4, 8), "head.w": f32(6)}, 30),
    ]
    new = masked_weighted_mean(state, updates)
    # (10*1 + 30*4)/40 = 3.25, (10*2 + 30*8)/40 = 6.5, (10*3 + 30*6)/40 = 5.25
    np.testing.assert_allclose(new["blocks.0.a"], [3.25, 6.5])
    np.testing.assert_allclose(new["head.w"], [5.25])
    np.testing.assert_array_equal(new["blocks.1.a"], [5, 5])  # nobody held block 1 (Eq. 2)
    np.testing.assert_array_equal(state["blocks.0.a"], [0, 0])  # input not modified
    assert new["blocks.0.a"].dtype == np.float32


def test_each_layer_averages_only_over_its_holders():
    state = {"blocks.0.a": f32(0), "blocks.1.a": f32(0)}
    updates = [ClientUpdate("a", {"blocks.0.a": f32(2)}, 1),
               ClientUpdate("b", {"blocks.0.a": f32(5), "blocks.1.a": f32(7)}, 2),
               ClientUpdate("c", {"blocks.1.a": f32(1)}, 6)]
    new = masked_weighted_mean(state, updates)
    np.testing.assert_allclose(new["blocks.0.a"], [(2 * 1 + 5 * 2) / 3])  # 4.0
    np.testing.assert_allclose(new["blocks.1.a"], [(7 * 2 + 1 * 6) / 8])  # 2.5


def test_reply_checks_name_every_problem():
    sent = {"blocks.0.a": f32(0, 0), "head.w": f32(0)}
    ok = {"blocks.0.a": f32(1, 1), "head.w": f32(2)}
    assert reply_problem(ok, sent, 5, 10) is None
    assert "missing" in reply_problem({"head.w": f32(1)}, sent, 5)
    assert "outside its plan" in reply_problem({**ok, "blocks.3.a": f32(1)}, sent, 5)
    assert "shape" in reply_problem({**ok, "head.w": f32(1, 2)}, sent, 5)
    assert "dtype" in reply_problem({**ok, "head.w": np.array([1.0])}, sent, 5)
    assert "NaN or Inf" in reply_problem({**ok, "head.w": f32(np.inf)}, sent, 5)
    assert "NaN or Inf" in reply_problem({**ok, "head.w": f32(np.nan)}, sent, 5)
    assert "positive integer" in reply_problem(ok, sent, 0)
    assert "positive integer" in reply_problem(ok, sent, 2.5)
    assert "exceeds" in reply_problem(ok, sent, 11, 10)


def test_reply_messages_name_at_most_three_tensors_and_the_edges_pass():
    sent = {n: f32(0) for n in "abcd"}
    reply = {n: f32(1) for n in "abcd"}
    # four missing: the first three named, then "..."; exactly three: no "..."
    assert reply_problem({}, sent, 5) == "missing tensors ['a', 'b', 'c']..."
    assert reply_problem({"d": f32(1)}, sent, 5) == "missing tensors ['a', 'b', 'c']"
    extra = {n: f32(1) for n in "efgh"}
    assert reply_problem(reply | extra, sent, 5) == "tensors outside its plan ['e', 'f', 'g']..."
    del extra["h"]
    assert reply_problem(reply | extra, sent, 5) == "tensors outside its plan ['e', 'f', 'g']"
    # one example is a positive count, and a client may send as many as it declared
    assert reply_problem(reply, sent, 1) is None
    assert reply_problem(reply, sent, 10, 10) is None
    assert reply_problem(reply, sent, np.int64(3), 10) is None
    assert "positive integer" in reply_problem(reply, sent, True)


def test_keyed_mean_shares_one_value_over_every_name_of_a_key():
    state = {"x.0": f32(0), "x.1": f32(0), "y": f32(5), "z": f32(2)}
    keys = {"x.0": "x", "x.1": "x", "y": "y", "z": "z"}
    updates = [ClientUpdate("b", {"x.1": f32(9), "z": f32(4)}, 3),
               ClientUpdate("a", {"x.0": f32(1)}, 1)]
    new = keyed_weighted_mean(state, updates, keys)
    # key x: (1 x 1 + 3 x 9) / 4 = 7 under both of its names; y was sent by nobody; z one holder
    assert new == {"x.0": f32(7), "x.1": f32(7), "y": f32(5), "z": f32(4)}
    assert all(v.dtype == np.float32 for v in new.values())
    assert state["x.0"] == f32(0)  # input not modified
