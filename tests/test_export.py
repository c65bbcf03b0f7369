"""Export: what peft / transformers / sentence-transformers / timm load from `fedtune export`
through their own front doors predicts what fedtune's own global model predicts.

Two kinds of run: random states (every trainable tensor drawn at random, non-zero LoRA B, head,
exits, so a name or scale the export got wrong changes the logits), compared logit by logit;
and a real short run of the main job (all-MiniLM-L6-v2 on BBC News, mean pooling), whose export
must reproduce the run's own test accuracy on the real test articles. The reference is the
global model as the server evaluates it (``recipe.load`` + ``recipe.eval_logits``).

Tolerance: the library model runs the same float32 operations as ours, in another module tree
(and another padding length); merging adds W + s B A once per adapted Linear. A float32 dot
product of n terms is off by at most n * eps relative to the sum of |terms| (eps = 2^-23); over
`depth` layers of width at most `n` that gives rtol = depth * n * eps relative to the logits'
scale (worst case, any CPU, any thread count). Two computations within that tolerance of the
reference pick the same class wherever the reference's top-two margin exceeds twice it (a near
tie can flip), so accuracies agree within (number of near ties) / (number of examples).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from fedtune_app.apps.evaluation import build_global
from fedtune_app.config import ConfigError, RunConfig
from fedtune_app.data.groups import GroupedModel
from fedtune_app.data.splits import class_names_of, run_num_classes, run_splits
from fedtune_app.methods import resolve_config
from fedtune_app.model.adapters import trainable_parameters
from fedtune_app.tools.export import export_run

EPS = float(torch.finfo(torch.float32).eps)
MIXER = {"preset": "smoke"}
VIT = {"preset": "smoke", "model": "vit_tiny_patch16_224",
       "model-args": "img_size=8,patch_size=2,in_chans=1,embed_dim=32,depth=4,num_heads=2"}


def tolerance(reference: torch.Tensor, depth: int, width: int) -> float:
    return depth * width * EPS * max(1.0, float(reference.abs().max()))


def near_ties(reference: torch.Tensor, tol: float) -> torch.Tensor:
    """Examples whose class may flip between two computations within ``tol`` of ``reference``:
    its top-two logit margin is at most 2 tol."""
    top = reference.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]) <= 2 * tol


def assert_same_predictions(predicted: torch.Tensor, reference: torch.Tensor, tol: float) -> int:
    """``predicted`` classes = the reference's argmax except at near ties; returns their count."""
    ties = near_ties(reference, tol)
    differ = predicted != reference.argmax(-1)
    assert not (differ & ~ties).any(), f"{int((differ & ~ties).sum())} examples disagree"
    return int(ties.sum())


def fake_run(tmp_path, run_config: dict, seed: int = 0):
    """A results folder whose final state is random (every tensor non-zero), and the server's
    global model holding that state."""
    cfg = resolve_config(run_config | {"results-dir": str(tmp_path)})
    model, recipe = build_global(cfg)
    rng = np.random.default_rng(seed)
    models = model.groups if isinstance(model, GroupedModel) else [model]
    state = {}
    for g, m in enumerate(models):
        wire = recipe.recipes[g].wire if isinstance(model, GroupedModel) else recipe.wire
        state |= {wire(n): rng.normal(0, 0.2, p.shape).astype(np.float32)
                  for n, p in trainable_parameters(m).items()}
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"run-config": dict(cfg.flat), "clients": []}))
    (folder / "metrics.json").write_text(json.dumps([{"round": 2, "accuracy": 0.5}]))
    save_file(state, str(folder / "state.safetensors"))
    if not isinstance(model, GroupedModel):
        recipe.load(model, state)
    return folder, cfg, model, recipe


def fedtune_logits(model, recipe, inputs) -> torch.Tensor:
    """The server's prediction (``predict_outputs``: eval mode, so no LoRA dropout)."""
    model.eval()
    with torch.no_grad():
        return recipe.eval_logits(model, tuple(range(model.num_blocks)), inputs)[""]


