"""Capacity profiles, dynamic capacities and the domain partitioners."""

import numpy as np
import pytest

from fedtune_app.config import ConfigError, parse_int_list
from fedtune_app.data.scenarios import check_scenario, client_capacities, num_clients
from fedtune_app.data.splits import client_examples, client_group, partition_indices, run_splits
from fedtune_app.federated.allocation import draw_round_capacities
from fedtune_app.methods import resolve_config


def cfg_of(**keys):
    return resolve_config({k.replace("_", "-"): v for k, v in keys.items()})


def test_repetition_syntax_expresses_all_smaller_profiles():
    assert parse_int_list("capacities", "4*6") == [4] * 6
    assert parse_int_list("capacities", "10*2,6*2,4*2") == [10, 10, 6, 6, 4, 4]
    with pytest.raises(ConfigError, match="'capacities'.*'4\\*6'"):
        parse_int_list("capacities", "4*x")


def test_per_domain_profile_gives_each_client_its_domain_capacity():
    cfg = cfg_of(capacity_profile="per-domain", capacities="12,10,8,6,4,3", clients_per_domain=5,
                 partitioner="domain-dirichlet", dataset="multi-domain-digits")
    assert num_clients(cfg) == 30
    caps = client_capacities(cfg)
    assert caps[:5] == [12] * 5 and caps[5:10] == [10] * 5 and caps[25:] == [3] * 5


def test_ratio_profile_largest_remainder_counts_and_seeded_placement():
    cfg = cfg_of(capacity_profile="ratio", capacities="3,6,9,12", capacity_ratio="3:3:2:2",
                 num_clients=100)
    caps = client_capacities(cfg)
    assert [caps.count(v) for v in (3, 6, 9, 12)] == [30, 30, 20, 20]
    # 7 clients: shares 2.1, 2.1, 1.4, 1.4 -> floors 2,2,1,1 and the one left goes to the first
    # largest remainder (0.4, level 9)
    seven = client_capacities(cfg_of(capacity_profile="ratio", capacities="3,6,9,12",
                                     capacity_ratio="3:3:2:2", num_clients=7))
    assert sorted(seven) == [3, 3, 6, 6, 9, 9, 12]
    assert client_capacities(cfg) == caps  # same seed, same placement
    other = client_capacities(cfg_of(capacity_profile="ratio", capacities="3,6,9,12",
                                     capacity_ratio="3:3:2:2", num_clients=100, seed=1))
    assert other != caps and sorted(other) == sorted(caps)


@pytest.mark.parametrize("keys, message", [
    (dict(capacity_profile="ratio", capacities="3,6", capacity_ratio="3:3:2:2", num_clients=10),
     "'capacity-ratio'.*4 parts.*2 levels"),
    (dict(capacity_profile="ratio", capacities="3,6", capacity_ratio="3:x", num_clients=10),
     "'capacity-ratio'.*'3:3:2:2'"),
    (dict(capacity_profile="ratio", capacities="3,6", capacity_ratio="1:1"),
     "'num-clients' > 0"),
    (dict(capacities="6,5,4", num_clients=4), "'num-clients' = 4.*describes 3"),
])
def test_bad_profiles_are_named(keys, message):
    with pytest.raises(ConfigError, match=message):
        client_capacities(cfg_of(**keys))


def test_scenario_checks_domains_and_clients_agree():
    """Checked where the run config is resolved: a bad scenario never reaches a node."""
    ok = cfg_of(dataset="multi-domain-digits", partitioner="domain", capacities="6,5,4,3,2,2")
    check_scenario(ok, 6)
    digits = {"dataset": "multi-domain-digits"}  # 6 domains
    with pytest.raises(ConfigError, match="6 domains.*makes 6 clients.*describes 5"):
        cfg_of(partitioner="domain", capacities="6,5,4,3,2", **digits)
    with pytest.raises(ConfigError, match="needs a data set with domains"):
        cfg_of(partitioner="domain", capacities="6,5")
    with pytest.raises(ConfigError, match="'per-domain' needs 'partitioner'"):
        cfg_of(capacity_profile="per-domain", capacities="6,5")
    with pytest.raises(ConfigError, match="lists 2 values but the data set uses 6 domains"):
        cfg_of(capacity_profile="per-domain", capacities="6,5", partitioner="domain-dirichlet",
               clients_per_domain=3, **digits)
    # the same rule asked directly, of a data set without domains given a count of 6
    no_domains = cfg_of(capacities="6,5,4,3,2").replace(partitioner="domain")
    with pytest.raises(ConfigError, match="6 domains.*makes 6 clients.*describes 5"):
        check_scenario(no_domains, 6)


