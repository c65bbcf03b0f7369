"""A node without the frozen weights reads only its planned blocks from a published layered
checkpoint (ranged HTTP requests against the safetensors header's offsets), checks each by hash,
caches it on disk, and computes exactly what the whole model computes.

The published folder is served on 127.0.0.1 by werkzeug (``send_file`` with ``conditional=True``
answers Range requests with 206), and the server logs every request and the bytes it sent: the
test counts what really went over the wire."""

import hashlib
import http.server
import json
import struct
import threading
from pathlib import Path

import pytest
import torch

from fedtune_app.config import ConfigError
from fedtune_app.model.backbones import build_backbone
from fedtune_app.model.block_store import (
    build_on_demand,
    checkpoint_path,
    hold_blocks,
    resident_weight_bytes,
)
from fedtune_app.model.published_blocks import PublishedBlocks, part_ranges, publish
from test_block_store import BLOCK_BYTES, SHARED_BYTES, VIT12


class RangeServer:
    """werkzeug serving ``folder`` on 127.0.0.1 from a thread; ``sent`` lists (path, Range
    header, status, body bytes) of every answer."""

    def __init__(self, folder: Path):
        from werkzeug.serving import make_server
        from werkzeug.utils import send_from_directory
        from werkzeug.wrappers import Request

        self.sent: list[tuple[str, str | None, int, int]] = []

        @Request.application
        def app(request):
            reply = send_from_directory(folder, request.path.lstrip("/"), request.environ,
                                        conditional=True, max_age=0, etag=False)
            self.sent.append((request.path, request.headers.get("Range"), reply.status_code,
                              reply.content_length))
            return reply

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.thread.join(timeout=10)

    def body_bytes(self) -> int:
        return sum(n for *_, n in self.sent)


@pytest.fixture
def published(tmp_path):
    data, manifest, sha = publish(VIT12, tmp_path / "public")
    return data, manifest, sha


def header_length(data: Path) -> int:
    return struct.unpack("<Q", data.read_bytes()[:8])[0]


