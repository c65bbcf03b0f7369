import numpy as np
import pytest

from fedtune_app.config import ConfigError
from fedtune_app.federated.allocation import (
    allocation_matrix,
    check_capacities,
    check_k_cover,
    covering_plans,
    draw_round_capacities,
    full_plans,
    k_cover_plans,
    prefix_plans,
    random_plans,
    smallest_prefix_plans,
    worst_round_capacities,
)

CAPS = [12, 10, 8, 6, 4, 3]


@pytest.mark.parametrize("draw", [random_plans, covering_plans])
def test_row_sums_equal_capacities_and_plans_are_ascending_sets(draw):
    rng = np.random.default_rng(0)
    for _ in range(50):
        plans = draw(CAPS, 12, rng)
        m = allocation_matrix(plans, 12)
        assert m.sum(1).tolist() == CAPS
        assert all(list(p) == sorted(set(p)) for p in plans)


def test_cover_all_holds_every_layer_even_when_capacities_barely_cover():
    rng = np.random.default_rng(1)
    for caps in ([4, 4, 4], [1] * 12, [6, 3, 3], [4, 4, 4, 2]):
        for _ in range(200):
            m = allocation_matrix(covering_plans(caps, 12, rng), 12)
            assert m.sum(0).min() >= 1
            assert m.sum(1).tolist() == caps


def test_keep_previous_can_leave_layers_uncovered():
    # with [4]*3 of 12, a random draw covers all 12 only with probability 34650/495^3 ~ 3e-4
    rng = np.random.default_rng(2)
    uncovered = [allocation_matrix(random_plans([4, 4, 4], 12, rng), 12).sum(0).min() == 0
                 for _ in range(100)]
    assert sum(uncovered) >= 95


def test_cover_all_refuses_capacities_that_cannot_cover_the_model():
    with pytest.raises(ConfigError) as err:
        covering_plans([4, 3, 3], 12, np.random.default_rng(0))
    assert str(err.value) == (
        "missing-layer-policy 'cover-all' needs the sampled clients to hold every block, but "
        "their capacities [4, 3, 3] sum to 10 < 12 blocks; use missing-layer-policy="
        "keep-previous or larger/more clients per round")


@pytest.mark.parametrize("draw", [random_plans, covering_plans])
def test_selection_frequency_matches_capacity_share(draw):
    # P(client i holds layer j) = L_i / L; 4000 draws: std of a frequency <= 0.008
    rng = np.random.default_rng(3)
    caps = [6, 3, 2, 1]
    total = sum(allocation_matrix(draw(caps, 12, rng), 12).astype(float) for _ in range(4000))
    freq = total / 4000
    expected = np.array(caps)[:, None] / 12 * np.ones((1, 12))
    assert np.abs(freq - expected).max() < 0.035


def test_same_seed_same_matrices_different_seed_different():
    def draws(seed):
        rng = np.random.default_rng(seed)
        return [random_plans(CAPS, 12, rng) for _ in range(5)]
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)


def test_depth_policies():
    assert prefix_plans([3, 1], 4) == [(0, 1, 2), (0,)]
    assert full_plans([3, 1], 4) == [(0, 1, 2, 3)] * 2
    assert smallest_prefix_plans([3, 2], 4) == [(0, 1)] * 2


@pytest.mark.parametrize("bad", [[0, 3], [13], [-1]])
def test_capacity_outside_one_to_L_is_rejected_with_the_allowed_range(bad):
    with pytest.raises(ConfigError, match=r"'capacities'.*allowed: 1\.\.12"):
        check_capacities(bad, 12)


def test_capacities_of_one_and_of_every_block_are_allowed_and_the_error_names_the_client():
    check_capacities([1, 12, 5], 12)  # both ends of 1..L
    with pytest.raises(ConfigError) as err:
        check_capacities([3, 0], 12)
    assert str(err.value) == ("run-config key 'capacities': client 1 has capacity 0; "
                              "allowed: 1..12 (the model has 12 blocks)")


def test_allsmall_with_a_given_depth_and_the_matrix_of_plans():
    assert smallest_prefix_plans([3, 2], 4, smallest=3) == [(0, 1, 2)] * 2
    m = allocation_matrix([(0, 2), (1,), ()], 3)
    assert m.tolist() == [[1, 0, 1], [0, 1, 0], [0, 0, 0]] and m.dtype == np.int8


