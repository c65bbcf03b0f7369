"""The app on Flower's deployment engine: a real SuperLink and SuperNodes on loopback, secure
as in production (TLS with our own CA, SuperNode authentication with registered keys), with the
credentials made by ``scripts/make_credentials.sh`` (the commands docs/deployment.md shows).

One federation checks a run as devices live it: each SuperNode declares its capacity in
``--node-config`` (the server must plan from what the nodes report, 3, 1 and 2 blocks, not from
the smoke preset's ``capacities`` 4,2,1), fetches the frozen checkpoint once (file:// here,
verified by hash), one device joins late and one is killed in round 2 and restarted. Devices 0
and 2 run a warm node worker beside their SuperNode (``fedtune node-worker``,
docs/deployment.md); device 1 names a worker that is not there and handles each message in a
fresh ClientApp process, which is also how a device without a worker runs. Slow (a dead node
is noticed after up to a minute of missed heartbeats): marked ``integration``.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from fedtune_app.methods import resolve_config
from localdeploy import ROOT, LocalDeployment, kinds_served, start_worker, stop_worker
from runs import assert_accuracy_counts_the_test_set

pytestmark = pytest.mark.integration

# smoke preset: Mixer, embed 32, 16 patches, token-MLP 16 -> 16 -> 16, channel-MLP
# 32 -> 128 -> 32, LoRA r=8 on the last FC of both (mlp_tokens.fc2, mlp_channels.fc2), 10
# classes. Per block: 8x16 + 16x8 + 8x128 + 32x8 = 1536 floats (4 tensors); head 32x10 + 10.
LORA_PER_BLOCK, HEAD = 8 * 16 + 16 * 8 + 8 * 128 + 32 * 8, 32 * 10 + 10


def wire_floats(capacities) -> int:
    return sum(c * LORA_PER_BLOCK + HEAD for c in capacities)


@pytest.fixture(scope="module")
def credentials(tmp_path_factory):
    out = tmp_path_factory.mktemp("credentials")
    subprocess.run([str(ROOT / "scripts" / "make_credentials.sh"), str(out), "4"], check=True,
                   capture_output=True, timeout=120)
    return {"tls": {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"},
            "keys": [(out / f"supernode-{i}", out / f"supernode-{i}.pub") for i in range(4)]}


def nodes_with(declared, data_dirs=None, more_keys=None):
    """Each device's --node-config: its partition and capacity, and its data-dir and other
    keys where given."""
    return [f"partition-id={i} num-partitions={len(declared)} capacity={c}"
            + (f' data-dir="{data_dirs[i]}"' if data_dirs else "")
            + (f" {more_keys[i]}" if more_keys else "")
            for i, c in enumerate(declared)]


def smoke_checkpoint(tmp_path: Path) -> tuple[Path, str]:
    """The smoke preset's Mixer, seeded, saved as the 'public' checkpoint devices fetch."""
    import hashlib

    import torch
    from safetensors.torch import save_file
    from timm.models.mlp_mixer import MlpMixer

    from conftest import TINY_MIXER

    torch.manual_seed(21)
    model = MlpMixer(num_classes=10, **TINY_MIXER.kwargs)  # smoke: img 8, patch 2, 4 blocks
    path = tmp_path / "public" / "mixer-smoke.safetensors"
    path.parent.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def poll_run(check, proc: subprocess.Popen, interval: float, timeout: float = 600):
    """``check()``'s first truthy value, polled while the run goes on; None once it ended."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            return None
        time.sleep(interval)
    return None


def wait_for_line(path: Path, pattern: str, proc: subprocess.Popen, dep: LocalDeployment,
                  timeout: float = 600) -> str:
    """The first line of the streamed run output matching ``pattern``."""
    found = poll_run(lambda: re.search(f".*{pattern}.*", path.read_text(errors="replace")),
                     proc, 1.0, timeout)
    if not found:
        pytest.fail(f"no line matching {pattern!r} in the run output:\n"
                    f"{path.read_text(errors='replace')}\n{dep.logs()}")
    return found.group(0)


def wait_for_rounds(results: Path, rounds: int, proc: subprocess.Popen, dep: LocalDeployment,
                    timeout: float = 600) -> None:
    """Until the ServerApp has written ``rounds`` round records to its metrics.json: written
    by the server process itself, so seen at once (the streamed run output can lag seconds)."""
    def recorded() -> bool:
        for path in results.glob("*/metrics.json"):
            with contextlib.suppress(ValueError):  # a file being replaced
                if len(json.loads(path.read_text())) >= rounds:
                    return True
        return False

    if not poll_run(recorded, proc, 0.1, timeout):
        pytest.fail(f"no metrics.json with {rounds} rounds under {results}\n{dep.logs()}")


def test_nodes_that_die_restart_or_join_late_train_in_the_same_run(tmp_path, credentials):
    """Under TLS and SuperNode authentication: partitions 0 and 1 start the run (min-nodes=2 of
    the 3 declared; a fourth device, whose key was never registered, is refused), partition 2's
    device is started in round 1 and joins when it is up; partition 1's SuperNode is killed as
    soon as round 1 is recorded (before its round-2 reply can exist: that needs a ClientApp
    process started and trained) and started again (same key, same node config) once the server
    has logged its failure. Round 2 reports that failure as node 1's own (Flower's
    NODE_UNAVAILABLE, sent by the SuperLink), the late and the restarted node train in later
    rounds with their own partitions, and metrics.json says per round who served what. Node 0's
    worker answers its start-up query and every round's train message in one process, building
    the backbone once, and node 2's its own; node 1, whose worker is missing, answers each
    message in a fresh ClientApp process."""
    # rounds enough that devices starting slowly (a minute or more on a loaded machine) train;
    # not 5: a key at pyproject's own value reaches the app as if unset, and the smoke preset's
    # 2 rounds would run
    declared, rounds = [3, 1, 2], 6
    checkpoint, sha = smoke_checkpoint(tmp_path)
    data_dirs = [tmp_path / f"device-{i}" for i in range(len(declared))]
    results = tmp_path / "results"
    with contextlib.ExitStack() as stack:
        workers = {}
        for i in (0, 2):  # there is no worker-1
            workers[i] = start_worker(tmp_path, f"worker-{i}")
            stack.callback(stop_worker, workers[i][0])
        # node 1 names worker-0's key, so that only its missing socket makes it fall back
        keys = {i: tmp_path / f"worker-{i if i in workers else 0}.key" for i in range(3)}
        with_workers = [f'worker-address="{tmp_path / f"worker-{i}.sock"}" '
                        f'worker-authkey-file="{keys[i]}"' for i in range(len(declared))]
        # a fourth device whose key was never registered (its node config is never read: the
        # SuperLink refuses it first)
        nodes = nodes_with(declared, data_dirs, with_workers) + ["partition-id=0 num-partitions=3"]
        dep = stack.enter_context(LocalDeployment(
            tmp_path, nodes, tls=credentials["tls"], auth_keys=credentials["keys"],
            registered=[0, 1, 2], started=[0, 1]))
        run, out = dep.run_in_background(
            f'preset="smoke" results-dir="{results}" min-nodes=2 '
            f'num-server-rounds={rounds} round-timeout=600.0 '
            f'checkpoint-url="{checkpoint.as_uri()}" checkpoint-sha256="{sha}" '
            f'checkpoint-dir="{tmp_path / "server-cache"}"')
        dep.launch_once(3, wait=0)  # refused while the run goes on
        wait_for_line(out, rf"\[ROUND 1/{rounds}\]", run, dep)
        assert dep.launch_once(2, wait=1) is None  # the late device, started without waiting
        wait_for_rounds(results, 1, run, dep)
        dep.kill_node(1)
        killed = time.time()
        # at once: refused, the SuperLink still lists the crashed instance as online
        assert dep.launch_once(1) not in (None, 0), dep.logs()
        refused = (tmp_path / "supernode-1-2.log").read_text()
        assert "Exit Code: 305" in refused and "Failed to activate SuperNode" in refused
        failure = wait_for_line(out, r"rejected client 1 \(node \d+\)", run, dep)
        logged = time.time()
        dep.start_node(1)  # the SuperLink reported it unavailable: now it is accepted
        back = time.time()
        try:
            run.wait(timeout=900)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the run did not finish\n{out.read_text()}\n{dep.logs()}")
        text = out.read_text(errors="replace")
        assert run.returncode == 0, text + dep.logs()
        assert dep.nodes[3].wait(timeout=120) != 0, dep.logs()  # refused, it gave up
        assert "No SuperNode found with the given public key" in \
            (tmp_path / "superlink.log").read_text()
        folder = Path(re.findall(r"RESULTS (\S+)", text)[-1])
        metrics = json.loads((folder / "metrics.json").read_text())
        # while the workers run: each logs a message it served after its reply has left
        check_workers(metrics, {i: proc.pid for i, (proc, _, _) in workers.items()}, tmp_path)
    assert all(p.poll() is not None for p in dep.procs)  # exactly ours, and all stopped
    ids = dep.node_ids  # key i -> the node id the SuperLink registered for it
    assert [m["round"] for m in metrics] == list(range(1, rounds + 1))
    served = [{int(p): n for p, n in m["nodes"].items()} for m in metrics]
    assert served[0] == {0: ids[0], 1: ids[1]}
    assert all(s[0] == ids[0] for s in served)
    # round 2: the SuperLink answered for the dead node; the failure is that node's own
    assert served[1][1] == ids[1]
    assert metrics[1]["errors"]["1"]["node"] == ids[1]
    assert metrics[1]["errors"]["1"]["name"] == "NODE_UNAVAILABLE"
    assert f"node {ids[1]}, Flower error 5 NODE_UNAVAILABLE" in metrics[1]["rejected"]["1"]
    assert f"(node {ids[1]})" in failure and "ignored node 1" not in text
    # the late node and the restarted one train later rounds with their own partitions
    late = [m["round"] for m in metrics if "2" in m["client-metrics"]]
    again = [m["round"] for m in metrics[2:] if "1" in m["client-metrics"]]
    assert late and again, (served, [m["rejected"] for m in metrics])
    assert all(s.get(2) in (None, ids[2]) for s in served)
    assert all(s[1] == ids[1] for s in served if 1 in s)  # a registered key keeps its node id
    clients = json.loads((folder / "config.json").read_text())["clients"]
    assert [(c["partition_id"], c["capacity"]) for c in clients] == list(enumerate(declared))
    for m in metrics:  # each node trained its own partition: its example count, every round
        assert {p: c["num-examples"] for p, c in m["client-metrics"].items()} == \
            {p: clients[int(p)]["num_examples"] for p in m["client-metrics"]}
    assert len({c["num_examples"] for c in clients}) == 3  # so they tell partitions apart
    # the checkpoint was fetched once per device; the restarted one found it in its data-dir
    # (0 bytes when the server noticed the restart and asked again, else its first answer)
    size = checkpoint.stat().st_size
    fetched = [c["checkpoint_bytes"] for c in clients]
    assert fetched[0] == fetched[2] == size and fetched[1] in (0, size), fetched
    for d in data_dirs:
        assert (d / "checkpoints" / f"{sha}.safetensors").read_bytes() == checkpoint.read_bytes()
    check_rounds(metrics, declared)
    allocation = json.loads((folder / "allocation.json").read_text())
    for entry in allocation:  # FedRA: every client holds exactly its declared number of blocks
        assert np.asarray(entry["matrix"]).sum(axis=1).tolist() == \
            [declared[p] for p in entry["clients"]]
    assert (folder / "state.safetensors").stat().st_size > 4 * (4 * LORA_PER_BLOCK + HEAD)
    trained = metrics[again[0] - 1]["started"]
    print(f"\nrestarted node: killed when round 1 was recorded; the server logged its failure "
          f"{logged - killed:.0f} s later; started again, it was up {back - logged:.0f} s "
          f"after that; round {again[0]} sent it work {trained - back:.0f} s later "
          f"({trained - killed:.0f} s after the kill, {again[0] - 2} round(s) later); the late "
          f"node trained first in round {late[0]}")


def check_workers(metrics: list[dict], worker_pids: dict[int, int], logs: Path) -> None:
    """Each worker served its node's start-up query and every train message the node was sent
    that round (node 0: all of them), in its one process, building the backbone once; node 1
    (its worker missing) handled each message in a process of its own."""
    for node, pid in worker_pids.items():
        trained = [m["client-metrics"][str(node)] for m in metrics
                   if str(node) in m["client-metrics"]]
        assert trained and (node != 0 or len(trained) == len(metrics)), (node, len(trained))
        kinds = kinds_served(logs / f"worker-{node}.log", pid, 1 + len(trained))
        # a node the SuperLink saw reconnect is asked its partition again: one query or more
        assert kinds[0] == "query" and kinds.count("train") == len(trained), kinds
        assert [(c["pid"], c["backbone-builds"]) for c in trained] == [(pid, 1)] * len(trained)
    cold = [m["client-metrics"]["1"]["pid"] for m in metrics if "1" in m["client-metrics"]]
    assert not set(cold) & set(worker_pids.values()) and len(set(cold)) == len(cold), cold
    node_1 = (logs / "supernode-1.log").read_text()
    assert "not reachable" in node_1 and "handling the train message in this process" in node_1


def check_rounds(metrics: list[dict], declared: list[int]) -> None:
    """Only the planned adapters and the head travel, for the clients sent work that round
    (float32 payload plus a small header per tensor); replies only from those that answered."""
    for m in metrics:
        sent = m["clients"]
        assert sorted(int(p) for p in m["nodes"]) == sent
        answered = [p for p in sent if str(p) not in m["rejected"]]
        for key, pids in (("bytes-down", sent), ("bytes-up", answered)):
            floats = wire_floats([declared[p] for p in pids])
            tensors = sum(4 * declared[p] + 2 for p in pids)  # LoRA A, B of 2 modules + head
            assert 4 * floats <= m[key] < 4 * floats + 256 * tensors, (key, m)
        assert m["trainable-params"] == {str(p): declared[p] * LORA_PER_BLOCK + HEAD
                                         for p in sent}
        assert np.isfinite(m["loss"])
        # the server evaluates on its own smoke test set, whatever the devices hold
        assert_accuracy_counts_the_test_set(m, resolve_config({"preset": "smoke"}))
    # the one rejected reply: the dead node's, round 2
    assert [sorted(m["rejected"]) for m in metrics] == [[], ["1"]] + [[]] * (len(metrics) - 2)
