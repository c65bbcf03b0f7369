"""pyproject.toml's [tool.flwr.app.config] is what the key registry generates."""

import tomllib

import pytest

import fedtune_app.methods  # noqa: F401  (registers every method's keys)
from fedtune_app.config import KEYS, ConfigError, app_defaults
from fedtune_app.tools.pyproject_keys import (
    PYPROJECT,
    main,
    render_table,
    split_pyproject,
    toml_value,
)

# The main job (`flwr run .`) = the library defaults but these values (README: "The two commands")
MAIN_JOB = {"train-subset": 720, "test-subset": 300, "batch-size": 16, "lr": 0.05}


def test_pyproject_table_is_the_generated_one(capsys):
    assert main(["--check"]) == 0, capsys.readouterr().out
    assert set(app_defaults()) == set(KEYS)


def test_main_job_differs_from_the_defaults_in_its_own_keys_only():
    # a default changed in code leaves the old value in pyproject, which would then show up here
    app = app_defaults()
    assert {k: v for k, v in app.items() if v != KEYS[k].default} == MAIN_JOB


def test_a_missing_key_is_drift_and_write_adds_it_with_its_default():
    table = split_pyproject(PYPROJECT.read_text())[1]
    dropped = "\n".join(line for line in table.splitlines()
                        if not line.startswith("fedbrick-rank ")) + "\n"
    assert dropped != table
    assert render_table(dropped) == table  # back in its owner's section, with its default 8


def test_main_job_values_keep_their_comments_defaults_lose_theirs():
    table = "[tool.flwr.app.config]\n# why so high\nlr = 0.05\n# stale note\nseed = 0\n"
    generated = render_table(table)
    assert "# why so high\nlr = 0.05\n" in generated
    assert "stale note" not in generated
    values = tomllib.loads(generated.replace("[tool.flwr.app.config]", ""))
    expected = {k: spec.default for k, spec in KEYS.items()} | {"lr": 0.05}
    assert values == expected
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