def test_a_node_fetches_exactly_its_planned_blocks_and_computes_as_the_whole_model(tmp_path,
                                                                                   published):
    data, manifest, sha = published
    cache = tmp_path / "node"
    with RangeServer(data.parent) as server:
        node = PublishedBlocks(server.url + manifest.name, sha, VIT12, cache)
        # the manifest (whole), then the header: 8 bytes of length and the JSON, nothing else
        n = header_length(data)
        assert [(p, r, s) for p, r, s, _ in server.sent] == [
            (f"/{manifest.name}", None, 200), (f"/{data.name}", "bytes=0-7", 206),
            (f"/{data.name}", f"bytes=8-{8 + n - 1}", 206)]
        assert server.body_bytes() == manifest.stat().st_size + 8 + n
        client = build_on_demand(VIT12, cache, "cpu", files=node.local_file)
        hold_blocks(client, (2, 7))
        # the parts outside the blocks and blocks 2 and 7: their ranges, byte for byte
        parts = server.sent[3:]
        assert all(status == 206 for _, _, status, _ in parts)
        assert sum(n for *_, n in parts) == SHARED_BYTES + 2 * BLOCK_BYTES
        ranges = part_ranges(data.read_bytes()[:8 + n])
        asked = {r for _, r, _, _ in parts}
        assert asked == {f"bytes={b}-{e - 1}" for key in ("rest", "2", "7")
                         for b, e in ranges[key]}
        assert node.fetched == server.body_bytes()
        # never the whole model: no layered checkpoint of its own, only the fetched parts
        assert not checkpoint_path(VIT12, cache).exists()
        assert sorted(p.name for p in node.folder.iterdir()) == [
            "block-2.safetensors", "block-7.safetensors", "header.bin", "manifest.json",
            "rest.safetensors"]
        assert resident_weight_bytes(client) == SHARED_BYTES + 2 * BLOCK_BYTES

        whole = build_backbone(VIT12)
        local = build_on_demand(VIT12, tmp_path / "local-path", "cpu")  # the existing path
        hold_blocks(local, (2, 7))
        x = torch.randn(5, 1, 8, 8, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ours = client(x, plan=(2, 7))
            assert torch.equal(ours, whole(x, plan=(2, 7)))
            assert torch.equal(ours, local(x, plan=(2, 7)))

        # FedRA's next round: only the new blocks 0 and 11 travel; 7 is kept, 2 dropped
        before = len(server.sent)
        hold_blocks(client, (0, 7, 11))
        assert sum(n for *_, n in server.sent[before:]) == 2 * BLOCK_BYTES
        with torch.no_grad():
            assert torch.equal(client(x, plan=(0, 7, 11)), whole(x, plan=(0, 7, 11)))

        # a later process of the same node: everything it needs is cached, nothing travels
        before = len(server.sent)
        again = build_on_demand(VIT12, cache, "cpu",
                                files=PublishedBlocks(server.url + manifest.name, sha, VIT12,
                                                      cache).local_file)
        hold_blocks(again, (2, 7))
        assert server.sent[before:] == []
        with torch.no_grad():
            assert torch.equal(again(x, plan=(2, 7)), ours)


def test_a_corrupted_block_is_a_clear_error_naming_it_and_is_not_kept(tmp_path, published):
    data, manifest, sha = published
    raw = bytearray(data.read_bytes())
    begin, end = part_ranges(bytes(raw[:8 + header_length(data)]))["7"][0]
    raw[(begin + end) // 2] ^= 0x01  # one flipped bit inside block 7
    data.write_bytes(bytes(raw))
    with RangeServer(data.parent) as server:
        node = PublishedBlocks(server.url + manifest.name, sha, VIT12, tmp_path / "node")
        client = build_on_demand(VIT12, tmp_path / "node", "cpu", files=node.local_file)
        with pytest.raises(ConfigError, match=r"block 7 of .* has SHA-256 .* the manifest says"):
            hold_blocks(client, (2, 7))
        assert not (node.folder / "block-7.safetensors").exists()
        hold_blocks(client, (2,))  # the intact blocks still load
        assert (node.folder / "block-2.safetensors").exists()


def test_a_tampered_manifest_or_another_model_is_refused(tmp_path, published):
    data, manifest, sha = published
    with RangeServer(data.parent) as server:
        with pytest.raises(ConfigError, match="layered-sha256"):
            PublishedBlocks(server.url + manifest.name, "0" * 64, VIT12, tmp_path / "a")
        other = VIT12.__class__(VIT12.name, VIT12.source, VIT12.args, VIT12.seed, 7)
        with pytest.raises(ConfigError, match="num-classes"):
            PublishedBlocks(server.url + manifest.name, sha, other, tmp_path / "b")
        with pytest.raises(ConfigError, match="64 hex digits"):
            PublishedBlocks(server.url + manifest.name, "abc", VIT12, tmp_path / "c")


def test_a_server_without_range_support_is_named_and_not_read_whole(tmp_path, published):
    """Python's http.server answers 200 with the whole file to a Range request: refused."""
    data, manifest, sha = published

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = lambda *a, **k: Quiet(*a, directory=str(data.parent), **k)  # noqa: E731
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/{manifest.name}"
        with pytest.raises(ConfigError, match="answered 200 to a Range request"):
            PublishedBlocks(url, sha, VIT12, tmp_path / "node")
    finally:
        server.shutdown()
        thread.join(timeout=10)


def test_the_manifest_hashes_every_part_of_the_file(published):
    data, manifest, sha = published
    assert hashlib.sha256(manifest.read_bytes()).hexdigest() == sha
    info = json.loads(manifest.read_text())
    raw = data.read_bytes()
    ranges = part_ranges(raw[:8 + header_length(data)])
    assert set(info["parts"]) == {"rest", *map(str, range(12))}
    for key, part in info["parts"].items():
        body = b"".join(raw[b:e] for b, e in ranges[key])
        assert part["bytes"] == len(body) == (SHARED_BYTES if key == "rest" else BLOCK_BYTES)
        assert part["sha256"] == hashlib.sha256(body).hexdigest()
    # the parts cover the data section exactly once
    assert sum(p["bytes"] for p in info["parts"].values()) == \
        len(raw) - 8 - header_length(data)


def test_a_federation_whose_nodes_fetch_their_blocks_gives_the_same_run(tmp_path):
    """The smoke preset's FedRA run (in process, 3 nodes) with ``layered-url``: the nodes fetch
    their blocks over HTTP and the run is bit-identical to the nodes building their layered
    checkpoint themselves."""
    from safetensors.numpy import load_file

    from fedtune_app.apps.inprocess import run_inprocess
    from fedtune_app.data.splits import run_num_classes
    from fedtune_app.methods import resolve_config
    from fedtune_app.model.backbones import ModelSpec

    cfg = resolve_config({"preset": "smoke"})
    data, manifest, sha = publish(ModelSpec.from_config(cfg.model, run_num_classes(cfg)),
                                  tmp_path / "public")
    runs = {}
    with RangeServer(data.parent) as server:
        for name, extra in (("built", {}), ("fetched", {"layered-url": server.url + manifest.name,
                                                        "layered-sha256": sha})):
            runs[name] = Path(run_inprocess({
                "preset": "smoke", "results-dir": str(tmp_path / name),
                "checkpoint-dir": str(tmp_path / f"cache-{name}"), **extra}))
    assert {p for p, _, _, _ in server.sent} >= {f"/{manifest.name}", f"/{data.name}"}
    fetched = tmp_path / "cache-fetched" / "layered"
    assert [p.name for p in fetched.iterdir()] == [sha[:20]]  # no checkpoint built by a node
    assert (fetched / sha[:20] / "rest.safetensors").is_file()
    built, ours = (json.loads((runs[n] / "metrics.json").read_text()) for n in ("built", "fetched"))
    assert [(m["train-loss"], m["loss"], m["accuracy"]) for m in ours] == \
        [(m["train-loss"], m["loss"], m["accuracy"]) for m in built]
    a, b = (load_file(str(runs[n] / "state.safetensors")) for n in ("built", "fetched"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
