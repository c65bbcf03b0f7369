"""The user's own data (dataset = "hf", hf-dataset = PATH) through the `datasets` loaders: every
format the docs name, string labels, a test split made when there is none, and the refusals."""

import csv
import json

import numpy as np
import pytest

from fedtune_app.config import ConfigError, app_defaults, settings_origins
from fedtune_app.data.splits import client_examples, describe_data, run_splits
from fedtune_app.methods import resolve_config

MIXER = {"model": "mixer_s16_224", "model-source": "random",
         "model-args": "img_size=8,patch_size=2,in_chans=1,embed_dim=32,num_blocks=4",
         "image-size": 8, "image-channels": 1}
CLASSES = ["cat", "dog", "owl"]  # sorted: the ClassLabel string labels become


def own(path, **keys):
    return resolve_config({**app_defaults(), "dataset": "hf", "hf-dataset": str(path), **keys})


def write_csv(path, rows, header=("text", "label")):
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def texts(n_per_class):
    """n_per_class texts of each class, string labels, classes interleaved."""
    return [(f"a note about a {c} number {i}", c) for i in range(n_per_class) for c in CLASSES]


def empty_set(path):
    from datasets import Dataset

    Dataset.from_dict({"text": [], "label": []}).save_to_disk(str(path))
    return path


def image_set(path, n_per_class, labels_as_strings=True):
    """A save_to_disk image set: class k's 8x8 grey images have brightness 60 + 60 k."""
    from datasets import Dataset, Image
    from PIL import Image as PIL

    rows = [(PIL.new("L", (8, 8), 60 + 60 * k), c if labels_as_strings else k)
            for i in range(n_per_class) for k, c in enumerate(CLASSES)]
    Dataset.from_dict({"image": [r[0] for r in rows], "label": [r[1] for r in rows]}
                      ).cast_column("image", Image()).save_to_disk(str(path))
    return path


def test_saved_image_set_with_string_labels_gets_a_seeded_test_split_and_all_of_its_rows(
        tmp_path):
    cfg = own(image_set(tmp_path / "imgs", 50), **MIXER)
    splits = run_splits(cfg)
    assert splits.class_names == CLASSES
    # no test split: round(0.2 * 50) = 10 of every class are the test set, the rest train
    assert len(splits.test) == 30 and len(splits.train) == 120
    assert np.bincount(splits.test.labels.numpy()).tolist() == [10, 10, 10]
    images, labels = next(splits.train.batches(150))
    # class k's pixels: (60 + 60 k) / 127.5 - 1, normalised by the mixer's 0.5 / 0.5
    expected = (60 + 60 * labels.double()) / 127.5 - 1
    assert images.shape == (120, 1, 8, 8)
    assert np.allclose(images.double().amax((1, 2, 3)), expected, atol=1e-6)
    assert np.allclose(images.double().amin((1, 2, 3)), expected, atol=1e-6)
    # the clients together hold every training example, each once
    parts = [client_examples(cfg, splits, p, 6) for p in range(6)]
    assert sum(len(p) for p in parts) == 120
    # the same seeded split every time (a second read of the folder)
    again = run_splits(own(tmp_path / "imgs", **MIXER, **{"max-length": 32}))
    assert np.array_equal(again.test.labels, splits.test.labels)


def test_single_csv_with_string_labels(tmp_path):
    cfg = own(write_csv(tmp_path / "notes.csv", texts(10)), **{"max-length": 16})
    splits = run_splits(cfg)
    assert splits.class_names == CLASSES
    assert len(splits.train) == 24 and len(splits.test) == 6  # 2 of every class
    assert set(splits.train.inputs) == {"input_ids", "attention_mask"}
    line = describe_data(cfg.data)
    assert "3 classes; training on all 24 examples, evaluating on all 6 test examples" in line
    assert "no test split: a fixed 20% of every class" in line


