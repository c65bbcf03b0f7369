"""Frozen blocks fetched one by one: a node that lacks the frozen weights never holds the model.

The server side publishes the layered checkpoint once (``publish``: the one safetensors file of
``block_store.save_layered`` plus a manifest with the SHA-256 of its header and of every part)
on any HTTP server that honours ``Range`` requests. A node given the manifest's URL and hash
(run-config keys ``layered-url`` and ``layered-sha256``):

1. fetches the manifest and checks its hash (the trust anchor; it names the data file);
2. reads the safetensors header with two ranged requests (8 bytes of length, then the JSON)
   and checks it against the manifest;
3. for each part it needs (``None`` = stem, neck, head and everything outside the blocks; ``j``
   = block j), fetches exactly the byte ranges of that part's tensors, checks their SHA-256
   against the manifest, and only then keeps them in its cache as a small safetensors file of
   that part alone (``<cache>/layered/<manifest hash>/block-<j>.safetensors``).

Nothing builds or downloads the whole model: a capacity-1 node holds the manifest, the header,
the parts outside the blocks and one block. A fetched part is cached on disk, so a block planned
again later (FedRA redraws plans every round) costs no traffic.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path
from urllib.parse import urljoin, urlparse

from fedtune_app.config import ConfigError
from fedtune_app.model.backbones import ModelSpec, frozen_backbone
from fedtune_app.model.block_store import block_of, checkpoint_path, save_layered

MANIFEST_FORMAT = "fedtune-layered-manifest-1"
CHUNK = 1 << 20
TIMEOUT = 60


def part_key(part: int | None) -> str:
    return "rest" if part is None else str(part)


def part_label(part: int | None) -> str:
    return "the parts outside the blocks (stem, neck, head)" if part is None else f"block {part}"


def read_header(raw: bytes) -> dict:
    """The JSON header of a safetensors file whose first bytes are ``raw`` (8 + N bytes)."""
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length])


def part_ranges(header_bytes: bytes) -> dict[str, list[tuple[int, int]]]:
    """Part key -> the absolute byte ranges [start, end) of its tensors in the file, in file
    order, adjacent ranges merged."""
    (length,) = struct.unpack("<Q", header_bytes[:8])
    base = 8 + length
    spans: dict[str, list[tuple[int, int]]] = {}
    for name, entry in read_header(header_bytes).items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        spans.setdefault(part_key(block_of(name)), []).append((base + begin, base + end))
    merged: dict[str, list[tuple[int, int]]] = {}
    for key, ranges in spans.items():
        out: list[tuple[int, int]] = []
        for begin, end in sorted(ranges):
            if out and out[-1][1] == begin:
                out[-1] = (out[-1][0], end)
            else:
                out.append((begin, end))
        merged[key] = out
    return merged


def _identity(spec: ModelSpec) -> dict:
    """What the architecture depends on (a node need not know where the weights came from)."""
    return {"name": spec.name, "args": spec.args, "num-classes": spec.num_classes}


# -- the server side: publish once -----------------------------------------------------------
def publish(spec: ModelSpec, out_dir: Path) -> tuple[Path, Path, str]:
    """Write ``out_dir/<name>.safetensors`` (every frozen tensor under its layered name) and
    ``<name>.manifest.json``; returns (data file, manifest, SHA-256 of the manifest)."""
    out_dir = Path(out_dir)
    data = out_dir / checkpoint_path(spec, out_dir).name
    save_layered(frozen_backbone(spec), data)
    with data.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = struct.pack("<Q", length) + f.read(length)
        parts = {}
        for key, ranges in part_ranges(header).items():
            digest, size = hashlib.sha256(), 0
            for begin, end in ranges:
                f.seek(begin)
                chunk = f.read(end - begin)
                digest.update(chunk)
                size += len(chunk)
            parts[key] = {"sha256": digest.hexdigest(), "bytes": size}
    manifest = {"format": MANIFEST_FORMAT, "file": data.name, "model": _identity(spec),
                "source": dataclasses.asdict(spec), "file-bytes": data.stat().st_size,
                "header-sha256": hashlib.sha256(header).hexdigest(), "parts": parts}
    text = json.dumps(manifest, indent=1, sort_keys=True).encode()
    path = data.with_name(data.name.removesuffix(".safetensors") + ".manifest.json")
    path.write_bytes(text)
    return data, path, hashlib.sha256(text).hexdigest()


# -- the node side: fetch what the plan needs ------------------------------------------------
class PublishedBlocks:
    """The parts of one published layered checkpoint, fetched on demand into ``cache_dir``."""

    def __init__(self, url: str, sha256: str, spec: ModelSpec, cache_dir: Path):
        sha256 = sha256.lower()
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ConfigError("run-config key 'layered-sha256' must be the 64 hex digits of the "
                              "manifest's SHA-256 (printed by `fedtune publish-layered`), got "
                              f"{sha256!r}")
        if urlparse(url).scheme not in ("http", "https"):
            raise ConfigError(f"run-config key 'layered-url' = {url!r}: the manifest's URL must "
                              "be http:// or https:// (parts are read with Range requests)")
        self.url, self.sha256 = url, sha256
        self.folder = Path(cache_dir) / "layered" / sha256[:20]
        self.fetched = 0  # bytes this object fetched (manifest, header, parts)
        self._session = None
        self.manifest = self._manifest()
        if self.manifest.get("model") != _identity(spec):
            raise ConfigError(f"layered-url {url}: the published checkpoint is of model "
                              f"{self.manifest.get('model')}, this run's is {_identity(spec)}")
        self.data_url = urljoin(url, self.manifest["file"])
        self.header = self._header()
        self.ranges = part_ranges(self.header)

    # ranged HTTP with requests: only the bytes asked for are read
    def _get(self, url: str, byte_range: tuple[int, int] | None = None):
        import requests

        if self._session is None:
            self._session = requests.Session()
        headers = {} if byte_range is None else \
            {"Range": f"bytes={byte_range[0]}-{byte_range[1] - 1}"}
        try:
            reply = self._session.get(url, headers=headers, stream=True, timeout=TIMEOUT)
        except requests.RequestException as err:
            raise ConfigError(f"run-config key 'layered-url': cannot fetch {url} "
                              f"({err.__class__.__name__}: {err})") from None
        if byte_range is not None and reply.status_code != 206:
            reply.close()  # never read a whole file that was not asked for
            raise ConfigError(f"{url} answered {reply.status_code} to a Range request (expected "
                              "206 Partial Content): serve the published checkpoint with an HTTP "
                              "server that supports ranged requests (nginx, caddy, object "
                              "stores; Python's http.server does not)")
        if reply.status_code != (206 if byte_range else 200):
            reply.close()
            raise ConfigError(f"run-config key 'layered-url': {url} answered "
                              f"{reply.status_code}")
        return reply

    def _read(self, url: str, byte_range: tuple[int, int] | None = None) -> bytes:
        with self._get(url, byte_range) as reply:
            data = reply.content
        if byte_range is not None and len(data) != byte_range[1] - byte_range[0]:
            raise ConfigError(f"{url}: asked for bytes {byte_range[0]}..{byte_range[1] - 1}, got "
                              f"{len(data)} bytes (the file is shorter than its header says)")
        self.fetched += len(data)
        return data

    def _cached_or(self, name: str, fetch, expected: str, what: str) -> bytes:
        """A small file (manifest, header) from the cache when its hash matches, else fetched,
        checked and cached."""
        path = self.folder / name
        if path.is_file():
            data = path.read_bytes()
            if hashlib.sha256(data).hexdigest() == expected:
                return data
        data = fetch()
        actual = hashlib.sha256(data).hexdigest()
        if actual != expected:
            raise ConfigError(f"{what} has SHA-256 {actual}, expected {expected}; it is "
                              "corrupted or not the one published; nothing was kept")
        _write_atomically(path, [data])
        return data

    def _manifest(self) -> dict:
        data = self._cached_or("manifest.json", lambda: self._read(self.url), self.sha256,
                               f"the manifest at {self.url} (run-config key 'layered-sha256')")
        manifest = json.loads(data)
        if manifest.get("format") != MANIFEST_FORMAT:
            raise ConfigError(f"{self.url} is not a fedtune layered manifest (format "
                              f"{manifest.get('format')!r}, expected {MANIFEST_FORMAT!r})")
        return manifest

    def _header(self) -> bytes:
        def fetch() -> bytes:
            head = self._read(self.data_url, (0, 8))
            (length,) = struct.unpack("<Q", head)
            if length > self.manifest["file-bytes"]:
                raise ConfigError(f"{self.data_url}: header length {length} exceeds the file")
            return head + self._read(self.data_url, (8, 8 + length))

        return self._cached_or("header.bin", fetch, self.manifest["header-sha256"],
                               f"the safetensors header of {self.data_url}")

    def local_file(self, part: int | None) -> Path:
        """The node's file of ``part`` (a small safetensors file of its tensors alone), fetched
        and verified first if the cache lacks it."""
        path = self.folder / ("rest.safetensors" if part is None else f"block-{part}.safetensors")
        if path.is_file():
            return path
        key = part_key(part)
        if key not in self.ranges or key not in self.manifest["parts"]:
            raise ConfigError(f"the published checkpoint {self.data_url} has no tensors of "
                              f"{part_label(part)}")
        expected = self.manifest["parts"][key]["sha256"]
        digest, chunks = hashlib.sha256(), []
        for byte_range in self.ranges[key]:
            chunk = self._read(self.data_url, byte_range)
            digest.update(chunk)
            chunks.append(chunk)
        if digest.hexdigest() != expected:
            raise ConfigError(f"{part_label(part)} of {self.data_url} has SHA-256 "
                              f"{digest.hexdigest()}, the manifest says {expected}: the published "
                              "file is corrupted or not the one the manifest describes; nothing "
                              "was kept")
        _write_atomically(path, [self._part_header(key), *chunks])
        return path

    def _part_header(self, key: str) -> bytes:
        """A safetensors header for the part's tensors alone, their offsets re-based onto the
        concatenation of the part's ranges (file order kept)."""
        header = read_header(self.header)
        (length,) = struct.unpack("<Q", self.header[:8])
        base = 8 + length
        starts, position = {}, 0
        for begin, end in self.ranges[key]:
            starts[begin] = position
            position += end - begin
        entries = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            begin, end = (base + o for o in entry["data_offsets"])
            for r_begin, r_end in self.ranges[key]:
                if r_begin <= begin and end <= r_end:
                    offset = starts[r_begin] + begin - r_begin
                    entries[name] = {"dtype": entry["dtype"], "shape": entry["shape"],
                                     "data_offsets": [offset, offset + end - begin]}
        text = json.dumps(entries, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)  # the 8-byte alignment safetensors writers keep
        return struct.pack("<Q", len(text)) + text


def _write_atomically(path: Path, pieces: list[bytes]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
    try:
        with os.fdopen(fd, "wb") as f:
            for piece in pieces:
                f.write(piece)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
