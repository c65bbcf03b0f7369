"""The node's prepared (tokenised) data on its disk: a fresh process reads what an earlier one
of the same node prepared, bit for bit what preparing it again gives; another data key is
another file; a damaged file is prepared again."""

import logging

import pytest
import torch

from fedtune_app.data import splits as data
from fedtune_app.data.splits import client_examples, prepared_path, run_splits
from fedtune_app.methods import resolve_config
from fedtune_app.model.backbones import ModelSpec

TEXT = {"dataset": "bbc-news", "train-subset": 40, "test-subset": 15, "max-length": 24}


def fresh_process():
    """What a new ClientApp process starts with: no data in memory."""
    data._PREPARED.clear()
    data._load_cached.cache_clear()


def data_key(cfg):
    spec = ModelSpec.from_config(cfg.model, num_classes=0)
    return data.data_set_of(cfg.data), ModelSpec(spec.name, spec.source, spec.args, spec.seed, 0)


def assert_same_examples(a, b):
    assert sorted(a.inputs) == sorted(b.inputs) == ["attention_mask", "input_ids"]
    for k in a.inputs:
        assert a.inputs[k].dtype == b.inputs[k].dtype and torch.equal(a.inputs[k], b.inputs[k])
    assert a.labels.dtype == b.labels.dtype and torch.equal(a.labels, b.labels)
    assert (a.domains is None) == (b.domains is None)


def test_a_fresh_process_reads_the_nodes_file_bit_for_bit(tmp_path):
    cfg = resolve_config(TEXT)
    fresh_process()
    written = run_splits(cfg, node_folder=tmp_path)
    path = prepared_path(*data_key(cfg), tmp_path)
    assert path.is_file() and path.parent == tmp_path / "prepared"
    assert data._load_cached.cache_info().misses == 1  # prepared here, once

    fresh_process()
    read = run_splits(cfg, node_folder=tmp_path)
    assert data._load_cached.cache_info().misses == 0  # nothing tokenised: read from disk
    assert read is not written
    fresh_process()
    rebuilt = run_splits(cfg)  # the simulation's in-process path, no node folder
    for splits in (read, written):
        assert_same_examples(splits.train, rebuilt.train)
        assert_same_examples(splits.test, rebuilt.test)
        assert splits.class_names == rebuilt.class_names == sorted(rebuilt.class_names)
        assert splits.domain_names is None
    assert len(read.train) == 40 and len(read.test) == 15
    assert read.train.inputs["input_ids"].shape == (40, 24)
    # the client's partition is cut from the read data exactly as from the rebuilt data
    assert_same_examples(client_examples(cfg, read, 2, 3), client_examples(cfg, rebuilt, 2, 3))
    # later calls of this process (e.g. a method's own run_splits(cfg)) reuse what was read
    fresh_process()
    first = run_splits(cfg, node_folder=tmp_path)
    assert run_splits(cfg) is first


@pytest.mark.parametrize("change", [{"max-length": 16}, {"train-subset": 30},
                                    {"model": "all-mpnet-base-v2"}])
def test_another_data_key_is_another_file(tmp_path, change):
    cfg, other = resolve_config(TEXT), resolve_config(TEXT | change)
    assert prepared_path(*data_key(cfg), tmp_path) != prepared_path(*data_key(other), tmp_path)
    # keys that do not change the prepared data do not change the file
    same = resolve_config(TEXT | {"seed": 7, "dirichlet-alpha": 0.1, "method": "depthfl"})
    assert prepared_path(*data_key(cfg), tmp_path) == prepared_path(*data_key(same), tmp_path)


def test_other_max_length_reads_its_own_file(tmp_path):
    fresh_process()
    long = run_splits(resolve_config(TEXT), node_folder=tmp_path)
    short = run_splits(resolve_config(TEXT | {"max-length": 16}), node_folder=tmp_path)
    assert long.train.inputs["input_ids"].shape[1] == 24
    assert short.train.inputs["input_ids"].shape[1] == 16
    assert len(list((tmp_path / "prepared").glob("*.safetensors"))) == 2


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_a_damaged_file_is_prepared_again(tmp_path, caplog, damage):
    cfg = resolve_config(TEXT)
    fresh_process()
    good = run_splits(cfg, node_folder=tmp_path)
    path = prepared_path(*data_key(cfg), tmp_path)
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2] if damage == "truncate" else b"not a file" * 9)
    fresh_process()
    with caplog.at_level(logging.WARNING):
        again = run_splits(cfg, node_folder=tmp_path)
    assert str(path) in caplog.text and "preparing the data again" in caplog.text
    assert data._load_cached.cache_info().misses == 1
    assert_same_examples(again.train, good.train)
    # replaced by a whole file again (same size; safetensors may order its header differently)
    assert path.stat().st_size == len(whole)
    fresh_process()
    assert_same_examples(run_splits(cfg, node_folder=tmp_path).train, good.train)
    assert data._load_cached.cache_info().misses == 0


def test_the_clients_partition_is_kept_beside_the_prepared_data(tmp_path, caplog):
    cfg = resolve_config(TEXT | {"partitioner": "iid"})
    fresh_process()
    data.partition_indices.cache_clear()
    first = client_examples(cfg, run_splits(cfg, node_folder=tmp_path), 1, 4)
    files = sorted((tmp_path / "prepared").glob("*-partition-1-of-4-*.npy"))
    assert len(files) == 1 and len(first) == 10  # 40 examples, 4 IID partitions

    fresh_process()
    data.partition_indices.cache_clear()
    read = client_examples(cfg, run_splits(cfg, node_folder=tmp_path), 1, 4)
    assert data.partition_indices.cache_info().misses == 0  # not partitioned again
    fresh_process()
    rebuilt = client_examples(cfg, run_splits(cfg), 1, 4)  # no node folder: partitioned here
    assert_same_examples(read, rebuilt)
    assert_same_examples(first, rebuilt)

    # another client, seed or partitioner: another file
    fresh_process()
    splits = run_splits(cfg, node_folder=tmp_path)
    client_examples(cfg, splits, 2, 4)
    client_examples(resolve_config(TEXT | {"partitioner": "iid", "seed": 3}), splits, 1, 4)
    client_examples(resolve_config(TEXT | {"min-partition-size": 2}), splits, 1, 4)  # dirichlet
    assert len(list((tmp_path / "prepared").glob("*-partition-*.npy"))) == 4

    files[0].write_bytes(files[0].read_bytes()[:40])  # truncated
    fresh_process()
    with caplog.at_level(logging.WARNING):
        again = client_examples(cfg, run_splits(cfg, node_folder=tmp_path), 1, 4)
    assert str(files[0]) in caplog.text and "partitioning again" in caplog.text
    assert_same_examples(again, rebuilt)
