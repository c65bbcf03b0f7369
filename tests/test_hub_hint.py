"""A model or data set that needs the Hugging Face hub fails with a message that says why (the
hub switched off, or no internet) and what a gated model needs besides (licence and token)."""

import pytest

from fedtune_app.config import ConfigError, hub_hint
from fedtune_app.model.backbones import ModelSpec, _build


@pytest.mark.parametrize("value", ["1", "ON", "true"])
def test_the_hint_says_the_hub_is_off_and_how_to_switch_it_on(monkeypatch, value):
    monkeypatch.setenv("HF_HUB_OFFLINE", value)
    hint = hub_hint()
    assert "HF_HUB_OFFLINE=1" in hint and "HF_HUB_OFFLINE=0" in hint
    assert "hf auth login" in hint and "HF_TOKEN" in hint and "meta-llama" in hint


@pytest.mark.parametrize("value", [None, "0", ""])
def test_with_the_hub_on_the_hint_names_internet_access(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    else:
        monkeypatch.setenv("HF_HUB_OFFLINE", value)
    hint = hub_hint()
    assert "internet access" in hint and "HF_HUB_OFFLINE" not in hint and "HF_TOKEN" in hint


@pytest.mark.parametrize("name", ["vit_base_patch16_224", "meta-llama/Llama-3.2-1B"])
def test_a_hub_model_with_the_hub_off_is_a_config_error_with_the_hint(monkeypatch, name):
    """The paper presets' timm ViT-B and HeteroTune's gated LLaMA (nothing cached here)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError) as err:
        _build(ModelSpec(name, "pretrained", "", 0, 10))
    assert repr(name) in str(err.value) and hub_hint() in str(err.value)
