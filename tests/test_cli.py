"""The `fedtune` command: what a user who mistypes a value sees."""

from fedtune_app.tools.cli import main


def test_a_bad_value_is_one_line_from_fedtune(capsys):
    assert main(["run", "--run-config", 'method="fedraa"']) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("fedtune: run-config key 'method' = 'fedraa' is not allowed; "
                          "Did you mean 'fedra'?")
