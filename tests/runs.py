"""Small helpers of the reliability tests: one in-process federated run, and its final state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from safetensors.numpy import load_file

from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.server import run_federation
from fedtune_app.config import RunConfig
from fedtune_app.methods import resolve_config
from inprocess import InProcessGrid, simulation_nodes

# the smoke preset, smaller still: a few seconds per round on a busy CPU
TINY = {"preset": "smoke", "partitioner": "iid", "train-subset": 240, "test-subset": 50}


def run(tmp_path, grid_class=InProcessGrid, faults=None, **keys) -> Path:
    rc = TINY | {"results-dir": str(tmp_path)} | keys
    cfg = resolve_config(rc)
    nodes = simulation_nodes(len(cfg.federation.capacity_list))
    return Path(run_federation(grid_class(client_app, nodes, rc, faults), cfg))


def final_state(folder) -> dict[str, np.ndarray]:
    return load_file(str(Path(folder) / "state.safetensors"))


def assert_same_tensors(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        assert a[name].tobytes() == b[name].tobytes(), name  # bit for bit (also -0.0 vs 0.0)


def assert_accuracy_counts_the_test_set(record: dict, cfg: RunConfig) -> None:
    """A single-model run's accuracy over its n test examples is k / n for a whole k, and k is
    the sum over the classes of n_c x the class's accuracy (the test labels counted here, from
    the run's data): an expectation a wrong denominator or a wrong class breaks, where
    ``0 <= accuracy <= 1`` would only catch NaN."""
    from fedtune_app.data.splits import run_splits

    counts = np.bincount(run_splits(cfg).test.labels.numpy())
    n = int(counts.sum())
    correct = record["accuracy-pooled"] * n
    assert abs(correct - round(correct)) < 1e-9 * n, (record["accuracy-pooled"], n)
    by_class = sum(int(k) * record["accuracy-per-class"][str(c)] for c, k in enumerate(counts))
    assert abs(by_class - correct) < 1e-9 * n, (by_class, correct)
    # which examples were right (the claims' bootstrap reads it): n of them, k right
    from fedtune_app.apps.evaluation import unpack_correct

    strata = [unpack_correct(v) for v in record["test-correct"].values()]
    assert sum(len(a) for a in strata) == n and sum(int(a.sum()) for a in strata) == round(correct)
