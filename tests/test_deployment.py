"""The app on Flower's deployment engine: a real SuperLink and SuperNodes on loopback, secure
as in production (TLS with our own CA, SuperNode authentication with registered keys), with the
credentials made by ``scripts/make_credentials.sh`` (the commands docs/deployment.md shows).

Each SuperNode declares its capacity in ``--node-config``; the server must plan from what the
nodes report (3 and 1 blocks), not from the run config's ``capacities`` (4,2,1 in the smoke
preset). Slow (every message starts a fresh ClientApp process): marked ``integration``.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from localdeploy import ROOT, LocalDeployment

pytestmark = pytest.mark.integration

# smoke preset: Mixer, embed 32, 16 patches, token-MLP 16 -> 16 -> 16, channel-MLP
# 32 -> 128 -> 32, LoRA r=8 on the last FC of both (mlp_tokens.fc2, mlp_channels.fc2), 10
# classes. Per block: 8x16 + 16x8 + 8x128 + 32x8 = 1536 floats (4 tensors); head 32x10 + 10.
LORA_PER_BLOCK, HEAD = 8 * 16 + 16 * 8 + 8 * 128 + 32 * 8, 32 * 10 + 10


def wire_floats(capacities) -> int:
    return sum(c * LORA_PER_BLOCK + HEAD for c in capacities)


def run_and_check(dep: LocalDeployment, tmp_path: Path, declared: list[int],
                  extra: str = "") -> dict:
    results = tmp_path / "results"
    run_config = (f'preset="smoke" results-dir="{results}" min-nodes={len(declared)} '
                  f'round-timeout=600.0 {extra}')
    try:
        done = dep.run(run_config, timeout=900)
    except subprocess.TimeoutExpired:
        pytest.fail(f"flwr run did not finish in 900 s\n{dep.logs()}")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out + dep.logs()
    found = re.findall(r"RESULTS (\S+)", out)
    assert found, f"no RESULTS line in the run's output:\n{out}\n{dep.logs()}"
    folder = Path(found[-1])
    assert folder.parent == results

    config = json.loads((folder / "config.json").read_text())
    assert [c["capacity"] for c in config["clients"]] == declared
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    floats = wire_floats(declared)
    tensors = sum(4 * c + 2 for c in declared)  # LoRA A and B of 2 modules per block + head
    for m in metrics:
        assert m["clients"] == list(range(len(declared))) and m["rejected"] == {}
        # only the planned adapters + head travel: float32 payload plus a small header per tensor
        assert 4 * floats <= m["bytes-down"] < 4 * floats + 256 * tensors
        assert m["bytes-up"] == m["bytes-down"]  # replies carry the same names and shapes
        assert m["trainable-params"] == {str(p): c * LORA_PER_BLOCK + HEAD
                                         for p, c in enumerate(declared)}
        assert 0.0 <= m["accuracy"] <= 1.0 and np.isfinite(m["loss"])
    allocation = json.loads((folder / "allocation.json").read_text())
    for entry in allocation:  # FedRA: every client holds exactly its declared number of blocks
        assert np.asarray(entry["matrix"]).sum(axis=1).tolist() == declared
    assert (folder / "state.safetensors").stat().st_size > 4 * (4 * LORA_PER_BLOCK + HEAD)
    return {"metrics": metrics, "config": config, "folder": folder}


@pytest.fixture(scope="module")
def credentials(tmp_path_factory):
    out = tmp_path_factory.mktemp("credentials")
    subprocess.run([str(ROOT / "scripts" / "make_credentials.sh"), str(out), "2"], check=True,
                   capture_output=True, timeout=120)
    return {"tls": {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"},
            "keys": [(out / f"supernode-{i}", out / f"supernode-{i}.pub") for i in range(2)]}


def nodes_with(declared, data_dirs=None):
    return [f"partition-id={i} num-partitions={len(declared)} capacity={c}"
            + (f' data-dir="{data_dirs[i]}"' if data_dirs else "")
            for i, c in enumerate(declared)]


def smoke_checkpoint(tmp_path: Path) -> tuple[Path, str]:
    """The smoke preset's Mixer, seeded, saved as the 'public' checkpoint devices fetch."""
    import hashlib

    import torch
    from conftest import TINY_MIXER
    from safetensors.torch import save_file
    from timm.models.mlp_mixer import MlpMixer

    torch.manual_seed(21)
    model = MlpMixer(num_classes=10, **TINY_MIXER.kwargs)  # smoke: img 8, patch 2, 4 blocks
    path = tmp_path / "public" / "mixer-smoke.safetensors"
    path.parent.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path, hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_fedra_rounds_over_tls_with_authenticated_supernodes(tmp_path, credentials):
    """Devices without the frozen checkpoint fetch it once (file:// here), verified by hash."""
    declared = [3, 1]
    checkpoint, sha = smoke_checkpoint(tmp_path)
    data_dirs = [tmp_path / f"device-{i}" for i in range(len(declared))]
    dep = LocalDeployment(tmp_path, nodes_with(declared, data_dirs), tls=credentials["tls"],
                          auth_keys=credentials["keys"])
    with dep:
        out = run_and_check(dep, tmp_path, declared,
                            f'checkpoint-url="{checkpoint.as_uri()}" checkpoint-sha256="{sha}" '
                            f'checkpoint-dir="{tmp_path / "server-cache"}"')
    assert all(p.poll() is not None for p in dep.procs)  # exactly ours, and all stopped
    size = checkpoint.stat().st_size
    assert [c["checkpoint_bytes"] for c in out["config"]["clients"]] == [size, size]
    for d in data_dirs:
        assert (d / "checkpoints" / f"{sha}.safetensors").read_bytes() == checkpoint.read_bytes()


def test_unregistered_supernode_is_refused(tmp_path, credentials):
    dep = LocalDeployment(tmp_path, nodes_with([3, 1]), tls=credentials["tls"],
                          auth_keys=credentials["keys"], registered=[0])
    with dep:
        assert dep.nodes[1].wait(timeout=120) != 0, dep.logs()  # refused: it gives up
        deadline, online = time.time() + 60, set()
        while time.time() < deadline and not online:
            online = dep.online_nodes()
            time.sleep(1)
        assert online == {dep.node_ids[0]}, dep.logs()
        assert "No SuperNode found with the given public key" in \
            (tmp_path / "superlink.log").read_text()
    assert all(p.poll() is not None for p in dep.procs)
