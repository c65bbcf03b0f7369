"""Config and data-file validation: types, conflicting keys (both named),
unreadable or ill-fitting local checkpoints."""

import pytest
import torch
from safetensors.torch import save_file

from conftest import TINY_MIXER, TINY_VIT
from fedtune_app.config import ConfigError
from fedtune_app.methods import resolve_config
from fedtune_app.model.backbones import ModelSpec, build_backbone


@pytest.mark.parametrize("key, value", [("seed", True), ("lr", "nan"), ("lr", float("inf")),
                                        ("round-timeout", "inf"), ("num-server-rounds", "2.5")])
def test_wrong_types_and_non_finite_numbers_name_the_key(key, value):
    with pytest.raises(ConfigError, match=f"'{key}' = .*expected"):
        resolve_config({key: value})


def test_a_quorum_no_round_can_reach_names_both_keys():
    with pytest.raises(ConfigError, match="'min-valid-replies' = 3 exceeds key "
                                          "'clients-per-round' = 2"):
        resolve_config({"clients-per-round": 2, "min-valid-replies": 3})
    with pytest.raises(ConfigError, match="'min-valid-replies' = 7 exceeds the 6 clients of "
                                          "key 'capacities'"):
        resolve_config({"capacities": "6,5,4,3,2,2", "min-valid-replies": 7})
    with pytest.raises(ConfigError, match="the 8 clients of key 'min-nodes'"):
        resolve_config({"min-nodes": 8, "min-valid-replies": 9})
    cfg = resolve_config({"clients-per-round": 3, "min-valid-replies": 3})
    assert cfg.federation.min_valid_replies == 3


def spec_from(spec: ModelSpec, source: str) -> ModelSpec:
    return ModelSpec(spec.name, source, spec.args, spec.seed, spec.num_classes)


def test_local_timm_checkpoint_loads_and_a_new_head_size_keeps_its_init(tmp_path):
    from timm.models.mlp_mixer import MlpMixer

    torch.manual_seed(5)
    donor = MlpMixer(num_classes=7, **TINY_MIXER.kwargs)  # a "pretrained" model, 7 classes
    path = tmp_path / "mixer.safetensors"
    save_file({k: v.contiguous() for k, v in donor.state_dict().items()}, str(path))
    model = build_backbone(spec_from(TINY_MIXER, str(path)))  # 10 classes
    random = build_backbone(TINY_MIXER)
    for ours, theirs in [(model.stem.stem.proj.weight, donor.stem.proj.weight),
                         (model.blocks[3].mlp_channels.fc2.weight,
                          donor.blocks[3].mlp_channels.fc2.weight),
                         (model.neck.weight, donor.norm.weight)]:
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    assert not torch.equal(random.blocks[3].mlp_channels.fc2.weight,
                           donor.blocks[3].mlp_channels.fc2.weight)
    assert model.head.weight.shape == (10, 32)  # the file's 7-class head was left out


def test_broken_or_foreign_model_files_name_the_key_and_the_file(tmp_path, tiny_bert_dir):
    truncated = tmp_path / "truncated.safetensors"
    save_file({"w": torch.zeros(100)}, str(truncated))
    truncated.write_bytes(truncated.read_bytes()[:60])
    with pytest.raises(ConfigError, match="'model-source' = .*truncated.*not a readable"):
        build_backbone(spec_from(TINY_MIXER, str(truncated)))
    vit = tmp_path / "vit.safetensors"  # a real checkpoint, of another architecture
    save_file({k: v.contiguous() for k, v in
               build_backbone(TINY_VIT).stem.state_dict().items()}, str(vit))
    with pytest.raises(ConfigError, match="does not fit model MlpMixer.*'model-args'"):
        build_backbone(spec_from(TINY_MIXER, str(vit)))
    with pytest.raises(ConfigError, match="'model-source' = .*no such checkpoint file"):
        build_backbone(spec_from(TINY_MIXER, str(tmp_path / "absent.pth")))
    # a Hugging Face directory with a config but no weight file
    with pytest.raises(ConfigError, match="'model-source' = .*cannot load the weights"):
        build_backbone(ModelSpec("tiny-bert", tiny_bert_dir, "", 0, 5))
