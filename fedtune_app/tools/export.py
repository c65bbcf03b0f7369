"""Export a run's final global model in the formats of the libraries it came from.

    fedtune export results/fedra-seed0-20261123-101500 [--merge] [--out DIR] [--extras] [--rank K]

writes into DIR (default: ``<results folder>/export``), for a single-model run, folders that the
libraries' own loaders read correctly without fedtune (docs/usage.md, "Exporting a model", says
which loader reads which):

    adapter_config.json, adapter_model.safetensors
        LoRA runs: a peft adapter folder with peft's own key names for the base model
        (``base_model.model.bert.encoder.layer.3.output.dense.lora_A.weight``, the head as
        ``modules_to_save``): ``peft.PeftModel.from_pretrained(base, DIR)`` loads it.
        pFedLoRA's B C A is written as LoRA's (B C) A (``ClientRecipe.library_state``).
    base/ (LoRA runs whose pooling the library's class lacks)
        the pretrained base model as a mean-pooling classifier (below), the base that
        ``adapter_config.json`` names: ``AutoPeftModelForSequenceClassification.from_pretrained(
        DIR, trust_remote_code=True)``.
    merged/ (``--merge``, LoRA runs)
        the model with the adapters merged into its weights, in its library's format:
        Hugging Face folder (+ tokenizer) for transformers (``pipeline``,
        ``AutoModelForSequenceClassification``); timm's own folder for timm
        (``timm.create_model("local-dir:DIR/merged")``).
    fedtune_extras.safetensors + fedtune_extras.json (``--extras``)
        every trained tensor peft has no module type for, with the base library's module paths:
        bottleneck adapters (``y + up(gelu(down(y)))`` on a Linear's output y), HeteroTune's
        fused adapters (``y + gelu(y A') B'``, Eq. 6), DepthFL's exit classifiers (``exits.<d>``
        reads the pooled features after block d; the global prediction is the mean of the exits'
        log-softmax), FedBRICK's BRICKs (``bricks.<domain>.<position>``, stand-ins for missing
        layers; the full global model does not use them); with no peft folder, the head too.
        Where such tensors change the global model's prediction no library loader computes it:
        the export refuses unless ``--extras`` asks for these fedtune-only files.
    rank.json (``--rank K``, LoRA runs)
        the adapters at rank K: each adapted Linear's whole global update
        dW = lora_delta + (lora_alpha / r) B A (the delta of FLoRA's merges, FedEx-LoRA's
        residual, FlexLoRA's remainder beyond rank r; none in other runs) replaced by its best
        rank-K approximation (SVD, Eckart-Young), written as a peft LoRA of rank K with the run's
        scale (lora_alpha = K x the run's lora_alpha / r), so no fedtune-only delta is left;
        rank.json gives each Linear's relative error ||dW - dW_K||_F / ||dW||_F (0 when K is
        at least dW's rank). Their product is the one a FlexLoRA client of rank K receives
        (FlexLoRA: B A is the top-r SVD of dW); HetLoRA's rank-K clients receive the first K
        components instead, in general not the best rank-K approximation. The factors split
        the singular values evenly (B = U sqrt(S), A = sqrt(S) V^T, over the scale).
    pooling.json
        how the classifier reads the encoder: ``mean`` (sentence-transformers checkpoints such as
        all-MiniLM-L6-v2 and all-mpnet-base-v2 are pooled by the token mean, which the Hugging
        Face classification class does not do) or ``library`` (the library's own forward gives
        the logits). MPNet read at its first token is refused: our head there is one Linear
        layer, transformers' MPNet head is dense + tanh + out_proj.
    README.md
        model card: method, data, classes, rounds, accuracy, the loaders, the run config.

Mean pooling: Hugging Face's ``BertForSequenceClassification`` reads the first token through its
pooler, so a mean-pooled run's merged/ and base/ folders ship ``modeling_fedtune.py`` (token mean
over the attention mask, dropout, classifier) named in ``config.json``'s ``auto_map``
(``trust_remote_code=True`` loads it), and merged/ is also a sentence-transformers folder
(Transformer -> mean Pooling -> the classifier as a Dense module with identity activation):
``SentenceTransformer(DIR/merged).encode(texts)`` returns the logits. Class names go in
``id2label`` / ``label2id`` (timm: ``label_names``) and the model card.

A run with model groups (HeteroTune and its comparators) gets one such folder per group:
``DIR/group-<g>/``.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fedtune_app.config import ConfigError, RunConfig, setup_logging
from fedtune_app.data.groups import group_config, group_of_name, group_specs, prefix
from fedtune_app.data.splits import class_names_of
from fedtune_app.methods import method_of
from fedtune_app.model.adapters import PEFT_ADAPTER
from fedtune_app.model.backbones import (
    EncoderLayered,
    FirstToken,
    LayeredModel,
    MeanPool,
    ModelSpec,
    build_backbone,
    hf_model_path,
    is_text_model,
    tokenizer_for,
)

_LORA = re.compile(r"^blocks\.(\d+)\.(.+)\.lora_([AB])\.weight$")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
# formulas of the tensors every method may have; a method's recipe adds its own
# (``ClientRecipe.tensor_formulas``)
EXTRA_FORMULAS = {
    ".adapter.down": "bottleneck adapter on the Linear's output y: y + up(gelu(down(y)))",
    "head.": "classification head (no peft adapter in this run)",
}


def load_run(folder: Path) -> tuple[dict, dict[str, np.ndarray], list[dict]]:
    """Resolved run config, final global state and per-round metrics of a results folder."""
    from safetensors.numpy import load_file

    from fedtune_app.methods import resolve_config

    folder = Path(folder)
    needed = [folder / n for n in ("config.json", "state.safetensors")]
    if missing := [str(p) for p in needed if not p.is_file()]:
        raise ConfigError(f"{folder} is not a finished results folder of a fedtune run: "
                          f"missing {', '.join(missing)}")
    cfg = resolve_config(json.loads((folder / "config.json").read_text())["run-config"])
    metrics_file = folder / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else []
    return cfg, load_file(str(folder / "state.safetensors")), metrics


def group_states(cfg: RunConfig, state: dict[str, np.ndarray]) -> dict[int | None, dict]:
    """group -> its tensors with model-parameter names (None: a single-model run)."""
    if not group_specs(cfg.model):
        return {None: state}
    groups: dict[int | None, dict] = {}
    for name, value in state.items():
        g = group_of_name(name)
        if g is not None:
            groups.setdefault(g, {})[name.removeprefix(prefix(g))] = value
    return dict(sorted(groups.items()))


def module_path(library: nn.Module, module: nn.Module) -> str:
    """Dotted name of ``module`` inside ``library`` (found by identity)."""
    for name, m in library.named_modules():
        if m is module:
            return name
    raise ValueError(f"{type(module).__name__} is not part of {type(library).__name__}")


def library_name(backbone: LayeredModel, library: nn.Module, name: str) -> str:
    """Our name (``blocks.3.output.dense...``, ``head.weight``) -> the library's
    (``bert.encoder.layer.3.output.dense...``, ``classifier.weight``)."""
    if match := _BLOCK.match(name):
        block = module_path(library, backbone.blocks[int(match.group(1))])
        return f"{block}.{name[match.end():]}"
    if name.startswith("head."):
        return f"{module_path(library, backbone.head)}.{name.removeprefix('head.')}"
    return name  # a module a method added: no library counterpart


def pooling_of(backbone: LayeredModel) -> str:
    """``mean``: the token mean (shipped code); ``library``: the library class's own forward
    computes the run's logits; ``first-token``: a Linear on the first token where the library's
    head is another (MPNet's dense + tanh + out_proj), which no loader computes."""
    if isinstance(backbone, EncoderLayered) and isinstance(backbone.neck, MeanPool):
        return "mean"
    return "first-token" if isinstance(backbone.neck, FirstToken) else "library"


# -- mean pooling as code shipped beside the weights (transformers' trust_remote_code) ----------
MODELING_FILE = "modeling_fedtune.py"
MEAN_POOLING_CODE = '''\
"""Sequence classification as fedtune trained it: the token mean of the encoder's last hidden
states over the attention mask (sentence-transformers' pooling, which the checkpoint was trained
with), then dropout and a linear classifier. transformers' own {library_class} reads the
first token through its pooler instead, so this file ships beside the weights, and the config's
own model type makes loaders without it fail instead of silently pooling the first token:

    AutoModelForSequenceClassification.from_pretrained(DIR, trust_remote_code=True)
    pipeline("text-classification", model=DIR, trust_remote_code=True)
    SentenceTransformer(DIR, trust_remote_code=True)  # AutoModel: the encoder alone

The checkpoint's pooler stays (the encoder loads as it was published) but is unused.
"""

import torch
from torch import nn
from transformers import {config_class}, {base_class}, {library_class}
from transformers.modeling_outputs import SequenceClassifierOutput


class {name}Config({config_class}):
    model_type = "{model_type}"


class {name}Model({base_class}):
    config_class = {name}Config


class {name}ForSequenceClassification({library_class}):
    """{library_class} with the token mean in place of the first-token pooler, and dropout +
    one Linear layer as the head (what was trained)."""

    config_class = {name}Config

    def __init__(self, config):
        super().__init__(config)
        dropout = getattr(config, "classifier_dropout", None)
        self.dropout = nn.Dropout(config.hidden_dropout_prob if dropout is None else dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None,
                **kwargs):
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        extra = {{}} if token_type_ids is None else {{"token_type_ids": token_type_ids}}
        hidden = self.{prefix}(input_ids=input_ids, attention_mask=attention_mask,
                               **extra).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        logits = self.classifier(self.dropout(pooled))
        loss = None if labels is None else nn.functional.cross_entropy(
            logits.view(-1, self.num_labels), labels.view(-1))
        return SequenceClassifierOutput(loss=loss, logits=logits)
'''


def mean_pooling_names(library: nn.Module) -> dict[str, str]:
    """Names for the shipped code, or a loud refusal where the library's classifier is not
    dropout + one Linear on the pooled vector (what the run trained on the token mean)."""
    import transformers

    names = {"library_class": type(library).__name__,
             "base_class": type(getattr(library, library.base_model_prefix, None)).__name__,
             "config_class": type(getattr(library, "config", None)).__name__}
    fits = isinstance(getattr(library, "classifier", None), nn.Linear) and \
        isinstance(getattr(library, "dropout", None), nn.Dropout) and \
        all(hasattr(transformers, n) for n in names.values())
    if not fits:
        raise ConfigError(
            f"no library loader fits this export: the run mean-pools "
            f"{names['library_class']}'s encoder into a Linear classifier, and the shipped "
            "mean-pooling code supports transformers classes whose head is dropout + a Linear "
            "`classifier` (BERT-like encoders)")
    stem = names["library_class"].removesuffix("ForSequenceClassification")
    return names | {"prefix": library.base_model_prefix, "name": "MeanPooled" + stem,
                    "model_type": "fedtune-mean-pooled-" + library.config.model_type}


def save_mean_pooled(library: nn.Module, target: Path) -> None:
    """``library`` (a ``*ForSequenceClassification``) saved with its config and class replaced
    by the shipped mean-pooling ones (same weights, same module names)."""
    names = mean_pooling_names(library)
    library.save_pretrained(str(target))
    (target / MODELING_FILE).write_text(MEAN_POOLING_CODE.format(**names))
    module, name = MODELING_FILE.removesuffix(".py"), names["name"]
    config_file = target / "config.json"
    config = json.loads(config_file.read_text())
    config["model_type"] = names["model_type"]
    config["architectures"] = [f"{name}ForSequenceClassification"]
    config["auto_map"] = {"AutoConfig": f"{module}.{name}Config",
                          "AutoModel": f"{module}.{name}Model",
                          "AutoModelForSequenceClassification":
                              f"{module}.{name}ForSequenceClassification"}
    config_file.write_text(json.dumps(config, indent=2))


def save_sentence_transformers_modules(library: nn.Module, target: Path,
                                       max_length: int) -> None:
    """Make ``target`` (a Hugging Face folder of ``library``) also a sentence-transformers
    folder: Transformer (the folder itself) -> mean Pooling -> the classifier as a Dense module
    without activation, so that ``encode`` returns the logits. ``max_seq_length`` is the run's
    ``max-length``: the classifier saw that many tokens per text."""
    from sentence_transformers.sentence_transformer.modules import Dense, Pooling

    classifier = library.classifier
    width, classes = classifier.in_features, classifier.out_features
    for sub in ("1_Pooling", "2_Dense"):
        (target / sub).mkdir(exist_ok=True)
    Pooling(width, "mean").save(str(target / "1_Pooling"))
    Dense(width, classes, activation_function=nn.Identity(),
          init_weight=classifier.weight.detach().clone(),
          init_bias=classifier.bias.detach().clone()).save(str(target / "2_Dense"))
    kinds = ("Transformer", "Pooling", "Dense")
    (target / "modules.json").write_text(json.dumps(
        [{"idx": i, "name": str(i), "path": path, "type": f"sentence_transformers.models.{kind}"}
         for i, (path, kind) in enumerate(zip(("", "1_Pooling", "2_Dense"), kinds))], indent=2))
    (target / "sentence_bert_config.json").write_text(json.dumps(
        {"max_seq_length": max_length, "do_lower_case": False}, indent=2))


def set_class_names(library: nn.Module, class_names: list[str]) -> None:
    """id2label / label2id of a transformers model (pipeline's labels) from the data set."""
    config = getattr(library, "config", None)
    if config is not None and hasattr(config, "id2label"):
        config.id2label = dict(enumerate(class_names))
        config.label2id = {name: i for i, name in enumerate(class_names)}


def peft_model_of(backbone: LayeredModel, state: dict[str, np.ndarray], cfg: RunConfig,
                  rank: int | None = None):
    """A real peft model of the base library model holding the run's LoRA tensors and head
    (of rank ``rank`` at the run's scale lora-alpha / lora-r; None: the run's rank)."""
    from peft import LoraConfig, get_peft_model

    library = backbone.library_model()
    modules = sorted({m.group(2) for n in state if (m := _LORA.match(n))})
    targets = sorted({library_name(backbone, library, f"blocks.{j}.{m}")
                      for j in range(backbone.num_blocks) for m in modules})
    head = module_path(library, backbone.head)
    # transformers classifiers: peft's sequence-classification task, so that
    # AutoPeftModelForSequenceClassification loads the base through transformers' Auto class
    # (which honours the base folder's auto_map) and not a fixed library class
    task = "SEQ_CLS" if backbone.family.startswith("hf") else None
    r = rank or cfg.adapter.lora_r
    config = LoraConfig(r=r, lora_alpha=cfg.adapter.lora_alpha * r / cfg.adapter.lora_r,
                        task_type=task,
                        lora_dropout=cfg.adapter.lora_dropout,
                        target_modules="^(?:" + "|".join(map(re.escape, targets)) + ")$",
                        modules_to_save=[head])
    model = get_peft_model(library, config, adapter_name=PEFT_ADAPTER)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in state.items():
            if not (_LORA.match(name) or name.startswith("head.")):
                continue
            lib = library_name(backbone, library, name)
            if name.startswith("head."):
                target = f"base_model.model.{head}.modules_to_save.{PEFT_ADAPTER}." \
                         f"{name.removeprefix('head.')}"
            else:
                target = "base_model.model." + re.sub(r"\.lora_([AB])\.",
                                                      rf".lora_\1.{PEFT_ADAPTER}.", lib)
            params[target].copy_(torch.as_tensor(value))
    return model.eval()


def at_rank(state: dict[str, np.ndarray], scale: float,
            rank: int) -> tuple[dict[str, np.ndarray], dict[str, float]]:
    """Each adapted Linear's update dW = lora_delta + scale B A as rank-``rank`` factors with
    scale B' A' = the best rank-``rank`` approximation of dW (the delta folded in and dropped);
    returns them and each Linear's relative Frobenius error."""
    modules = sorted({f"blocks.{m.group(1)}.{m.group(2)}" for n in state if (m := _LORA.match(n))})
    out = {n: v for n, v in state.items()
           if not _LORA.match(n) and not n.endswith(".lora_delta")}
    errors = {}
    for module in modules:
        a, b = state[f"{module}.lora_A.weight"], state[f"{module}.lora_B.weight"]
        dw = scale * (b.astype(np.float64) @ a.astype(np.float64))
        if (delta := state.get(f"{module}.lora_delta")) is not None:
            dw = dw + delta
        u, sigma, vt = np.linalg.svd(dw / scale, full_matrices=False)
        # the top ``rank`` singular triples, split evenly; a thinner matrix's extra are zero
        root = np.sqrt(np.pad(sigma[:rank], (0, max(0, rank - len(sigma)))))
        new_b = np.pad(u[:, :rank], ((0, 0), (0, max(0, rank - u.shape[1])))) * root
        new_a = root[:, None] * np.pad(vt[:rank], ((0, max(0, rank - vt.shape[0])), (0, 0)))
        out[f"{module}.lora_A.weight"] = new_a.astype(np.float32)
        out[f"{module}.lora_B.weight"] = new_b.astype(np.float32)
        norm = float(np.linalg.norm(dw))
        errors[module] = float(np.linalg.norm(dw - scale * (new_b @ new_a))) / norm if norm else 0.0
    return out, errors


def check_state(backbone: LayeredModel, state: dict[str, np.ndarray], r: int) -> None:
    """Refuse, before anything is written, a state whose LoRA or head tensors do not fit the
    model the run config builds (another run's state, another 'lora-r' or 'model-args'),
    naming the first such tensor; tensors no library module holds go to the extras."""
    modules, head = dict(backbone.named_modules()), dict(backbone.head.named_parameters())
    for name, value in sorted(state.items()):
        fits = None
        if group_of_name(name) is not None:
            problem = "belongs to a model group, and the run config names none"
        elif match := _LORA.match(name):
            linear = modules.get(f"blocks.{match.group(1)}.{match.group(2)}")
            if isinstance(linear, nn.Linear):
                fits = (r, linear.in_features) if match.group(3) == "A" else \
                    (linear.out_features, r)
            problem = "adapts no Linear layer of the model"
        elif name.startswith("head."):
            if (param := head.get(name.removeprefix("head."))) is not None:
                fits = tuple(param.shape)
            problem = "names no parameter of the model's head"
        else:
            continue
        if fits is not None:
            if tuple(value.shape) == fits:
                continue
            problem = f"has shape {tuple(value.shape)}, the model takes {fits}"
        raise ConfigError(f"the run's state does not fit the model its config builds (run-config "
                          f"keys 'model', 'model-args', 'lora-r'): {name} {problem}")


def base_name(spec: ModelSpec) -> str:
    """What ``adapter_config.json`` names as the base model."""
    if is_text_model(spec):
        return str(hf_model_path(spec))
    return spec.name if spec.source in ("pretrained", "random") else spec.source


# extras that change what the global model predicts: no library module computes them (a
# method's recipe adds its own, ``ClientRecipe.predicting_tensors``)
_PREDICTING_EXTRAS = (".adapter.",)


def export_group(cfg: RunConfig, state: dict[str, np.ndarray], out: Path, merge: bool,
                 class_names: list[str], extras_ok: bool = False,
                 rank: int | None = None) -> dict:
    """One model's export into ``out`` (``rank``: the LoRA update refactored at that rank);
    returns what the model card lists."""
    if cfg.adapter.client_trains == "full":
        raise ConfigError("run-config key 'client-trains' = 'full': export writes adapters on "
                          "the pretrained backbone; a fully fine-tuned run's block weights are "
                          "in its checkpoint, and their export is not implemented")
    recipe = method_of(cfg).recipe
    state = recipe.library_state(state)
    spec = ModelSpec.from_config(cfg.model, len(class_names))
    backbone = build_backbone(spec)
    check_state(backbone, state, cfg.adapter.lora_r)
    rank_errors = None
    if rank is not None:
        if rank < 1:
            raise ConfigError(f"--rank {rank}: a LoRA rank is a whole number >= 1")
        if not any(_LORA.match(n) for n in state):
            raise ConfigError(f"--rank {rank}: run-config key 'adapter' = "
                              f"{cfg.adapter.adapter!r}: only LoRA factors have a rank")
        scale = cfg.adapter.lora_alpha / cfg.adapter.lora_r
        state, rank_errors = at_rank(state, scale, rank)
    library = backbone.library_model()
    set_class_names(library, class_names)
    pooling = pooling_of(backbone)
    has_lora = any(_LORA.match(n) for n in state)
    extras = {library_name(backbone, library, n): v for n, v in state.items()
              if not _LORA.match(n) and (not has_lora or not n.startswith("head."))}
    predicting = sorted(n for n in extras
                        if any(k in n for k in _PREDICTING_EXTRAS + recipe.predicting_tensors))
    if predicting and not extras_ok:
        raise ConfigError(
            f"no library loader computes this model: method {cfg.method!r}, adapter "
            f"{cfg.adapter.adapter!r} trained tensors that peft / transformers / timm have no "
            "module "
            f"for ({predicting[0]}, ... {len(predicting)} in all; see fedtune_extras.json's "
            "formulas). Pass --extras to write them anyway as fedtune-only files "
            "(fedtune_extras.safetensors + fedtune_extras.json)"
            + ("; or --rank K to fold each lora_delta into rank-K LoRA factors"
               if any(n.endswith(".lora_delta") for n in predicting) else ""))
    if merge and not has_lora:
        raise ConfigError(f"--merge: run-config key 'adapter' = {cfg.adapter.adapter!r}: only "
                          "LoRA adapters merge into the base weights (a bottleneck adapter "
                          "is non-linear); export without --merge")
    if pooling == "first-token":
        raise ConfigError(
            f"no library loader fits this export: the run reads {type(library).__name__}'s "
            "first token into one Linear layer, a head no library class has; train from a "
            "mean-pooled (sentence-transformers) checkpoint to export it")
    if pooling == "mean":
        mean_pooling_names(library)  # refuse before writing anything where the code cannot fit
    out.mkdir(parents=True, exist_ok=True)
    written, base = [], base_name(spec)
    if has_lora and pooling == "mean":  # the adapters' base: the pretrained model, mean-pooled
        save_mean_pooled(library, out / "base")
        base = str(out / "base")
        written.append("base/")
    if has_lora:
        model = peft_model_of(backbone, state, cfg, rank)
        model.peft_config[PEFT_ADAPTER].base_model_name_or_path = base
        model.save_pretrained(str(out))
        written += ["adapter_config.json", "adapter_model.safetensors"]
    if extras:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in extras.items()},
                  str(out / "fedtune_extras.safetensors"))
        # the extras carry the library's names: the head's formula goes under its module path
        # (``classifier.`` in transformers encoders, ``score.`` in decoders)
        head = f"{module_path(library, backbone.head)}."
        formulas = {head if k == "head." else k: v
                    for k, v in (EXTRA_FORMULAS | recipe.tensor_formulas).items()}
        formulas = {k: v for k, v in formulas.items() if any(k in n for n in extras)}
        (out / "fedtune_extras.json").write_text(json.dumps(
            {"tensors": sorted(extras), "formulas": formulas}, indent=1))
        written += ["fedtune_extras.safetensors", "fedtune_extras.json"]
    if rank_errors is not None:
        (out / "rank.json").write_text(json.dumps(
            {"rank": rank, "max-relative-error": max(rank_errors.values(), default=0.0),
             "relative-error": rank_errors}, indent=1))
        written.append("rank.json")
    (out / "pooling.json").write_text(json.dumps({"pooling": pooling}, indent=1))
    written.append("pooling.json")
    if merge:
        merged = model.merge_and_unload()
        target = out / "merged"
        if is_text_model(spec):
            if pooling == "mean":
                save_mean_pooled(merged, target)
                save_sentence_transformers_modules(merged, target, cfg.data.max_length)
            else:
                merged.save_pretrained(str(target))
            tokenizer_for(spec).save_pretrained(str(target))
            (target / "pooling.json").write_text(json.dumps({"pooling": pooling}, indent=1))
        else:
            from timm.models import get_pretrained_cfg, save_for_hf

            if not hasattr(merged, "pretrained_cfg"):  # built from its class, not create_model
                merged.pretrained_cfg = get_pretrained_cfg(spec.name).to_dict()
            # timm's own folder (config.json with the architecture, its arguments and the
            # class names as label_names; model.safetensors): create_model("local-dir:...")
            save_for_hf(merged, str(target), model_config={"label_names": class_names},
                        model_args=spec.kwargs, safe_serialization=True)
        written.append("merged/")
    return {"model": spec.name, "source": spec.source, "base": base, "pooling": pooling,
            "text": is_text_model(spec), "lora": has_lora, "files": written,
            "num_classes": len(class_names)}


