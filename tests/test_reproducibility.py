"""Same seed, same run; another seed, another run: allocation matrices, client
sampling, partitions, initial adapters and (on CPU) the final tensors of a whole run."""

import numpy as np
import pytest

from conftest import TINY_MIXER
from fedtune_app.data.splits import partition_indices
from fedtune_app.federated.strategy import ClientInfo
from fedtune_app.methods import METHODS, resolve_config
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, initial_state
from fedtune_app.model.backbones import build_backbone
from runs import assert_same_tensors, final_state, run

CAPACITIES = (4, 3, 2, 2, 1)
CLIENTS = [ClientInfo(node_id=500 - i, partition_id=i, capacity=c, num_examples=10, group="g")
           for i, c in enumerate(CAPACITIES)]


def rounds(method: str, seed: int, policy="keep-previous", count=6):
    """(sampled partition ids, allocation matrix) of ``count`` rounds."""
    cfg = resolve_config({"preset": "smoke", "method": method, "seed": seed,
                          "clients-per-round": 3, "capacities": "4,3,2,2,1",
                          "missing-layer-policy": policy})
    strategy = METHODS[method].strategy(cfg, CLIENTS, 4, {})
    out = []
    for r in range(1, count + 1):
        sampled = strategy.sample_clients()
        plans = strategy.plan_round(r, sampled)
        out.append(([c.partition_id for c in sampled], [list(p) for p in plans]))
    return out


@pytest.mark.parametrize("method, policy", [("fedra", "keep-previous"), ("fedra", "cover-all"),
                                            ("all-small", "keep-previous")])
def test_allocation_and_sampling_follow_the_seed(method, policy):
    first = rounds(method, 0, policy)
    assert rounds(method, 0, policy) == first
    assert rounds(method, 1, policy) != first
    for sampled, plans in first:  # and they are what they claim to be
        assert len(sampled) == 3 == len(set(sampled))
        assert [len(p) for p in plans] == ([CAPACITIES[i] for i in sampled]
                                           if method == "fedra" else [1, 1, 1])


@pytest.mark.parametrize("partitioner", ["dirichlet", "iid"])
def test_partitions_follow_the_seed(partitioner):
    labels = tuple(np.arange(400) % 10)
    split = lambda seed: partition_indices(labels, None, 4, partitioner, 0.5, 10, seed)  # noqa: E731
    assert split(3) == split(3) and split(3) != split(4)
    for parts in (split(3), split(4)):  # each a partition of all 400 examples
        assert sorted(i for part in parts for i in part) == list(range(400))


def test_initial_adapters_follow_the_seed():
    model = attach_adapters(build_backbone(TINY_MIXER), AdapterSpec())
    a, b, c = initial_state(model, 0), initial_state(model, 0), initial_state(model, 1)
    assert_same_tensors(a, b)
    assert any(not np.array_equal(a[k], c[k]) for k in a)


def test_whole_runs_repeat_bit_for_bit_and_another_seed_differs(tmp_path):
    # LoRA dropout 0.1 is on: the clients' dropout masks must follow the seed too
    keys = {"num-server-rounds": 1, "clients-per-round": 2}
    first, again = run(tmp_path / "a", **keys), run(tmp_path / "b", **keys)
    other = run(tmp_path / "c", seed=1, **keys)
    assert_same_tensors(final_state(first), final_state(again))
    a, c = final_state(first), final_state(other)
    assert any(not np.array_equal(a[k], c[k]) for k in a)
