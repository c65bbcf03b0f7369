import numpy as np
import pytest
import timm
import torch
from torch import nn

from conftest import TINY_MIXER, TINY_VIT
from fedtune_app.config import ConfigError
from fedtune_app.model.adapters import (
    AdapterSpec,
    attach_adapters,
    global_name,
    initial_state,
    load_state,
    local_name,
    names_for_plan,
    trainable_parameters,
)
from fedtune_app.model.backbones import ModelSpec, build_backbone
from floats import NETWORK_FLOAT64_ATOL


def reference_timm(spec: ModelSpec, plan):
    """timm's own model with the same seeded weights, unplanned blocks removed."""
    torch.manual_seed(spec.seed)
    try:
        model = timm.create_model(spec.name, num_classes=spec.num_classes, **spec.kwargs)
    except TypeError:
        from timm.models.mlp_mixer import MlpMixer
        model = MlpMixer(num_classes=spec.num_classes, **spec.kwargs)
    model.blocks = nn.Sequential(*[model.blocks[j] for j in plan])
    return model.eval()


@pytest.mark.parametrize("spec", [TINY_VIT, TINY_MIXER], ids=["vit", "mixer"])
@pytest.mark.parametrize("plan", [(0, 1, 2, 3), (1, 3), (2,), (0, 2, 3)])
def test_subnetwork_equals_timm_model_with_unplanned_blocks_removed(spec, plan):
    # float64 on both sides: two implementations of one function, so only rounding may differ
    model = build_backbone(spec).double()
    x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        expected = reference_timm(spec, plan).double()(x)
        for got in (model(x, plan), model.subnetwork(plan)(x)):
            torch.testing.assert_close(got, expected, rtol=0, atol=NETWORK_FLOAT64_ATOL)


@pytest.mark.parametrize("plan", [(0, 1, 2), (0, 2), (1,)])
def test_bert_subnetwork_equals_hf_model_with_layers_removed(tiny_bert_dir, plan):
    from transformers import AutoConfig, AutoModelForSequenceClassification
    model = build_backbone(ModelSpec(tiny_bert_dir, "random", "", 5, 3)).double()
    torch.manual_seed(5)  # the same seeded init as the backbone
    config = AutoConfig.from_pretrained(tiny_bert_dir, num_labels=3)
    config._attn_implementation = "eager"
    ref = AutoModelForSequenceClassification.from_config(config).eval().double()
    ref.bert.encoder.layer = nn.ModuleList([ref.bert.encoder.layer[j] for j in plan])
    ids = torch.randint(1, 100, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0  # padding must be masked the same way
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
        got = model.subnetwork(plan)({"input_ids": ids, "attention_mask": mask})
    torch.testing.assert_close(got, expected, rtol=0, atol=NETWORK_FLOAT64_ATOL)  # float64


def _tiny_encoder(model_type: str, path):
    from transformers import BertConfig, ElectraConfig, RobertaConfig, XLMRobertaConfig
    classes = {"bert": BertConfig, "roberta": RobertaConfig, "xlm-roberta": XLMRobertaConfig,
               "electra": ElectraConfig}
    # ELECTRA with embeddings narrower than the hidden states: its projection is part of the stem
    extra = {"embedding_size": 8} if model_type == "electra" else {}
    classes[model_type](vocab_size=100, hidden_size=16, num_hidden_layers=3,
                        num_attention_heads=2, intermediate_size=32, max_position_embeddings=40,
                        **extra).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "electra"])
