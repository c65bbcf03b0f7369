"""Clients that differ in LoRA rank on Flower's deployment engine: a real SuperLink and three
SuperNodes on loopback, each node declaring its own rank in ``--node-config`` (``rank=4``,
``rank=2``, ``rank=1``). The run config names no ranks, so without the declarations every client
would hold 'lora-r' = 8 (the smoke preset's): what the server sends, receives and merges shows
it planned from the ranks the nodes reported. FLoRA runs one round. The three devices' SuperNodes
share one warm node worker on this machine, as a simulation actor serves several virtual clients
(every message reaches it with its own node's context; a fresh ClientApp process per message is
tested in test_deployment.py). A node declaring more than
'lora-r' is refused at the start-up query, in process (the node config reaches the same ClientApp
handler).

Smoke preset: Mixer, 4 blocks, LoRA on mlp_tokens.fc2 (16 -> 16) and mlp_channels.fc2
(128 -> 32). Rank r of an (out x in) pair is r (in + out) floats: per block r (16 + 16) +
r (128 + 32) = 192 r; head 10 x 32 + 10 = 330. FLoRA also sends each block's merged delta,
16 x 16 + 32 x 128 = 4352 floats.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedtune_app.methods import resolve_config
from localdeploy import LocalDeployment, kinds_served, start_worker, stop_worker
from runs import assert_accuracy_counts_the_test_set

RANKS, CAPACITY, LORA_R = (4, 2, 1), 4, 8  # declared by the nodes; every node holds all blocks


# what client i trains and returns, 4 blocks x 192 r_i + 330 floats: 4 x 768 + 330,
# 4 x 384 + 330, 4 x 192 + 330 (rank 8 would be 6474 each)
TRAINABLE = {"0": 3402, "1": 1866, "2": 1098}
UP = 6366  # floats a round, from the three clients
FLORA_DOWN = UP + 3 * 4 * 4352  # 58590: and each block's merged delta


@pytest.mark.integration
def test_nodes_declaring_their_rank_train_flora_through_a_superlink(tmp_path):
    # one method through real processes (HetLoRA's zero-padding of the same ranks is checked
    # in-process in test_rank_methods.py): a second run here costs the suite 45 s
    worker, sock, key = start_worker(tmp_path)
    try:
        nodes = [f'partition-id={i} num-partitions={len(RANKS)} capacity={CAPACITY} rank={r} '
                 f'data-dir="{tmp_path / f"device-{i}"}" worker-address="{sock}" '
                 f'worker-authkey-file="{key}"' for i, r in enumerate(RANKS)]
        with LocalDeployment(tmp_path, nodes) as dep:
            done = dep.run(f'preset="smoke" method="flora" num-server-rounds=1 '
                           f'results-dir="{tmp_path / "flora"}" round-timeout=600.0', timeout=600)
            out = done.stdout + done.stderr
            assert done.returncode == 0, out + dep.logs()
            folder = Path(re.findall(r"RESULTS (\S+)", out)[-1])
        # each node's query (again if it reconnected) and train message, all by the one worker
        kinds = kinds_served(tmp_path / "worker.log", worker.pid, 6)
    finally:
        stop_worker(worker)
    assert all(p.poll() is not None for p in dep.procs)
    assert kinds.count("train") == 3 and kinds.count("query") >= 3, kinds
    cfg = resolve_config({"preset": "smoke"})
    assert (cfg.adapter.lora_r, cfg.federation.ranks) == (LORA_R, "")  # none in the run config
    tensors = 3 * (4 * 4 + 2)  # per client: A, B of 2 Linears in each of 4 blocks, head's 2
    clients = json.loads((folder / "config.json").read_text())["clients"]
    assert [(c["partition_id"], c["rank"]) for c in clients] == list(enumerate(RANKS))
    [m] = json.loads((folder / "metrics.json").read_text())
    assert m["rejected"] == {} and m["clients"] == [0, 1, 2]
    assert {c["pid"] for c in m["client-metrics"].values()} == {worker.pid}
    # each client was sent, trained and returned the first r_i components only
    assert m["trainable-params"] == TRAINABLE
    # float32 payload plus a small header per tensor
    assert 4 * UP <= m["bytes-up"] < 4 * UP + 256 * tensors, m["bytes-up"]
    sent = tensors + 3 * 4 * 2  # and the merged deltas
    assert 4 * FLORA_DOWN <= m["bytes-down"] < 4 * FLORA_DOWN + 256 * sent, m["bytes-down"]
    assert_accuracy_counts_the_test_set(m, cfg)
    check_flora_merge(load_file(str(folder / "state.safetensors")))


def check_flora_merge(state: dict[str, np.ndarray]) -> None:
    """After one round each merged delta is s sum_i p_i B_i A_i, a sum of products of ranks 4,
    2 and 1: rank 7 or less, computed in float64 and rounded once to float32. Rounding D adds E
    with |E_jk| <= u |D_jk| (u = 2^-24), so by Weyl the 8th singular value and beyond are at
    most ||E||_2 <= ||E||_F <= u ||D||_F <= u / (1 - u) ||delta||_F. Had every client held
    rank 8 (the nodes' ranks lost on the way), the 8th would be a trained component, as large
    as the others: the clients' A start as the first r_i rows of the round's one fresh A."""
    u = 2.0 ** -24
    deltas = {n: v for n, v in state.items() if n.endswith(".lora_delta")}
    assert len(deltas) == 4 * 2
    for name, delta in deltas.items():
        sv = np.linalg.svd(delta.astype(np.float64), compute_uv=False)
        assert sv[0] > 0, name  # it trained
        bound = 2 * u * np.linalg.norm(delta.astype(np.float64))  # 2: float64's own error
        assert sv[sum(RANKS):].max() <= bound, (name, sv)
    # the next round's adapters are fresh: B = 0
    assert all(not v.any() for n, v in state.items() if n.endswith(".lora_B.weight"))


def test_a_node_declaring_a_rank_above_lora_r_fails_the_start_up_query(tmp_path):
    """The node config's rank is checked against 'lora-r' where the node answers the query;
    the server stops the run naming the node and the value."""
    from fedtune_app.apps.client_app import app as client_app
    from fedtune_app.apps.server import run_federation
    from inprocess import InProcessGrid

    rc = {"preset": "smoke", "method": "flora", "num-server-rounds": 1,
          "results-dir": str(tmp_path)}
    nodes = [{"partition-id": i, "num-partitions": 2, "capacity": 4, "rank": r}
             for i, r in enumerate((4, 9))]
    grid = InProcessGrid(client_app, nodes, rc)
    with pytest.raises(RuntimeError) as err:
        run_federation(grid, resolve_config(rc))
    assert f"node {grid.node_ids[1]} failed the query: ConfigError: node config rank=9: rank 9 " \
           "is outside 1..8; ranks run from 1 to run-config key 'lora-r' = 8" in str(err.value)
    assert f"node {grid.node_ids[0]}" not in str(err.value)
