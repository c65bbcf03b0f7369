"""Export a run's final global model in the formats of the libraries it came from.

    fedtune export results/fedra-seed0-20261123-101500 [--merge] [--out DIR]

writes into DIR (default: ``<results folder>/export``), for a single-model run:

    adapter_config.json, adapter_model.safetensors
        LoRA runs: a peft adapter folder with peft's own key names for the base model
        (``base_model.model.bert.encoder.layer.3.output.dense.lora_A.weight``, the head as
        ``modules_to_save``): ``peft.PeftModel.from_pretrained(base, DIR)`` loads it.
    merged/ (``--merge``, LoRA runs)
        the base model with the adapters merged into its weights, in its library's format:
        ``save_pretrained`` (+ tokenizer) for Hugging Face models; ``model.safetensors`` +
        ``config.json`` for timm (``timm.create_model(name, num_classes=n, pretrained=True,
        pretrained_cfg_overlay=dict(file=DIR/merged/model.safetensors, num_classes=n))``).
    fedtune_extras.safetensors + fedtune_extras.json
        every trained tensor peft has no module type for, with the base library's module paths:
        bottleneck adapters (``y + up(gelu(down(y)))`` on a Linear's output y), HeteroTune's
        fused adapters (``y + gelu(y A') B'``, Eq. 6), DepthFL's exit classifiers (``exits.<d>``
        reads the pooled features after block d; the global prediction is the mean of the exits'
        log-softmax), FedBRICK's BRICKs (``bricks.<domain>.<position>``, stand-ins for missing
        layers; the full global model does not use them); with no peft folder, the head too.
    pooling.json
        how the classifier reads the encoder: ``mean`` (sentence-transformers checkpoints such as
        all-MiniLM-L6-v2 are pooled by the token mean, which the Hugging Face classification
        class does not do; ``pooled_logits`` below applies it) or ``library`` (the library's own
        forward gives the logits).
    README.md
        model card: method, data, rounds, accuracy, the run config and the commands.

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

from fedtune_app.config import ConfigError, setup_logging
from fedtune_app.data.groups import group_config, group_of_name, group_specs, prefix
from fedtune_app.data.splits import num_classes_of
from fedtune_app.model.adapters import PEFT_ADAPTER
from fedtune_app.model.backbones import (EncoderLayered, LayeredModel, ModelSpec, MeanPool,
                                         build_backbone, hf_model_path, is_text_model,
                                         tokenizer_for)

_LORA = re.compile(r"^blocks\.(\d+)\.(.+)\.lora_([AB])\.weight$")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
EXTRA_FORMULAS = {
    ".adapter.down": "bottleneck adapter on the Linear's output y: y + up(gelu(down(y)))",
    ".adapter.A": "HeteroTune fused FedAdapter (Eq. 6) on the Linear's output y: "
                  "y + gelu(y @ A) @ B",
    "exits.": "DepthFL exit classifier: Linear on the pooled features after block <d> "
              "(exits.<d>); prediction = mean over exits and head of log_softmax",
    "bricks.": "FedBRICK BRICK E(x) = x * softmax(B1 A1 x) + B2 A2 x + x standing in for block "
               "<position> of domain <domain>",
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


def group_states(cfg: dict, state: dict[str, np.ndarray]) -> dict[int | None, dict]:
    """group -> its tensors with model-parameter names (None: a single-model run)."""
    if not group_specs(cfg):
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
    return name  # exits.*, bricks.*: modules of our own, no library counterpart


def pooling_of(backbone: LayeredModel) -> str:
    return "mean" if isinstance(backbone, EncoderLayered) and \
        isinstance(backbone.neck, MeanPool) else "library"


def pooled_logits(model: nn.Module, inputs: dict, pooling: str) -> torch.Tensor:
    """Logits of an exported Hugging Face classifier (a PeftModel or the merged model) the way
    the run computed them: ``pooling = "mean"`` takes the token mean of the last hidden states
    over the attention mask, then the classifier; ``"library"`` is the model's own forward."""
    if pooling == "library":
        return model(**inputs).logits
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model
    encoder = getattr(inner, inner.base_model_prefix)
    pooled = MeanPool()(encoder(**inputs).last_hidden_state, inputs["attention_mask"])
    return inner.classifier(inner.dropout(pooled))


