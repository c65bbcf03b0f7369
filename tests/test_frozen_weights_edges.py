"""The frozen-weight fetch on its own, with files small enough to reason about: the hash is
the file's whole SHA-256, the cache folder follows node config > run config > home, the
archive suffixes, the error messages, and an archive is unpacked once per fetch."""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import zipfile

import pytest

from fedtune_app.config import ConfigError
from fedtune_app.methods import resolve_config
from fedtune_app.model import frozen_weights
from fedtune_app.model.frozen_weights import (
    CHUNK,
    _copy_file_url,
    _suffix,
    cache_dir,
    ensure_checkpoint,
    sha256_of,
    with_checkpoint,
)

EMPTY_SHA = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"  # sha256 of b""


def test_the_hash_is_the_sha256_of_every_byte_across_chunks(tmp_path):
    assert CHUNK == 1 << 20
    path = tmp_path / "w.bin"
    path.write_bytes(b"")
    assert sha256_of(path) == EMPTY_SHA
    data = bytes(range(256)) * (2 * CHUNK // 256) + b"tail"  # two whole chunks and 4 bytes
    path.write_bytes(data)
    assert sha256_of(path) == hashlib.sha256(data).hexdigest()
    path.write_bytes(data[:-1] + b"T")  # the last byte counts
    assert sha256_of(path) != hashlib.sha256(data).hexdigest()


def test_the_cache_folder_is_the_node_s_then_the_run_s_then_the_home_one(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    plain = resolve_config({}).model
    assert cache_dir(plain) == tmp_path / "home" / ".cache" / "fedtune" / "checkpoints"
    assert cache_dir(plain, {"data-dir": ""}) == cache_dir(plain)  # an empty data-dir: unset
    run = resolve_config({"checkpoint-dir": str(tmp_path / "run")}).model
    assert cache_dir(run) == tmp_path / "run"
    assert cache_dir(run, {"partition-id": 0}) == tmp_path / "run"
    assert cache_dir(run, {"data-dir": str(tmp_path / "node")}) == tmp_path / "node" / "checkpoints"


def test_the_suffix_of_a_url_keeps_whole_archive_endings():
    assert _suffix("https://host/m/model.tar.gz?download=1") == ".tar.gz"
    assert _suffix("https://host/model.tgz") == ".tgz"
    assert _suffix("file:///data/model.tar") == ".tar"
    assert _suffix("file:///data/model.zip") == ".zip"
    assert _suffix("https://host/vit.v2.safetensors") == ".safetensors"
    assert _suffix("https://host/weights") == ""


def test_a_file_url_is_copied_to_a_path_or_an_open_file(tmp_path):
    source = tmp_path / "w.bin"
    data = b"0123456789" * (CHUNK // 5 + 1)  # more than two chunks
    source.write_bytes(data)
    _copy_file_url(source.as_uri(), str(tmp_path / "copy.bin"))
    assert (tmp_path / "copy.bin").read_bytes() == data
    out = io.BytesIO()
    _copy_file_url(source.as_uri(), out, None)
    assert out.getvalue() == data


def test_bad_keys_are_named_with_their_values(tmp_path):
    sha = "A" * 64
    cfg = resolve_config({"checkpoint-url": "ftp://host/w.pth", "checkpoint-sha256": sha})
    with pytest.raises(ConfigError) as err:
        ensure_checkpoint(cfg.model)  # upper-case hex is accepted: the scheme is what fails
    assert str(err.value) == ("run-config key 'checkpoint-url' = 'ftp://host/w.pth': allowed "
                              "schemes: file://, http://, https://")
    for bad in ("a" * 63, "g" * 64, "a" * 65):
        with pytest.raises(ConfigError) as err:
            ensure_checkpoint(cfg.replace(**{"checkpoint-sha256": bad}).model)
        assert str(err.value) == (
            "run-config key 'checkpoint-sha256' must be the 64 hex digits of the checkpoint's "
            f"SHA-256 (e.g. from `sha256sum FILE`), got {bad!r}")
    # nothing listens on port 9 of this machine: an http(s) fetch is tried and fails,
    # naming the url
    for url in ("http://127.0.0.1:9/w.pth", "https://127.0.0.1:9/w.pth"):
        with pytest.raises(ConfigError) as err:
            ensure_checkpoint(resolve_config({"checkpoint-url": url, "checkpoint-sha256": sha,
                                              "checkpoint-dir": str(tmp_path)}).model)
        assert str(err.value).startswith(f"run-config key 'checkpoint-url' = {url!r}: cannot "
                                         "fetch it (ConnectionError: ")
    source = tmp_path / "w.pth"
    source.write_bytes(b"weights")
    with pytest.raises(ConfigError) as err:
        ensure_checkpoint(resolve_config({"checkpoint-url": source.as_uri(),
                                          "checkpoint-sha256": EMPTY_SHA,
                                          "checkpoint-dir": str(tmp_path / "cache")}).model)
    assert str(err.value) == (
        f"run-config key 'checkpoint-sha256': the file at {source.as_uri()} does not have "
        f"SHA-256 {EMPTY_SHA}; the file is corrupted or not the one named; it was discarded")


def test_an_archive_of_several_entries_is_unpacked_once_per_fetch(tmp_path, monkeypatch):
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("config.json", "{}")
        z.writestr("weights/w.bin", "abc")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    cfg = resolve_config({"checkpoint-url": archive.as_uri(), "checkpoint-sha256": sha.upper(),
                          "checkpoint-dir": str(tmp_path / "cache")})
    local, fetched = ensure_checkpoint(cfg.model)
    assert (local, fetched) == (tmp_path / "cache" / sha, archive.stat().st_size)
    # two entries at the top: the unpacked folder is the archive's root, nothing else is left
    assert sorted(p.name for p in local.iterdir()) == ["config.json", "weights"]
    assert (local / "weights" / "w.bin").read_text() == "abc"
    assert sorted(p.name for p in local.parent.iterdir()) == [sha, f"{sha}.zip"]
    # cached and unpacked: not unpacked again; hashed once in this process, not again
    (local / "config.json").write_text('{"edited": 1}')
    assert ensure_checkpoint(cfg.model) == (local, 0)
    monkeypatch.setattr(frozen_weights, "sha256_of", lambda path: pytest.fail("hashed again"))
    assert ensure_checkpoint(cfg.model) == (local, 0)
    assert (local / "config.json").read_text() == '{"edited": 1}'
    monkeypatch.undo()
    # the unpacked folder gone: unpacked again from the cached archive, nothing fetched
    shutil.rmtree(local)
    assert ensure_checkpoint(cfg.model) == (local, 0)
    assert (local / "config.json").read_text() == "{}"
    # the cached archive corrupted: fetched again and unpacked over the old folder
    (local / "config.json").write_text('{"edited": 2}')
    (local.parent / f"{sha}.zip").write_bytes(b"corrupt")
    assert ensure_checkpoint(cfg.model) == (local, archive.stat().st_size)
    assert (local / "config.json").read_text() == "{}"


def test_an_archive_of_one_folder_is_that_folder_unpacked_beside_the_cache(tmp_path,
                                                                           monkeypatch):
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("model/config.json", "{}")
    sha = hashlib.sha256(archive.read_bytes()).hexdigest()
    cache = tmp_path / "cache"
    unpacked_into = []
    real_unpack = shutil.unpack_archive

    def unpack(filename, extract_dir):
        unpacked_into.append(extract_dir)
        real_unpack(filename, extract_dir)

    monkeypatch.setattr(shutil, "unpack_archive", unpack)
    local, _ = ensure_checkpoint(resolve_config({"checkpoint-url": archive.as_uri(),
                                                 "checkpoint-sha256": sha,
                                                 "checkpoint-dir": str(cache)}).model)
    assert local == cache / sha and [p.name for p in local.iterdir()] == ["config.json"]
    # unpacked in a hidden folder of the cache (the move into place is a rename on one file
    # system), which is gone afterwards
    (staging,) = unpacked_into
    assert staging.parent == cache and staging.name.startswith(".unpack-")
    assert sorted(p.name for p in cache.iterdir()) == [sha, f"{sha}.zip"]


def test_the_verified_files_are_remembered_by_path_not_by_size_and_time(tmp_path):
    # two checkpoints of the same size whose cached copies share a modification time
    cache = tmp_path / "cache"
    cfgs, blobs = [], []
    for name in ("a", "b"):
        source = tmp_path / f"{name}.bin"
        source.write_bytes(name.encode() * 10)
        sha = hashlib.sha256(source.read_bytes()).hexdigest()
        cfgs.append(resolve_config({"checkpoint-url": source.as_uri(), "checkpoint-sha256": sha,
                                    "checkpoint-dir": str(cache)}).model)
        blobs.append(ensure_checkpoint(cfgs[-1])[0])
    for blob in blobs:
        os.utime(blob, ns=(0, 9_000_000_000))
    assert ensure_checkpoint(cfgs[0]) == (blobs[0], 0)  # verified now, remembered
    blobs[1].write_bytes(b"x" * 10)  # the other one corrupted: same size
    os.utime(blobs[1], ns=(0, 9_000_000_000))
    assert ensure_checkpoint(cfgs[1]) == (blobs[1], 10)  # hashed, found bad, fetched again
    assert blobs[1].read_bytes() == b"b" * 10


def test_the_run_config_points_at_the_verified_local_file(tmp_path):
    cfg = resolve_config({"model-source": "random"})
    assert with_checkpoint(cfg) == (cfg, 0)
    source = tmp_path / "w.safetensors"
    source.write_bytes(b"weights")
    sha = hashlib.sha256(b"weights").hexdigest()
    cfg = resolve_config({"checkpoint-url": source.as_uri(), "checkpoint-sha256": sha,
                          "checkpoint-dir": str(tmp_path / "cache")})
    local, fetched = with_checkpoint(cfg, {"data-dir": str(tmp_path / "node")})
    assert local.model.model_source == str(tmp_path / "node" / "checkpoints" /
                                           f"{sha}.safetensors")
    assert fetched == 7


def test_an_http_fetch_has_a_timeout_and_lands_verified(tmp_path, monkeypatch):
    # a server that stops answering must not hang a node for ever: pooch's HTTP downloader
    # gets a 60 s timeout (waiting it out here would take a minute, so the downloader built
    # is recorded; the download itself is real, from a local HTTP server)
    import functools
    import http.server
    import threading

    import pooch

    served = tmp_path / "served"
    served.mkdir()
    (served / "w.pth").write_bytes(b"weights")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    built = []

    class Recording(pooch.HTTPDownloader):
        def __init__(self, *args, **kwargs):
            built.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(pooch, "HTTPDownloader", Recording)
    sha = hashlib.sha256(b"weights").hexdigest()
    url = f"http://127.0.0.1:{server.server_address[1]}/w.pth"
    try:
        path, fetched = ensure_checkpoint(resolve_config({
            "checkpoint-url": url, "checkpoint-sha256": sha,
            "checkpoint-dir": str(tmp_path / "cache")}).model)
    finally:
        server.shutdown()
    assert built == [{"timeout": 60}]
    assert fetched == len(b"weights") and path.read_bytes() == b"weights"