def test_round_capacity_is_uniform_on_one_to_the_declared_capacity():
    rng = np.random.default_rng(4)
    draws = np.array([draw_round_capacities([3, 1], rng) for _ in range(3000)])
    assert set(draws[:, 1]) == {1}  # capacity 1 can only draw 1
    # P(1) = P(2) = P(3) = 1/3; the std of a frequency over 3000 draws is 0.0086, 0.04 > 4.5 x
    freq = np.bincount(draws[:, 0], minlength=4)[1:] / 3000
    assert np.abs(freq - 1 / 3).max() < 0.04 and draws.dtype.kind == "i"


def test_k_cover_every_block_k_holders():
    from fedtune_app.federated.allocation import k_cover_plans

    for seed in range(200):
        rng = np.random.default_rng(seed)
        plans = k_cover_plans([3, 2, 2, 2, 1], 4, rng, k=2)
        m = allocation_matrix(plans, 4)
        assert m.sum(axis=1).tolist() == [3, 2, 2, 2, 1] and m.sum(axis=0).min() >= 2
        # capacities summing to exactly k L: every block exactly k holders
        exact = allocation_matrix(k_cover_plans([2, 2, 2, 2, 1, 3], 4, rng, k=3), 4)
        assert exact.sum(axis=0).tolist() == [3, 3, 3, 3]
    with pytest.raises(ConfigError, match="'min-holders' = 3.*sum 10"):
        k_cover_plans([3, 2, 2, 2, 1], 4, np.random.default_rng(0), k=3)  # 10 < 12
    with pytest.raises(ConfigError, match="'min-holders' = 3"):
        k_cover_plans([4, 4], 4, np.random.default_rng(0), k=3)  # 2 clients


def test_k_cover_with_as_many_clients_as_k_and_its_message():
    # k = 2 clients of capacity 4 on 4 blocks: both hold everything
    assert k_cover_plans([4, 4], 4, np.random.default_rng(0), k=2) == [(0, 1, 2, 3)] * 2
    with pytest.raises(ConfigError) as err:
        k_cover_plans([3, 2, 2, 2, 1], 4, np.random.default_rng(0), k=3)
    assert str(err.value) == (
        "run-config key 'min-holders' = 3: every block held by 3 clients needs at least 3 "
        "clients whose capacities sum to >= 3 x 4 blocks = 12; this round's 5 clients have "
        "capacities [3, 2, 2, 2, 1] (sum 10)")


def test_a_k_cover_some_round_could_not_draw_is_refused_at_the_start():
    six = [4, 4, 3, 2, 2, 1]  # 4 blocks, k = 3: 3 x 4 = 12 entries a round
    check_k_cover(six, 4, 3)  # all six each round: 16 >= 12
    # 4 sampled: the weakest draw is the four smallest, 1 + 2 + 2 + 3 = 8 < 12
    assert worst_round_capacities(six, per_round=4) == [1, 2, 2, 3]
    with pytest.raises(ConfigError) as err:
        check_k_cover(six, 4, 3, per_round=4)
    assert str(err.value) == (
        "run-config key 'min-holders' = 3: every block held by 3 clients needs, in every round, "
        "3 clients whose capacities sum to >= 3 x 4 blocks = 12; the weakest round "
        "'clients-per-round' = 4 can draw has capacities [1, 2, 2, 3] (sum 8): lower "
        "'min-holders', or sample more clients")
    check_k_cover(six, 4, 3, per_round=5)  # 1 + 2 + 2 + 3 + 4 = 12: just enough
    # dynamic capacities: any client may draw 1 block, so six clients give 6 < 12
    assert worst_round_capacities(six, dynamic=True) == [1] * 6
    with pytest.raises(ConfigError, match=r"\[1, 1, 1, 1, 1, 1\] \(sum 6, dynamic"):
        check_k_cover(six, 4, 3, dynamic=True)
    check_k_cover(six, 2, 3, dynamic=True)  # 6 >= 3 x 2
    # one client of each domain: each domain's smallest, a: 4, b: min(3, 2) = 2, c: 1
    domains = ["a", "a", "b", "b", "c", "c"]
    assert worst_round_capacities([4, 4, 3, 2, 2, 1], domains=domains) == [4, 2, 1]
    with pytest.raises(ConfigError, match="one client of each domain can draw"):
        check_k_cover([4, 4, 3, 2, 2, 1], 4, 3, domains=domains)  # 7 < 12
    check_k_cover([4, 4, 3, 2, 2, 1], 2, 3, domains=domains)  # 7 >= 6, 3 domains >= k
    # each domain's smallest also where it is not the domain's last client
    assert worst_round_capacities([1, 4, 2, 3], domains=["a", "a", "b", "b"]) == [1, 2]
    with pytest.raises(ConfigError, match=r"the weakest round all clients can draw has "
                                          r"capacities \[4, 4\] \(sum 8\)"):
        check_k_cover([4, 4], 4, 3)  # k = 3 holders from 2 clients
