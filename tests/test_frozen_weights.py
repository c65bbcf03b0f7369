"""Frozen weights on devices: a node fetches the public checkpoint once, verified by SHA-256,
and reports that one-time cost apart from the per-round adapter bytes."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from safetensors.torch import save_file

from conftest import TINY_VIT
from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.server import run_federation
from fedtune_app.config import ConfigError, RunConfig
from fedtune_app.methods import resolve_config
from fedtune_app.model.frozen_weights import ensure_checkpoint, with_checkpoint
from inprocess import InProcessGrid


def cfg_for(path: Path, sha: str, cache: Path) -> RunConfig:
    return resolve_config({"checkpoint-url": path.as_uri(), "checkpoint-sha256": sha,
                           "checkpoint-dir": str(cache)})


@pytest.fixture
def blob(tmp_path):
    data = np.random.default_rng(3).bytes(3 * (1 << 20) + 123)  # spans several 1 MiB chunks
    path = tmp_path / "remote" / "weights.safetensors"
    path.parent.mkdir()
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest(), len(data)


def test_fetched_once_then_served_from_cache(blob, tmp_path):
    path, sha, size = blob
    cfg = cfg_for(path, sha, tmp_path / "cache")
    local, fetched = ensure_checkpoint(cfg.model)
    assert fetched == size == 3 * 1048576 + 123
    assert local == tmp_path / "cache" / f"{sha}.safetensors"
    assert local.read_bytes() == path.read_bytes()
    assert ensure_checkpoint(cfg.model) == (local, 0)
    # the node config's data-dir wins over the run config's checkpoint-dir
    node_local, fetched = ensure_checkpoint(cfg.model, {"data-dir": str(tmp_path / "node")})
    assert node_local == tmp_path / "node" / "checkpoints" / f"{sha}.safetensors"
    assert fetched == size


def test_corrupted_download_is_rejected_and_nothing_is_kept(blob, tmp_path):
    path, sha, size = blob
    data = bytearray(path.read_bytes())
    data[size // 2] ^= 0x01  # one flipped bit in transit
    path.write_bytes(bytes(data))
    cache = tmp_path / "cache"
    with pytest.raises(ConfigError, match=r"checkpoint-sha256.*corrupted"):
        ensure_checkpoint(cfg_for(path, sha, cache).model)
    assert list(cache.iterdir()) == []  # no partial or bad file left behind


def test_corrupted_cache_is_fetched_again(blob, tmp_path):
    path, sha, size = blob
    cfg = cfg_for(path, sha, tmp_path / "cache")
    local, _ = ensure_checkpoint(cfg.model)
    local.write_bytes(b"truncated")
    assert ensure_checkpoint(cfg.model) == (local, size)
    assert hashlib.sha256(local.read_bytes()).hexdigest() == sha


def test_archive_is_unpacked_into_a_directory(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"a": 1}')
    archive = tmp_path / "model.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname="model")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    local, fetched = ensure_checkpoint(cfg_for(archive, sha, tmp_path / "cache").model)
    assert fetched == archive.stat().st_size
    assert local.is_dir() and json.loads((local / "config.json").read_text()) == {"a": 1}


@pytest.mark.parametrize("changes, match", [
    ({"checkpoint-sha256": "abc"}, "64 hex digits"),
    ({"checkpoint-url": "ftp://host/w.pth"}, "allowed schemes"),
    ({"checkpoint-url": "file:///nonexistent/w.pth"}, "cannot fetch"),
])
def test_bad_checkpoint_keys_name_the_key(blob, tmp_path, changes, match):
    path, sha, _ = blob
    cfg = cfg_for(path, sha, tmp_path / "cache").replace(**changes)
    with pytest.raises(ConfigError, match=match):
        ensure_checkpoint(cfg.model)


def test_nodes_fetch_the_checkpoint_once_and_train_on_its_weights(tmp_path):
    """Two nodes with their own data-dir fetch the checkpoint in the start-up query (bytes in
    config.json), not again in later rounds or runs, and their frozen blocks are its weights."""
    torch.manual_seed(11)
    kwargs = TINY_VIT.kwargs
    reference = timm.create_model(TINY_VIT.name, num_classes=10, **kwargs)
    path = tmp_path / "vit-tiny.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    rc = {"preset": "smoke", "model": TINY_VIT.name, "model-args": TINY_VIT.args,
          "model-source": "random", "checkpoint-url": path.as_uri(), "checkpoint-sha256": sha,
          "checkpoint-dir": str(tmp_path / "server-cache"), "capacities": "3,2",
          "num-server-rounds": 1, "results-dir": str(tmp_path / "results")}
    nodes = [{"partition-id": i, "num-partitions": 2, "data-dir": str(tmp_path / f"node{i}")}
             for i in range(2)]
    folders = [run_federation(InProcessGrid(client_app, nodes, rc), resolve_config(rc))
               for _ in range(2)]
    size = path.stat().st_size
    first, second = (json.loads((Path(f) / "config.json").read_text()) for f in folders)
    assert [c["checkpoint_bytes"] for c in first["clients"]] == [size, size]
    assert [c["checkpoint_bytes"] for c in second["clients"]] == [0, 0]
    for i in range(2):
        assert (tmp_path / f"node{i}" / "checkpoints" / f"{sha}.safetensors").is_file()
    # per-round traffic is the adapters only: 5 blocks x (8x128 + 32x8) + head 32x10 + 10
    metrics = json.loads((Path(folders[0]) / "metrics.json").read_text())
    assert 4 * (5 * 1280 + 2 * 330) <= metrics[0]["bytes-down"] < size
    # the frozen weights the node trains on are the checkpoint's, not the seeded random init
    from fedtune_app.apps.client import runtime
    from fedtune_app.model.block_store import hold_blocks
    node_cfg, fetched = with_checkpoint(resolve_config(rc), nodes[0])
    assert fetched == 0
    model, _ = runtime(node_cfg)
    hold_blocks(model, (1,))
    torch.testing.assert_close(model.blocks[1].attn.qkv.weight, reference.blocks[1].attn.qkv.weight)


def test_mixer_checkpoint_file_loads_although_its_entrypoint_fixes_patch_size(tmp_path):
    """timm's mixer_s16_224 entrypoint fixes patch_size (TypeError when overridden): the file
    is then loaded into the class directly; its blocks are the checkpoint's."""
    from timm.models.mlp_mixer import MlpMixer

    from conftest import TINY_MIXER
    from fedtune_app.model.backbones import ModelSpec, build_backbone

    torch.manual_seed(4)
    reference = MlpMixer(num_classes=10, **TINY_MIXER.kwargs)
    path = tmp_path / "mixer.safetensors"
    save_file({k: v.contiguous() for k, v in reference.state_dict().items()}, str(path))
    model = build_backbone(ModelSpec(TINY_MIXER.name, str(path), TINY_MIXER.args, 0, 10))
    torch.testing.assert_close(model.blocks[2].mlp_channels.fc2.weight,
                               reference.blocks[2].mlp_channels.fc2.weight)
    torch.testing.assert_close(model.head.weight, reference.head.weight)  # same class count
    other = build_backbone(ModelSpec(TINY_MIXER.name, str(path), TINY_MIXER.args, 0, 3))
    assert other.head.weight.shape == (3, 32)  # other class count: seeded head, blocks loaded
    torch.testing.assert_close(other.blocks[0].mlp_tokens.fc1.weight,
                               reference.blocks[0].mlp_tokens.fc1.weight)
