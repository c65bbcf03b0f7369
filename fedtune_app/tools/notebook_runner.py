"""Execute the notebooks headless (nbclient + ipykernel), so they never rot.

    python -m fedtune_app.tools.notebook_runner notebooks/*.ipynb --preset smoke \
        --out results/notebooks

The notebooks read ``FEDTUNE_PRESET`` (run-config preset of every run they start),
``FEDTUNE_RESULTS_DIR`` (where their runs, plots and tables go) and ``FEDTUNE_LOAD_FROM``
(results folders to compare instead of running, ``compare_strategies``); this sets them, runs every
cell in a fresh kernel with the notebook's folder as working directory, and writes the executed
copies to ``--out`` (executed outputs are not committed).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path


def execute(notebook, out_dir=None, timeout: int = 1800):
    """Run every cell; raises nbclient's CellExecutionError (with the cell's traceback)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = Path(notebook)
    nb = nbformat.read(notebook, as_version=4)
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(notebook.parent.resolve())}}).execute()
    if out_dir is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, Path(out_dir) / notebook.name)
    return nb


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fedtune_app.tools.notebook_runner",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+")
    parser.add_argument("--preset", default="smoke",
                        help="run-config preset of the notebooks' runs (main: the main job)")
    parser.add_argument("--load-from", nargs="*", default=[],
                        help="results folders to compare instead of running (compare_strategies)")
    parser.add_argument("--out", default="results/notebooks",
                        help="folder for the executed notebooks and their runs")
    args = parser.parse_args(argv)
    out = Path(args.out).resolve()
    os.environ["FEDTUNE_PRESET"] = args.preset
    os.environ["FEDTUNE_LOAD_FROM"] = os.pathsep.join(str(Path(p).resolve())
                                                      for p in args.load_from)
    for notebook in map(Path, args.notebooks):
        started = time.time()
        os.environ["FEDTUNE_RESULTS_DIR"] = str(out / notebook.stem)
        execute(notebook, out)
        print(f"{notebook}: ok in {time.time() - started:.0f} s -> {out / notebook.name}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
