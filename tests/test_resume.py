"""Checkpoint and resume: a server stopped after round 2 of 4 and resumed from its
checkpoint ends bit for bit where an uninterrupted run ends; bad resumes fail clearly."""

import json

import pytest

from fedtune_app.config import ConfigError
from fedtune_app.federated.checkpoint import FILE
from inprocess import InProcessGrid
from runs import assert_same_tensors, final_state, run

# 2 of 3 clients per round: the resumed run must also continue the sampling RNG
KEYS = {"num-server-rounds": 4, "clients-per-round": 2, "eval-every": 2, "checkpoint-every": 2}


class ServerKilled(Exception):
    pass


class GridKilledInRound3(InProcessGrid):
    """The server process dies as it sends round 3 (after round 2's checkpoint)."""

    def push_messages(self, messages):
        if any(m.metadata.group_id == "3" for m in messages):
            raise ServerKilled
        return super().push_messages(messages)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    whole = run(tmp / "whole", **KEYS)
    with pytest.raises(ServerKilled):
        run(tmp / "stopped", grid_class=GridKilledInRound3, **KEYS)
    [stopped] = (tmp / "stopped").iterdir()
    resumed = run(tmp / "resumed", resume=str(stopped), **KEYS)
    return whole, stopped, resumed


def test_resumed_run_ends_bit_for_bit_like_the_uninterrupted_one(runs):
    whole, stopped, resumed = runs
    assert not (stopped / "state.safetensors").exists()  # it really stopped early
    assert not list(stopped.glob("*.tmp"))  # written then renamed: no half files
    assert_same_tensors(final_state(resumed), final_state(whole))
    read = lambda folder, name: json.loads((folder / name).read_text())  # noqa: E731
    assert read(resumed, "allocation.json") == read(whole, "allocation.json")
    for a, b in zip(read(resumed, "metrics.json"), read(whole, "metrics.json"), strict=True):
        for key in ("round", "accuracy", "loss", "train-loss", "clients", "bytes-up"):
            assert a[key] == b[key], (a["round"], key)
    assert read(resumed, "config.json")["run-config"]["resume"] == str(stopped)


def test_resume_refuses_another_run_or_a_broken_checkpoint(runs, tmp_path):
    _, stopped, _ = runs
    with pytest.raises(ConfigError, match=r"'seed' = 1 \(checkpoint: 0\)"):
        run(tmp_path, resume=str(stopped), **KEYS | {"seed": 1})
    with pytest.raises(ConfigError, match="already has 2 rounds"):
        run(tmp_path, resume=str(stopped), **KEYS | {"num-server-rounds": 2})
    with pytest.raises(ConfigError, match="'resume'.*no checkpoint file"):
        run(tmp_path, resume=str(tmp_path / "nowhere"), **KEYS)
    broken = tmp_path / "broken"
    broken.mkdir()
    data = (stopped / FILE).read_bytes()
    (broken / FILE).write_bytes(data[: len(data) // 2])  # truncated, e.g. a full disk
    with pytest.raises(ConfigError, match="'resume'.*not a readable fedtune checkpoint"):
        run(tmp_path, resume=str(broken), **KEYS)


@pytest.mark.parametrize("keys", [{"aggregator": "median"}, {"aggregator": "trimmed-mean"},
                                  {"aggregator": "clipped-mean"},
                                  {"dp-noise-multiplier": 0.5, "dp-noise-seed": 11},
                                  {"method": "all-large", "client-trains": "full"}],
                         ids=["median", "trimmed-mean", "clipped-mean", "dp", "full"])
def test_resume_is_bit_exact_with_each_aggregator(keys, tmp_path):
    whole = run(tmp_path / "whole", **KEYS | keys)
    with pytest.raises(ServerKilled):
        run(tmp_path / "stopped", grid_class=GridKilledInRound3, **KEYS | keys)
    [stopped] = (tmp_path / "stopped").iterdir()
    resumed = run(tmp_path / "resumed", resume=str(stopped), **KEYS | keys)
    assert_same_tensors(final_state(resumed), final_state(whole))


def test_dp_noise_seed_from_the_os_survives_a_resume(tmp_path):
    """Fresh entropy (the private default) is drawn once and carried by the checkpoint."""
    from safetensors.numpy import load_file

    keys = KEYS | {"dp-noise-multiplier": 0.5}
    with pytest.raises(ServerKilled):
        run(tmp_path / "stopped", grid_class=GridKilledInRound3, **keys)
    [stopped] = (tmp_path / "stopped").iterdir()
    seed = load_file(str(stopped / FILE))["extra/dp-noise-seed"]
    resumed = run(tmp_path / "resumed", resume=str(stopped), **keys)
    assert load_file(str(resumed / FILE))["extra/dp-noise-seed"].tobytes() == seed.tobytes()