def loaders(info: dict, where: str, max_length: int) -> list[str]:
    """The model card's loading lines for one exported folder."""
    d = where if where != "." else "EXPORT_DIR"
    lines = []
    if info["text"] and info["pooling"] == "mean":
        if "merged/" in info["files"]:
            lines += [f'pipeline("text-classification", model="{d}/merged", '
                      "trust_remote_code=True)  # labels are the class names",
                      f'AutoModelForSequenceClassification.from_pretrained("{d}/merged", '
                      "trust_remote_code=True)",
                      f'SentenceTransformer("{d}/merged", trust_remote_code=True)'
                      ".encode(texts)  # the logits",
                      "# (AutoTokenizer.from_pretrained: trust_remote_code=True too; without "
                      "it these loaders refuse the folder)"]
        if info["lora"]:
            lines.append(f'AutoPeftModelForSequenceClassification.from_pretrained("{d}", '
                         "trust_remote_code=True)  # base: base/")
    elif info["text"]:
        if "merged/" in info["files"]:
            lines += [f'pipeline("text-classification", model="{d}/merged")',
                      f'AutoModelForSequenceClassification.from_pretrained("{d}/merged")']
        if info["lora"]:  # the base is the original checkpoint: give it the head's size
            lines.append(f'AutoPeftModelForSequenceClassification.from_pretrained("{d}", '
                         f'num_labels={info["num_classes"]})')
    else:
        if "merged/" in info["files"]:
            lines.append(f'timm.create_model("local-dir:{d}/merged")')
        if info["lora"]:
            lines.append(f'PeftModel.from_pretrained(timm.create_model("{info["base"]}", '
                         f'pretrained=True, num_classes={info["num_classes"]}), "{d}")')
    if info["text"]:
        lines.append(f"# the run read the first {max_length} tokens of each text: "
                     f"pipeline(..., truncation=True, max_length={max_length})")
    return lines