def timm_base(cfg):
    """The timm model as fedtune builds it (same seeded random init)."""
    import timm

    from fedtune_app.model.backbones import ModelSpec, _timm_class

    spec = ModelSpec.from_config(cfg.model, run_num_classes(cfg))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        try:
            model = timm.create_model(spec.name, pretrained=False,
                                      num_classes=spec.num_classes, **spec.kwargs)
        except TypeError:  # the mixer entrypoint fixes patch_size: its class takes it
            model = _timm_class(spec.name)(num_classes=spec.num_classes, **spec.kwargs)
    return model.eval()


@pytest.mark.parametrize("run_config", [MIXER, VIT], ids=["mixer", "vit"])
def test_timm_lora_export_loads_in_peft_and_merged_in_timm(tmp_path, run_config):
    import timm
    from peft import PeftModel

    folder, cfg, model, recipe = fake_run(tmp_path, run_config)
    out = export_run(folder, merge=True)
    images = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1))
    expected = fedtune_logits(model, recipe, images)
    tol = tolerance(expected, depth=4, width=4 * 32)

    saved = load_file(str(out / "adapter_model.safetensors"))
    assert "base_model.model.blocks.3.mlp_channels.fc2.lora_A.weight" in saved or \
        "base_model.model.blocks.3.mlp.fc2.lora_A.weight" in saved
    assert not any(".default." in k for k in saved)  # peft drops the adapter name
    peft_model = PeftModel.from_pretrained(timm_base(cfg), str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(images), expected, rtol=0, atol=tol)

    file = str(out / "merged" / "model.safetensors")
    config = json.loads((out / "merged" / "config.json").read_text())
    assert config["architecture"] == cfg.model.model
    assert config["label_names"] == class_names_of(cfg.data) == [str(d) for d in range(10)]
    if cfg.model.model.startswith("mixer"):  # its entrypoint fixes patch_size: load into the class
        merged = timm_base(cfg)
        timm.models.load_checkpoint(merged, file, strict=True)
    else:  # timm's own front door for a saved folder: architecture, arguments, weights, labels
        merged = timm.create_model(f"local-dir:{out / 'merged'}", pretrained=True).eval()
        assert merged.pretrained_cfg["label_names"] == config["label_names"]
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(images), expected, rtol=0, atol=tol)
    card = (out / "README.md").read_text()
    assert "fedra" in card and "50.00%" in card and "fedtune export" in card
    assert "- classes (label id: name): 0: 0, 1: 1," in card


def test_bert_with_pooler_export_is_the_library_forward(tmp_path, tiny_bert_dir):
    check_library_export(tmp_path, tiny_bert_dir, "bert", "BertForSequenceClassification")


def test_roberta_export_with_its_first_token_head_is_the_library_forward(tmp_path):
    # RoBERTa's classifier (dense, tanh, out_proj) reads the first token itself
    from transformers import RobertaConfig
    model_dir = tmp_path / "tiny-roberta"
    RobertaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                  intermediate_size=32, max_position_embeddings=40).save_pretrained(model_dir)
    (tmp_path / "run").mkdir()
    check_library_export(tmp_path / "run", str(model_dir), "roberta",
                         "RobertaForSequenceClassification")