def peft_model_of(backbone: LayeredModel, state: dict[str, np.ndarray], cfg: dict):
    """A real peft model of the base library model holding the run's LoRA tensors and head."""
    from peft import LoraConfig, get_peft_model

    library = backbone.library_model()
    modules = sorted({m.group(2) for n in state if (m := _LORA.match(n))})
    targets = sorted({library_name(backbone, library, f"blocks.{j}.{m}")
                      for j in range(backbone.num_blocks) for m in modules})
    head = module_path(library, backbone.head)
    config = LoraConfig(r=cfg["lora-r"], lora_alpha=cfg["lora-alpha"],
                        lora_dropout=cfg["lora-dropout"],
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


def base_name(spec: ModelSpec) -> str:
    """What ``adapter_config.json`` names as the base model."""
    if is_text_model(spec):
        return str(hf_model_path(spec))
    return spec.name if spec.source in ("pretrained", "random") else spec.source


def export_group(cfg: dict, state: dict[str, np.ndarray], out: Path, merge: bool) -> dict:
    """One model's export into ``out``; returns what the model card lists."""
    spec = ModelSpec.from_config(cfg, num_classes_of(cfg))
    backbone = build_backbone(spec)
    library = backbone.library_model()
    out.mkdir(parents=True, exist_ok=True)
    has_lora = any(_LORA.match(n) for n in state)
    written = []
    if has_lora:
        model = peft_model_of(backbone, state, cfg)
        model.peft_config[PEFT_ADAPTER].base_model_name_or_path = base_name(spec)
        model.save_pretrained(str(out))
        written += ["adapter_config.json", "adapter_model.safetensors"]
    extras = {library_name(backbone, library, n): v for n, v in state.items()
              if not _LORA.match(n) and (not has_lora or not n.startswith("head."))}
    if extras:
        from safetensors.numpy import save_file

        save_file({k: np.ascontiguousarray(v) for k, v in extras.items()},
                  str(out / "fedtune_extras.safetensors"))
        formulas = {k: v for k, v in EXTRA_FORMULAS.items() if any(k in n for n in extras)}
        (out / "fedtune_extras.json").write_text(json.dumps(
            {"tensors": sorted(extras), "formulas": formulas}, indent=1))
        written += ["fedtune_extras.safetensors", "fedtune_extras.json"]
    pooling = pooling_of(backbone)
    (out / "pooling.json").write_text(json.dumps({"pooling": pooling}, indent=1))
    written.append("pooling.json")
    if merge:
        if not has_lora:
            raise ConfigError(f"--merge: run-config key 'adapter' = {cfg['adapter']!r}: only "
                              "LoRA adapters merge into the base weights (a bottleneck adapter "
                              "is non-linear); export without --merge")
        merged = model.merge_and_unload()
        target = out / "merged"
        if is_text_model(spec):
            merged.save_pretrained(str(target))
            tokenizer_for(spec).save_pretrained(str(target))
            (target / "pooling.json").write_text(json.dumps({"pooling": pooling}, indent=1))
        else:
            from safetensors.torch import save_file as save_torch

            target.mkdir(parents=True, exist_ok=True)
            save_torch({k: v.contiguous() for k, v in merged.state_dict().items()},
                       str(target / "model.safetensors"))
            (target / "config.json").write_text(json.dumps(
                {"architecture": spec.name, "num_classes": spec.num_classes,
                 "model_args": spec.kwargs}, indent=1))
        written.append("merged/")
    return {"model": spec.name, "source": spec.source, "base": base_name(spec),
            "pooling": pooling, "files": written}


def model_card(cfg: dict, metrics: list[dict], groups: dict, folder: Path, merge: bool) -> str:
    evaluated = [m for m in metrics if m.get("accuracy") is not None]
    last = evaluated[-1] if evaluated else {}
    accuracy = f"{100 * last['accuracy']:.2f}% (round {last['round']})" if last else "not evaluated"
    overrides = " ".join(f"{k}={json.dumps(v)}" for k, v in sorted(cfg.items())
                         if k != "results-dir")
    lines = [f"# fedtune export: {cfg['method']} on {cfg['dataset']}", "",
             f"- method: `{cfg['method']}`, adapter `{cfg['adapter']}` on "
             f"`{cfg['adapter-modules']}` (r={cfg['lora-r']}, alpha={cfg['lora-alpha']})",
             f"- data: `{cfg['dataset']}`, partitioner `{cfg['partitioner']}`, capacities "
             f"`{cfg['capacities']}`, seed {cfg['seed']}",
             f"- rounds: {cfg['num-server-rounds']}; global test accuracy {accuracy}",
             f"- from: `{folder}`",
             f"- made by: `fedtune export {shlex.quote(str(folder))}"
             f"{' --merge' if merge else ''}`", ""]
    for g, info in groups.items():
        where = "." if g is None else f"group-{g}"
        lines += [f"## {where}: {info['model']} ({info['source']})", "",
                  f"- base model: `{info['base']}`; pooling `{info['pooling']}`",
                  f"- files: {', '.join(info['files'])}", ""]
    lines += ["Load (LoRA runs):", "", "```python",
              "from peft import PeftModel",
              "model = PeftModel.from_pretrained(base, EXPORT_DIR)  # base: the model named above",
              "from fedtune_app.tools.export import pooled_logits  # honours pooling.json",
              "```", "", "Run config:", "", "```", overrides, "```", ""]
    return "\n".join(lines)


def export_run(folder: Path, out: Path | None = None, merge: bool = False) -> Path:
    folder = Path(folder).resolve()
    cfg, state, metrics = load_run(folder)
    out = Path(out or folder / "export").resolve()
    groups = {}
    for g, tensors in group_states(cfg, state).items():
        gcfg = cfg if g is None else group_config(cfg, g)
        groups[g] = export_group(gcfg, tensors, out if g is None else out / f"group-{g}", merge)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(model_card(cfg, metrics, groups, folder, merge))
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
    args = parser.parse_args(argv)
    setup_logging()
    try:
        out = export_run(args.results, args.out, args.merge)
    except ConfigError as err:
        parser.exit(2, f"fedtune export: {err}\n")
    print(out)


if __name__ == "__main__":
    main()
