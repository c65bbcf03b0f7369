"""Frozen weights on a device: fetch the public checkpoint once, verified by its SHA-256.

Frozen backbone weights never travel in round messages. A node that lacks the checkpoint named
by ``checkpoint-url`` (https://, http:// or file://) downloads it once into its own cache
(``<data-dir>/checkpoints`` from its node config, else the run config's ``checkpoint-dir``, else
``~/.cache/fedtune/checkpoints``) with pooch, which checks the SHA-256 given in
``checkpoint-sha256`` and only then moves it into place under its hash. A corrupted or tampered
file is rejected and never used. The node reports the bytes of that one fetch in its start-up
answer, apart from the per-round adapter traffic.

Archives (.tar, .tar.gz, .tgz, .zip) are unpacked after the check: that is how a Hugging Face
model directory travels; a timm checkpoint is a single .safetensors / .pth / .bin file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from urllib.parse import urlparse

from fedtune_app.config import ConfigError, ModelConfig, RunConfig

CHUNK = 1 << 20
ARCHIVES = (".tar.gz", ".tgz", ".tar", ".zip")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir(model: ModelConfig, node_config: dict | None = None) -> Path:
    node_dir = (node_config or {}).get("data-dir")
    if node_dir:
        return Path(str(node_dir)) / "checkpoints"
    if model.checkpoint_dir:
        return Path(model.checkpoint_dir)
    return Path.home() / ".cache" / "fedtune" / "checkpoints"


def _suffix(url: str) -> str:
    name = Path(urlparse(url).path).name
    for ext in ARCHIVES:
        if name.endswith(ext):
            return ext
    return Path(name).suffix


def _copy_file_url(url: str, output_file, _pooch=None) -> None:
    """pooch downloader for file:// URLs (pooch itself speaks http(s), ftp, sftp, doi)."""
    with urllib.request.urlopen(url, timeout=60) as src:
        if hasattr(output_file, "write"):
            shutil.copyfileobj(src, output_file, CHUNK)
        else:
            with open(output_file, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)


def _download(url: str, target: Path, expected: str) -> int:
    """Fetch ``url`` into ``target`` with pooch: it streams into a temporary file next to the
    target, checks the SHA-256 and only then moves the file into place (a parallel node sharing
    the cache never sees half a file; a bad file is discarded). Returns the bytes read."""
    import pooch
    import requests

    target.parent.mkdir(parents=True, exist_ok=True)
    downloader = _copy_file_url if urlparse(url).scheme == "file" else \
        pooch.HTTPDownloader(timeout=60)
    try:
        pooch.retrieve(url, known_hash=f"sha256:{expected}", fname=target.name,
                       path=target.parent, downloader=downloader)
    except ValueError as err:  # pooch's hash mismatch
        if "hash" not in str(err).lower():
            raise
        raise ConfigError(f"run-config key 'checkpoint-sha256': the file at {url} does not "
                          f"have SHA-256 {expected}; the file is corrupted or not the one "
                          "named; it was discarded") from None
    except (OSError, requests.RequestException) as err:
        raise ConfigError(f"run-config key 'checkpoint-url' = {url!r}: cannot fetch it "
                          f"({err.__class__.__name__}: {err})") from None
    return target.stat().st_size


_VERIFIED: set[tuple[str, int, int]] = set()


def _verified(blob: Path, expected: str) -> bool:
    """The cached file exists and has the expected hash (hashed once per process and file
    version: a node in simulation asks every round)."""
    if not blob.is_file():
        return False
    stat = blob.stat()
    key = (str(blob), stat.st_mtime_ns, stat.st_size)
    if key not in _VERIFIED and sha256_of(blob) == expected:
        _VERIFIED.add(key)
    return key in _VERIFIED


def ensure_checkpoint(model: ModelConfig, node_config: dict | None = None) -> tuple[Path, int]:
    """(local path of the verified checkpoint, bytes fetched now: 0 when it was cached)."""
    url, expected = model.checkpoint_url, model.checkpoint_sha256.lower()
    if len(expected) != 64 or any(c not in "0123456789abcdef" for c in expected):
        raise ConfigError("run-config key 'checkpoint-sha256' must be the 64 hex digits of the "
                          f"checkpoint's SHA-256 (e.g. from `sha256sum FILE`), got {expected!r}")
    if urlparse(url).scheme not in ("file", "http", "https"):
        raise ConfigError(f"run-config key 'checkpoint-url' = {url!r}: allowed schemes: "
                          "file://, http://, https://")
    suffix = _suffix(url)
    blob = cache_dir(model, node_config) / f"{expected}{suffix}"
    fetched = 0
    if not _verified(blob, expected):  # missing or corrupted on disk
        fetched = _download(url, blob, expected)
    if suffix not in ARCHIVES:
        return blob, fetched
    unpacked = blob.parent / expected
    if fetched or not unpacked.is_dir():
        staging = Path(tempfile.mkdtemp(dir=blob.parent, prefix=".unpack-"))
        shutil.unpack_archive(blob, staging)
        entries = list(staging.iterdir())  # an archive of one top folder: use that folder
        root = entries[0] if len(entries) == 1 and entries[0].is_dir() else staging
        shutil.rmtree(unpacked, ignore_errors=True)
        os.replace(root, unpacked)
        shutil.rmtree(staging, ignore_errors=True)
    return unpacked, fetched


def with_checkpoint(cfg: RunConfig, node_config: dict | None = None) -> tuple[RunConfig, int]:
    """The run config with ``model-source`` pointing at the local verified checkpoint (when
    ``checkpoint-url`` is set), and the bytes fetched for it now."""
    if not cfg.model.checkpoint_url:
        return cfg, 0
    path, fetched = ensure_checkpoint(cfg.model, node_config)
    return cfg.replace(**{"model-source": str(path)}), fetched
