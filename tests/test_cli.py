"""The `fedtune` command: what a user who mistypes a value sees."""

import pytest
import torch

from fedtune_app.tools.cli import main


def test_a_bad_value_is_one_line_from_fedtune(capsys):
    assert main(["run", "--run-config", 'method="fedraa"']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("fedtune: run-config key 'method' = 'fedraa' is not allowed; "
                          "Did you mean 'fedra'?")


def test_a_scenario_that_cannot_hold_is_one_line_before_flower_starts(capsys):
    """Clients, domains and partitioner are checked where the run config is resolved: the
    smoke digits have no domains, so a domain partitioner is refused before `flwr run`."""
    assert main(["run", "--run-config", 'preset="smoke" partitioner="domain"']) == 2
    err = capsys.readouterr().err
    assert err == ("fedtune: run-config key 'partitioner' = 'domain' needs a data set with "
                   "domains (multi-domain-digits, domainnet, nico++)\n")


def test_a_toml_file_as_run_config_gets_the_results_folder(tmp_path):
    """Flower takes a TOML file only on its own: the copy holds results-dir and the file's keys
    (a key the file sets itself wins), each value as Flower parses it back."""
    from fedtune_app.federated.flower_private import parse_config_args
    from fedtune_app.tools.cli import with_results_dir

    given = tmp_path / "mine.toml"
    given.write_text('preset = "smoke"\nlr = 0.5\nscreen-updates = false\nseed = 3\n'
                     'domains = "a \\"b\\""\n')
    passed = with_results_dir(str(given), tmp_path / "out", tmp_path)
    assert passed.endswith(".toml") and passed != str(given)
    assert parse_config_args([passed]) == {
        "results-dir": str(tmp_path / "out"), "preset": "smoke", "lr": 0.5,
        "screen-updates": False, "seed": 3, "domains": 'a "b"',
        "preset-overrides": "lr,screen-updates,seed,domains"}
    given.write_text('results-dir = "/elsewhere"\n')
    assert parse_config_args([with_results_dir(str(given), tmp_path / "out", tmp_path)]) == {
        "results-dir": "/elsewhere"}
    # a key=value string: results-dir first, the user's keys after it (later keys win)
    assert with_results_dir('preset="smoke"', tmp_path, tmp_path) == \
        f'results-dir="{tmp_path}" preset="smoke"'


def test_a_missing_toml_file_is_one_line(capsys, tmp_path):
    assert main(["run", "--run-config", str(tmp_path / "none.toml"), "--results",
                 str(tmp_path)]) == 2
    assert "no such TOML file" in capsys.readouterr().err


def test_fedtune_run_keeps_the_callers_hub_setting(monkeypatch, tmp_path):
    from fedtune_app.tools.cli import flower_env

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert flower_env(tmp_path)["HF_HUB_OFFLINE"] == "1"  # offline unless asked
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    env = flower_env(tmp_path)
    assert env["HF_HUB_OFFLINE"] == "0"
    assert env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"


def test_keys_given_beside_a_preset_are_named_for_flower(tmp_path):
    """pyproject runs 5 rounds and the smoke preset 2: `num-server-rounds=5` beside it looks to
    the ServerApp like a key nobody gave (Flower passes all of pyproject's), so `fedtune run`
    names the given keys in 'preset-overrides' and the run does the 5 rounds asked for."""
    from fedtune_app.federated.flower_private import parse_config_args
    from fedtune_app.tools.cli import with_results_dir
    from fedtune_app.tools.config_info import resolved

    given = 'preset="smoke" num-server-rounds=5 seed=0'
    passed = parse_config_args([with_results_dir(given, tmp_path, tmp_path)])
    assert passed["preset-overrides"] == "num-server-rounds,seed"
    assert resolved(given).federation.num_server_rounds == 5
    # without a preset nothing needs naming
    assert "preset-overrides" not in with_results_dir("num-server-rounds=5", tmp_path, tmp_path)


def test_a_missing_stand_in_checkpoint_names_the_command_that_makes_it(tmp_path, monkeypatch,
                                                                        capsys):
    """The mini preset's backbone is made offline: without it (and without a committed copy)
    `fedtune run` stops before Flower starts, naming the file and its pretraining command."""
    from fedtune_app.tools import pretrain

    monkeypatch.setattr(pretrain, "CACHE", tmp_path)  # a machine that never pretrained
    monkeypatch.setattr(pretrain, "COMMITTED", tmp_path / "none")  # a checkout without copies

    def no_flower(*args, **kwargs):
        raise AssertionError("`flwr run` started")

    monkeypatch.setattr("subprocess.Popen", no_flower)
    stand_in = tmp_path / "vit12-s-fmnist-mnist16.safetensors"
    assert main(["run", "--results", str(tmp_path / "results"), "--run-config",
                 f'preset="mini" model-source="{stand_in}"']) == 2
    assert capsys.readouterr().err == (
        f"fedtune: the run's backbone checkpoints are missing: {stand_in}: no such checkpoint "
        "(make it with `python -m fedtune_app.tools.pretrain --family vit12-s --no-probe "
        "--threads 1`)\n")


def test_a_missing_stand_in_is_restored_from_its_committed_copy_byte_for_byte(tmp_path,
                                                                             monkeypatch):
    """A stand-in family's file missing from the cache is copied from docs/claims/backbones/
    (the files the claims' records load); a file of no family is not."""
    from fedtune_app.claims.store import run_config
    from fedtune_app.methods import resolve_config
    from fedtune_app.model.frozen_weights import sha256_of
    from fedtune_app.tools import pretrain

    committed = pretrain.COMMITTED / "vit12-s-fmnist-mnist16.safetensors"
    assert committed.is_file()
    monkeypatch.setattr(pretrain, "CACHE", tmp_path / "cache")
    restored = tmp_path / "cache" / committed.name
    keys = run_config("mini", "fedra-uneven", "fedra", 0) | {"model-source": str(restored)}
    assert pretrain.missing_checkpoints(resolve_config(keys)) == []
    assert sha256_of(restored) == sha256_of(committed)
    other = tmp_path / "mine.safetensors"  # no family's name: nothing to restore
    assert pretrain.missing_checkpoints(resolve_config(keys | {"model-source": str(other)})) == [
        f"{other}: no such checkpoint"]


def test_missing_checkpoints_per_group_once_and_a_checkpoint_url_fetches_its_source(
        tmp_path, monkeypatch):
    from fedtune_app.claims.store import run_config
    from fedtune_app.methods import resolve_config
    from fedtune_app.tools import pretrain

    monkeypatch.setattr(pretrain, "CACHE", tmp_path)  # a machine that pretrained vit12-s only
    monkeypatch.setattr(pretrain, "COMMITTED", tmp_path / "none")
    small, tiny = (tmp_path / f"{f}-fmnist-mnist16.safetensors" for f in ("vit12-s", "vit12-t"))
    small.write_bytes(b"")
    keys = run_config("mini", "heterotune-groups", "heterotune", 0)  # three widths' groups
    keys["model-group-sources"] = f"{tiny};{small};{tiny}"
    assert pretrain.missing_checkpoints(resolve_config(keys)) == [
        f"{tiny}: no such checkpoint (make it with `python -m fedtune_app.tools.pretrain "
        "--family vit12-t --no-probe --threads 1`)"]
    # a checkpoint-url stands for 'model-source', not for the groups' own files
    fetched = keys | {"checkpoint-url": "https://example.org/vit12-t.safetensors"}
    assert pretrain.missing_checkpoints(resolve_config(fetched)) == \
        pretrain.missing_checkpoints(resolve_config(keys))
    single = run_config("mini", "fedra-uneven", "fedra", 0) | {"model-source": str(tiny)}
    assert len(pretrain.missing_checkpoints(resolve_config(single))) == 1
    assert pretrain.missing_checkpoints(resolve_config(single | {
        "checkpoint-url": "https://example.org/vit12-t.safetensors"})) == []


def test_an_interrupted_run_says_how_to_continue_with_the_same_federation(tmp_path, monkeypatch):
    """The continue command repeats the run config with resume=, the --federation-config the run
    was given (and `make run`'s FEDERATION=) and its --app, so the run goes on as it was."""
    import argparse
    import json

    import numpy as np
    from safetensors.numpy import save_file

    from fedtune_app.tools.cli import interrupted_report

    folder, results = tmp_path / "run", tmp_path / "results"
    folder.mkdir()
    save_file({"w": np.zeros(1, np.float32)}, str(folder / "checkpoint.safetensors"),
              metadata={"fedtune-checkpoint": json.dumps({"round": 7})})
    monkeypatch.setenv("MAKELEVEL", "1")
    federation = "num-supernodes=3 client-resources-num-cpus=2"
    args = argparse.Namespace(app=".", run_config='preset="smoke"', federation_config=federation)
    keys = f"'preset=\"smoke\" resume=\"{folder}\"'"
    said = interrupted_report("SIGINT", 9, str(folder), results, args).splitlines()
    assert said[1:] == [
        f"results so far: {folder}",
        f"last checkpoint: {folder / 'checkpoint.safetensors'} (after round 7)",
        f"continue with: fedtune run --results {results} --federation-config '{federation}' "
        f"--run-config {keys}",
        f"  (or: make run RESULTS={results} FEDERATION='{federation}' CONFIG={keys})"]
    args.federation_config, args.app = "", "/apps/mine"  # the default federation, another app
    assert interrupted_report("SIGINT", 9, str(folder), results, args).splitlines()[3:] == [
        f"continue with: fedtune run --app /apps/mine --results {results} --run-config {keys}",
        f"  (or: make run RESULTS={results} CONFIG={keys})"]


# What `fedtune run` refuses before Flower starts, each in one line naming the key and value
# (the smoke preset: a 4-block Mixer, 3 clients of capacities 4,2,1, lora-r 8; smoke-groups:
# two ViTs of 2 and 3 blocks, 4 clients of capacity 1)
REFUSED = {
    "a capacity deeper than the model": (
        'preset="smoke" capacities="9,2,1"',
        "run-config key 'capacities': client 0 has capacity 9; allowed: 1..4 (the model has 4 "
        "blocks)"),
    "a capacity that holds no DepthFL exit (exits after 2 and 4 blocks)": (
        'preset="smoke" method="depthfl" depthfl-client-depth="exit-depth" '
        "depthfl-exit-every=2",
        "run-config key 'capacities': capacity 1 holds no DepthFL exit (exits after [2, 4] "
        "blocks); lower 'depthfl-exit-every' to at most 1, raise the capacity, or set "
        "'depthfl-client-depth' = 'capacity'"),
    "a capacity below every model group's threshold": (
        'preset="smoke-groups" model-group-assign="capacity" model-group-capacities="2,3"',
        "client 0 has capacity 1, below every threshold of run-config key "
        "'model-group-capacities' = '2,3'"),
    "a rank above lora-r": (
        'preset="smoke" method="hetlora" ranks="16,4,2"',
        "run-config key 'ranks': rank 16 is outside 1..8; ranks run from 1 to run-config key "
        "'lora-r' = 8 (raise 'lora-r' to the largest client rank)"),
    "fewer ranks than clients": (
        'preset="smoke" method="hetlora" ranks="8,4"',
        "run-config key 'ranks' = '8,4' lists 2 ranks but the capacity profile describes 3 "
        "clients; give one per client or one for all"),
    "a model-group method without groups": (
        'preset="smoke" method="heterotune"',
        "run-config key 'method' = 'heterotune' needs model groups: set 'model-groups' (e.g. "
        "two timm models separated by ';'), or take preset 'smoke-groups' (the smoke run over "
        "two model groups)"),
    "a missing data folder": (
        'preset="smoke" data-dir="/no/such/folder"',
        "run-config key 'data-dir' = '/no/such/folder': no such folder"),
    "a missing own data set": (
        'dataset="hf" hf-dataset="/no/such/notes.csv"',
        "run-config key 'hf-dataset' = '/no/such/notes.csv': no such file or folder"),

}
NO_GPU = {"a GPU on a machine without one": (
    'preset="smoke" device="cuda"',
    "run-config key 'device' = 'cuda': this machine has no CUDA GPU (the LLaMA presets need "
    "one); allowed here: auto, cpu")}


@pytest.mark.parametrize("run_config, said", [
    *REFUSED.values(), *(pytest.param(*case, marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="this machine has a GPU")) for case in NO_GPU.values())],
    ids=[*REFUSED, *NO_GPU])
