"""Smoke means seconds, for every method: each registered method runs the smoke preset (one
backbone) or smoke-groups (model groups) in process, and its run may cost at most K times the
CPU time of FedRA's smoke run measured here. A method whose server phase keeps its paper's
budget on smoke (FedDF's 10^4 distillation steps: minutes per round) fails this, whoever adds
it. CPU time of this process, not wall time: other jobs on the machine do not count."""

import json
import logging
import time
from pathlib import Path

import pytest

from fedtune_app.apps.inprocess import run_inprocess
from fedtune_app.methods import resolve_config
from fedtune_app.methods.registry import METHODS
from fedtune_app.model import progress

K = 10  # FedBRICK, the dearest today: ~2x FedRA (10 server epochs + two client stages)
RUNS = [(name, preset) for name, m in sorted(METHODS.items())
        for preset, needs in (("smoke", m.strategy), ("smoke-groups", m.group_strategy)) if needs]


def cpu_seconds(run_config: dict) -> tuple[float, Path]:
    started = time.process_time()
    folder = Path(run_inprocess(run_config))
    return time.process_time() - started, folder


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@pytest.fixture(scope="module")
def fedra_seconds(tmp_path_factory, cache):
    """FedRA on smoke: once to warm up (imports, data, the layered checkpoint), then the
    fastest of two timed runs."""
    rc = {"preset": "smoke", "method": "fedra", "checkpoint-dir": str(cache)}
    times = [cpu_seconds(rc | {"results-dir": str(tmp_path_factory.mktemp("fedra"))})[0]
             for _ in range(3)]
    return min(times[1:])


def test_every_method_has_a_smoke_run():
    assert {name for name, _ in RUNS} == set(METHODS)


@pytest.mark.parametrize("method, preset", RUNS)
def test_every_method_finishes_smoke_within_k_fedra_runs(method, preset, fedra_seconds, cache,
                                                         tmp_path):
    rc = {"preset": preset, "method": method, "checkpoint-dir": str(cache),
          "results-dir": str(tmp_path)}
    seconds, folder = cpu_seconds(rc)
    rounds = resolve_config(rc).federation.num_server_rounds
    assert [m["round"] for m in json.loads((folder / "metrics.json").read_text())] == \
        list(range(1, rounds + 1))
    assert seconds <= K * fedra_seconds, \
        f"{method} on preset {preset!r}: {seconds:.1f} s of CPU > {K} x FedRA's smoke run " \
        f"({fedra_seconds:.2f} s): give its dear phase a smoke-sized budget in conf/{preset}.toml"


def test_feddf_keeps_its_paper_budget_outside_smoke(tmp_path, cache):
    """The paper presets keep FedDF's 10^4 steps; smoke-groups distils 20 per round and group,
    all of them (no validation split, so no early stop)."""
    assert resolve_config({"preset": "heterotune-t1-cifar10", "method": "feddf"}
                          ).own.feddf_steps == 10_000
    folder = Path(run_inprocess({"preset": "smoke-groups", "method": "feddf",
                                 "checkpoint-dir": str(cache), "results-dir": str(tmp_path)}))
    assert [m["feddf-steps"] for m in json.loads((folder / "metrics.json").read_text())] == \
        [[20, 20], [20, 20]]


def test_smoke_groups_shares_the_smoke_presets_settings():
    """smoke-groups differs from smoke only in the model keys, the clients and the method."""
    own = {"model", "model-source", "model-args", "model-groups", "model-group-args",
           "model-group-sources", "model-group-ratio", "capacities", "method"}
    smoke, groups = (resolve_config({"preset": p}).flat for p in ("smoke", "smoke-groups"))
    assert {k for k in smoke if k != "preset" and smoke[k] != groups[k]} <= own


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.mark.parametrize("method, preset, first", [
    ("feddf", "smoke-groups", "feddf round 1 group 0: server distillation: 1/20 steps | "),
    ("fedbrick", "smoke", "fedbrick round 1 domain all: server distillation: 1/10 steps | ")])
def test_server_distillation_says_how_far_it_is(method, preset, first, monkeypatch, tmp_path,
                                                cache):
    """With lines due every 0 s, each step of the phase logs done/total, elapsed and ETA (the
    smoke proxy set of FedBRICK is one batch: 10 epochs = 10 steps)."""
    monkeypatch.setattr(progress, "EVERY", 0.0)
    lines, logger = Lines(), logging.getLogger("fedtune")
    level = logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    try:
        run_inprocess({"preset": preset, "method": method, "checkpoint-dir": str(cache),
                       "results-dir": str(tmp_path)})
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    phase = [line for line in lines.lines if "server distillation: " in line]
    assert phase[0].startswith(first)
    assert " | elapsed 0:0" in phase[0] and " | ETA " in phase[0]
    total = int(first.split("/")[1].split()[0])
    # every step but the last (the phase's end needs no ETA)
    assert sum(line.startswith(first.split(":")[0] + ":") for line in phase) == total - 1
