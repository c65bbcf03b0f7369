"""The user's own data (``dataset = "hf"``), read by the ``datasets`` library's own loaders.

``hf-dataset`` names one of:

| what                                    | read with                                         |
| --------------------------------------- | ------------------------------------------------- |
| a folder written by ``save_to_disk``    | ``load_from_disk`` (``Dataset`` or ``DatasetDict``) |
| a folder of CSV / JSON / Parquet files  | ``load_dataset("csv" | "json" | "parquet", ...)``  |
| one CSV / TSV / JSON(L) / Parquet file  | ``load_dataset(..., data_files=PATH)``            |
| a folder of images (a subfolder a class)| ``load_dataset("imagefolder", data_dir=PATH)``    |
| a hub name (``uoft-cs/cifar10``)        | ``load_dataset(name, hf-config)``: needs the hub  |

Then, in this order: the training split (``train``, or the only split) and the test split
(``hf-test-split``; a data set without one gets a seeded ``test-fraction`` of its examples, made
by ``splits.py``); the label column (``hf-label-column``, else the one ``ClassLabel`` column);
integer labels as they are, string labels encoded as a ``ClassLabel`` over all splits (sorted
names, kept as the class names of exports); the input column(s) (``hf-input-column``, else the
image column, else a text column found by name or as the only other string column).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from fedtune_app.config import ConfigError, DataConfig, hub_hint
from fedtune_app.data.sources import LazyImages, Raw, pil_to_tensor

FILE_BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json",
                 ".parquet": "parquet"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}
TEXT_COLUMN_NAMES = ("text", "sentence", "content", "review", "document", "body")
KEY = "run-config key 'hf-dataset'"


def is_local(name: str) -> bool:
    """A path, not a hub name: it exists, or it is written as a path (``/``, ``.``, ``~``) or
    names a data file."""
    return Path(name).expanduser().exists() or name.startswith(("/", ".", "~")) or \
        Path(name).suffix.lower() in FILE_BUILDERS


def _builder_args(suffix: str) -> dict:
    """What ``load_dataset`` needs besides the builder for files of this suffix."""
    return {"delimiter": "\t"} if suffix == ".tsv" else {}


def _folder_builder(root: Path) -> tuple[str, dict]:
    """The ``datasets`` builder (and its arguments) for a folder of files: images win (an image
    folder may hold a metadata.csv), else the commonest data-file type."""
    files = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(".")]
    if any(p.suffix.lower() in IMAGE_SUFFIXES for p in files):
        return "imagefolder", {}
    suffixes = Counter(p.suffix.lower() for p in files if p.suffix.lower() in FILE_BUILDERS)
    if not suffixes:
        raise ConfigError(f"{KEY} = {str(root)!r}: the folder holds no data files (CSV, TSV, "
                          "JSON, JSONL, Parquet or images) and was not written by save_to_disk")
    suffix = suffixes.most_common(1)[0][0]
    return FILE_BUILDERS[suffix], _builder_args(suffix)


def open_dataset(data: DataConfig):
    """``hf-dataset`` as a ``DatasetDict`` (a lone ``Dataset`` becomes its ``train`` split)."""
    import datasets

    name = data.hf_dataset
    if not name:
        raise ConfigError("dataset 'hf' needs run-config key 'hf-dataset': a folder written by "
                          "save_to_disk, a folder or file of CSV / JSON / Parquet data, an image "
                          "folder, or a Hugging Face hub name such as uoft-cs/cifar10")
    datasets.disable_progress_bars()
    path = Path(name).expanduser()
    try:
        if is_local(name):
            if not path.exists():
                raise ConfigError(f"{KEY} = {name!r}: no such file or folder")
            if path.is_dir() and any((path / f).is_file() for f in ("dataset_dict.json",
                                                                    "state.json")):
                loaded = datasets.load_from_disk(str(path))
            elif path.is_dir():
                builder, extra = _folder_builder(path)
                loaded = datasets.load_dataset(builder, data_dir=str(path), **extra)
            else:
                builder = FILE_BUILDERS.get(path.suffix.lower())
                if builder is None:
                    raise ConfigError(f"{KEY} = {name!r}: a file must be CSV, TSV, JSON, JSONL "
                                      "or Parquet")
                loaded = datasets.load_dataset(builder, data_files=str(path),
                                               **_builder_args(path.suffix.lower()))
        else:
            loaded = datasets.load_dataset(name, data.hf_config or None)
    except ConfigError:
        raise
    except Exception as err:  # unreadable file, offline hub, unknown name: the user's to fix
        where = "" if is_local(name) else \
            f"; not a local path, and reading it from the hub failed: {hub_hint(gated=False)}"
        raise ConfigError(f"{KEY} = {name!r} could not be read ({err.__class__.__name__}: "
                          f"{str(err).splitlines()[0][:200]}){where}") from None
    if isinstance(loaded, datasets.Dataset):
        loaded = datasets.DatasetDict(train=loaded)
    return loaded


def _pick_splits(loaded, data: DataConfig, name: str) -> list:
    """[train] or [train, test]: the test split when the data set has one."""
    splits = list(loaded)
    train = "train" if "train" in splits else splits[0] if len(splits) == 1 else None
    if train is None:
        raise ConfigError(f"{KEY} = {name!r} has splits {', '.join(splits)} but none named "
                          "'train'")
    test = data.hf_test_split
    if test == train or test not in splits:
        if test != "test":  # named by the user: it must be there
            raise ConfigError(f"run-config key 'hf-test-split' = {test!r} is not a split of "
                              f"{name!r} other than its training split; it has: "
                              f"{', '.join(splits)}")
        return [loaded[train]]
    return [loaded[train], loaded[test]]


def _label_column(features, data: DataConfig, name: str) -> str:
    from datasets import ClassLabel

    if data.hf_label_column in features:
        return data.hf_label_column
    class_labels = [c for c, f in features.items() if isinstance(f, ClassLabel)]
    if data.hf_label_column == "label" and len(class_labels) == 1:  # the default: found by type
        return class_labels[0]
    raise ConfigError(f"run-config key 'hf-label-column' = {data.hf_label_column!r} is not a "
                      f"column of {name!r}; columns: {', '.join(features)}")


def _input_columns(features, label: str, data: DataConfig, name: str) -> list[str]:
    from datasets import Image, Value

    given = [c.strip() for c in data.hf_input_column.split(",") if c.strip()]
    if given:
        bad = [c for c in given if c not in features]
        if bad:
            raise ConfigError(f"run-config key 'hf-input-column': {bad} not in {name!r}; "
                              f"columns: {', '.join(features)}")
        return given
    others = {c: f for c, f in features.items() if c != label}
    images = [c for c, f in others.items() if isinstance(f, Image)]
    texts = [c for c, f in others.items()
             if isinstance(f, Value) and f.dtype in ("string", "large_string")]
    named = [c for c in TEXT_COLUMN_NAMES if c in texts]
    found = images[:1] or named[:1] or (texts if len(texts) == 1 else [])
    if not found:
        raise ConfigError(f"{name!r} has no image column and no text column to train on "
                          f"(columns: {', '.join(features)}); name it with run-config key "
                          "'hf-input-column' (two comma-separated columns: sentence pairs)")
    return found


def _encode_labels(parts: list, label: str, name: str) -> tuple[list, list[str]]:
    """``parts`` with integer labels, and the class names: a ``ClassLabel``'s names, ``0..k-1``
    for plain integers, sorted strings (one ``ClassLabel`` over all splits) for string labels."""
    from datasets import ClassLabel, Value, concatenate_datasets

    feature = parts[0].features[label]
    if isinstance(feature, ClassLabel):
        return parts, list(feature.names)
    kind = feature.dtype if isinstance(feature, Value) else type(feature).__name__
    if kind in ("string", "large_string"):
        if any(v is None for p in parts for v in p[label]):
            raise ConfigError(f"{name!r}: column {label!r} has empty labels")
        whole = concatenate_datasets(parts).class_encode_column(label)
        sizes = np.cumsum([0] + [len(p) for p in parts])
        parts = [whole.select(range(a, b)) for a, b in zip(sizes[:-1], sizes[1:])]
        return parts, list(whole.features[label].names)
    if not (kind.startswith(("int", "uint")) or kind == "bool"):
        raise ConfigError(f"{name!r}: label column {label!r} holds {kind} values; labels must "
                          "be integers or strings (class names)")
    values = np.concatenate([np.asarray(p[label], dtype=np.int64) for p in parts])
    return parts, [str(k) for k in range(int(values.max(initial=0)) + 1)]


def load(data: DataConfig) -> Raw:
    """The user's data set as a ``Raw``: inputs (lazy images, texts or text pairs), integer
    labels, class names and, when the data set has a test split, the official split."""
    from datasets import Image

    name = data.hf_dataset
    parts = _pick_splits(open_dataset(data), data, name)
    features = parts[0].features
    label = _label_column(features, data, name)
    columns = _input_columns(features, label, data, name)
    if len(parts) == 2 and (missing := [c for c in columns + [label]
                                        if c not in parts[1].features]):
        raise ConfigError(f"{name!r}: its test split lacks column(s) {missing}")
    parts, classes = _encode_labels(parts, label, name)
    labels = np.concatenate([np.asarray(p[label], dtype=np.int64) for p in parts])
    if len(labels) and labels.min() < 0:  # a ClassLabel's -1 too
        raise ConfigError(f"{name!r}: label column {label!r} has negative labels (unlabelled "
                          "rows, as in GLUE's test split: use hf-test-split = 'validation')")
    sizes = [len(p) for p in parts]
    split = None if len(parts) == 1 else (np.arange(sizes[0]), np.arange(sizes[0], sum(sizes)))
    if isinstance(features[columns[0]], Image):
        column = columns[0]
        items = [(p, i) for p, size in enumerate(sizes) for i in range(size)]
        decode = lambda item: pil_to_tensor(parts[item[0]][item[1]][column])  # noqa: E731
        first = decode(items[0])
        inputs = LazyImages(items, decode, data.image_size or first.shape[-1],
                            data.image_channels or first.shape[0])
    elif len(columns) == 2:  # sentence pairs (GLUE QQP, MRPC, ...): the tokenizer pairs them
        inputs = [(str(row[columns[0]] or ""), str(row[columns[1]] or ""))
                  for p in parts for row in p.select_columns(columns)]
    else:  # text: more columns are joined with " | "
        inputs = [" | ".join(str(row[c] or "") for c in columns)
                  for p in parts for row in p.select_columns(columns)]
    return Raw(inputs, labels, classes, split=split)
