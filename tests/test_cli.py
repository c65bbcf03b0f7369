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