def check_library_export(tmp_path, model_dir: str, prefix: str, class_name: str):
    """A run whose pooling is the library's own exports adapters that peft loads and a merged
    model of the library's standard class, both computing fedtune's logits."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForSequenceClassification

    rc = {"model": model_dir,
          "model-source": "random", "adapter-modules": "attention.self.query,output.dense",
          "capacities": "3,2", "max-length": 12}
    folder, cfg, model, recipe = fake_run(tmp_path, rc)
    out = export_run(folder, merge=True)
    assert json.loads((out / "pooling.json").read_text()) == {"pooling": "library"}
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert f"base_model.model.{prefix}.encoder.layer.2.output.dense.lora_B.weight" in saved
    assert f"base_model.model.{prefix}.encoder.layer.0.attention.self.query.lora_A.weight" \
        in saved
    ids = torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    # RoBERTa numbers positions after its padding id
    ids[1, 7:] = AutoConfig.from_pretrained(model_dir).pad_token_id
    inputs = {"input_ids": ids, "attention_mask": mask}
    expected = fedtune_logits(model, recipe, inputs)
    tol = tolerance(expected, depth=3, width=32)

    torch.manual_seed(cfg.model.model_seed)  # fedtune's seeded random init of the base
    config = AutoConfig.from_pretrained(model_dir, num_labels=5)
    config._attn_implementation = "eager"
    base = AutoModelForSequenceClassification.from_config(config)
    peft_model = PeftModel.from_pretrained(base, str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(**inputs).logits, expected, rtol=0, atol=tol)
        merged = AutoModelForSequenceClassification.from_pretrained(str(out / "merged")).eval()
        torch.testing.assert_close(merged(**inputs).logits, expected, rtol=0, atol=tol)
    # the run's pooling is the library's own: its standard class, no code shipped
    assert type(merged).__name__ == class_name
    assert not (out / "merged" / "modeling_fedtune.py").exists()
    names = ["business", "entertainment", "politics", "sports", "tech"]
    assert merged.config.id2label == dict(enumerate(names))
    assert merged.config.label2id == {n: i for i, n in enumerate(names)}


def test_minilm_mean_pooling_export_loads_through_every_front_door(tmp_path):
    """The real all-MiniLM-L6-v2 (sentence-transformers, mean pooling) with LoRA on the default
    modules: transformers' Auto class and pipeline (shipped mean-pooling code),
    sentence-transformers (Transformer + mean Pooling + the head as a Dense module), peft (the
    adapter on the mean-pooled base/), each without fedtune, give fedtune's logits; loading
    without the shipped code is refused, not silently first-token pooled."""
    from peft import AutoPeftModelForSequenceClassification, PeftModel
    from sentence_transformers import SentenceTransformer
    from transformers import (
        AutoModelForSequenceClassification,
        AutoTokenizer,
        BertForSequenceClassification,
        pipeline,
    )

    folder, cfg, model, recipe = fake_run(tmp_path, {"capacities": "6,3"})
    out = export_run(folder, merge=True)
    assert json.loads((out / "pooling.json").read_text())["pooling"] == "mean"
    assert json.loads((out / "adapter_config.json").read_text())[
        "base_model_name_or_path"] == str(out / "base")
    texts = ["Shares rose after the results.",
             "The striker scored twice in the second half of the match."]
    tokenizer = AutoTokenizer.from_pretrained(str(out / "merged"), trust_remote_code=True)
    inputs = dict(tokenizer(texts, padding=True, return_tensors="pt"))
    expected = fedtune_logits(model, recipe, {k: inputs[k] for k in ("input_ids",
                                                                     "attention_mask")})
    tol = tolerance(expected, depth=6, width=1536)

    merged = AutoModelForSequenceClassification.from_pretrained(
        str(out / "merged"), trust_remote_code=True).eval()
    assert type(merged).__name__ == "MeanPooledBertForSequenceClassification"
    assert merged.config.id2label[3] == "sports"
    adapter = AutoPeftModelForSequenceClassification.from_pretrained(
        str(out), trust_remote_code=True).eval()
    base = AutoModelForSequenceClassification.from_pretrained(str(out / "base"),
                                                              trust_remote_code=True)
    on_base = PeftModel.from_pretrained(base, str(out)).eval()
    sentence = SentenceTransformer(str(out / "merged"), device="cpu", trust_remote_code=True)
    with torch.no_grad():
        for loaded in (merged, adapter, on_base):
            torch.testing.assert_close(loaded(**inputs).logits, expected, rtol=0, atol=tol)
        torch.testing.assert_close(sentence.encode(texts, convert_to_tensor=True), expected,
                                   rtol=0, atol=tol)
    classify = pipeline("text-classification", model=str(out / "merged"),
                        trust_remote_code=True)
    names = merged.config.id2label
    assert [r["label"] for r in classify(texts)] == [names[int(i)] for i in expected.argmax(-1)]

    # the same weights in the stock class read the first token: another model, which is why
    # the code ships and the folder refuses loaders that would not run it
    stock = BertForSequenceClassification.from_pretrained(str(out / "merged")).eval()
    with torch.no_grad():
        assert not torch.allclose(stock(**inputs).logits, expected, atol=100 * tol)
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        AutoModelForSequenceClassification.from_pretrained(str(out / "merged"))
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        pipeline("text-classification", model=str(out / "merged"))


def test_bottleneck_and_depthfl_exits_go_to_documented_extras(tmp_path):
    folder, cfg, model, recipe = fake_run(tmp_path, MIXER | {"method": "depthfl",
                                                             "adapter": "bottleneck"})
    with pytest.raises(ConfigError, match="only LoRA adapters merge"):
        export_run(folder, merge=True, extras=True)
    # no library module computes the exits' ensemble or a bottleneck adapter: refused, loudly
    with pytest.raises(ConfigError, match=r"no library loader computes this model: method "
                                          r"'depthfl', adapter 'bottleneck'.*--extras"):
        export_run(folder, out=tmp_path / "refused")
    assert not (tmp_path / "refused").exists()
    out = export_run(folder, out=tmp_path / "exp", extras=True)
    assert not (out / "adapter_model.safetensors").exists()
    extras = load_file(str(out / "fedtune_extras.safetensors"))
    state = load_file(str(folder / "state.safetensors"))
    # our names are the timm module paths of the mixer, so they stay; every tensor is there
    assert sorted(extras) == sorted(state)
    for name in state:
        np.testing.assert_array_equal(extras[name], state[name])
    doc = json.loads((out / "fedtune_extras.json").read_text())
    assert set(doc["formulas"]) == {".adapter.down", "exits.", "head."}


def test_heterotune_exports_one_folder_per_group(tmp_path):
    groups = {"method": "heterotune", "model-groups": "vit_tiny_patch16_224",
              "model-group-args": "img_size=8,patch_size=2,in_chans=1,embed_dim=16,depth=2,"
                                  "num_heads=2;img_size=8,patch_size=2,in_chans=1,embed_dim=32,"
                                  "depth=4,num_heads=2",
              "model-group-sources": "random", "model-group-ratio": "1:1",
              "capacities": "4,4,4,4"}
    folder, cfg, model, recipe = fake_run(tmp_path, MIXER | groups)
    # the results folder holds the fused state (Eq. 6), as the strategy saves it
    from fedtune_app.data.groups import group_depths
    from fedtune_app.methods.heterotune import fuse_state, share_positions

    state = load_file(str(folder / "state.safetensors"))
    fused = fuse_state(state, group_depths(cfg), share_positions(cfg))
    save_file(fused, str(folder / "state.safetensors"))
    with pytest.raises(ConfigError, match="no library loader computes this model"):
        export_run(folder)  # the fused adapters are modules of fedtune's own
    out = export_run(folder, extras=True)
    for g, depth in enumerate((2, 4)):
        extras = load_file(str(out / f"group-{g}" / "fedtune_extras.safetensors"))
        name = f"blocks.{depth - 1}.mlp.fc2.adapter.A"
        np.testing.assert_array_equal(extras[name], fused[f"groups.{g}.{name}"])
        assert f"group-{g}" in (out / "README.md").read_text()


def test_cli_exports_a_real_run(tmp_path, capsys):
    """A real (in-process) FedRA run, exported through `fedtune export --merge`."""
    from peft import PeftModel

    from fedtune_app.tools.cli import main
    from runs import run

    folder = run(tmp_path)
    assert main(["export", str(folder), "--merge", "--out", str(tmp_path / "exp")]) == 0
    out = tmp_path / "exp"
    assert capsys.readouterr().out.strip().endswith(str(out))
    cfg = resolve_config(json.loads((folder / "config.json").read_text())["run-config"])
    model, recipe = build_global(cfg)
    recipe.load(model, load_file(str(folder / "state.safetensors")))
    images = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
    expected = fedtune_logits(model, recipe, images)
    peft_model = PeftModel.from_pretrained(timm_base(cfg), str(out)).eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(images), expected, rtol=0,
                                   atol=tolerance(expected, depth=4, width=4 * 32))
    assert "round 2" in (out / "README.md").read_text()


def test_llama_decoder_export_is_the_library_forward(tmp_path):
    """A tiny random Llama (the decoder family): peft and merged logits = fedtune's, which read
    the last non-padding token as LlamaForSequenceClassification does."""
    from peft import PeftModel
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from test_decoders import minilm_tokenizer, save_decoder

    path = save_decoder(tmp_path / "llama")
    folder, cfg, model, recipe = fake_run(tmp_path, {"model": path, "model-source": "random",
                                                     "capacities": "4,2"})
    out = export_run(folder, merge=True)
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert any(k.startswith("base_model.model.model.layers.3.") for k in saved)
    enc = minilm_tokenizer()(["a short one", "a somewhat longer sentence than that"],
                             padding=True, return_tensors="pt")
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    expected = fedtune_logits(model, recipe, inputs)
    tol = tolerance(expected, depth=4, width=64)
    torch.manual_seed(cfg.model.model_seed)  # fedtune's seeded random init of the base
    config = AutoConfig.from_pretrained(path, num_labels=5)
    config._attn_implementation = "eager"
    base = AutoModelForSequenceClassification.from_config(config)
    peft_model = PeftModel.from_pretrained(base, str(out)).eval()
    merged = AutoModelForSequenceClassification.from_pretrained(str(out / "merged")).eval()
    with torch.no_grad():
        torch.testing.assert_close(peft_model(**inputs).logits, expected, rtol=0, atol=tol)
        torch.testing.assert_close(merged(**inputs).logits, expected, rtol=0, atol=tol)
    assert type(merged).__name__ == "LlamaForSequenceClassification"  # its own class
    assert merged.config.id2label[0] == "business"


# -- the main job, trained for real and exported: every front door reproduces its accuracy -----
# The main job (preset main: all-MiniLM-L6-v2, BBC News, FedRA, LoRA, mean pooling), shortened
# for a test: 2 clients, 80 training / 100 test articles, 32 tokens, 2 rounds (~40 s here)
MAIN_JOB_SHORT = {"preset": "main", "capacities": "6,4", "partitioner": "iid", "train-subset": 80,
                  "test-subset": 100, "max-length": 32, "num-server-rounds": 2}


def bbc_test_articles(cfg: RunConfig) -> tuple[list[str], np.ndarray]:
    """The run's test articles as raw text, with their labels (the fixed split, re-drawn)."""
    from fedtune_app.data.sources import bbc_news
    from fedtune_app.data.splits import (
        SPLIT_SEED,
        TEST_FRACTION,
        _stratified_subset,
        stratified_split,
    )

    raw = bbc_news()
    texts, labels = raw.inputs, raw.labels
    _, test = stratified_split(labels, TEST_FRACTION, SPLIT_SEED)
    test = _stratified_subset(test, labels, cfg.data.test_subset, SPLIT_SEED + 2)
    return [texts[i] for i in test], labels[test]


