"""The block store's guards on their own, with tensors small enough to reason about: the cache
key follows a replaced local checkpoint, a tensor of the wrong shape or dtype is refused by
name, and a tensor read off torch's 64-byte alignment is copied to an aligned one."""

import hashlib
import json
import os

import pytest
import timm
import torch
import transformers
from safetensors.torch import save_file
from torch import nn

from fedtune_app.config import ConfigError
from fedtune_app.model.backbones import ModelSpec
from fedtune_app.model.block_store import (
    ALIGN,
    FORMAT,
    BlockStore,
    Slot,
    block_of,
    build_on_demand,
    check_memory,
    checkpoint_path,
    frozen_bytes,
    frozen_slots,
    hold_blocks,
    layered_checkpoint,
    place,
    resident_weight_bytes,
    save_layered,
    source_identity,
)


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


# -- the store's bookkeeping, one piece at a time, on modules small enough to count by hand --
def test_a_slot_counts_its_bytes_and_a_name_its_block():
    owner = nn.Module()
    assert Slot(owner, "w", True, "w", (3, 2), torch.float16).nbytes == 3 * 2 * 2
    assert Slot(owner, "w", True, "w", (5,), torch.float64).nbytes == 5 * 8
    assert Slot(owner, "w", False, "w", (), torch.int32).nbytes == 4  # a scalar: one element
    assert block_of("blocks.12.attn.qkv.weight") == 12
    assert block_of("blocks.0.w") == 0
    for outside in ("head.weight", "blocks.x.w", "blocks.3", "stem.blocks.1.w", "blocks..w"):
        assert block_of(outside) is None


class Tied(nn.Module):
    """stem: Linear 2 -> 3 with bias; head: Linear 3 -> 2 without bias; blocks.0: a buffer and
    a Linear whose weight is the stem's (tied); a None buffer (no tensor) before the real one."""

    num_blocks = 1

    def __init__(self):
        super().__init__()
        self.stem = nn.Linear(2, 3)
        self.blocks = nn.ModuleList([nn.Module()])
        self.blocks[0].register_buffer("unset", None)
        self.blocks[0].register_buffer("scale", torch.full((4,), 2.0, dtype=torch.float64))
        self.blocks[0].proj = nn.Linear(2, 3, bias=False)
        self.blocks[0].proj.weight = self.stem.weight
        self.head = nn.Linear(3, 2, bias=False)
        self.register_buffer("step", torch.tensor(7))


def test_frozen_slots_name_every_tensor_once_by_its_first_name():
    model = Tied()
    slots = frozen_slots(model)
    # named_modules without removing duplicates: root, stem, blocks, blocks.0, blocks.0.proj,
    # head; per module its parameters, then its buffers; None entries are no tensors
    assert [(s.name, s.leaf, s.is_param, s.shape, s.dtype) for s in slots] == [
        ("step", "step", False, (), torch.int64),
        ("stem.weight", "weight", True, (3, 2), torch.float32),
        ("stem.bias", "bias", True, (3,), torch.float32),
        ("blocks.0.scale", "scale", False, (4,), torch.float64),
        ("stem.weight", "weight", True, (3, 2), torch.float32),  # tied: the stem's name
        ("head.weight", "weight", True, (2, 3), torch.float32),
    ]
    assert [s.owner for s in slots] == [model, model.stem, model.stem, model.blocks[0],
                                        model.blocks[0].proj, model.head]


def test_the_cache_key_reads_no_file_for_the_hub_or_a_random_init(tmp_path, monkeypatch):
    # files named like the two keywords in the working folder are not the model's source
    monkeypatch.chdir(tmp_path)
    for word in ("pretrained", "random"):
        (tmp_path / word).write_bytes(b"x")
        ident = source_identity(ModelSpec("vit_tiny", word, "depth=2", 3, 10))
        assert ident[:6] == [FORMAT, "vit_tiny", word, "depth=2", 3, 10]
        # the installed versions (torch's without its local build tag)
        assert ident[6:] == [torch.__version__.split("+")[0], timm.__version__,
                             transformers.__version__]
        assert len(ident) == 9
    # a missing source adds nothing either (loading it fails later, naming it)
    assert len(source_identity(ModelSpec("vit_tiny", str(tmp_path / "nowhere")))) == 9