def test_csv_folder_with_train_and_test_files_keeps_its_split(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    write_csv(folder / "train.csv", texts(4))
    write_csv(folder / "test.csv", texts(1)[::-1])  # owl, dog, cat
    splits = run_splits(own(folder, **{"max-length": 16}))
    assert len(splits.train) == 12
    assert splits.test.labels.tolist() == [2, 1, 0]  # one ClassLabel over both files
    assert "no test split" not in describe_data(own(folder).data)


def test_json_lines_with_integer_labels_and_a_named_text_column(tmp_path):
    path = tmp_path / "reviews.jsonl"
    path.write_text("".join(json.dumps({"body": f"review {i}", "stars": i % 4, "id": i}) + "\n"
                            for i in range(40)))
    with pytest.raises(ConfigError, match="'hf-label-column' = 'label' is not a column.*"
                       "columns: body, stars, id"):
        run_splits(own(path))
    splits = run_splits(own(path, **{"hf-label-column": "stars", "max-length": 8}))
    assert splits.class_names == ["0", "1", "2", "3"]  # integer labels 0..3 as they are
    assert len(splits.train) + len(splits.test) == 40


def test_image_folder_takes_class_names_from_its_subfolders(tmp_path):
    from PIL import Image as PIL

    for k, c in enumerate(CLASSES):
        (tmp_path / "pics" / c).mkdir(parents=True)
        for i in range(5):
            PIL.new("L", (12, 8), 40 * k).save(tmp_path / "pics" / c / f"{i}.png")
    splits = run_splits(own(tmp_path / "pics", **MIXER))
    assert splits.class_names == CLASSES and len(splits.train) + len(splits.test) == 15
    images, _ = next(splits.test.batches(8))
    assert images.shape[1:] == (1, 8, 8)  # 12 x 8 images resized to the model's 8 x 8


def test_the_settings_line_says_where_each_non_default_came_from(tmp_path):
    given = {**app_defaults(), "preset": "main", "method": "depthfl"}
    origins = settings_origins(given)
    assert origins["train-subset"] == (720, "preset 'main'")
    assert origins["method"] == ("depthfl", "run-config")
    assert "seed" not in origins  # at its default
    line = describe_data(resolve_config(given).data, origins)
    assert "training on 720 of 1,781 (train-subset = 720, preset 'main') examples" in line


@pytest.mark.parametrize("make, keys, message", [
    (lambda p: p / "absent", {}, "'hf-dataset' = '.*absent': no such file or folder"),
    (lambda p: (p / "empty").mkdir() or p / "empty", {}, "holds no data files"),
    (lambda p: write_csv(p / "n.csv", [(1.5, "a"), (2.5, "b")], ("x", "label")), {},
     "no image column and no text column.*'hf-input-column'"),
    (lambda p: write_csv(p / "f.csv", [("t", 0.5), ("u", 1.5)]), {},
     "label column 'label' holds float64 values"),
    (lambda p: write_csv(p / "m.csv", [("t", -1), ("u", 1)]), {}, "negative labels"),
    (lambda p: write_csv(p / "c.csv", [("t", "a")]), {"hf-input-column": "body"},
     r"'hf-input-column': \['body'\] not in"),
    (lambda p: write_csv(p / "d.csv", [("t", "a")]), {"hf-test-split": "dev"},
     "'hf-test-split' = 'dev' is not a split"),
    (lambda p: (p / "x.txt").write_text("hello") and p / "x.txt", {},
     "a file must be CSV, TSV, JSON, JSONL or Parquet"),
    # two notes a class: round(0.2 x 2) = 0 test examples of each
    (lambda p: write_csv(p / "few.csv", texts(2)), {}, "its test set is empty \\(6 examples"),
    (lambda p: empty_set(p / "empty-set"), {}, "could not be read"),
])
def test_bad_own_data_is_one_clear_error(tmp_path, make, keys, message):
    with pytest.raises(ConfigError, match=message):
        run_splits(own(make(tmp_path), **keys))


@pytest.mark.parametrize("kind", ["images", "texts"])
def test_own_data_journey_two_methods_one_table(tmp_path, kind):
    """A user's own image set / CSV of texts, string labels, two methods for one round through
    `fedtune compare` (in process): every client trains on its share of ALL the data, and
    compare and analyze give the same headline, the run's own test accuracy."""
    import csv as csv_module
    from pathlib import Path

    from fedtune_app.tools import analysis
    from fedtune_app.tools.compare import compare

    if kind == "images":
        keys = MIXER | {"hf-dataset": str(image_set(tmp_path / "imgs", 20)),
                        "capacities": "4,2,1", "lr": 0.2}
        train = 48  # 60 images, 12 of them (4 a class) the drawn test set
    else:
        keys = {"hf-dataset": str(write_csv(tmp_path / "notes.csv", texts(10))),
                "capacities": "2,1", "max-length": 16}
        train = 24
    keys |= {"dataset": "hf", "num-server-rounds": 1, "partitioner": "iid"}
    rows = compare(["fedra", "all-small"], keys, tmp_path / "cmp", command="test")
    with (tmp_path / "cmp" / "compare.csv").open() as f:
        table = {r["method"]: r for r in csv_module.DictReader(f)}
    paper = analysis.paper_table(analysis.load_runs(tmp_path / "cmp" / "runs"), proposed=None)
    for row in rows:
        metrics = json.loads((Path(row["folder"]) / "metrics.json").read_text())
        assert sum(c["num-examples"] for c in metrics[-1]["client-metrics"].values()) == train
        headline = 100 * analysis.last_evaluated(metrics)["accuracy"]
        assert float(table[row["method"]]["test accuracy"]) == pytest.approx(headline, abs=0.005)
        assert paper.mean.loc[("-", row["method"]), "test accuracy"] == pytest.approx(
            headline, rel=1e-12)
    # the string labels' names, kept for exports and plots
    config = json.loads((Path(rows[0]["folder"]) / "config.json").read_text())
    assert config["class-names"] == CLASSES


def test_a_tsv_folder_and_unlabelled_classlabel_rows(tmp_path):
    """A folder of TSV files reads with its tab delimiter; a ClassLabel test split of -1s
    (GLUE's unlabelled test rows) is refused, not read as a class."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features, Value

    folder = tmp_path / "tsv"
    folder.mkdir()
    for part, n in (("train", 4), ("test", 1)):
        (folder / f"{part}.tsv").write_text("text\tlabel\n" + "".join(
            f"note {i} on {c}\t{c}\n" for i in range(n) for c in CLASSES))
    splits = run_splits(own(folder, **{"max-length": 8}))
    assert splits.class_names == CLASSES and (len(splits.train), len(splits.test)) == (12, 3)
    features = Features({"text": Value("string"), "label": ClassLabel(names=["no", "yes"])})
    DatasetDict(train=Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}, features=features),
                test=Dataset.from_dict({"text": ["c", "d"], "label": [-1, -1]},
                                       features=features)).save_to_disk(str(tmp_path / "glue"))
    with pytest.raises(ConfigError, match="negative labels.*hf-test-split = 'validation'"):
        run_splits(own(tmp_path / "glue"))
