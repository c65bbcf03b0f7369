"""`fedtune export`, branch by branch, in seconds: hand-made results folders (a config, a state
drawn at random with the names and shapes a run saves, metrics) of tiny random-init models (a
2-block timm ViT, the smoke preset's MLP-Mixer, 2-layer BERT / MPNet configs written
here), no download. Each refusal is checked word for word and writes nothing; each export is
read back through the libraries' own loaders (peft, timm, transformers, sentence-transformers'
modules) and compared tensor by tensor: bit-equal where the export copies the run's tensors,
within a rounding bound where it computes (LoRA merged into a weight). tests/test_export.py
checks the logits of whole exported models against fedtune's own.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from torch import nn

from fedtune_app.config import ConfigError
from fedtune_app.methods import resolve_config
from fedtune_app.model.backbones import ModelSpec, build_backbone
from fedtune_app.tools import export
from fedtune_app.tools.export import export_group, export_run

EPS = float(np.finfo(np.float32).eps)
VIT = {"preset": "smoke", "model": "vit_tiny_patch16_224", "max-classes": 3,
       "model-args": "img_size=8,patch_size=2,in_chans=1,embed_dim=16,depth=2,num_heads=2"}
# ViT blocks (d = 16): attn.proj 16 -> 16, mlp.fc2 64 -> 16 ('last-fc': both)
VIT_FC = {"attn.proj": (16, 16), "mlp.fc2": (64, 16)}
DIGITS = ["0", "1", "2"]  # digits' first three classes ('max-classes' = 3)
NAMES = ["zero", "one", "two"]  # class names a run recorded


def draw(rng, *shape) -> np.ndarray:
    return rng.normal(0, 0.5, shape).astype(np.float32)


def lora_state(rng, blocks: int, modules: dict, r: int, width: int, classes: int = 3,
               prefix: str = "") -> dict[str, np.ndarray]:
    """What a LoRA run saves: A (r x fan-in) and B (fan-out x r) of each adapted Linear of
    each block, and the head."""
    state = {}
    for j in range(blocks):
        for name, (fan_in, fan_out) in modules.items():
            state[f"{prefix}blocks.{j}.{name}.lora_A.weight"] = draw(rng, r, fan_in)
            state[f"{prefix}blocks.{j}.{name}.lora_B.weight"] = draw(rng, fan_out, r)
    state[f"{prefix}head.weight"] = draw(rng, classes, width)
    state[f"{prefix}head.bias"] = draw(rng, classes)
    return state


def bottleneck_state(rng, blocks: int, module: str, width: int, r: int,
                     classes: int = 3) -> dict[str, np.ndarray]:
    """A bottleneck-adapter run's tensors: down (r x width), up (width x r) per block, head."""
    state = {}
    for j in range(blocks):
        stem = f"blocks.{j}.{module}.adapter"
        state |= {f"{stem}.down.weight": draw(rng, r, width), f"{stem}.down.bias": draw(rng, r),
                  f"{stem}.up.weight": draw(rng, width, r), f"{stem}.up.bias": draw(rng, width)}
    return state | {"head.weight": draw(rng, classes, width), "head.bias": draw(rng, classes)}


def results_folder(folder: Path, run_config: dict, state: dict, metrics=None,
                   class_names=None) -> Path:
    """A finished run's results folder as the server writes it."""
    folder.mkdir(parents=True)
    config = {"run-config": run_config, "clients": []}
    if class_names is not None:
        config["class-names"] = class_names
    (folder / "config.json").write_text(json.dumps(config))
    save_file(state, str(folder / "state.safetensors"))
    if metrics is not None:
        (folder / "metrics.json").write_text(json.dumps(metrics))
    return folder


def seeded_timm(name: str, args: str, classes: int):
    """The base model as fedtune builds it (model-seed 0), straight from timm."""
    import timm

    spec = ModelSpec(name, "random", args, 0, classes)
    torch.manual_seed(0)
    return timm.create_model(name, pretrained=False, num_classes=classes, **spec.kwargs).eval()


def seeded_hf(path: str, classes: int):
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(
        AutoConfig.from_pretrained(path, num_labels=classes), dtype=torch.float32).eval()


def assert_merged(merged: torch.Tensor, base: torch.Tensor, a: np.ndarray, b: np.ndarray,
                  scale: float) -> None:
    """merged = W + scale B A, computed in float32: the r-term dot product, the scaling and
    the sum round r + 2 times, so each element is within gamma_{r+2} (|W| + scale |B| |A|) of
    the exact value (Higham, Sec. 3.1; u = eps / 2)."""
    w, a64, b64 = base.double().numpy(), a.astype(np.float64), b.astype(np.float64)
    m, unit = a.shape[0] + 2, EPS / 2
    bound = m * unit / (1 - m * unit) * (np.abs(w) + scale * np.abs(b64) @ np.abs(a64))
    error = np.abs(merged.double().numpy() - (w + scale * b64 @ a64))
    assert (error <= bound).all(), float((error - bound).max())
    assert not torch.equal(merged, base)  # the adapter changed the weight


def param(model: nn.Module, name: str) -> np.ndarray:
    return model.get_parameter(name).detach().numpy()


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def hf_dir(path: Path, kind: str, mean_pooled: bool = False) -> str:
    """A 2-layer random-init Hugging Face config (hidden 16); a sentence-transformers pooling
    file where ``mean_pooled``."""
    from transformers import BertConfig, MPNetConfig

    config = {"bert": BertConfig, "mpnet": MPNetConfig}[kind]
    config(vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
           intermediate_size=32, max_position_embeddings=40).save_pretrained(path)
    if mean_pooled:
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(
            json.dumps({"pooling_mode_mean_tokens": True}))
    return str(path)


# -- the results folder -------------------------------------------------------------------------