def test_the_cache_key_lists_a_folder_s_files_sorted_with_size_and_mtime(tmp_path,
                                                                           monkeypatch):
    folder = tmp_path / "model"
    (folder / "b").mkdir(parents=True)
    (folder / "z.json").write_bytes(b"12345")
    (folder / "b" / "a.bin").write_bytes(b"123")
    os.utime(folder / "z.json", ns=(0, 5_000_000_000))
    os.utime(folder / "b" / "a.bin", ns=(0, 7_000_000_000))
    ident = source_identity(ModelSpec("m", str(folder)))
    # files only (not the folder b), in sorted path order
    assert ident[6:8] == [(str(folder / "b" / "a.bin"), 3, 7_000_000_000),
                          (str(folder / "z.json"), 5, 5_000_000_000)]
    assert len(ident) == 6 + 2 + 3
    # one file; '~' is the user's home
    monkeypatch.setenv("HOME", str(tmp_path))
    ident = source_identity(ModelSpec("m", "~/model/z.json"))
    assert ident[6] == (str(folder / "z.json"), 5, 5_000_000_000)
    assert len(ident) == 6 + 1 + 3


def test_the_cache_file_is_named_by_the_model_and_20_hex_digits_of_the_key(tmp_path):
    spec = ModelSpec("hf-org/Tiny BERT :v1.2", "random")
    path = checkpoint_path(spec, tmp_path)
    assert path.parent == tmp_path / "layered"
    name, digest = path.name.removesuffix(".safetensors").rsplit("-", 1)
    assert name == "hf-org_Tiny_BERT_v1.2"  # runs of other characters become one '_'
    assert len(digest) == 20 and set(digest) <= set("0123456789abcdef")
    key = json.dumps(source_identity(spec)).encode()
    assert digest == hashlib.sha256(key).hexdigest()[:20]
    # a long name keeps its last 60 characters
    long = checkpoint_path(ModelSpec("a" * 30 + "b" * 40, "random"), tmp_path)
    assert long.name.startswith("a" * 20 + "b" * 40 + "-")


def test_the_layered_file_holds_each_tensor_once_under_its_name(tmp_path, monkeypatch):
    from safetensors import safe_open

    model = Tied()
    path = tmp_path / "new" / "folder" / "layered.safetensors"  # folders made as needed
    save_layered(model, path)
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": FORMAT, "blocks": "1"}
        assert sorted(f.keys()) == ["blocks.0.scale", "head.weight", "stem.bias", "stem.weight",
                                    "step"]
        assert torch.equal(f.get_tensor("stem.weight"), model.stem.weight.detach())
        assert torch.equal(f.get_tensor("blocks.0.scale"), torch.full((4,), 2.0,
                                                                      dtype=torch.float64))
        assert f.get_tensor("step").item() == 7
    assert os.listdir(path.parent) == ["layered.safetensors"]  # no temporary file left
    # a writer that fails half way leaves neither its temporary file nor a checkpoint
    import safetensors.torch

    written = []

    def full_disk(tensors, filename, metadata):
        written.append(filename)
        open(filename, "wb").write(b"half")
        raise OSError("No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full_disk)
    with pytest.raises(OSError, match="No space"):
        save_layered(model, tmp_path / "other" / "layered.safetensors")
    assert os.listdir(tmp_path / "other") == []
    # it wrote a hidden temporary file beside the target (same file system: the rename is
    # atomic), named like a safetensors file
    (temporary,) = written
    assert os.path.dirname(temporary) == str(tmp_path / "other")
    assert os.path.basename(temporary).startswith(".part-")
    assert temporary.endswith(".safetensors")


def test_a_missing_or_unreadable_file_is_named_with_what_to_do(tmp_path):
    store, _ = store_of(tmp_path, {"head.weight": torch.zeros(3, 2)})
    assert store.files(None) == store.path == tmp_path / "layered.safetensors"
    assert store.held == set() and store.adapters_ready is False
    store.path.write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError) as err:
        store.load([None])
    assert str(err.value).startswith(f"frozen-weight file {store.path} is not a readable "
                                     "safetensors file (")
    assert str(err.value).endswith("); delete it to rebuild it")
    store.path.unlink()
    with pytest.raises(ConfigError) as err:
        store.load([None])
    assert str(err.value) == (
        f"frozen-weight file {store.path} is missing (the node's layered checkpoint; delete "
        "its folder's lock file and start again to rebuild it)")