@pytest.fixture(scope="module")
def main_job(tmp_path_factory):
    """A real in-process run of the main job, exported by `fedtune export --merge`, and
    fedtune's own global model's logits on the run's test articles."""
    from types import SimpleNamespace

    from fedtune_app.tools.cli import main
    from runs import run

    tmp = tmp_path_factory.mktemp("main-job")
    folder = run(tmp, **MAIN_JOB_SHORT)
    assert main(["export", str(folder), "--merge", "--out", str(tmp / "export")]) == 0
    cfg = resolve_config(json.loads((folder / "config.json").read_text())["run-config"])
    texts, labels = bbc_test_articles(cfg)
    test = run_splits(cfg).test
    # they are the run's test examples: the same labels and, tokenised, the same tokens
    np.testing.assert_array_equal(labels, test.labels.numpy())
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp / "export" / "merged"),
                                              trust_remote_code=True)
    assert torch.equal(tokenizer(texts, padding="max_length", truncation=True, max_length=32,
                                 return_tensors="pt")["input_ids"], test.inputs["input_ids"])
    model, recipe = build_global(cfg)
    recipe.load(model, load_file(str(folder / "state.safetensors")))
    expected = fedtune_logits(model, recipe, test.inputs)
    [last] = [m for m in json.loads((folder / "metrics.json").read_text()) if m["round"] == 2]
    return SimpleNamespace(folder=folder, out=tmp / "export", texts=texts,
                           labels=torch.from_numpy(labels),
                           expected=expected, tol=tolerance(expected, depth=6, width=1536),
                           accuracy=last["accuracy"], tokenizer=tokenizer,
                           class_names=json.loads(
                               (folder / "config.json").read_text())["class-names"])