def test_dynamic_capacities_are_uniform_on_1_to_capacity():
    rng = np.random.default_rng(0)
    draws = np.array([draw_round_capacities([4, 2], rng) for _ in range(4000)])
    assert draws[:, 0].min() == 1 and draws[:, 0].max() == 4 and set(draws[:, 1]) == {1, 2}
    # U[1, 4]: each value has probability 1/4 -> 1000 of 4000 (sd ~27)
    counts = np.bincount(draws[:, 0], minlength=5)[1:]
    assert np.all(np.abs(counts - 1000) < 150), counts


def _domain_table(per_domain=40, num_domains=3, seed=0):
    rng = np.random.default_rng(seed)
    labels = tuple(int(v) for v in rng.integers(0, 4, size=per_domain * num_domains))
    domains = tuple(int(d) for d in np.repeat(np.arange(num_domains), per_domain)[
        rng.permutation(per_domain * num_domains)])
    return labels, domains


def test_feature_skew_gives_client_i_all_of_domain_i():
    labels, domains = _domain_table()
    parts = partition_indices(labels, domains, 3, "domain", 0.5, 1, 0)
    for i, part in enumerate(parts):
        assert sorted(part) == [j for j, d in enumerate(domains) if d == i]


def test_feature_and_label_skew_splits_each_domain_in_k_clients():
    labels, domains = _domain_table()
    parts = partition_indices(labels, domains, 6, "domain-dirichlet", 0.5, 2, 0)
    assert sorted(j for p in parts for j in p) == list(range(len(labels)))  # disjoint cover
    for pid, part in enumerate(parts):
        assert {domains[j] for j in part} == {pid // 2} and len(part) >= 2
    assert partition_indices(labels, domains, 6, "domain-dirichlet", 0.5, 2, 0) == parts
    assert partition_indices(labels, domains, 6, "domain-dirichlet", 0.5, 2, 1) != parts
    with pytest.raises(ConfigError, match="4 clients cannot be split evenly over 3 domains"):
        partition_indices(labels, domains, 4, "domain-dirichlet", 0.5, 2, 0)
    with pytest.raises(ConfigError, match="needs a data set with domains"):
        partition_indices(labels, None, 3, "domain", 0.5, 2, 0)


def test_group_dirichlet_gives_every_group_every_class_and_each_client_a_skewed_share():
    # 10 classes x 30 examples; 10 clients placed 3:3:2:2 by the ratio's seeded permutation
    labels = tuple(int(c) for c in np.repeat(np.arange(10), 30))
    groups = (0, 1, 0, 3, 1, 2, 0, 1, 2, 3)
    parts = partition_indices(labels, None, 10, "group-dirichlet", 0.1, 2, 0, groups=groups)
    assert sorted(j for p in parts for j in p) == list(range(300))  # a disjoint cover
    held = np.zeros((4, 10), int)  # examples of each class per group
    for pid, part in enumerate(parts):
        np.add.at(held[groups[pid]], [labels[j] for j in part], 1)
    # every class dealt in proportion to the groups' clients: 30 * 3/10 = 9, 30 * 2/10 = 6
    assert held.tolist() == [[9] * 10, [9] * 10, [6] * 10, [6] * 10]
    # Dirichlet(0.1) inside a group: a client holds far fewer than the 10 classes its group has
    assert np.mean([len({labels[j] for j in p}) for p in parts]) < 8
    assert partition_indices(labels, None, 10, "group-dirichlet", 0.1, 2, 0, groups=groups) \
        == parts
    assert partition_indices(labels, None, 10, "group-dirichlet", 0.1, 2, 1, groups=groups) \
        != parts
    with pytest.raises(ConfigError, match="'group-dirichlet' needs model groups"):
        partition_indices(labels, None, 10, "group-dirichlet", 0.1, 2, 0)


def test_group_dirichlet_splits_by_the_ratio_placement_for_every_arm():
    from fedtune_app.data.groups import node_model_group, ratio_groups

    keys = dict(dataset="digits", partitioner="group-dirichlet", dirichlet_alpha=0.1,
                min_partition_size=2, capacities="1*10", model="vit_tiny_patch16_224",
                model_groups="vit_tiny_patch16_224",
                model_group_args="img_size=16,patch_size=4,in_chans=3,embed_dim=8,depth=1,"
                "num_heads=1;img_size=16,patch_size=4,in_chans=3,embed_dim=16,depth=1,num_heads=1",
                model_group_sources="random", model_group_ratio="3:2", seed=4)
    homo, all_small = cfg_of(method="homo", **keys), cfg_of(method="all-small", **keys)
    assert [node_model_group(homo, p, 10, 1) for p in range(10)] == list(ratio_groups(homo, 10))
    assert ratio_groups(all_small, 10) == ratio_groups(homo, 10)  # not AllSmall's one group
    splits = run_splits(homo)
    for pid in (0, 7):
        assert client_examples(homo, splits, pid, 10).labels.tolist() == \
            client_examples(all_small, splits, pid, 10).labels.tolist()
    with pytest.raises(ConfigError, match="'group-dirichlet'.*needs 'model-groups'"):
        check_scenario(cfg_of(partitioner="group-dirichlet"), None)


def test_domain_clients_report_their_domain_as_group():
    cfg = cfg_of(dataset="multi-domain-digits", partitioner="domain-dirichlet",
                 clients_per_domain=2, capacity_profile="per-domain",
                 capacities="4,4,3,3,2,2", model="vit_tiny_patch16_224", model_source="random")
    splits = run_splits(cfg)
    assert [client_group(cfg.data, splits, p, 12) for p in (0, 1, 2, 11)] == [
        "original", "original", "rotated", "coloured"]
    plain = cfg_of(dataset="digits", model="vit_tiny_patch16_224")
    assert client_group(plain.data, run_splits(plain), 3, 6) == "client-3"


def test_dynamic_capacities_drive_every_method_and_repeat_with_the_seed():
    from fedtune_app.federated.strategy import ClientInfo
    from fedtune_app.methods import METHODS

    cfg = cfg_of(capacities="12*6", dynamic_capacities=True, seed=3)
    clients = [ClientInfo(100 + i, i, 12, 10, f"client-{i}") for i in range(6)]

    def three_rounds(method):
        strategy = METHODS[method].strategy(cfg, clients, 12, {})
        rounds = []
        for r in range(3):
            drawn = strategy.round_clients(clients)
            rounds.append(([c.capacity for c in drawn], strategy.plan_round(r + 1, drawn)))
        return rounds

    fedra = three_rounds("fedra")
    assert fedra == three_rounds("fedra")  # same seed, same capacities and plans
    caps = [c for round_caps, _ in fedra for c in round_caps]
    assert all(1 <= c <= 12 for c in caps) and len(set(caps)) > 3  # they do change
    for round_caps, plans in fedra:
        assert [len(p) for p in plans] == round_caps  # FedRA holds exactly L_i blocks
    assert fedra[0][0] != fedra[1][0]
    # AllSmall ignores the draws (FedRA Table 4 repeats Table 1's AllSmall row): the model of
    # 'all-small-layers' blocks every round
    cfg = cfg.replace(**{"method": "all-small", "all-small-layers": 3})
    for _, plans in three_rounds("all-small"):
        assert plans == [(0, 1, 2)] * 6


def test_dirichlet_with_quantity_skew_lets_big_clients_keep_growing():
    # 3 classes x 200 examples, 6 clients: the average size N / K is 100
    labels = (0,) * 200 + (1,) * 200 + (2,) * 200
    grew = 0
    for seed in (0, 1, 2):
        counts = {}
        for balanced in (True, False):
            parts = partition_indices(labels, None, 6, "dirichlet", 0.5, 1, seed, balanced)
            assert sorted(i for p in parts for i in p) == list(range(600))  # disjoint, complete
            counts[balanced] = [[sum(labels[i] == c for i in p) for c in range(3)]
                                for p in parts]
        # the first class is split by the same Dirichlet draw either way
        assert [c[0] for c in counts[True]] == [c[0] for c in counts[False]]
        for per_class in counts[True]:  # self-balancing: above 100, no later class
            for c in (1, 2):
                if sum(per_class[:c]) > 100:
                    assert per_class[c] == 0
        grew += sum(per_class[2] > 0 for per_class in counts[False]
                    if sum(per_class[:2]) > 100)
    assert grew > 0  # without it a client above the average still draws later classes
    assert cfg_of().data.dirichlet_self_balancing is True  # the default is unchanged
    for preset in ("heterotune-t1-cifar10", "heterotune-t5-cifar10-ratio"):
        assert cfg_of(preset=preset).data.dirichlet_self_balancing is False
