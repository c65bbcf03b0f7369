"""The `fedtune` command: what a user who mistypes a value sees."""

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
        "screen-updates": False, "seed": 3, "domains": 'a "b"'}
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


def test_a_key_at_pyprojects_value_beside_a_preset_that_sets_another_is_refused(capsys):
    """pyproject runs 5 rounds and the smoke preset 2: `num-server-rounds=5` beside it looks to
    the ServerApp like a key nobody gave (Flower passes all of pyproject's), so the run would
    silently do 2 rounds; it is refused before Flower starts. 6 rounds, or 5 without the
    preset, mean what they say."""
    from fedtune_app.tools.cli import check_preset_overrides

    assert main(["run", "--run-config", 'preset="smoke" num-server-rounds=5 seed=0']) == 2
    assert capsys.readouterr().err == (
        "fedtune: --run-config: 'num-server-rounds' = 5 (preset 'smoke': 2) equals "
        "pyproject.toml's value, which Flower passes for every key the user did not give, so "
        "the preset's value would win; edit the preset, or give the keys without it\n")
    check_preset_overrides({"preset": "smoke", "num-server-rounds": 6, "seed": 0})
    check_preset_overrides({"num-server-rounds": 5})
    check_preset_overrides({"preset": "smoke", "num-server-rounds": 2})  # the preset's own


def test_a_missing_stand_in_checkpoint_names_the_command_that_makes_it(tmp_path, monkeypatch,
                                                                        capsys):
    """The mini preset's backbone is made offline and kept out of git: without it `fedtune run`
    stops before Flower starts, naming the file and the pretraining command of its family."""
    from fedtune_app.tools import pretrain

    monkeypatch.setattr(pretrain, "CACHE", tmp_path)  # a machine that never pretrained

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


def test_missing_checkpoints_per_group_once_and_a_checkpoint_url_fetches_its_source(
        tmp_path, monkeypatch):
    from fedtune_app.claims.store import run_config
    from fedtune_app.methods import resolve_config
    from fedtune_app.tools import pretrain

    monkeypatch.setattr(pretrain, "CACHE", tmp_path)  # a machine that pretrained vit12-s only
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
