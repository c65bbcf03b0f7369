"""Capacity-true clients: a model that holds only the blocks of its plan.

A node keeps the frozen backbone once on its disk, as one safetensors file of the layered
model's tensors named as the layered view names them (``stem.*``, ``blocks.<j>.*``, ``neck.*``,
``head.*`` and whatever else a family registers outside the blocks); every parameter and every
buffer, non-persistent ones included (e.g. a decoder's rotary frequencies), so nothing of a
family has to be recomputed. The file is written once per node (``layered_checkpoint``): from
the hub / a local checkpoint / the seeded random init, by building the backbone whole one time.
A random-init backbone is therefore the same block by block as whole, on every node. A node
that cannot hold the whole model fetches the parts it needs from a published copy of that file
instead (``published_blocks``: ranged HTTP reads, each part checked by hash).

A client then builds the model's skeleton on the meta device (no storage), fills the parts
outside the blocks from that file, and per round ``hold_blocks(model, plan)`` reads the planned
blocks' tensors by name from the memory-mapped file (loading a newly planned block, reusing one
still planned, dropping the others back to the meta device). Adapters and a method's extra
modules (BRICKs, exits) stay allocated for every block: they are the small trainable part, and
their values come from the server every round.

Nothing here knows a family: a frozen tensor is found by walking the plain layered model's
modules before adapters wrap them (the wrapped Linear stays the same module object), so a
family that registers its parts in ``LayeredModel`` plugs in as it is.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import torch
from torch import nn

from fedtune_app.config import ConfigError
from fedtune_app.model.backbones import (
    BUILDS,
    LayeredModel,
    ModelSpec,
    build_skeleton,
    frozen_backbone,
)

log = logging.getLogger("fedtune")
_BLOCK = re.compile(r"^blocks\.(\d+)\.")
# node config key: false = this device never builds the whole backbone (refuses instead)
WHOLE_MODEL_KEY = "build-whole-model"
FORMAT = "fedtune-layered-1"  # bump when the file layout changes: old cache files are ignored
ALIGN = 64  # bytes: torch's CPU allocator's alignment


@dataclass(frozen=True)
class Slot:
    """One frozen tensor of the backbone: where it sits (module + attribute) and its name in
    the layered checkpoint (aliases of one tensor share the name: tied weights stay tied)."""

    owner: nn.Module
    leaf: str
    is_param: bool
    name: str
    shape: tuple
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize


def block_of(name: str) -> int | None:
    match = _BLOCK.match(name)
    return int(match.group(1)) if match else None


def frozen_slots(model: LayeredModel) -> list[Slot]:
    """Every parameter and buffer of a plain (adapter-free) layered model, as slots."""
    names: dict[int, str] = {}
    slots = []
    for module_name, module in model.named_modules(remove_duplicate=False):
        for is_param, table in ((True, module._parameters), (False, module._buffers)):
            for leaf, tensor in table.items():
                if tensor is None:
                    continue
                full = f"{module_name}.{leaf}" if module_name else leaf
                name = names.setdefault(id(tensor), full)
                slots.append(Slot(module, leaf, is_param, name, tuple(tensor.shape),
                                  tensor.dtype))
    return slots


# -- the node's layered checkpoint ------------------------------------------------------------
def source_identity(spec: ModelSpec) -> list:
    """What the weights depend on besides the spec's fields: a local file's size and mtime, and
    the library versions that define architectures and random inits."""
    ident: list = [FORMAT, *dataclasses.astuple(spec)]
    source = Path(spec.source).expanduser()
    if spec.source not in ("pretrained", "random") and source.exists():
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*")
                                                         if p.is_file())
        ident += [(str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
    for package in ("torch", "timm", "transformers"):
        try:
            ident.append(metadata.version(package))
        except metadata.PackageNotFoundError:
            ident.append(None)
    return ident


def checkpoint_path(spec: ModelSpec, cache_dir: Path) -> Path:
    digest = hashlib.sha256(json.dumps(source_identity(spec), default=str).encode())
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.name)[-60:]
    return Path(cache_dir) / "layered" / f"{safe}-{digest.hexdigest()[:20]}.safetensors"


def save_layered(model: LayeredModel, path: Path) -> None:
    """Write every tensor of ``model`` under its layered name, atomically (a reader never sees
    half a file; parallel writers leave one whole file)."""
    from safetensors.torch import save_file

    tensors = {}
    for slot in frozen_slots(model):
        table = slot.owner._parameters if slot.is_param else slot.owner._buffers
        tensors.setdefault(slot.name, table[slot.leaf].detach().to("cpu").contiguous())
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-", suffix=".safetensors")
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"format": FORMAT, "blocks": str(model.num_blocks)})
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def layered_checkpoint(spec: ModelSpec, cache_dir: Path, allow_build: bool = True,
                       publish_hint: str = "") -> Path:
    """The node's layered checkpoint of ``spec`` (written on first use: the one time this node
    builds the whole backbone, e.g. downloading a hub model). Before that build the node says
    so, with the peak it needs and how to avoid it (``publish_hint``: the publish command);
    ``allow_build=False`` (node config ``build-whole-model=false``) refuses instead."""
    from filelock import FileLock

    path = checkpoint_path(spec, cache_dir)
    if path.is_file():
        return path
    if not allow_build:
        raise ConfigError(whole_model_refusal(spec, path, publish_hint))
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.lock"):  # simulation actors of one node build it once
        if not path.is_file():
            log.warning(whole_model_notice(spec, path, publish_hint))
            started = time.perf_counter()
            save_layered(frozen_backbone(spec), path)
            log.info("fedtune node: layered checkpoint %s written in %.1f s", path,
                     time.perf_counter() - started)
    return path


def _mb(nbytes: int) -> str:
    """9,535,016 -> '9.1 MB'; 17,960 -> '17.5 KB' (binary units, as ``check_memory``)."""
    return f"{nbytes / 2**20:.1f} MB" if nbytes >= 2**20 else f"{nbytes / 2**10:.1f} KB"


def whole_model_notice(spec: ModelSpec, path: Path, publish_hint: str = "") -> str:
    """What a node says before it builds the whole backbone once."""
    shared, blocks = frozen_bytes(spec)
    return (f"fedtune node: building the WHOLE backbone {spec.name!r} once, to write this "
            f"node's layered checkpoint {path}: its peak holds at least {_mb(shared + sum(blocks))}"
            f" of frozen weights (more while a pretrained checkpoint loads), where training "
            f"needs only {_mb(shared)} + up to {_mb(max(blocks, default=0))} per held block. "
            f"{_avoid(publish_hint)}")


def whole_model_refusal(spec: ModelSpec, path: Path, publish_hint: str = "") -> str:
    shared, blocks = frozen_bytes(spec)
    return (f"node config {WHOLE_MODEL_KEY}=false: this node has no layered checkpoint of "
            f"{spec.name!r} ({path}) and must not build the whole backbone "
            f"({_mb(shared + sum(blocks))} of frozen weights) to write one. {_avoid(publish_hint)}")


def _avoid(publish_hint: str) -> str:
    command = publish_hint or "fedtune publish-layered --run-config '<the run's model keys>' " \
                              "--out DIR --base-url URL"
    return ("To fetch only its planned blocks instead, publish them once on a machine that can "
            f"hold the model, `{command}`, serve DIR over HTTP with Range support and run with "
            f"the printed layered-url and layered-sha256 (docs/deployment.md); node config "
            f"{WHOLE_MODEL_KEY}=false makes a device refuse this build.")


def allows_whole_model(node_config: dict | None) -> bool:
    """Node config ``build-whole-model`` (default true): may this node build the whole
    backbone once?"""
    value = (node_config or {}).get(WHOLE_MODEL_KEY, True)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        value = value.strip().lower() == "true"
    if not isinstance(value, bool):
        raise ConfigError(f"node config {WHOLE_MODEL_KEY}={value!r} is not a boolean; allowed: "
                          "true, false")
    return value


# -- a model that holds only its plan's blocks -----------------------------------------------
class BlockStore:
    """The frozen tensors of one layered model, read by name from its layered checkpoint."""

    def __init__(self, files, slots: list[Slot], device: torch.device):
        """``files``: the node's layered checkpoint (one file of every part), or a function
        part -> a local file holding that part's tensors (blocks fetched one by one from a
        published checkpoint, ``published_blocks``)."""
        self.path = None if callable(files) else Path(files)
        self.files = files if callable(files) else (lambda part: self.path)
        self.device = torch.device(device)
        self.slots: dict[int | None, list[Slot]] = {}
        for slot in slots:
            self.slots.setdefault(block_of(slot.name), []).append(slot)
        self.held: set[int] = set()
        self.adapters_ready = False

    def _open(self, part):
        from safetensors import SafetensorError, safe_open

        path = self.files(part)
        if not path.is_file():
            raise ConfigError(f"frozen-weight file {path} is missing (the node's layered "
                              "checkpoint; delete its folder's lock file and start again to "
                              "rebuild it)")
        try:
            return path, safe_open(str(path), framework="pt", device=str(self.device))
        except (SafetensorError, OSError, ValueError) as err:
            raise ConfigError(f"frozen-weight file {path} is not a readable safetensors "
                              f"file ({err}); delete it to rebuild it") from None

    def load(self, parts) -> None:
        """Read the slots of ``parts`` (block indices, None = everything outside the blocks),
        one part per opening of the file: the mapped pages a read touches count in the
        process's resident set until the file is closed, so at most one block's do."""
        read: dict[str, torch.Tensor] = {}  # a tensor tied across parts is read once
        for part in parts:
            path, opened = self._open(part)
            with opened as f:
                available = set(f.keys())
                for slot in self.slots.get(part, []):
                    if slot.name not in read:
                        read[slot.name] = self._tensor(f, available, slot, path)
                    _assign(slot, read[slot.name])

    def _tensor(self, f, available: set, slot: Slot, path: Path) -> torch.Tensor:
        if slot.name not in available:
            raise ConfigError(f"frozen-weight file {path} lacks tensor {slot.name!r} "
                              "(truncated or another model); delete it to rebuild it")
        tensor = f.get_tensor(slot.name)
        if tuple(tensor.shape) != slot.shape or tensor.dtype != slot.dtype:
            raise ConfigError(f"frozen-weight file {path}: tensor {slot.name!r} is "
                              f"{tuple(tensor.shape)} {tensor.dtype}, the model needs "
                              f"{slot.shape} {slot.dtype}; delete it to rebuild it")
        # safetensors' CPU tensors may start off the 64-byte alignment of torch's allocator;
        # kernels then take other summation paths, and a held block must compute exactly as
        # the whole model's does
        return tensor if tensor.data_ptr() % ALIGN == 0 else tensor.clone()

    def drop(self, block: int) -> None:
        for slot in self.slots.get(block, []):
            _assign(slot, torch.empty(slot.shape, dtype=slot.dtype, device="meta"))

    def part_bytes(self, part) -> int:
        seen = {s.name: s.nbytes for s in self.slots.get(part, [])}
        return sum(seen.values())


def _assign(slot: Slot, tensor: torch.Tensor) -> None:
    if slot.is_param:
        old = slot.owner._parameters[slot.leaf]
        slot.owner._parameters[slot.leaf] = nn.Parameter(tensor, requires_grad=old.requires_grad)
    else:
        slot.owner._buffers[slot.leaf] = tensor


def build_on_demand(spec: ModelSpec, cache_dir: Path, device, files=None,
                    allow_build: bool = True, publish_hint: str = "") -> LayeredModel:
    """The skeleton of ``spec`` with everything outside the blocks read from the node's layered
    checkpoint, and no block held yet (``hold_blocks`` loads a plan's). ``files`` (part -> local
    file of that part, e.g. ``PublishedBlocks.local_file``) replaces the layered checkpoint: the
    whole backbone is then never built on this node. ``allow_build`` / ``publish_hint``: see
    ``layered_checkpoint``."""
    files = files or layered_checkpoint(spec, cache_dir, allow_build, publish_hint)
    BUILDS["count"] += 1
    model = build_skeleton(spec)
    store = BlockStore(files, frozen_slots(model), device)
    store.load([None])
    model.block_store = store
    return model


def _materialise_rest(model: nn.Module, device: torch.device) -> None:
    """Adapters and a method's modules attached on the skeleton may sit on the meta device
    (peft creates them beside their base layer): give them zeroed storage once; the server's
    values overwrite them before every use."""
    frozen = {(id(s.owner), s.leaf) for slots in model.block_store.slots.values() for s in slots}
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for leaf, tensor in table.items():
                if tensor is not None and tensor.is_meta and (id(module), leaf) not in frozen:
                    new = torch.zeros(tensor.shape, dtype=tensor.dtype, device=device)
                    table[leaf] = nn.Parameter(new, tensor.requires_grad) \
                        if isinstance(tensor, nn.Parameter) else new


def place(model: nn.Module, device) -> nn.Module:
    """``model.to(device)`` for a model whose unheld blocks sit on the meta device."""
    return model._apply(lambda t: t if t.is_meta else t.to(device))


def hold_blocks(model: LayeredModel, plan) -> None:
    """Make the model hold exactly the frozen blocks of ``plan``: load the newly planned ones,
    keep those still planned, drop the others. A model built whole holds all: nothing to do."""
    store = getattr(model, "block_store", None)
    if store is None:
        return
    if not store.adapters_ready:
        _materialise_rest(model, store.device)
        store.adapters_ready = True
    wanted = set(plan)
    for block in sorted(store.held - wanted):
        store.drop(block)
    new = sorted(wanted - store.held)
    if new:
        store.load(new)
    store.held = wanted


def resident_weight_bytes(model: nn.Module) -> int:
    """Bytes of the model's parameters and buffers that have storage (not on the meta device),
    each storage once."""
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_meta:
            continue
        key = (t.untyped_storage().data_ptr(), t.device)
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def frozen_bytes(spec: ModelSpec) -> tuple[int, list[int]]:
    """(bytes of the frozen tensors outside the blocks, bytes of each block), from the
    architecture alone (nothing is read or allocated)."""
    per_part: dict = {}
    for slot in {s.name: s for s in frozen_slots(build_skeleton(spec))}.values():
        part = block_of(slot.name)
        per_part[part] = per_part.get(part, 0) + slot.nbytes
    return per_part.get(None, 0), [per_part.get(j, 0) for j in range(len(per_part) - 1)]


def check_memory(spec: ModelSpec, capacity: int, memory_mb: int) -> None:
    """A node that declares ``memory-mb`` must hold the frozen weights of its ``capacity``
    largest blocks and of everything outside the blocks (activations and the small trainable
    part come on top)."""
    shared, blocks = frozen_bytes(spec)
    largest = sorted(blocks, reverse=True)
    budget = memory_mb * 2**20
    need = shared + sum(largest[:capacity])
    if need <= budget:
        return
    fits = 0
    while fits < len(largest) and shared + sum(largest[:fits + 1]) <= budget:
        fits += 1
    mb = 2**20
    advice = f"declare capacity={fits} or less" if fits else \
        "not even the parts outside the blocks fit"
    raise ConfigError(f"node config memory-mb={memory_mb} cannot hold capacity={capacity} of "
                      f"model {spec.name!r}: its frozen weights need {need / mb:.1f} MB "
                      f"({shared / mb:.1f} MB outside the blocks + {capacity} blocks of up to "
                      f"{largest[0] / mb:.1f} MB each); {advice}, or give the node more memory")
