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
