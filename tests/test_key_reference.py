"""docs/run-config.md is generated from the config classes and never drifts from them."""

from fedtune_app.tools.key_reference import REFERENCE, main, render


def test_the_reference_is_the_generated_one():
    assert REFERENCE.read_text() == render()
    assert main(["--check"]) == 0


def test_rows_show_type_default_and_range_of_the_field():
    text = render()
    # TrainingConfig.lr: config_key(0.01, minimum=0): a float, at least 0, no maximum
    assert "| `lr` | float | `0.01` | ≥ 0 | local learning rate" in text
    # AdapterConfig.lora_dropout: config_key(0.1, minimum=0, maximum=0.99)
    assert "| `lora-dropout` | float | `0.1` | ≥ 0 and ≤ 0.99 | LoRA dropout |" in text
    # a bool default is written as TOML writes it; a method's key sits in its method's section
    assert "| `screen-updates` | bool | `true` |" in text
    section = text.split("## Method fedbrick", 1)[1].split("\n## ", 1)[0]
    assert "| `fedbrick-rank` | int | `8` | ≥ 1 |" in section
