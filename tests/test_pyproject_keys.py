"""pyproject.toml's [tool.flwr.app.config] is what the key registry generates."""

import tomllib

import pytest

import fedtune_app.methods  # noqa: F401  (registers every method's keys)
from fedtune_app.config import KEYS, ConfigError, app_defaults, load_preset
from fedtune_app.tools.pyproject_keys import (
    PYPROJECT,
    main,
    render_table,
    split_pyproject,
    toml_value,
)

# The main job (`make run`, conf/main.toml) = the library defaults but these values
MAIN_JOB = {"train-subset": 720, "test-subset": 300, "batch-size": 16, "lr": 0.05}


def test_pyproject_table_is_the_generated_one(capsys):
    assert main(["--check"]) == 0, capsys.readouterr().out
    assert set(app_defaults()) == set(KEYS)


def test_pyproject_holds_the_defaults_and_the_main_job_is_a_preset():
    # nothing of the main job's sizes may apply to a run on another data set
    assert app_defaults() == {k: spec.default for k, spec in KEYS.items()}
    assert load_preset("main") == MAIN_JOB


def test_a_missing_key_is_drift_and_write_adds_it_with_its_default():
    table = split_pyproject(PYPROJECT.read_text())[1]
    dropped = "\n".join(line for line in table.splitlines()
                        if not line.startswith("fedbrick-rank ")) + "\n"
    assert dropped != table
    assert render_table(dropped) == table  # back in its owner's section, with its default 8


def test_every_value_is_written_at_its_default_with_its_type():
    table = "[tool.flwr.app.config]\n# stale note\nlr = 0.05\nseed = 0\n"
    generated = render_table(table)
    assert "stale note" not in generated
    values = tomllib.loads(generated.replace("[tool.flwr.app.config]", ""))
    expected = {k: spec.default for k, spec in KEYS.items()}
    assert values == expected and values["lr"] == 0.01
    # same TOML types as the defaults: bool stays bool, float stays float (1e-5 -> 1e-5)
    assert {k: type(v) for k, v in values.items()} == {k: type(v) for k, v in expected.items()}


def test_an_unknown_key_in_pyproject_is_named():
    with pytest.raises(ConfigError, match="unknown run-config key.*fedra-temperature"):
        render_table("[tool.flwr.app.config]\nfedra-temperature = 1.0\n")


def test_toml_value_reads_back_as_the_value_it_wrote():
    values = {"flag": False, "rounds": 5, "lr": 1e-05, "mu": 0.1, "big": 2.5e10,
              "text": 'say "hi"\\n', "path": "~/a b/c.toml"}
    text = "".join(f"{k} = {toml_value(v)}\n" for k, v in values.items())
    assert tomllib.loads(text) == values
    assert "lr = 1e-5\n" in text  # the exponent without its leading zero, as pyproject writes it