def test_an_unfinished_or_wrong_results_folder_is_named_with_what_it_lacks(tmp_path, capsys):
    gone = tmp_path / "no-such-run"
    with pytest.raises(ConfigError) as err:
        export.load_run(gone)
    assert str(err.value) == (f"{gone} is not a finished results folder of a fedtune run: "
                              f"missing {gone}/config.json, {gone}/state.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"run-config": {}}))
    with pytest.raises(ConfigError) as err:
        export.load_run(tmp_path)  # a run still going: no final state yet
    assert str(err.value).endswith(f"run: missing {tmp_path}/state.safetensors")
    (tmp_path / "config.json").unlink()
    save_file({"head.bias": np.zeros(3, np.float32)}, str(tmp_path / "state.safetensors"))
    with pytest.raises(ConfigError) as err:
        export.load_run(str(tmp_path))  # a str is a folder too
    assert str(err.value).endswith(f"run: missing {tmp_path}/config.json")
    with pytest.raises(SystemExit) as exit_:  # the CLI says the same, exit status 2
        export.main([str(gone)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err == (f"fedtune export: {gone} is not a finished results "
                                       f"folder of a fedtune run: missing {gone}/config.json, "
                                       f"{gone}/state.safetensors\n")
    # nothing was written where the export would have gone
    assert not gone.exists() and sorted(os.listdir(tmp_path)) == ["state.safetensors"]


def test_load_run_reads_the_config_the_state_and_the_metrics(tmp_path, rng):
    state = {"head.weight": draw(rng, 3, 16), "head.bias": draw(rng, 3)}
    metrics = [{"round": 1, "accuracy": 0.25}]
    folder = results_folder(tmp_path / "run", VIT | {"lora-r": 2}, state, metrics)
    cfg, loaded, read = export.load_run(folder)
    assert (cfg.model.model, cfg.adapter.lora_r, cfg.data.max_classes) == (
        "vit_tiny_patch16_224", 2, 3)
    assert sorted(loaded) == ["head.bias", "head.weight"]
    for name in state:
        np.testing.assert_array_equal(loaded[name], state[name])
    assert read == metrics
    (folder / "metrics.json").unlink()  # a run that never evaluated
    assert export.load_run(folder)[2] == []


def test_class_names_are_the_recorded_ones_else_the_data_sets(tmp_path):
    cfg = resolve_config(VIT)
    (tmp_path / "config.json").write_text(json.dumps({"class-names": NAMES}))
    assert export.run_class_names(tmp_path, cfg) == NAMES
    for recorded in ({}, {"class-names": []}):  # older runs recorded none
        (tmp_path / "config.json").write_text(json.dumps(recorded))
        assert export.run_class_names(tmp_path, cfg) == DIGITS


def test_a_run_with_max_classes_has_as_many_outputs_as_class_names():
    """The export sizes the head by the class names the run recorded; the run's model must
    have that many outputs (digits: 10 classes, the first 3 kept)."""
    from fedtune_app.data.splits import class_names_of, run_num_classes

    for keep, classes in ((3, 3), (20, 10), (0, 10)):
        cfg = resolve_config(VIT | {"max-classes": keep})
        assert run_num_classes(cfg) == len(class_names_of(cfg.data)) == classes


# -- names ---------------------------------------------------------------------------------------

def test_group_states_splits_a_grouped_state_and_drops_shared_tensors():
    one = resolve_config(VIT)
    state = {"head.bias": np.zeros(1)}
    assert export.group_states(one, state) == {None: state}
    groups = resolve_config({**VIT, "method": "homo", "model-groups": "vit_tiny_patch16_224",
                             "model-group-args": VIT["model-args"] + ";" + VIT["model-args"],
                             "model-group-sources": "random", "model-group-ratio": "1:1",
                             "capacities": "1,1"})
    a, b, c, shared = (np.full(1, v) for v in (1.0, 2.0, 3.0, 4.0))
    split = export.group_states(groups, {"groups.1.head.bias": a, "groups.0.head.bias": b,
                                         "groups.1.blocks.0.x": c, "share.adapter.0": shared})
    assert list(split) == [0, 1]  # group order, whatever the state's order
    assert split == {0: {"head.bias": b}, 1: {"head.bias": a, "blocks.0.x": c}}


def test_library_names_of_block_head_and_method_tensors():
    vit = build_backbone(ModelSpec("vit_tiny_patch16_224", "random", VIT["model-args"], 0, 3))
    library = vit.library_model()
    assert export.library_name(vit, library, "blocks.1.mlp.fc2.lora_A.weight") == \
        "blocks.1.mlp.fc2.lora_A.weight"
    assert export.library_name(vit, library, "head.bias") == "head.bias"
    assert export.library_name(vit, library, "bricks.all.1.A1") == "bricks.all.1.A1"
    assert export.module_path(library, vit.blocks[1]) == "blocks.1"
    with pytest.raises(ValueError) as err:
        export.module_path(library, nn.Linear(2, 2))
    assert str(err.value) == "Linear is not part of VisionTransformer"


def test_library_names_of_a_text_model(tmp_path):
    bert = build_backbone(ModelSpec(hf_dir(tmp_path / "bert", "bert"), "random", "", 0, 3))
    library = bert.library_model()
    assert export.library_name(bert, library, "blocks.1.output.dense.lora_B.weight") == \
        "bert.encoder.layer.1.output.dense.lora_B.weight"
    assert export.library_name(bert, library, "head.weight") == "classifier.weight"
    # a tensor a method adds keeps its name, also where "head." is inside it
    assert export.library_name(bert, library, "exits.head.0") == "exits.head.0"
    assert export.pooling_of(bert) == "library"  # BERT's own pooler reads the first token


def test_base_names():
    assert export.base_name(ModelSpec("vit_tiny_patch16_224", "random")) == \
        "vit_tiny_patch16_224"
    assert export.base_name(ModelSpec("vit_tiny_patch16_224", "pretrained")) == \
        "vit_tiny_patch16_224"
    assert export.base_name(ModelSpec("vit_tiny_patch16_224", "/ckpt/vit.safetensors")) == \
        "/ckpt/vit.safetensors"
    # a Hugging Face model: the folder it loads from
    assert export.base_name(ModelSpec("some/model", "random")) == "some/model"
    assert export.base_name(ModelSpec("some/model", "/local/model")) == "/local/model"


def test_class_names_go_to_a_transformers_config_only():
    from types import SimpleNamespace

    from transformers import BertConfig

    with_config = SimpleNamespace(config=BertConfig())
    export.set_class_names(with_config, NAMES)
    assert with_config.config.id2label == {0: "zero", 1: "one", 2: "two"}
    assert with_config.config.label2id == {"zero": 0, "one": 1, "two": 2}
    plain = SimpleNamespace(config=SimpleNamespace())  # a config without labels: left alone
    export.set_class_names(plain, NAMES)
    assert vars(plain.config) == {}
    export.set_class_names(nn.Linear(2, 2), NAMES)  # timm models: no config at all


def test_mean_pooling_code_needs_a_dropout_and_linear_classifier(tmp_path):
    from transformers import BertForSequenceClassification

    library = build_backbone(ModelSpec(hf_dir(tmp_path / "b", "bert", mean_pooled=True),
                                       "random", "", 0, 3)).library_model()
    assert export.mean_pooling_names(library) == {
        "library_class": "BertForSequenceClassification", "base_class": "BertModel",
        "config_class": "BertConfig", "prefix": "bert", "name": "MeanPooledBert",
        "model_type": "fedtune-mean-pooled-bert"}
    refusal = ("no library loader fits this export: the run mean-pools {}'s encoder into a "
               "Linear classifier, and the shipped mean-pooling code supports transformers "
               "classes whose head is dropout + a Linear `classifier` (BERT-like encoders)")
    dropout = library.dropout
    library.dropout = nn.Identity()  # a Linear classifier, no dropout
    with pytest.raises(ConfigError) as err:
        export.mean_pooling_names(library)
    assert str(err.value) == refusal.format("BertForSequenceClassification")
    library.dropout, library.classifier = dropout, nn.Sequential()  # dropout, no Linear
    with pytest.raises(ConfigError):
        export.mean_pooling_names(library)

    class Renamed(BertForSequenceClassification):  # not a class transformers can import
        pass

    renamed = Renamed(library.config)
    assert isinstance(renamed.classifier, nn.Linear)
    with pytest.raises(ConfigError) as err:
        export.mean_pooling_names(renamed)
    assert str(err.value) == refusal.format("Renamed")

    class Plain(nn.Module):  # dropout + Linear, but no base model and no config: refused too
        base_model_prefix = "encoder"

        def __init__(self):
            super().__init__()
            self.dropout, self.classifier = nn.Dropout(), nn.Linear(2, 2)

    with pytest.raises(ConfigError) as err:
        export.mean_pooling_names(Plain())
    assert str(err.value) == refusal.format("Plain")


# -- refusals: each names what is wrong, and nothing is written ---------------------------------

def refused(call, out: Path) -> str:
    with pytest.raises(ConfigError) as err:
        call()
    assert not out.exists()
    return str(err.value)


def test_a_fully_fine_tuned_run_is_refused(tmp_path):
    cfg = resolve_config(VIT | {"method": "all-large", "client-trains": "full"})
    out = tmp_path / "out"
    assert refused(lambda: export_group(cfg, {}, out, False, DIGITS), out) == (
        "run-config key 'client-trains' = 'full': export writes adapters on the pretrained "
        "backbone; a fully fine-tuned run's block weights are in its checkpoint, and their "
        "export is not implemented")


def test_adapters_no_library_computes_need_extras_and_never_merge(tmp_path, rng):
    state = bottleneck_state(rng, 2, "mlp.fc2", 16, 4)
    cfg = resolve_config(VIT | {"adapter": "bottleneck", "adapter-modules": "mlp.fc2"})
    out = tmp_path / "out"
    for merge in (False, True):  # --extras is asked first
        assert refused(lambda m=merge: export_group(cfg, state, out, m, DIGITS), out) == (
            "no library loader computes this model: method 'fedra', adapter 'bottleneck' "
            "trained tensors that peft / transformers / timm have no module for "
            "(blocks.0.mlp.fc2.adapter.down.bias, ... 8 in all; see fedtune_extras.json's "
            "formulas). Pass --extras to write them anyway as fedtune-only files "
            "(fedtune_extras.safetensors + fedtune_extras.json)")
    assert refused(lambda: export_group(cfg, state, out, True, DIGITS, True), out) == (
        "--merge: run-config key 'adapter' = 'bottleneck': only LoRA adapters merge into the "
        "base weights (a bottleneck adapter is non-linear); export without --merge")


def test_depthfl_exits_change_the_prediction_so_they_need_extras(tmp_path, rng):
    cfg = resolve_config(VIT | {"method": "depthfl", "adapter-modules": "mlp.fc2"})
    state = lora_state(rng, 2, {"mlp.fc2": (64, 16)}, 8, 16)
    state |= {"exits.0.weight": draw(rng, 3, 16), "exits.0.bias": draw(rng, 3)}
    out = tmp_path / "out"
    assert refused(lambda: export_group(cfg, state, out, False, DIGITS), out).startswith(
        "no library loader computes this model: method 'depthfl', adapter 'lora' trained "
        "tensors that peft / transformers / timm have no module for (exits.0.bias, ... 2 in "
        "all;")
    info = export_group(cfg, state, out, False, DIGITS, extras_ok=True)
    assert info["files"] == ["adapter_config.json", "adapter_model.safetensors",
                             "fedtune_extras.safetensors", "fedtune_extras.json", "pooling.json"]
    extras = load_file(str(out / "fedtune_extras.safetensors"))
    assert sorted(extras) == ["exits.0.bias", "exits.0.weight"]  # the head is peft's
    for name, value in extras.items():
        np.testing.assert_array_equal(value, state[name])
    assert json.loads((out / "fedtune_extras.json").read_text()) == {
        "tensors": ["exits.0.bias", "exits.0.weight"],
        "formulas": {"exits.": "DepthFL exit classifier: Linear on the pooled features after "
                               "block <d> (exits.<d>); prediction = mean over exits and head "
                               "of log_softmax"}}


def test_a_first_token_mpnet_run_is_refused(tmp_path, rng):
    mpnet = resolve_config({"model": hf_dir(tmp_path / "mpnet", "mpnet"),
                            "model-source": "random", "capacities": "2,1"})
    state = lora_state(rng, 2, {"output.dense": (32, 16)}, 8, 16)
    out = tmp_path / "out"
    assert refused(lambda: export_group(mpnet, state, out, False, NAMES), out) == (
        "no library loader fits this export: the run reads MPNetForSequenceClassification's "
        "first token into one Linear layer, a head no library class has; train from a "
        "mean-pooled (sentence-transformers) checkpoint to export it")


def test_a_mean_pooled_head_the_shipped_code_cannot_hold_is_refused_before_writing(
        tmp_path, rng, monkeypatch):
    """BERT and MPNet, the encoders fedtune builds, both fit the shipped mean-pooling code; a
    BERT whose head lost its dropout stands for one that would not."""
    real = export.build_backbone

    def without_dropout(spec):
        backbone = real(spec)
        backbone.library_model().dropout = nn.Identity()  # the model the export saves
        return backbone

    monkeypatch.setattr(export, "build_backbone", without_dropout)
    cfg = resolve_config({"model": hf_dir(tmp_path / "bert", "bert", mean_pooled=True),
                          "model-source": "random", "capacities": "2,1"})
    state = lora_state(rng, 2, {"output.dense": (32, 16)}, 8, 16)
    out = tmp_path / "out"
    assert refused(lambda: export_group(cfg, state, out, False, NAMES), out).startswith(
        "no library loader fits this export: the run mean-pools "
        "BertForSequenceClassification's encoder into a Linear classifier")


MISFIT = ("the run's state does not fit the model its config builds (run-config keys 'model', "
          "'model-args', 'lora-r'): ")


@pytest.mark.parametrize("change, problem", [
    ({"blocks.0.mlp.fc2.lora_A.weight": (4, 64)},  # another run's lora-r
     "blocks.0.mlp.fc2.lora_A.weight has shape (4, 64), the model takes (8, 64)"),
    ({"blocks.1.attn.proj.lora_B.weight": (32, 8)},  # a wider model's
     "blocks.1.attn.proj.lora_B.weight has shape (32, 8), the model takes (16, 8)"),
    ({"blocks.2.mlp.fc2.lora_A.weight": (8, 64)},  # a deeper model's (depth 2 here)
     "blocks.2.mlp.fc2.lora_A.weight adapts no Linear layer of the model"),
    ({"blocks.0.mlp.lora_B.weight": (16, 8)},  # the MLP is no Linear
     "blocks.0.mlp.lora_B.weight adapts no Linear layer of the model"),
    # 5 classes (checked after a tensor of a method's, which is not checked)
    ({"exits.0.bias": (3,), "head.bias": (5,)}, "head.bias has shape (5,), the model takes (3,)"),
    ({"head.scale": (3,)}, "head.scale names no parameter of the model's head"),
    ({"groups.1.head.bias": (3,)},
     "groups.1.head.bias belongs to a model group, and the run config names none"),
], ids=["lora-r", "width", "depth", "not-linear", "classes", "head-part", "group"])
def test_a_state_that_does_not_fit_the_run_s_model_is_refused(tmp_path, rng, change, problem):
    state = lora_state(rng, 2, VIT_FC, 8, 16)
    state |= {name: draw(rng, *shape) for name, shape in change.items()}
    out = tmp_path / "out"
    assert refused(lambda: export_group(resolve_config(VIT), state, out, True, DIGITS),
                   out) == MISFIT + problem


def test_a_grouped_run_whose_state_holds_no_group_is_refused(tmp_path, rng):
    rc = {**VIT, "method": "homo", "model-groups": "vit_tiny_patch16_224",
          "model-group-args": VIT["model-args"] + ";" + VIT["model-args"],
          "model-group-sources": "random", "model-group-ratio": "1:1", "capacities": "1,1"}
    # a single model's state under a grouped config
    folder = results_folder(tmp_path / "run", rc, lora_state(rng, 2, VIT_FC, 8, 16),
                            class_names=NAMES)
    assert refused(lambda: export_run(folder), folder / "export") == (
        "the run's state does not fit the model its config builds: no tensor of the 2 model "
        "groups the config names")


def test_the_cli_prints_the_refusal_and_exits_2(tmp_path, rng, capsys):
    folder = results_folder(tmp_path / "run", VIT | {"adapter": "bottleneck",
                                                     "adapter-modules": "mlp.fc2"},
                            bottleneck_state(rng, 2, "mlp.fc2", 16, 4), class_names=NAMES)
    with pytest.raises(SystemExit) as exit_:
        export.main([str(folder)])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.startswith(
        "fedtune export: no library loader computes this model: method 'fedra', adapter "
        "'bottleneck' trained")
    assert not (folder / "export").exists()
    # with --extras the same run exports, where --out says, and the folder is printed
    export.main([str(folder), "--extras", "--out", str(tmp_path / "o")])
    assert capsys.readouterr().out == f"{tmp_path / 'o'}\n"
    assert (tmp_path / "o" / "fedtune_extras.safetensors").is_file()


def test_the_cli_help_says_what_each_option_does(capsys):
    with pytest.raises(SystemExit) as exit_:
        export.main(["--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for part in ("usage: fedtune export [-h] [--merge] [--out OUT] [--extras] [--rank K] "
                 "results",
                 "Export a run's global model as a peft adapter folder (and with --merge the "
                 "merged model in its library's format).",
                 "results results folder of a finished run",
                 "--merge also save the base model with the LoRA adapters merged in",
                 "--out OUT output folder (default: <results>/export)",
                 "--extras write tensors no library module computes (bottleneck adapters, "
                 "DepthFL exits) as fedtune-only files instead of refusing",
                 "--rank K LoRA runs: write each adapted Linear's whole update (lora_delta "
                 "included: FLoRA, FedEx-LoRA, FlexLoRA) as its best rank-K LoRA factors (SVD); "
                 "rank.json gives each one's relative error"):
        assert part in text


# -- exports, read back by the libraries ---------------------------------------------------------

def test_timm_lora_export_loads_in_peft_and_merged_in_timm(tmp_path, rng, capsys):
    """r = 4, alpha = 12: peft scales B A by alpha / r = 3."""
    import timm
    from peft import PeftModel

    rc = VIT | {"lora-r": 4, "lora-alpha": 12.0, "lora-dropout": 0.05}
    state = lora_state(rng, 2, VIT_FC, 4, 16)
    folder = results_folder(tmp_path / "run", rc, state, [{"round": 2, "accuracy": 0.5}])
    export.main([str(folder), "--merge"])
    out = folder / "export"  # the default place
    assert capsys.readouterr().out == f"{out}\n"
    assert sorted(os.listdir(out)) == ["README.md", "adapter_config.json",
                                       "adapter_model.safetensors", "merged", "pooling.json"]
    config = json.loads((out / "adapter_config.json").read_text())
    assert (config["r"], config["lora_alpha"], config["lora_dropout"]) == (4, 12.0, 0.05)
    assert config["target_modules"] == (r"^(?:blocks\.0\.attn\.proj|blocks\.0\.mlp\.fc2|"
                                        r"blocks\.1\.attn\.proj|blocks\.1\.mlp\.fc2)$")
    assert config["modules_to_save"] == ["head"]
    assert config["task_type"] is None  # not a transformers class
    assert config["base_model_name_or_path"] == "vit_tiny_patch16_224"
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert sorted(saved) == sorted(f"base_model.model.{n}" for n in state)
    for name, value in state.items():  # copied: bit-equal
        np.testing.assert_array_equal(saved[f"base_model.model.{name}"], value)
    assert json.loads((out / "pooling.json").read_text()) == {"pooling": "library"}

    base = seeded_timm("vit_tiny_patch16_224", VIT["model-args"], 3)
    untouched = {n: p.detach().clone() for n, p in base.named_parameters()}
    peft_model = PeftModel.from_pretrained(base, str(out))
    for j in range(2):
        for m in VIT_FC:
            for x in "AB":
                np.testing.assert_array_equal(
                    param(peft_model, f"base_model.model.blocks.{j}.{m}.lora_{x}.default."
                                      "weight"), state[f"blocks.{j}.{m}.lora_{x}.weight"])
    for x in ("weight", "bias"):
        np.testing.assert_array_equal(
            param(peft_model, f"base_model.model.head.modules_to_save.default.{x}"),
            state[f"head.{x}"])

    merged = timm.create_model(f"local-dir:{out / 'merged'}", pretrained=True)
    assert merged.pretrained_cfg["label_names"] == DIGITS
    # the run's model's own input (1 x 8 x 8) and one channel's normalisation (timm averages
    # the published model's three means 0.5): what timm's data config prepares images with
    assert tuple(merged.pretrained_cfg["input_size"]) == (1, 8, 8)
    assert tuple(merged.pretrained_cfg["mean"]) == tuple(merged.pretrained_cfg["std"]) == (0.5,)
    assert (merged.embed_dim, len(merged.blocks), merged.num_classes) == (16, 2, 3)
    for name, value in merged.named_parameters():
        if name.startswith("head."):
            np.testing.assert_array_equal(value.detach().numpy(), state[name])
        elif (m := re.match(r"blocks\.(\d)\.(attn\.proj|mlp\.fc2)\.weight", name)):
            j, fc = m.groups()
            assert_merged(value.detach(), untouched[name], state[f"blocks.{j}.{fc}.lora_A.weight"],
                          state[f"blocks.{j}.{fc}.lora_B.weight"], scale=3.0)
        else:  # every other weight is the base's
            assert torch.equal(value, untouched[name]), name


def test_mixer_built_from_its_class_gets_a_pretrained_cfg_for_timms_folder(tmp_path, rng):
    """The smoke preset's Mixer overrides patch_size, which its timm entrypoint fixes: fedtune
    builds it from the class, which sets no pretrained_cfg; the merged folder still names the
    architecture, the arguments and the classes, and holds the merged weights."""
    import timm
    from timm.models.mlp_mixer import MlpMixer

    rc = {"preset": "smoke", "max-classes": 3, "adapter-modules": "last-fc-mlp"}
    state = lora_state(rng, 4, {"mlp_channels.fc2": (128, 32)}, 8, 32)
    info = export_group(resolve_config(rc), state, tmp_path / "out", True, NAMES)
    assert info["files"] == ["adapter_config.json", "adapter_model.safetensors", "pooling.json",
                             "merged/"]
    config = json.loads((tmp_path / "out" / "merged" / "config.json").read_text())
    assert config["architecture"] == "mixer_s16_224"
    assert config["label_names"] == NAMES
    assert config["model_args"] | {"num_classes": 3} == {
        "img_size": 8, "patch_size": 2, "in_chans": 1, "embed_dim": 32, "num_blocks": 4,
        "num_classes": 3, "global_pool": "avg"}
    kwargs = {"img_size": 8, "patch_size": 2, "in_chans": 1, "embed_dim": 32, "num_blocks": 4}
    torch.manual_seed(0)
    base = MlpMixer(num_classes=3, **kwargs)
    merged = MlpMixer(num_classes=3, **kwargs)
    timm.models.load_checkpoint(merged, str(tmp_path / "out" / "merged" / "model.safetensors"),
                                strict=True)
    for j in range(4):
        name = f"blocks.{j}.mlp_channels.fc2.weight"
        assert_merged(merged.get_parameter(name).detach(), base.get_parameter(name).detach(),
                      state[f"blocks.{j}.mlp_channels.fc2.lora_A.weight"],
                      state[f"blocks.{j}.mlp_channels.fc2.lora_B.weight"], scale=1.0)
    assert torch.equal(merged.stem.proj.weight, base.stem.proj.weight)


def test_fedbrick_bricks_go_to_the_extras_beside_a_loadable_adapter(tmp_path, rng):
    """BRICKs stand in for missing blocks: the full global model does not use them, so the
    export needs no --extras, and the adapter loads like any LoRA run's."""
    cfg = resolve_config(VIT | {"method": "fedbrick", "adapter-modules": "mlp.fc2"})
    state = lora_state(rng, 2, {"mlp.fc2": (64, 16)}, 8, 16)
    bricks = {f"bricks.all.{pos}.{m}": draw(rng, *((8, 16) if m[0] == "A" else (16, 8)))
              for pos in (0, 1) for m in ("A1", "A2", "B1", "B2")}
    out = tmp_path / "out"
    info = export_group(cfg, bricks | state, out, False, DIGITS)  # the bricks first
    assert info == {"model": "vit_tiny_patch16_224", "source": "random",
                    "base": "vit_tiny_patch16_224", "pooling": "library", "text": False,
                    "lora": True, "num_classes": 3,
                    "files": ["adapter_config.json", "adapter_model.safetensors",
                              "fedtune_extras.safetensors", "fedtune_extras.json",
                              "pooling.json"]}
    extras = load_file(str(out / "fedtune_extras.safetensors"))
    assert sorted(extras) == sorted(bricks)
    for name, value in bricks.items():
        np.testing.assert_array_equal(extras[name], value)
    assert json.loads((out / "fedtune_extras.json").read_text()) == {
        "tensors": sorted(bricks),
        "formulas": {"bricks.": "FedBRICK BRICK E(x) = x * softmax(B1 A1 x) + B2 A2 x + x "
                                "standing in for block <position> of domain <domain>"}}
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert sorted(saved) == sorted(f"base_model.model.{n}" for n in state)
    for name, value in state.items():
        np.testing.assert_array_equal(saved[f"base_model.model.{name}"], value)


def test_bottleneck_extras_hold_every_tensor_and_the_head_with_their_formulas(tmp_path, rng):
    state = bottleneck_state(rng, 2, "mlp.fc2", 16, 4)
    cfg = resolve_config(VIT | {"adapter": "bottleneck", "adapter-modules": "mlp.fc2"})
    info = export_group(cfg, state, tmp_path / "out", False, DIGITS, extras_ok=True)
    assert info["lora"] is False and info["files"] == [
        "fedtune_extras.safetensors", "fedtune_extras.json", "pooling.json"]
    extras = load_file(str(tmp_path / "out" / "fedtune_extras.safetensors"))
    assert sorted(extras) == sorted(state)  # timm's module paths are ours
    for name, value in state.items():
        np.testing.assert_array_equal(extras[name], value)
    assert json.loads((tmp_path / "out" / "fedtune_extras.json").read_text())["formulas"] == {
        ".adapter.down": "bottleneck adapter on the Linear's output y: y + up(gelu(down(y)))",
        "head.": "classification head (no peft adapter in this run)"}


def test_a_text_models_extras_name_the_library_head_and_give_its_formula(tmp_path, rng):
    """BERT's head is `classifier`: the extras hold `classifier.*`, and the formula of the
    head is keyed by that name part, so that every tensor of the file has its formula."""
    cfg = resolve_config({"model": hf_dir(tmp_path / "bert", "bert"), "model-source": "random",
                          "capacities": "2,1", "adapter": "bottleneck",
                          "adapter-modules": "output.dense"})
    state = bottleneck_state(rng, 2, "output.dense", 16, 4, classes=5)
    export_group(cfg, state, tmp_path / "out", False, NAMES + ["three", "four"], True)
    extras = load_file(str(tmp_path / "out" / "fedtune_extras.safetensors"))
    for name, value in state.items():
        lib = name.replace("blocks.", "bert.encoder.layer.").replace("head.", "classifier.")
        np.testing.assert_array_equal(extras[lib], value)
    doc = json.loads((tmp_path / "out" / "fedtune_extras.json").read_text())
    assert doc["tensors"] == sorted(extras) and len(extras) == len(state)
    assert doc["formulas"] == {
        ".adapter.down": "bottleneck adapter on the Linear's output y: y + up(gelu(down(y)))",
        "classifier.": "classification head (no peft adapter in this run)"}
    assert all(any(k in n for k in doc["formulas"]) for n in doc["tensors"]
               if ".adapter.up." not in n)  # up goes with down's formula


def test_bert_lora_export_is_the_library_class_with_the_run_s_labels(tmp_path, tiny_bert_dir,
                                                                      rng):
    from peft import PeftModel
    from transformers import AutoModelForSequenceClassification

    cfg = resolve_config({"model": tiny_bert_dir, "model-source": "random", "capacities": "3,2",
                          "adapter-modules": "output.dense", "lora-alpha": 16.0})
    state = lora_state(rng, 3, {"output.dense": (32, 16)}, 8, 16)
    out = tmp_path / "out"
    info = export_group(cfg, state, out, True, NAMES)
    assert info == {"model": tiny_bert_dir, "source": "random", "base": tiny_bert_dir,
                    "pooling": "library", "text": True, "lora": True, "num_classes": 3,
                    "files": ["adapter_config.json", "adapter_model.safetensors",
                              "pooling.json", "merged/"]}
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["task_type"] == "SEQ_CLS"  # AutoPeftModelForSequenceClassification's task
    assert "classifier" in config["modules_to_save"]
    assert config["target_modules"] == "^(?:" + "|".join(
        rf"bert\.encoder\.layer\.{j}\.output\.dense" for j in range(3)) + ")$"
    base = seeded_hf(tiny_bert_dir, 3)
    untouched = {n: p.detach().clone() for n, p in base.named_parameters()}
    peft_model = PeftModel.from_pretrained(base, str(out))
    np.testing.assert_array_equal(
        param(peft_model, "base_model.model.bert.encoder.layer.2.output.dense.lora_B.default."
                          "weight"), state["blocks.2.output.dense.lora_B.weight"])
    np.testing.assert_array_equal(
        param(peft_model, "base_model.model.classifier.modules_to_save.default.weight"),
        state["head.weight"])

    merged = AutoModelForSequenceClassification.from_pretrained(str(out / "merged"))
    assert type(merged).__name__ == "BertForSequenceClassification"
    assert merged.config.id2label == {0: "zero", 1: "one", 2: "two"}
    assert merged.config.label2id == {"zero": 0, "one": 1, "two": 2}
    np.testing.assert_array_equal(param(merged, "classifier.bias"), state["head.bias"])
    for j in range(3):
        name = f"bert.encoder.layer.{j}.output.dense.weight"
        assert_merged(merged.get_parameter(name).detach(), untouched[name],
                      state[f"blocks.{j}.output.dense.lora_A.weight"],
                      state[f"blocks.{j}.output.dense.lora_B.weight"], scale=2.0)
    assert torch.equal(merged.bert.pooler.dense.weight, untouched["bert.pooler.dense.weight"])
    assert json.loads((out / "merged" / "pooling.json").read_text()) == {"pooling": "library"}
    assert (out / "merged" / "tokenizer_config.json").is_file()
    assert not (out / "merged" / "modeling_fedtune.py").exists()


def test_mean_pooled_bert_ships_its_pooling_code_base_and_sentence_transformers_modules(
        tmp_path, rng):
    """A sentence-transformers checkpoint (token mean): base/ and merged/ load through the
    shipped class (trust_remote_code), which pools by the token mean; merged/ is also a
    sentence-transformers folder whose Dense module is the trained head."""
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling
    from transformers import AutoModelForSequenceClassification

    path = hf_dir(tmp_path / "st-bert", "bert", mean_pooled=True)
    cfg = resolve_config({"model": path, "model-source": "random", "capacities": "2,1",
                          "adapter-modules": "output.dense", "max-length": 12})
    state = lora_state(rng, 2, {"output.dense": (32, 16)}, 8, 16)
    folder = results_folder(tmp_path / "run", dict(cfg.flat), state, class_names=NAMES)
    out = export_run(folder, out=tmp_path / "a" / "b", merge=True)  # parents made
    assert out == tmp_path / "a" / "b"
    assert json.loads((out / "pooling.json").read_text()) == {"pooling": "mean"}
    assert json.loads((out / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == str(out / "base")
    assert "\n- files: base/, adapter_config.json, adapter_model.safetensors, pooling.json, " \
        "merged/\n" in (out / "README.md").read_text()
    auto_map = {"AutoConfig": "modeling_fedtune.MeanPooledBertConfig",
                "AutoModel": "modeling_fedtune.MeanPooledBertModel",
                "AutoModelForSequenceClassification":
                    "modeling_fedtune.MeanPooledBertForSequenceClassification"}
    for sub in ("base", "merged"):
        config = json.loads((out / sub / "config.json").read_text())
        assert config["model_type"] == "fedtune-mean-pooled-bert"
        assert config["architectures"] == ["MeanPooledBertForSequenceClassification"]
        assert config["auto_map"] == auto_map
        code = (out / sub / "modeling_fedtune.py").read_text()
        assert "class MeanPooledBertForSequenceClassification(BertForSequenceClassification):" \
            in code and "hidden = self.bert(input_ids=input_ids" in code

    seeded = seeded_hf(path, 3)
    base = AutoModelForSequenceClassification.from_pretrained(str(out / "base"),
                                                              trust_remote_code=True).eval()
    assert type(base).__name__ == "MeanPooledBertForSequenceClassification"
    for name, value in seeded.named_parameters():  # the pretrained model, no adapter in it
        assert torch.equal(base.get_parameter(name), value), name
    merged = AutoModelForSequenceClassification.from_pretrained(str(out / "merged"),
                                                                trust_remote_code=True).eval()
    np.testing.assert_array_equal(param(merged, "classifier.weight"), state["head.weight"])
    assert merged.config.id2label == {0: "zero", 1: "one", 2: "two"}
    # the shipped forward: the mean of the unpadded tokens' last hidden states, then the head
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 0, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with torch.no_grad():
        logits = merged(input_ids=ids, attention_mask=mask).logits
        hidden = merged.bert(input_ids=ids, attention_mask=mask).last_hidden_state
        pooled = torch.stack([hidden[0].mean(0), hidden[1, :2].mean(0)])
        expected = pooled @ merged.classifier.weight.T + merged.classifier.bias
    # each side: a mean of <= 4 token states, then a 16-term dot product and the bias: at
    # most m = 4 + 16 + 2 roundings, each logit within gamma_m * 16 max|W| max|h| (+ |b|) of
    # the exact one, gamma_m < m eps; twice that between the two
    h, w = float(hidden.abs().max()), float(merged.classifier.weight.abs().max())
    b = float(merged.classifier.bias.abs().max())
    tol = 2 * (4 + 16 + 2) * EPS * (16 * w * h + b)
    torch.testing.assert_close(logits, expected, rtol=0, atol=tol)

    assert json.loads((out / "merged" / "modules.json").read_text()) == [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}]
    assert json.loads((out / "merged" / "sentence_bert_config.json").read_text()) == {
        "max_seq_length": 12, "do_lower_case": False}
    pooling = Pooling.load(str(out / "merged" / "1_Pooling"))
    assert (pooling.get_embedding_dimension(), pooling.pooling_mode) == (16, "mean")
    dense = Dense.load(str(out / "merged" / "2_Dense"))
    assert isinstance(dense.activation_function, nn.Identity)
    np.testing.assert_array_equal(dense.linear.weight.detach().numpy(), state["head.weight"])
    np.testing.assert_array_equal(dense.linear.bias.detach().numpy(), state["head.bias"])
    assert "\n# the run read the first 12 tokens of each text: pipeline(..., truncation=True, " \
        "max_length=12)\n```\n" in (out / "README.md").read_text()
    # written again over the same folder (a second export): the same modules
    export.save_sentence_transformers_modules(merged, out / "merged", 20)
    assert Dense.load(str(out / "merged" / "2_Dense")).linear.weight.shape == (3, 16)
    assert json.loads((out / "merged" / "sentence_bert_config.json").read_text())[
        "max_seq_length"] == 20


def test_model_group_lora_runs_export_one_folder_per_group(tmp_path, rng):
    import timm
    from peft import PeftModel

    args = "img_size=8,patch_size=2,in_chans=1,num_heads=2"
    rc = {**VIT, "method": "homo", "model-groups": "vit_tiny_patch16_224",
          "model-group-args": f"{args},embed_dim=16,depth=2;{args},embed_dim=32,depth=3",
          "model-group-sources": "random", "model-group-ratio": "1:1", "capacities": "1,1"}
    states = [lora_state(rng, 2, VIT_FC, 8, 16),
              lora_state(rng, 3, {"attn.proj": (32, 32), "mlp.fc2": (128, 32)}, 8, 32)]
    state = {f"groups.{g}.{n}": v for g, s in enumerate(states) for n, v in s.items()}
    folder = results_folder(tmp_path / "run", rc, state, class_names=NAMES)
    out = export_run(folder, merge=True)
    assert sorted(os.listdir(out)) == ["README.md", "group-0", "group-1"]
    card = (out / "README.md").read_text()
    for g, (width, depth) in enumerate(((16, 2), (32, 3))):
        where = out / f"group-{g}"
        base = seeded_timm("vit_tiny_patch16_224", f"{args},embed_dim={width},depth={depth}", 3)
        peft_model = PeftModel.from_pretrained(base, str(where))
        for name, value in states[g].items():
            lib = name.replace(".weight", ".default.weight") if "lora_" in name else \
                name.replace("head.", "head.modules_to_save.default.")
            np.testing.assert_array_equal(param(peft_model, f"base_model.model.{lib}"), value)
        merged = timm.create_model(f"local-dir:{where / 'merged'}", pretrained=True)
        assert (merged.embed_dim, len(merged.blocks)) == (width, depth)
        np.testing.assert_array_equal(param(merged, "head.weight"), states[g]["head.weight"])
        assert f"## group-{g}: vit_tiny_patch16_224 (random)" in card
        assert f'timm.create_model("local-dir:group-{g}/merged")' in card


def test_pfedlora_b_c_a_is_exported_as_lora_b_times_c(tmp_path, rng):
    """pFedLoRA adapts W by (alpha / r) B C A with a core C (r x r): the adapter folder holds
    B' = B C as LoRA's B, so that peft computes the run's model; C is in no file."""
    from peft import PeftModel

    from fedtune_app.apps.evaluation import build_global
    from floats import FLOAT32_ROUNDING, float64_atol
    from test_export import tolerance

    args = "img_size=8,patch_size=2,in_chans=1,num_heads=2"
    rc = {**VIT, "method": "pfedlora", "model-groups": "vit_tiny_patch16_224",
          "model-group-args": f"{args},embed_dim=16,depth=2;{args},embed_dim=32,depth=2",
          "model-group-sources": "random", "model-group-ratio": "1:1", "capacities": "1,1",
          "lora-alpha": 16.0}
    state = {}
    for g, width in enumerate((16, 32)):
        state |= lora_state(rng, 2, {"attn.proj": (width, width), "mlp.fc2": (4 * width, width)},
                            8, width, prefix=f"groups.{g}.")
        state |= {f"groups.{g}.blocks.{j}.{m}.lora_C.weight": draw(rng, 8, 8)
                  for j in range(2) for m in ("attn.proj", "mlp.fc2")}
    folder = results_folder(tmp_path / "run", rc, state, class_names=NAMES)
    out = export_run(folder)
    assert sorted(os.listdir(out / "group-0")) == [
        "README.md", "adapter_config.json", "adapter_model.safetensors", "pooling.json"]
    model, recipe = build_global(resolve_config(rc))
    images = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(3))
    for g, width in enumerate((16, 32)):
        saved = load_file(str(out / f"group-{g}" / "adapter_model.safetensors"))
        assert not any("lora_C" in k for k in saved)
        for j in range(2):
            stem = f"groups.{g}.blocks.{j}.mlp.fc2"
            b, c = (state[f"{stem}.lora_{x}.weight"].astype(np.float64) for x in "BC")
            # B C in float64 (8-term sums), rounded once to float32
            np.testing.assert_allclose(
                saved[f"base_model.model.blocks.{j}.mlp.fc2.lora_B.weight"], b @ c,
                rtol=FLOAT32_ROUNDING, atol=float64_atol(np.abs(b).max(), np.abs(c).max(),
                                                         terms=8))
        # peft on the base computes what fedtune's group model computes
        base = seeded_timm("vit_tiny_patch16_224", f"{args},embed_dim={width},depth=2", 3)
        peft_model = PeftModel.from_pretrained(base, str(out / f"group-{g}")).eval()
        ours = model.groups[g].eval()
        recipe.recipes[g].load(ours, state)
        with torch.no_grad():
            expected = ours(images)
            torch.testing.assert_close(peft_model(images), expected, rtol=0,
                                       atol=tolerance(expected, depth=2, width=4 * width))


def test_heterotune_groups_write_their_fused_adapters_with_the_formula(tmp_path, rng):
    rc = {**VIT, "method": "heterotune", "model-groups": "vit_tiny_patch16_224",
          "model-group-args": VIT["model-args"] + ";" + VIT["model-args"],
          "model-group-sources": "random", "model-group-ratio": "1:1", "capacities": "1,1"}
    state = {}
    for g in (0, 1):
        state |= {f"groups.{g}.blocks.1.mlp.fc2.adapter.A": draw(rng, 16, 4),
                  f"groups.{g}.blocks.1.mlp.fc2.adapter.B": draw(rng, 4, 16),
                  f"groups.{g}.head.weight": draw(rng, 3, 16)}
    folder = results_folder(tmp_path / "run", rc, state, class_names=NAMES)
    with pytest.raises(ConfigError, match="^no library loader computes this model: method "
                                          "'heterotune', adapter 'lora'"):
        export_run(folder)
    out = export_run(folder, extras=True)
    for g in (0, 1):
        doc = json.loads((out / f"group-{g}" / "fedtune_extras.json").read_text())
        assert doc == {"tensors": ["blocks.1.mlp.fc2.adapter.A", "blocks.1.mlp.fc2.adapter.B",
                                   "head.weight"],
                       "formulas": {"head.": "classification head (no peft adapter in this run)",
                                    ".adapter.A": "HeteroTune fused FedAdapter (Eq. 6) on the "
                                                  "Linear's output y: y + gelu(y @ A) @ B"}}
        extras = load_file(str(out / f"group-{g}" / "fedtune_extras.safetensors"))
        np.testing.assert_array_equal(extras["blocks.1.mlp.fc2.adapter.B"],
                                      state[f"groups.{g}.blocks.1.mlp.fc2.adapter.B"])


# -- the model card ------------------------------------------------------------------------------

def test_model_card_of_a_timm_lora_run(tmp_path, rng, monkeypatch):
    rc = VIT | {"lora-r": 4, "lora-alpha": 12.0}
    metrics = [{"round": 1, "accuracy": 0.5}, {"round": 2, "accuracy": 0.875},
               {"round": 3, "loss": 1.0}, {"round": 4, "accuracy": None}]
    folder = results_folder(tmp_path / "my run", rc, lora_state(rng, 2, VIT_FC, 4, 16), metrics,
                            class_names=NAMES)
    monkeypatch.chdir(tmp_path)
    out = export_run(Path("my run"), merge=True)  # a relative folder: named in full
    assert out == folder / "export"
    card = (out / "README.md").read_text()
    head, config = card.split("Run config:\n\n```\n")
    assert head == f"""\
# fedtune export: fedra on digits

- method: `fedra`, adapter `lora` on `last-fc` (r=4, alpha=12.0)
- data: `digits`, partitioner `dirichlet`, capacities `4,2,1`, seed 0
- classes (label id: name): 0: zero, 1: one, 2: two
- rounds: 2; global test accuracy 87.50% (round 2)
- from: `{folder}`
- made by: `fedtune export '{folder}' --merge`

## .: vit_tiny_patch16_224 (random)

- base model: `vit_tiny_patch16_224`; pooling `library`
- files: adapter_config.json, adapter_model.safetensors, pooling.json, merged/

Load:

```python
timm.create_model("local-dir:EXPORT_DIR/merged")
PeftModel.from_pretrained(timm.create_model("vit_tiny_patch16_224", pretrained=True, \
num_classes=3), "EXPORT_DIR")
```

"""
    line, rest = config.split("\n", 1)
    assert rest == "```\n"
    # every key of the run config but results-dir, sorted, as key=JSON value
    keys = [item.split("=", 1)[0] for item in line.split(" ")]
    cfg = resolve_config(rc)
    assert keys == sorted(set(cfg.flat) - {"results-dir"})
    assert "lora-r=4" in line.split(" ") and "lora-alpha=12.0" in line.split(" ")
    assert 'model="vit_tiny_patch16_224"' in line.split(" ")
    assert f"results-dir={json.dumps(str(tmp_path))}" not in line


def test_model_card_of_a_run_never_evaluated_nor_merged(tmp_path, rng):
    folder = results_folder(tmp_path / "run", VIT, lora_state(rng, 2, VIT_FC, 8, 16), [],
                            class_names=NAMES)
    card = (export_run(folder) / "README.md").read_text()
    assert "- rounds: 2; global test accuracy not evaluated\n" in card
    assert f"- made by: `fedtune export {folder}`\n" in card
    assert "- files: adapter_config.json, adapter_model.safetensors, pooling.json\n" in card
    assert "local-dir" not in card


def info(text: bool, pooling: str, lora: bool, merged: bool, base: str = "the/base") -> dict:
    return {"text": text, "pooling": pooling, "lora": lora, "base": base, "num_classes": 5,
            "files": ["adapter_config.json"] + (["merged/"] if merged else [])}


TRUNCATE = ("# the run read the first 32 tokens of each text: pipeline(..., truncation=True, "
            "max_length=32)")


def test_loaders_of_a_mean_pooled_text_export():
    assert export.loaders(info(True, "mean", True, True), ".", 32) == [
        'pipeline("text-classification", model="EXPORT_DIR/merged", trust_remote_code=True)'
        "  # labels are the class names",
        'AutoModelForSequenceClassification.from_pretrained("EXPORT_DIR/merged", '
        "trust_remote_code=True)",
        'SentenceTransformer("EXPORT_DIR/merged", trust_remote_code=True).encode(texts)'
        "  # the logits",
        "# (AutoTokenizer.from_pretrained: trust_remote_code=True too; without it these "
        "loaders refuse the folder)",
        'AutoPeftModelForSequenceClassification.from_pretrained("EXPORT_DIR", '
        "trust_remote_code=True)  # base: base/",
        TRUNCATE]
    # bottleneck adapters: no peft folder, no merge: only the truncation note
    assert export.loaders(info(True, "mean", False, False), "group-1", 32) == [TRUNCATE]


def test_loaders_of_a_library_pooled_text_export():
    assert export.loaders(info(True, "library", True, True), "group-0", 32) == [
        'pipeline("text-classification", model="group-0/merged")',
        'AutoModelForSequenceClassification.from_pretrained("group-0/merged")',
        'AutoPeftModelForSequenceClassification.from_pretrained("group-0", num_labels=5)',
        TRUNCATE]
    assert export.loaders(info(True, "library", False, False), ".", 32) == [TRUNCATE]


def test_loaders_of_a_timm_export():
    assert export.loaders(info(False, "library", True, True, "vit_small"), ".", 32) == [
        'timm.create_model("local-dir:EXPORT_DIR/merged")',
        'PeftModel.from_pretrained(timm.create_model("vit_small", pretrained=True, '
        'num_classes=5), "EXPORT_DIR")']
    assert export.loaders(info(False, "library", False, False), ".", 32) == []


def test_a_pooling_of_each_kind(tmp_path):
    mean = build_backbone(ModelSpec(hf_dir(tmp_path / "m", "bert", True), "random", "", 0, 3))
    first = build_backbone(ModelSpec(hf_dir(tmp_path / "f", "mpnet"), "random", "", 0, 3))
    vit = build_backbone(ModelSpec("vit_tiny_patch16_224", "random", VIT["model-args"], 0, 3))
    assert [export.pooling_of(b) for b in (mean, first, vit)] == ["mean", "first-token",
                                                                  "library"]
    # the token mean is an encoder's pooling; a timm model pools as timm does
    vit.neck = export.MeanPool()
    assert export.pooling_of(vit) == "library"


def test_a_second_export_into_the_same_folder_replaces_the_first(tmp_path, rng):
    folder = results_folder(tmp_path / "run", VIT, lora_state(rng, 2, VIT_FC, 8, 16),
                            class_names=NAMES)
    first = export_run(folder, out=tmp_path / "exp")
    second = load_file(str(folder / "state.safetensors"))
    second["head.bias"] = second["head.bias"] + 1
    save_file(second, str(folder / "state.safetensors"))
    assert export_run(folder, out=tmp_path / "exp") == first
    np.testing.assert_array_equal(
        load_file(str(first / "adapter_model.safetensors"))["base_model.model.head.bias"],
        second["head.bias"])
