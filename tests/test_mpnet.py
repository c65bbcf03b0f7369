"""MPNet in the layered view: a sub-network is the Hugging Face model with layers removed, the
relative position bias shared by every block, padding masked; the real all-mpnet-base-v2."""

import json

import pytest
import torch
from torch import nn

from fedtune_app.config import ConfigError
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, resolve_modules
from fedtune_app.model.assets import asset_path
from fedtune_app.model.backbones import MPNET, ModelSpec, build_backbone, tokenizer_for

PAD = 1  # MPNet's padding id: position ids count only the tokens before it


@pytest.fixture(scope="module")
def tiny_mpnet_dir(tmp_path_factory):
    """A 3-layer MPNet (random init) saved as a sentence-transformers directory (mean pooling)."""
    from transformers import MPNetConfig

    path = tmp_path_factory.mktemp("tiny-mpnet")
    MPNetConfig(vocab_size=100, hidden_size=16, num_hidden_layers=3, num_attention_heads=2,
                intermediate_size=32, max_position_embeddings=40).save_pretrained(path)
    (path / "1_Pooling").mkdir()
    (path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    return str(path)


def batch():
    ids = torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    ids[1, 7:], mask[1, 7:] = PAD, 0  # one padded sentence
    ids[3, 10:], mask[3, 10:] = PAD, 0
    return {"input_ids": ids, "attention_mask": mask}


def reference_features(path, plan, inputs):
    """Hugging Face's MPNetModel with the same seeded weights and the unplanned layers removed,
    then sentence-transformers' mean over the non-padding tokens."""
    from transformers import AutoConfig, AutoModelForSequenceClassification

    torch.manual_seed(5)  # the seed of the backbone's init
    config = AutoConfig.from_pretrained(path, num_labels=3)
    config._attn_implementation = "eager"
    ref = AutoModelForSequenceClassification.from_config(config).eval().mpnet
    ref.encoder.layer = nn.ModuleList([ref.encoder.layer[j] for j in plan])
    states = ref(**inputs).last_hidden_state
    weights = inputs["attention_mask"][..., None].float()
    return (states * weights).sum(1) / weights.sum(1)


@pytest.mark.parametrize("plan", [(0, 1, 2), (0, 2), (1,), ()])
def test_mpnet_subnetwork_equals_hf_model_with_layers_removed(tiny_mpnet_dir, plan):
    model = build_backbone(ModelSpec(tiny_mpnet_dir, "random", "", 5, 3))
    inputs = batch()
    with torch.no_grad():
        expected = reference_features(tiny_mpnet_dir, plan, inputs)
        got = model.subnetwork(plan).features(inputs)
        logits = model(inputs, plan)
    # the same modules run in the same order: equal up to float reordering of 16-wide sums
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(logits, expected @ model.head.weight.T + model.head.bias,
                               rtol=0, atol=1e-5)


def test_mpnet_padding_changes_nothing_and_bias_is_computed_once(tiny_mpnet_dir):
    model = build_backbone(ModelSpec(tiny_mpnet_dir, "random", "", 5, 3))
    inputs = batch()
    longer = {"input_ids": nn.functional.pad(inputs["input_ids"], (0, 6), value=PAD),
              "attention_mask": nn.functional.pad(inputs["attention_mask"], (0, 6))}
    calls = []
    model.stem.encoder.register_forward_hook(lambda *a: calls.append(1))  # never as a module
    original = model.stem.encoder.compute_position_bias
    model.stem.encoder.compute_position_bias = lambda x: calls.append(x.shape) or original(x)
    with torch.no_grad():
        short, padded = model.features(inputs), model.features(longer)
    assert calls == [(4, 12, 16), (4, 18, 16)]  # once per forward, for all three blocks
    # masked tokens get exp(-inf) = 0 attention: at most float rounding of the softmax sums
    torch.testing.assert_close(padded, short, rtol=0, atol=1e-5)


def test_mpnet_adapters_sit_in_every_block_and_start_as_the_pretrained_model(tiny_mpnet_dir):
    model = build_backbone(ModelSpec(tiny_mpnet_dir, "random", "", 5, 3))
    # the papers' position: the last Linear of both sublayers (attention output, MLP output)
    assert resolve_modules(model, "last-fc") == ["attention.attn.o", "output.dense"]
    with torch.no_grad():
        before = model(batch())
    attach_adapters(model, AdapterSpec("lora", "output.dense,attention.attn.q")).eval()
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert {n for n in trainable if n.startswith("blocks.")} == {
        f"blocks.{j}.{m}.lora_{ab}.default.weight" for j in range(3)
        for m in ("output.dense", "attention.attn.q") for ab in "AB"}
    assert {n for n in trainable if not n.startswith("blocks.")} == {"head.weight", "head.bias"}
    with torch.no_grad():
        torch.testing.assert_close(model(batch()), before, rtol=0, atol=0)  # lora_B starts at 0


def test_missing_asset_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDTUNE_MODELS_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match="python -m fedtune_app.tools.assets install "
                                          "all-mpnet-base-v2"):
        build_backbone(ModelSpec(MPNET, "pretrained", "", 0, 5))


def test_real_all_mpnet_base_v2_puts_paraphrases_closer_than_unrelated_sentences():
    # `make setup` installs the asset (make assets): a machine without it is not set up
    try:
        asset_path(MPNET)
    except ConfigError as err:
        pytest.fail(f"all-mpnet-base-v2 is not installed ({err}); `make setup` installs it: "
                    "python -m fedtune_app.tools.assets install all-mpnet-base-v2")
    spec = ModelSpec(MPNET, "pretrained", "", 0, 5)
    model = build_backbone(spec)
    assert (model.num_blocks, model.head.in_features) == (12, 768)
    assert sum(p.numel() for n, p in model.named_parameters() if not n.startswith("head.")) \
        == 109_486_464 - 768 * 768 - 768  # the checkpoint minus its unused BERT-style pooler
    sentences = ["A man is playing a guitar.", "Someone plays the guitar.",
                 "The stock market fell sharply today."]
    inputs = dict(tokenizer_for(spec)(sentences, padding=True, return_tensors="pt"))
    with torch.no_grad():
        emb = nn.functional.normalize(model.features(inputs), dim=-1)
    cos = emb @ emb.T
    # measured: paraphrases 0.85, unrelated below 0.0; the margin is far above float noise
    assert cos[0, 1] > 0.7 and cos[0, 2] < 0.3 and cos[1, 2] < 0.3
