"""Experiment tracking: a real (in-process) federated run writes every round's scalars to
TensorBoard / MLflow / Weights & Biases (offline), and reading them back gives the numbers of
metrics.json."""

from __future__ import annotations

import json
import logging
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from fedtune_app.apps.results import clock, round_listener
from fedtune_app.apps.tracking import round_scalars
from runs import run


def expected_curves(folder) -> dict[str, list[tuple[int, float]]]:
    metrics = json.loads((folder / "metrics.json").read_text())
    curves: dict[str, list] = {}
    for record in metrics:
        for name, value in round_scalars(record).items():
            curves.setdefault(name, []).append((record["round"], value))
    return curves


def test_round_scalars_flatten_groups_and_skip_non_numbers():
    record = {"round": 3, "accuracy": 0.5, "loss": None, "accuracy-per-group": {"0": 0.25},
              "rejected": {"2": "nan"}, "clients": [0, 1], "state-updated": True,
              "bytes-up": 10, "started": 1.0e9, "server": {"rss": 1}}
    assert round_scalars(record) == {"accuracy": 0.5, "accuracy-per-group/0": 0.25,
                                     "rejected-clients": 1.0, "bytes-up": 10.0}


def test_clock():
    assert (clock(59.6), clock(61), clock(3723)) == ("1:00", "1:01", "1:02:03")


def test_tensorboard_reads_back_every_round(tmp_path, caplog):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    seen = []
    with caplog.at_level(logging.INFO, logger="fedtune"), \
            round_listener(lambda cfg, record: seen.append((cfg.method, record["round"]))):
        folder = run(tmp_path, tracker="tensorboard")
    assert seen == [("fedra", 1), ("fedra", 2)]  # what compare's progress bar counts
    lines = [m for m in caplog.messages if m.startswith("round ")]
    assert len(lines) == 2 and " | elapsed " in lines[0]
    assert lines[-1].endswith(" | ETA 0:00")  # no round left after the last one
    events = EventAccumulator(str(folder / "tensorboard")).Reload()
    curves = expected_curves(folder)
    assert {"accuracy", "train-loss", "bytes-down", "accuracy-per-group/client-0"} <= set(curves)
    assert set(events.Tags()["scalars"]) == set(curves)
    for name, points in curves.items():
        got = [(e.step, e.value) for e in events.Scalars(name)]
        # TensorBoard stores float32: the float64 value rounded to float32, exactly
        assert got == [(step, float(np.float32(v))) for step, v in points], name
    assert "fedra" in events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()


def test_mlflow_reads_back_every_round(tmp_path, monkeypatch):
    from mlflow import MlflowClient

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    folder = run(tmp_path, tracker="mlflow")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    [found] = client.search_runs([client.get_experiment_by_name("fedtune").experiment_id])
    assert found.data.params["method"] == "fedra"
    assert found.data.tags["results-folder"] == str(folder)
    assert found.info.status == "FINISHED"
    for name, points in expected_curves(folder).items():
        got = sorted((m.step, m.value) for m in client.get_metric_history(found.info.run_id, name))
        assert got == points, name  # MLflow keeps float64


WANDB_BLOCK = 32 * 1024


def wandb_records(path: Path):
    """The records of an offline W&B run file (``run-<id>.wandb``), parsed with W&B's own
    protobuf messages. The file is a 7-byte header (":W&B", magic, version) and then LevelDB's
    log format, which W&B documents for it: 32 KiB blocks of chunks, each a 7-byte header
    (crc32 over the type byte and the data, data length, type: 1 full, 2 first, 3 middle,
    4 last) and its data; a block's tail shorter than a header is zero padding."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        if WANDB_BLOCK - pos % WANDB_BLOCK < 7:
            pos += WANDB_BLOCK - pos % WANDB_BLOCK
            continue
        crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:  # zero padding to the end of the file
            break
        chunk = data[pos + 7:pos + 7 + length]
        assert crc == zlib.crc32(chunk, zlib.crc32(bytes([kind]))), f"bad chunk at {pos}"
        pos, pending = pos + 7 + length, pending + chunk
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record
            pending = b""


def item_key(item) -> str:
    """A logged item's name: W&B writes it as ``key`` or as the path ``nested_key``."""
    return item.key or "/".join(item.nested_key)


def test_wandb_offline_reads_back_every_round(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    folder = run(tmp_path, tracker="wandb")
    [path] = (folder / "wandb").glob("offline-run-*/run-*.wandb")
    records = list(wandb_records(path))
    [started] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (started.project, started.display_name) == ("fedtune", folder.name)
    config = {item_key(i): json.loads(i.value_json) for i in started.config.update}
    assert config["method"] == "fedra" and config["tracker"] == "wandb"
    rows = {r.history.step.num: {item_key(i): json.loads(i.value_json) for i in r.history.item}
            for r in records if r.WhichOneof("record_type") == "history"}
    assert sorted(rows) == [1, 2]
    curves = expected_curves(folder)
    assert {"accuracy", "train-loss", "accuracy-per-group/client-0"} <= set(curves)
    for name, points in curves.items():
        # JSON carries the float64 value exactly
        assert [(step, rows[step][name]) for step, _ in points] == points, name
    assert sum(r.WhichOneof("record_type") == "exit" for r in records) == 1  # finished


def test_a_missing_tracker_package_is_a_config_error_naming_the_key(tmp_path, monkeypatch):
    import sys

    from fedtune_app.apps.tracking import make_tracker
    from fedtune_app.config import ConfigError
    from fedtune_app.methods import resolve_config

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed
    with pytest.raises(ConfigError, match="'tracker' = 'wandb' needs the package 'wandb'"):
        make_tracker(resolve_config({"tracker": "wandb"}), tmp_path)
    assert make_tracker(resolve_config({"tracker": ""}), tmp_path) is None