def test_a_tied_tensor_is_read_once_and_stays_tied_and_a_dropped_block_keeps_its_types(
        tmp_path):
    path = tmp_path / "layered.safetensors"
    weight = torch.arange(6.0).reshape(3, 2)
    save_file({"stem.weight": weight, "stem.bias": torch.ones(3), "head.weight": torch.ones(2, 3),
               "step": torch.tensor(3), "blocks.0.scale": torch.ones(4, dtype=torch.float64)},
              str(path))
    model = Tied()
    store = BlockStore(path, frozen_slots(model), "cpu")
    assert store.path == path and store.device == torch.device("cpu")
    # the tied weight's name is the stem's: it belongs to the part outside the blocks, once
    assert store.part_bytes(None) == 8 + 24 + 12 + 24  # step, stem weight + bias, head
    assert store.part_bytes(0) == 4 * 8  # the float64 buffer
    assert store.part_bytes(1) == 0
    model.stem.weight.requires_grad_(False)
    model.head.weight.requires_grad_(True)
    store.load([None, 0])
    # one tensor read, both Parameters on it: tied as built
    assert model.blocks[0].proj.weight.data_ptr() == model.stem.weight.data_ptr()
    assert torch.equal(model.stem.weight.detach(), weight)
    assert not model.stem.weight.requires_grad and model.head.weight.requires_grad
    assert model.step.item() == 3 and type(model.step) is torch.Tensor  # a buffer stays one
    assert torch.equal(model.blocks[0].scale, torch.ones(4, dtype=torch.float64))
    store.drop(0)
    scale = model.blocks[0].scale
    assert scale.is_meta and scale.shape == (4,) and scale.dtype == torch.float64
    assert type(scale) is torch.Tensor
    assert not model.stem.weight.is_meta  # the tied weight is not block 0's
    model.blocks[0].proj.weight = model.head.weight  # a block's parameter, dropped
    store.slots[0].append(Slot(model.blocks[0].proj, "weight", True, "blocks.0.proj.weight",
                               (2, 3), torch.float16))
    store.drop(0)
    proj = model.blocks[0].proj.weight
    assert isinstance(proj, nn.Parameter) and proj.is_meta and proj.shape == (2, 3)
    assert proj.dtype == torch.float16 and proj.requires_grad


def test_the_sizes_of_the_parts_of_a_model_and_its_resident_bytes(tmp_path):
    model = Tied()
    # step int64 8 B; stem 6 + 3 float32 = 36 B; head 6 float32 = 24 B; block 0: scale
    # 4 float64 = 32 B; the tied weight is counted where its first name puts it (the stem)
    assert resident_weight_bytes(model) == 8 + 36 + 24 + 32
    model.head.weight = nn.Parameter(torch.empty(2, 3, device="meta"))
    assert resident_weight_bytes(model) == 8 + 36 + 32  # the meta device holds nothing
    base = torch.zeros(10)
    model.blocks[0].scale = base[2:4]  # a view: its whole storage (10 floats) is resident
    model.register_buffer("step", base[:1])  # the same storage again: counted once
    assert resident_weight_bytes(model) == 36 + 40