def model_card(cfg: RunConfig, metrics: list[dict], groups: dict, folder: Path, merge: bool,
               class_names: list[str], rank: int | None = None) -> str:
    evaluated = [m for m in metrics if m.get("accuracy") is not None]
    last = evaluated[-1] if evaluated else {}
    accuracy = f"{100 * last['accuracy']:.2f}% (round {last['round']})" if last else "not evaluated"
    overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(cfg.flat.items())
                         if k != "results-dir")
    alpha_k = cfg.adapter.lora_alpha * (rank or 1) / cfg.adapter.lora_r
    lines = [f"# fedtune export: {cfg.method} on {cfg.data.dataset}", "",
             f"- method: `{cfg.method}`, adapter `{cfg.adapter.adapter}` on "
             f"`{cfg.adapter.adapter_modules}` (r={cfg.adapter.lora_r}, "
             f"alpha={cfg.adapter.lora_alpha})"
             + (f"; exported at rank {rank} (alpha={alpha_k:g}, the same scale; rank.json: "
                "each Linear's relative error)" if rank else ""),
             f"- data: `{cfg.data.dataset}`, partitioner `{cfg.data.partitioner}`, capacities "
             f"`{cfg.federation.capacities}`, seed {cfg.seed}",
             "- classes (label id: name): " + ", ".join(f"{i}: {n}"
                                                        for i, n in enumerate(class_names)),
             f"- rounds: {cfg.federation.num_server_rounds}; global test accuracy {accuracy}",
             f"- from: `{folder}`",
             f"- made by: `fedtune export {shlex.quote(str(folder))}"
             f"{' --merge' if merge else ''}{f' --rank {rank}' if rank else ''}`", ""]
    for g, info in groups.items():
        where = "." if g is None else f"group-{g}"
        lines += [f"## {where}: {info['model']} ({info['source']})", "",
                  f"- base model: `{info['base']}`; pooling `{info['pooling']}`",
                  f"- files: {', '.join(info['files'])}", "", "Load:", "", "```python",
                  *loaders(info, where, cfg.data.max_length), "```", ""]
    lines += ["Run config:", "", "```", overrides, "```", ""]
    return "\n".join(lines)