@pytest.mark.parametrize("plan", [(0, 1, 2), (0, 2)])
def test_encoders_with_a_first_token_head_equal_the_hf_model(tmp_path, model_type, plan):
    # RoBERTa's and ELECTRA's classifier (dense, tanh/gelu, out_proj) reads the first token
    # itself; the layered model must compute the library's logits with the same layers
    from transformers import AutoConfig, AutoModelForSequenceClassification
    path = _tiny_encoder(model_type, tmp_path)
    model = build_backbone(ModelSpec(path, "random", "", 5, 3)).double().eval()
    torch.manual_seed(5)
    config = AutoConfig.from_pretrained(path, num_labels=3)
    config._attn_implementation = "eager"
    ref = AutoModelForSequenceClassification.from_config(config).eval().double()
    base = getattr(ref, ref.base_model_prefix)
    base.encoder.layer = nn.ModuleList([base.encoder.layer[j] for j in plan])
    ids = torch.randint(3, 100, (4, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    ids[1, 7:] = config.pad_token_id  # RoBERTa numbers positions after the padding id
    with torch.no_grad():
        expected = ref(input_ids=ids, attention_mask=mask).logits
        got = model.subnetwork(plan)({"input_ids": ids, "attention_mask": mask})
        # the library's own forward through the layered model's modules is unchanged
        library = model.library_model()
        library_logits = library(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got, expected, rtol=0, atol=NETWORK_FLOAT64_ATOL)
    if plan == (0, 1, 2):
        torch.testing.assert_close(library_logits, expected, rtol=0, atol=NETWORK_FLOAT64_ATOL)


def test_distilbert_is_refused_with_the_supported_types(tmp_path):
    from transformers import DistilBertConfig
    DistilBertConfig(vocab_size=100, dim=16, n_layers=2, n_heads=2, hidden_dim=32,
                     max_position_embeddings=32).save_pretrained(tmp_path)
    with pytest.raises(ConfigError, match="model type 'distilbert' is not supported.*roberta"):
        build_backbone(ModelSpec(str(tmp_path), "random", "", 5, 3))


def test_global_local_names_round_trip():
    plan = (1, 4, 7)
    for local in ["blocks.0.mlp.fc2.lora_A.weight", "blocks.2.x.lora_B.weight", "head.bias"]:
        g = global_name(local, plan)
        assert local_name(g, plan) == local
    assert global_name("blocks.2.mlp.fc2.lora_A.weight", plan) == "blocks.7.mlp.fc2.lora_A.weight"
    assert global_name("blocks.0.blocks.1.w", (5,)) == "blocks.5.blocks.1.w"  # first index only


def test_subnetwork_trainables_are_the_planned_blocks_of_the_global_model_by_reference():
    model = attach_adapters(build_backbone(TINY_VIT), AdapterSpec())
    full = trainable_parameters(model)
    plan = (1, 3)
    sub = {global_name(n, plan): p for n, p in trainable_parameters(model.subnetwork(plan)).items()}
    assert sorted(sub) == sorted(names_for_plan(full, plan))
    assert all(sub[n] is full[n] for n in sub)  # shared, not copied
    # default position: the last FC of both sublayers, attn.proj and mlp.fc2
    assert sorted(sub) == [f"blocks.{j}.{m}.lora_{ab}.weight" for j in (1, 3)
                           for m in ("attn.proj", "mlp.fc2") for ab in "AB"] + \
        ["head.bias", "head.weight"]


@pytest.mark.parametrize("kind", ["lora", "bottleneck"])
def test_adapters_start_as_the_pretrained_model_and_only_adapters_and_head_train(kind):
    base = build_backbone(TINY_VIT)
    model = attach_adapters(build_backbone(TINY_VIT), AdapterSpec(kind=kind, r=4))
    state = initial_state(model, seed=0)
    load_state(model, state)
    base.head.load_state_dict({"weight": torch.tensor(state["head.weight"]),
                               "bias": torch.tensor(state["head.bias"])})
    x = torch.randn(3, 1, 8, 8)
    with torch.no_grad():
        # LoRA B / adapter up start at zero: the same timm layers plus an exact 0.0, bit for bit
        torch.testing.assert_close(model(x), base(x), rtol=0, atol=0)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n or ".adapter." in n or n.startswith("head.")
                             for n in trainable)
    # r * (in + out) per LoRA pair, r=4: attn.proj 32 -> 32: 4*32 + 32*4 = 256; mlp.fc2
    # 128 -> 32: 4*128 + 32*4 = 640; 896 per block
    if kind == "lora":
        per_block = sum(p.numel() for n, p in model.named_parameters()
                        if p.requires_grad and n.startswith("blocks.0."))
        assert per_block == 896


def test_initial_state_is_seeded():
    model = attach_adapters(build_backbone(TINY_VIT), AdapterSpec())
    a, b, c = initial_state(model, 1), initial_state(model, 1), initial_state(model, 2)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["blocks.0.mlp.fc2.lora_A.weight"],
                              c["blocks.0.mlp.fc2.lora_A.weight"])
    assert not a["blocks.0.mlp.fc2.lora_B.weight"].any()


def test_random_init_backbone_is_the_same_on_every_node():
    a, b = build_backbone(TINY_VIT), build_backbone(TINY_VIT)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def test_adapter_modules_can_be_chosen_and_unknown_names_are_rejected():
    model = attach_adapters(build_backbone(TINY_VIT), AdapterSpec(modules="attn.proj,mlp.fc2"))
    names = trainable_parameters(model)
    assert "blocks.2.attn.proj.lora_A.weight" in names and "blocks.2.mlp.fc2.lora_B.weight" in names
    with pytest.raises(ConfigError, match="'adapter-modules'.*allowed: last-fc, last-fc-attn, "
                                          "last-fc-mlp, attn.proj"):
        attach_adapters(build_backbone(TINY_VIT), AdapterSpec(modules="mlp.fc9"))


def test_unknown_model_names_the_key_and_examples():
    with pytest.raises(ConfigError, match="'model' = 'no_such_model'.*vit_tiny_patch16_224"):
        build_backbone(ModelSpec("no_such_model", "random", "", 0, 2))