def test_hold_blocks_gives_adapters_storage_once_and_keeps_frozen_ones_on_meta(tmp_path):
    model = Tied()
    path = tmp_path / "layered.safetensors"
    save_layered(model, path)
    store = BlockStore(path, frozen_slots(model), "cpu")
    store.drop(0)  # block 0 not held yet: its frozen buffer is on the meta device
    model.block_store = store
    # an adapter and a method's buffer attached beside the base layer, on the meta device
    proj = model.blocks[0].proj
    proj.lora = nn.Parameter(torch.empty(2, 3, device="meta"))
    proj.frozen_extra = nn.Parameter(torch.empty(1, device="meta"), requires_grad=False)
    proj.register_buffer("mask", torch.empty(2, dtype=torch.int8, device="meta"))
    hold_blocks(model, ())
    assert store.adapters_ready and store.held == set()
    assert isinstance(proj.lora, nn.Parameter) and proj.lora.requires_grad
    assert torch.equal(proj.lora.detach(), torch.zeros(2, 3))
    assert isinstance(proj.frozen_extra, nn.Parameter) and not proj.frozen_extra.requires_grad
    assert torch.equal(proj.frozen_extra.detach(), torch.zeros(1))
    assert type(proj.mask) is torch.Tensor and proj.mask.dtype == torch.int8
    assert torch.equal(proj.mask, torch.zeros(2, dtype=torch.int8))
    assert model.blocks[0].scale.is_meta  # frozen: read when block 0 is planned
    hold_blocks(model, (0,))
    assert store.held == {0}
    assert torch.equal(model.blocks[0].scale, torch.full((4,), 2.0, dtype=torch.float64))
    # storage is given once: a module attached later on the meta device stays there
    proj.late = nn.Parameter(torch.empty(1, device="meta"))
    hold_blocks(model, [0, 0])
    assert proj.late.is_meta and store.held == {0}
    hold_blocks(model, [])
    assert model.blocks[0].scale.is_meta and store.held == set()
    # a model built whole has no store: nothing to hold or drop
    whole = Tied()
    hold_blocks(whole, ())
    assert not whole.blocks[0].scale.is_meta and not hasattr(whole, "block_store")
    # adapters get their storage on the store's device (here the meta device: none)
    model = Tied()
    model.block_store = BlockStore(path, frozen_slots(model), "meta")
    model.head.lora = nn.Parameter(torch.empty(2, device="meta"))
    hold_blocks(model, ())
    assert model.head.lora.is_meta and model.block_store.adapters_ready


def test_place_moves_the_held_tensors_and_leaves_the_meta_ones(tmp_path):
    model = Tied()
    model.head.weight = nn.Parameter(torch.empty(2, 3, device="meta"))
    assert place(model, "meta") is model
    assert model.stem.weight.is_meta and model.step.is_meta and model.head.weight.is_meta
    model = Tied()
    model.head.weight = nn.Parameter(torch.empty(2, 3, device="meta"))
    weight = model.stem.weight.detach().clone()
    place(model, torch.device("cpu"))
    assert torch.equal(model.stem.weight.detach(), weight) and model.head.weight.is_meta