def assert_reproduces_the_run(main_job, predicted: torch.Tensor) -> float:
    """Same class as fedtune's global model on every article but near ties, and the run's own
    test accuracy within (near ties) / (articles)."""
    ties = assert_same_predictions(predicted, main_job.expected, main_job.tol)
    accuracy = float((predicted == main_job.labels).float().mean())
    assert abs(accuracy - main_job.accuracy) <= ties / len(main_job.labels)
    return accuracy


def test_main_job_run_is_clearly_above_chance_and_fedtune_reproduces_it(main_job):
    # 5 classes: chance is 20%; P(>= 50 of 100 right by chance) < 1e-9
    assert main_job.accuracy >= 0.5
    assert main_job.class_names == ["business", "entertainment", "politics", "sports", "tech"]
    assert_reproduces_the_run(main_job, main_job.expected.argmax(-1))


def test_main_job_export_in_transformers_auto_class_and_pipeline(main_job):
    from transformers import AutoModelForSequenceClassification, pipeline

    merged = AutoModelForSequenceClassification.from_pretrained(
        str(main_job.out / "merged"), trust_remote_code=True).eval()
    inputs = main_job.tokenizer(main_job.texts, padding=True, truncation=True, max_length=32,
                                return_tensors="pt")
    with torch.no_grad():
        logits = merged(**inputs).logits
    torch.testing.assert_close(logits, main_job.expected, rtol=0, atol=main_job.tol)
    assert_reproduces_the_run(main_job, logits.argmax(-1))

    classify = pipeline("text-classification", model=str(main_job.out / "merged"),
                        trust_remote_code=True)
    names = [r["label"] for r in classify(main_job.texts, truncation=True, max_length=32,
                                          batch_size=20)]
    predicted = torch.tensor([main_job.class_names.index(n) for n in names])
    assert_reproduces_the_run(main_job, predicted)
    card = (main_job.out / "README.md").read_text()
    assert "0: business, 1: entertainment, 2: politics, 3: sports, 4: tech" in card
    assert f"global test accuracy {100 * main_job.accuracy:.2f}% (round 2)" in card


