"""Publish a run's frozen backbone for nodes that fetch only their blocks.

    fedtune publish-layered --run-config "key=value ..." --out DIR [--base-url URL]

Writes ``DIR/<model>-<hash>.safetensors`` (every frozen tensor under its layered name: stem,
``blocks.<j>.*``, neck, head) and ``DIR/<model>-<hash>.manifest.json`` (the SHA-256 of the
header and of every block), built once from the run config's model (``model``, ``model-source``,
``model-args``, ``model-seed``, the data set's number of classes). Serve DIR with any HTTP
server that honours Range requests and give the nodes the printed run-config keys: a node then
reads the header and its planned blocks' byte ranges alone (``model/published_blocks.py``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fedtune_app.data.splits import run_num_classes
from fedtune_app.federated.flower_private import parse_config_args
from fedtune_app.methods import resolve_config
from fedtune_app.model.backbones import ModelSpec
from fedtune_app.model.block_store import frozen_bytes
from fedtune_app.model.published_blocks import publish


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="fedtune publish-layered",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-config", default="", help="'key=value ...' or a TOML file: the "
                        "run's model keys (and data set, for the number of classes)")
    parser.add_argument("--out", required=True, help="folder the HTTP server serves")
    parser.add_argument("--base-url", default="http://HOST:PORT/",
                        help="where DIR will be served (only for the printed run-config keys)")
    args = parser.parse_args(argv)
    cfg = resolve_config(parse_config_args([args.run_config] if args.run_config else None))
    spec = ModelSpec.from_config(cfg.model, run_num_classes(cfg))
    shared, blocks = frozen_bytes(spec)
    print(f"building the whole backbone {spec.name!r} once ({(shared + sum(blocks)) / 2**20:.1f} "
          f"MB of frozen weights) ...", flush=True)
    started = time.perf_counter()
    data, manifest, sha = publish(spec, Path(args.out))
    print(f"published {data} ({data.stat().st_size} bytes) and {manifest} in "
          f"{time.perf_counter() - started:.1f} s")
    print(f'run-config: layered-url="{args.base_url.rstrip("/")}/{manifest.name}" '
          f'layered-sha256="{sha}"')


if __name__ == "__main__":
    main()