def run_class_names(folder: Path, cfg: RunConfig) -> list[str]:
    """The class names the run recorded (its config.json), else the data set's."""
    recorded = json.loads((folder / "config.json").read_text()).get("class-names")
    return list(recorded) if recorded else class_names_of(cfg.data)


def export_run(folder: Path, out: Path | None = None, merge: bool = False,
               extras: bool = False, rank: int | None = None) -> Path:
    folder = Path(folder).resolve()
    cfg, state, metrics = load_run(folder)
    class_names = run_class_names(folder, cfg)
    out = Path(out or folder / "export").resolve()
    groups = {}
    if not (states := group_states(cfg, state)):
        raise ConfigError(f"the run's state does not fit the model its config builds: no "
                          f"tensor of the {len(group_specs(cfg.model))} model groups the config "
                          "names")
    for g, tensors in states.items():
        gcfg = cfg if g is None else group_config(cfg, g)
        groups[g] = export_group(gcfg, tensors, out if g is None else out / f"group-{g}", merge,
                                 class_names, extras, rank)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(model_card(cfg, metrics, groups, folder, merge, class_names,
                                              rank))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="fedtune export", description="Export a run's global model as a peft adapter "
        "folder (and with --merge the merged model in its library's format).")
    parser.add_argument("results", type=Path, help="results folder of a finished run")
    parser.add_argument("--merge", action="store_true",
                        help="also save the base model with the LoRA adapters merged in")
    parser.add_argument("--out", type=Path, default=None,
                        help="output folder (default: <results>/export)")
    parser.add_argument("--extras", action="store_true",
                        help="write tensors no library module computes (bottleneck adapters, "
                             "DepthFL exits) as fedtune-only files instead of refusing")
    parser.add_argument("--rank", type=int, default=None, metavar="K",
                        help="LoRA runs: write each adapted Linear's whole update (lora_delta "
                             "included: FLoRA, FedEx-LoRA, FlexLoRA) as its best rank-K LoRA "
                             "factors (SVD); rank.json gives each one's relative error")
    args = parser.parse_args(argv)
    setup_logging()
    try:
        out = export_run(args.results, args.out, args.merge, args.extras, args.rank)
    except ConfigError as err:
        parser.exit(2, f"fedtune export: {err}\n")
    print(out)


if __name__ == "__main__":
    main()