def test_what_the_server_would_refuse_is_one_line_before_flower_starts(
        run_config, said, tmp_path, monkeypatch, capsys):
    """Exit status 2, one line, no traceback, and nothing of Flower: no FLWR_HOME (`fedtune
    run` makes it, with the log, before it starts `flwr run`) and no results folder."""
    home, results = tmp_path / "flwr-home", tmp_path / "results"
    monkeypatch.setenv("FLWR_HOME", str(home))
    assert main(["run", "--results", str(results), "--run-config", run_config]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"fedtune: {said}\n" and captured.out == ""
    assert not home.exists() and not results.exists()


def test_own_data_that_does_not_suit_the_model_is_refused_before_flower_starts(
        tmp_path, monkeypatch, capsys):
    from test_own_data import image_set

    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    images = image_set(tmp_path / "imgs", 5)
    assert main(["run", "--results", str(tmp_path / "results"), "--run-config",
                 f'dataset="hf" hf-dataset="{images}"']) == 2
    assert capsys.readouterr().err == (
        "fedtune: run-config key 'dataset' = 'hf' is images; key 'model' = 'all-MiniLM-L6-v2' "
        "is a text model; use a timm vision model\n")
    assert not (tmp_path / "flwr-home").exists()


def test_debug_shows_the_traceback_of_a_configuration_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    run_config = REFUSED["a capacity deeper than the model"][0]
    line = f"fedtune: {REFUSED['a capacity deeper than the model'][1]}\n"
    for argv in (["--debug", "run"], ["run", "--debug"]):
        assert main(argv + ["--run-config", run_config]) == 2
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last):\n") and err.endswith(line)
        assert "in check_capacities" in err  # the server's own check, called before Flower
    # a tool's error too: `--debug` goes before the tool's name
    assert main(["--debug", "compare", "--methods", "fedra", "--out", str(tmp_path / "c"),
                 "--run-config", run_config]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and err.endswith(line)
    assert not (tmp_path / "c").exists()


def test_every_command_keeps_the_hub_offline_unless_the_caller_says(monkeypatch, tmp_path):
    import os

    for given, kept in ((None, "1"), ("0", "0")):
        if given is None:
            monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
        else:
            monkeypatch.setenv("HF_HUB_OFFLINE", given)
        assert main(["stop", "--flwr-home", str(tmp_path)]) == 0
        assert os.environ["HF_HUB_OFFLINE"] == kept


def test_compare_md_records_the_fedtune_command_the_user_typed(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", "--methods", "all-small", "--run-config",
                 'preset="smoke" num-server-rounds=1', "--out", str(out)]) == 0
    assert (out / "compare.md").read_text().splitlines()[-1] == (
        "Command: `fedtune compare --methods all-small --run-config "
        "'preset=\"smoke\" num-server-rounds=1'`")