def test_the_memory_check_compares_with_the_largest_blocks_in_mebibytes(monkeypatch):
    import fedtune_app.model.block_store as block_store

    mb = 2**20
    spec = ModelSpec("m", "random")
    # 0.5 MB outside the blocks; blocks of 0.25, 0.5 and 0.125 MB (unsorted)
    monkeypatch.setattr(block_store, "frozen_bytes",
                        lambda s: (mb // 2, [mb // 4, mb // 2, mb // 8]))
    check_memory(spec, 1, 1)  # 0.5 + 0.5 MB is exactly 1 MB: it fits
    check_memory(spec, 3, 2)  # 0.5 + 0.875 MB
    with pytest.raises(ConfigError) as err:
        check_memory(spec, 2, 1)  # 0.5 + 0.5 + 0.25 MB
    assert str(err.value) == (
        "node config memory-mb=1 cannot hold capacity=2 of model 'm': its frozen weights need "
        "1.2 MB (0.5 MB outside the blocks + 2 blocks of up to 0.5 MB each); declare "
        "capacity=1 or less, or give the node more memory")
    # 0.5 MB + the largest block fit exactly (the count stops at the first that does not)
    with pytest.raises(ConfigError, match=r"need 1.4 MB \(0.5 MB outside the blocks \+ 3 "
                                          r"blocks .* declare capacity=1 or less"):
        check_memory(spec, 3, 1)
    # the count of blocks that fit goes on past the first one: 0.5 MB + 2 x 0.25 MB fit in
    # 1 MB, a third block does not (a guard: a count stuck at one would never end)
    import signal

    def stuck(*_):
        raise TimeoutError("the count of fitting blocks does not end")

    monkeypatch.setattr(block_store, "frozen_bytes", lambda s: (mb // 2, [mb // 4] * 3))
    signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)
    try:
        with pytest.raises(ConfigError, match="declare capacity=2 or less"):
            check_memory(spec, 3, 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
    # 1.5 MB outside the blocks alone is more than 1 MB
    monkeypatch.setattr(block_store, "frozen_bytes", lambda s: (3 * mb // 2, [mb // 4]))
    with pytest.raises(ConfigError) as err:
        check_memory(spec, 1, 1)
    assert str(err.value).endswith("1 blocks of up to 0.2 MB each); not even the parts "
                                   "outside the blocks fit, or give the node more memory")


def test_a_byte_tensor_one_byte_past_the_alignment_is_copied(tmp_path):
    from safetensors import safe_open

    # uint8 tensors: 'a' (1 byte) first, then 'mask' at data offset 1; the header is padded
    # (through its metadata) until the data starts on a 64-byte boundary of the mapped file
    path = tmp_path / "layered.safetensors"
    mask = torch.arange(6, dtype=torch.uint8).reshape(2, 3)
    for pad in range(64):
        save_file({"a": torch.ones(1, dtype=torch.uint8), "mask": mask}, str(path),
                  metadata={"pad": "x" * pad})
        if (8 + int.from_bytes(path.read_bytes()[:8], "little")) % ALIGN == 0:
            break
    with safe_open(str(path), framework="pt") as f:
        assert f.get_tensor("mask").data_ptr() % ALIGN == 1
    owner = nn.Module()
    owner.register_buffer("mask", torch.zeros(2, 3, dtype=torch.uint8))
    store = BlockStore(path, [Slot(owner, "mask", False, "mask", (2, 3), torch.uint8)], "cpu")
    store.load([None])
    store.load([7])  # a part without slots reads nothing and drops nothing
    store.drop(7)
    assert owner.mask.data_ptr() % ALIGN == 0 and torch.equal(owner.mask, mask)


def test_a_missing_tensor_is_named_with_what_to_do(tmp_path):
    store, _ = store_of(tmp_path, {"other": torch.zeros(3, 2)})
    with pytest.raises(ConfigError) as err:
        store.load([None])
    assert str(err.value) == (
        f"frozen-weight file {store.path} lacks tensor 'head.weight' (truncated or another "
        "model); delete it to rebuild it")


# 2 blocks of width 8 (MLP 32), 4x4 one-channel images in 2x2 patches, 3 classes
VIT2 = ModelSpec("vit_tiny_patch16_224", "random",
                 "img_size=4,patch_size=2,in_chans=1,embed_dim=8,depth=2,num_heads=2", 1, 3)


def test_the_node_file_is_written_into_a_new_folder_and_counted_as_no_build(tmp_path):
    from fedtune_app.model.backbones import BUILDS

    cache = tmp_path / "not" / "yet"
    path = layered_checkpoint(VIT2, cache)
    assert path.parent == cache / "layered"
    # a second model in the same (existing) folder
    other = layered_checkpoint(ModelSpec(VIT2.name, "random", VIT2.args, 2, 3), cache)
    assert other.parent == path.parent and other != path
    builds = BUILDS["count"]
    model = build_on_demand(VIT2, tmp_path / "elsewhere", "cpu", files=lambda part: path)
    assert BUILDS["count"] == builds + 1  # one skeleton, counted as one build
    assert not (tmp_path / "elsewhere").exists()  # the given files replace the node's file
    # patch embedding 4*8+8, cls token 8, positions 5*8, final norm 2*8, head 8*3+3 floats
    assert resident_weight_bytes(model) == 4 * (40 + 8 + 40 + 16 + 27)


def test_the_part_sizes_are_counted_block_by_block(monkeypatch):
    import fedtune_app.model.block_store as block_store

    # blocks of different sizes: block 0 holds 4 float64 (32 B), block 1 a float16 Linear
    # 3 -> 5 with bias (20 halves, 40 B); outside: step 8 B, stem 36 B, head 24 B
    model = Tied()
    model.blocks.append(nn.Linear(3, 5, dtype=torch.float16))
    monkeypatch.setattr(block_store, "build_skeleton", lambda spec: model)
    assert frozen_bytes(ModelSpec("m")) == (8 + 36 + 24, [32, 40])


def test_the_file_is_opened_on_the_node_s_device(tmp_path, monkeypatch):
    # a GPU node must read its frozen weights straight to its device: safetensors opens to the
    # CPU unless told otherwise, which this CPU-only machine could not tell apart by the result
    import safetensors

    real, devices = safetensors.safe_open, []

    def recording(*args, **kwargs):
        devices.append(kwargs.get("device"))
        return real(*args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", recording)
    store, head = store_of(tmp_path, {"head.weight": torch.arange(6.0).reshape(3, 2)})
    store.load([None])
    assert devices == ["cpu"] and torch.equal(head.weight.detach(),
                                              torch.arange(6.0).reshape(3, 2))
