"""The block store's guards on their own, with tensors small enough to reason about: the cache
key follows a replaced local checkpoint, a tensor of the wrong shape or dtype is refused by
name, and a tensor read off torch's 64-byte alignment is copied to an aligned one."""

import os

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from fedtune_app.config import ConfigError
from fedtune_app.model.backbones import ModelSpec
from fedtune_app.model.block_store import ALIGN, BlockStore, Slot, checkpoint_path


def test_the_cache_key_follows_a_replaced_local_checkpoint(tmp_path):
    source = tmp_path / "weights.bin"
    source.write_bytes(b"a" * 10)
    spec = ModelSpec("vit_tiny", str(source))
    first = checkpoint_path(spec, tmp_path / "cache")
    assert checkpoint_path(spec, tmp_path / "cache") == first  # same file: same cache entry
    # the same file under other constructor arguments is another model
    assert checkpoint_path(ModelSpec("vit_tiny", str(source), "depth=2"), tmp_path / "cache") \
        != first
    source.write_bytes(b"b" * 11)  # replaced by a file of another size
    bigger = checkpoint_path(spec, tmp_path / "cache")
    assert bigger != first
    stat = source.stat()
    source.write_bytes(b"c" * 11)  # same size, written later
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert checkpoint_path(spec, tmp_path / "cache") not in (first, bigger)
    # a checkpoint directory: any file in it counts
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "sub" / "config.json").write_text("{}")
    in_folder = ModelSpec("vit_tiny", str(folder))
    before = checkpoint_path(in_folder, tmp_path / "cache")
    (folder / "sub" / "config.json").write_text('{"a": 1}')
    assert checkpoint_path(in_folder, tmp_path / "cache") != before


def store_of(tmp_path, tensors: dict) -> tuple[BlockStore, nn.Linear]:
    """A store whose one slot is the weight (3 x 2, float32) of a Linear outside the blocks."""
    path = tmp_path / "layered.safetensors"
    save_file(tensors, str(path))
    head = nn.Linear(2, 3, bias=False)
    slot = Slot(head, "weight", True, "head.weight", (3, 2), torch.float32)
    return BlockStore(path, [slot], "cpu"), head


def test_a_tensor_of_another_shape_or_dtype_is_refused_by_name(tmp_path):
    store, _ = store_of(tmp_path, {"head.weight": torch.zeros(2, 3)})
    with pytest.raises(ConfigError) as err:
        store.load([None])
    assert str(err.value) == (
        f"frozen-weight file {store.path}: tensor 'head.weight' is (2, 3) torch.float32, the "
        "model needs (3, 2) torch.float32; delete it to rebuild it")
    store, _ = store_of(tmp_path, {"head.weight": torch.zeros(3, 2, dtype=torch.float64)})
    with pytest.raises(ConfigError, match=r"is \(3, 2\) torch.float64, the model needs "
                                          r"\(3, 2\) torch.float32"):
        store.load([None])
    store, _ = store_of(tmp_path, {"other": torch.zeros(3, 2)})
    with pytest.raises(ConfigError, match="lacks tensor 'head.weight'"):
        store.load([None])


def test_a_tensor_read_off_the_alignment_is_copied_to_an_aligned_one(tmp_path):
    # 4 bytes of 'a' stored first put 'head.weight' 4 bytes off any 64-byte boundary
    weight = torch.arange(6.0).reshape(3, 2)
    store, head = store_of(tmp_path, {"a": torch.ones(1), "head.weight": weight})
    store.load([None])
    assert head.weight.data_ptr() % ALIGN == 0
    assert torch.equal(head.weight.detach(), weight) and head.weight.requires_grad


def test_blocks_fetched_part_by_part_name_the_file_of_the_part(tmp_path):
    # a node fetching parts one by one: the store reads each part from the file it is given
    good, bad = tmp_path / "rest.safetensors", tmp_path / "block-0.safetensors"
    save_file({"head.weight": torch.ones(3, 2)}, str(good))
    save_file({"blocks.0.w": torch.ones(2)}, str(bad))
    head, block = nn.Linear(2, 3, bias=False), nn.Module()
    block.register_buffer("w", torch.zeros(4))
    slots = [Slot(head, "weight", True, "head.weight", (3, 2), torch.float32),
             Slot(block, "w", False, "blocks.0.w", (4,), torch.float32)]
    store = BlockStore(lambda part: good if part is None else bad, slots, "cpu")
    store.load([None])
    assert torch.equal(head.weight.detach(), torch.ones(3, 2))
    with pytest.raises(ConfigError, match=rf"frozen-weight file {bad}: tensor 'blocks.0.w' is "
                                          r"\(2,\) torch.float32, the model needs \(4,\)"):
        store.load([0])
