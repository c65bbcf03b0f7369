"""What a run config implies, without running it.

    python -m fedtune_app.tools.config_info num-clients 'key=value ...'
        how many simulated SuperNodes the run needs (``make run`` sizes the federation with it)
    python -m fedtune_app.tools.config_info params 'key=value ...'
        the Table-2 parameter counts of every model group (e.g. method=heterotune with
        ViT-T/S/B/L, or preset=heterotune-t3-glue-sst2 for LLaMA-3.2-1B/3B, next to the paper's
        counts), in Markdown, from the architectures on the meta device (no weights)
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from fedtune_app.apps.evaluation import parameter_counts
from fedtune_app.config import ConfigError, RunConfig, app_defaults, naming_given_keys
from fedtune_app.data.groups import group_config, group_specs
from fedtune_app.data.scenarios import num_clients
from fedtune_app.data.splits import run_num_classes
from fedtune_app.federated.flower_private import parse_config_args
from fedtune_app.methods import recipe_for, resolve_config
from fedtune_app.model.backbones import ModelSpec


def resolved(run_config: str) -> RunConfig:
    """The config `fedtune run --run-config RUN_CONFIG` resolves to (the keys beside a preset
    named in 'preset-overrides', as `fedtune run` passes them)."""
    run_config = run_config.strip()
    if run_config.endswith(".toml") and not Path(run_config).expanduser().is_file():
        raise ConfigError(f"--run-config {run_config!r}: no such TOML file")
    return resolve_config(flower_run_config(run_config))


def flower_run_config(run_config: str) -> dict:
    """What Flower hands the ServerApp for `fedtune run --run-config RUN_CONFIG`: pyproject's
    keys, the given ones over them, named in 'preset-overrides' beside a preset."""
    run_config = run_config.strip()
    given = parse_config_args([run_config]) if run_config else {}
    return {**app_defaults(), **naming_given_keys(given)}


def supernodes_needed(run_config: str) -> int:
    """Simulated SuperNodes of a run: one per client of the (preset's) capacity profile."""
    return num_clients(resolved(run_config))


# HeteroTune Table 2 (M parameters): full fine-tuning, trained & sent by HeteroTune
PAPER_TABLE2 = {"meta-llama/Llama-3.2-1B": (1236.58, 50.33),
                "meta-llama/Llama-3.2-3B": (3212.75, 117.44)}


def parameter_table(cfg: RunConfig) -> list[dict]:
    """Table 2 of a run config without any weights (architectures on the meta device)."""
    rows = []
    for g, spec in enumerate(group_specs(cfg.model)):
        model_cfg = group_config(cfg, g).replace(**{"model-source": "random"})  # loads nothing
        with torch.device("meta"):
            recipe = recipe_for(cfg, g)
            model = recipe.build(ModelSpec.from_config(model_cfg.model, run_num_classes(model_cfg)))
            rows.append({"group": g, "model": spec["model"], "model-args": spec["model-args"]}
                        | parameter_counts(model, recipe))
    return rows


def print_parameter_table(cfg: RunConfig) -> None:
    print(f"method {cfg.method}, client-trains {cfg.adapter.client_trains}, "
          f"r = {cfg.adapter.lora_r}, adapter-modules {cfg.adapter.adapter_modules}")
    print("| group | model | full fine-tuning (M) | trained & sent (M) | received (M) | "
          "reduction (%) | paper: full / trained (M) |\n|---|---|---|---|---|---|---|")
    for r in parameter_table(cfg):
        paper = " / ".join(map(str, PAPER_TABLE2.get(r["model"], ("-",))))
        print(f"| {r['group']} | {r['model']} {r['model-args']} | {r['model-params'] / 1e6:.3f} "
              f"| {r['trainable-params'] / 1e6:.4f} | {r['received-params'] / 1e6:.4f} | "
              f"{r['reduction-%']:.2f} | {paper} |")


def main(argv: list[str]) -> None:
    if len(argv) != 2 or argv[0] not in ("num-clients", "params"):
        raise SystemExit(__doc__)
    if argv[0] == "num-clients":
        print(supernodes_needed(argv[1]))
    else:
        given = parse_config_args([argv[1]]) if argv[1].strip() else {}
        print_parameter_table(resolve_config(given))


if __name__ == "__main__":
    main(sys.argv[1:])