def test_main_job_export_in_sentence_transformers(main_job):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(main_job.out / "merged"), device="cpu",
                                trust_remote_code=True)
    assert model.max_seq_length == 32  # the run's max-length
    logits = model.encode(main_job.texts, convert_to_tensor=True, batch_size=20)
    torch.testing.assert_close(logits, main_job.expected, rtol=0, atol=main_job.tol)
    assert_reproduces_the_run(main_job, logits.argmax(-1))


def test_main_job_export_as_peft_adapter(main_job):
    from peft import AutoPeftModelForSequenceClassification

    model = AutoPeftModelForSequenceClassification.from_pretrained(
        str(main_job.out), trust_remote_code=True).eval()
    inputs = main_job.tokenizer(main_job.texts, padding=True, truncation=True, max_length=32,
                                return_tensors="pt")
    with torch.no_grad():
        logits = model(**inputs).logits
    torch.testing.assert_close(logits, main_job.expected, rtol=0, atol=main_job.tol)
    assert_reproduces_the_run(main_job, logits.argmax(-1))


def test_main_job_plots_name_the_classes(main_job, tmp_path):
    """The partition plot of the results folder and the notebooks' label-count plot put the
    data set's class names in their legends (drawn from what the run recorded)."""
    from fedtune_app.apps.plots import plot_partition
    from fedtune_app.federated.strategy import ClientInfo
    from fedtune_app.tools.analysis import load_run, plot_label_counts

    run = load_run(main_job.folder)
    assert run.class_names == tuple(main_job.class_names)
    fig = plot_label_counts([run])
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == main_job.class_names
    clients = [ClientInfo(**(c | {"label_counts": tuple(c["label_counts"])}))
               for c in run.clients]
    assert plot_partition(clients, [], tmp_path / "partition.png",
                          main_job.class_names) == main_job.class_names


