import tomllib
from pathlib import Path

import pytest

from fedtune_app.config import KEYS, ConfigError, app_defaults
from fedtune_app.methods import resolve_config

ROOT = Path(__file__).resolve().parent.parent


def test_pyproject_lists_every_key_flower_must_accept():
    # Flower rejects --run-config keys that pyproject.toml does not list
    assert sorted(app_defaults()) == sorted(KEYS)


def test_main_job_is_fedra_on_minilm_bbc_with_capacities_6_to_2():
    cfg = resolve_config({})
    assert (cfg.method, cfg.model.model, cfg.data.dataset) == ("fedra", "all-MiniLM-L6-v2",
                                                             "bbc-news")
    assert cfg.federation.capacities == "6,5,4,3,2,2"


def test_preset_values_are_defaults_that_given_keys_override():
    smoke = tomllib.loads((ROOT / "conf" / "smoke.toml").read_text())
    cfg = resolve_config({**app_defaults(), "preset": "smoke"})
    assert cfg.model.model == smoke["model"]
    assert cfg.federation.num_server_rounds == smoke["num-server-rounds"]
    cfg = resolve_config({**app_defaults(), "preset": "smoke", "num-server-rounds": 7})
    assert cfg.federation.num_server_rounds == 7


@pytest.mark.parametrize("given, message", [
    ({"methd": "fedra"}, "unknown run-config key 'methd'.*Did you mean 'method'"),
    ({"method": "fedavg"},
     "'method' = 'fedavg' is not allowed; Did you mean 'fedra'\\? allowed: all-large, all-small, "
     "depthfl"),
    ({"method": "fedraa"}, "'method' = 'fedraa' is not allowed; Did you mean 'fedra'\\?"),
    ({"aggregator": "medain"}, "'aggregator' = 'medain' is not allowed; Did you mean 'median'\\?"),
    ({"method": "fedmd", "proxy-for-all-methods": True}, "cannot be combined with method 'fedmd'"),
    ({"lr": "fast"}, "'lr' = 'fast': expected float"),
    ({"num-server-rounds": 0}, "'num-server-rounds' = 0 is below its minimum 1"),
    ({"lora-dropout": 1.5}, "'lora-dropout' = 1.5 is above its maximum"),
    ({"capacities": "6,x"}, "'capacities' = '6,x': expected comma-separated integers"),
    ({"preset": "nope"}, "'preset' = 'nope'.*allowed: .*smoke"),
    ({"adapter": "prefix"}, "'adapter' = 'prefix' is not allowed; allowed: lora, bottleneck"),
])
def test_bad_config_names_the_key_and_what_is_allowed(given, message):
    with pytest.raises(ConfigError, match=message):
        resolve_config(given)