@pytest.mark.parametrize("mean_pooled", [True, False], ids=["mean", "first-token"])
def test_mpnet_mean_pooled_export_loads_and_first_token_is_refused(tmp_path, mean_pooled):
    """MPNet (all-mpnet-base-v2's family): fedtune's head is one Linear on the pooled vector,
    transformers' MPNet head is dense + tanh + out_proj. Mean-pooled: the shipped code's class
    (and peft on its base/) give fedtune's logits; first-token: no loader fits, refused."""
    from peft import AutoPeftModelForSequenceClassification
    from transformers import AutoModelForSequenceClassification, MPNetConfig

    path = tmp_path / "tiny-mpnet"
    MPNetConfig(vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=40).save_pretrained(path)
    if mean_pooled:  # a sentence-transformers folder: its pooling config says mean
        (path / "1_Pooling").mkdir()
        (path / "1_Pooling" / "config.json").write_text(
            json.dumps({"pooling_mode_mean_tokens": True}))
    folder, cfg, model, recipe = fake_run(tmp_path, {"model": str(path), "model-source": "random",
                                                     "capacities": "3,2", "max-length": 12})
    if not mean_pooled:
        with pytest.raises(ConfigError, match="no library loader fits this export: the run "
                                              "reads MPNetForSequenceClassification's first"):
            export_run(folder)
        return
    out = export_run(folder, merge=False)
    ids = torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, 7:], mask[1, 7:] = 1, 0  # MPNet's padding id
    inputs = {"input_ids": ids, "attention_mask": mask}
    expected = fedtune_logits(model, recipe, inputs)
    tol = tolerance(expected, depth=3, width=32)
    adapter = AutoPeftModelForSequenceClassification.from_pretrained(
        str(out), trust_remote_code=True).eval()
    assert type(adapter.get_base_model()).__name__ == "MeanPooledMPNetForSequenceClassification"
    with torch.no_grad():
        torch.testing.assert_close(adapter(**inputs).logits, expected, rtol=0, atol=tol)
    with pytest.raises(ValueError, match="trust_remote_code=True"):
        AutoModelForSequenceClassification.from_pretrained(str(out / "base"))


def test_export_of_an_unfinished_results_folder_names_what_is_missing(tmp_path):
    # a run still going (or stopped) has no final state.safetensors yet
    (tmp_path / "config.json").write_text(json.dumps({"run-config": {}}))
    with pytest.raises(ConfigError) as err:
        export_run(tmp_path)
    assert str(err.value) == (f"{tmp_path.resolve()} is not a finished results folder of a "
                              f"fedtune run: missing {tmp_path.resolve()}/state.safetensors")
    (tmp_path / "config.json").unlink()
    with pytest.raises(ConfigError, match=r"missing \S+/config\.json, \S+/state\.safetensors$"):
        export_run(tmp_path)
