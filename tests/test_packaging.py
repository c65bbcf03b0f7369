"""Flower app packaging: `flwr build` makes a FAB (format 1) with what a SuperNode runs and
nothing else; the `fedtune` command and every subcommand answer --help."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def test_flwr_build_ships_the_app_without_tests_notebooks_benchmarks_docs(tmp_path):
    env = os.environ | {"FLWR_HOME": str(tmp_path / ".flwr"), "FLWR_TELEMETRY_ENABLED": "0",
                        "FLWR_DISABLE_UPDATE_CHECK": "1",
                        "PATH": f"{BIN}:{os.environ['PATH']}"}
    # flwr build takes the app's name from its folder, and a checkout may sit in any folder
    # (mktemp's "tmp.XXXX" is no valid name): build a copy of the working tree's files
    app = tmp_path / "fedtune-app"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, text=True, check=True, capture_output=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (app / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, app / name)
    subprocess.run([str(BIN / "flwr"), "build", "--app", str(app)], cwd=tmp_path, env=env,
                   check=True, capture_output=True, timeout=300)
    [fab] = tmp_path.glob("*.fab")
    names = zipfile.ZipFile(fab).namelist()
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard",
                              "fedtune_app", "conf"], cwd=ROOT, text=True,
                             check=True, capture_output=True).stdout.split()
    shipped = {n for n in names if not n.startswith(".info/")}
    expected = {p for p in tracked if p.endswith((".py", ".toml"))} | {
        "server_app.py", "client_app.py", "README.md", "LICENSE", "pyproject.toml"}
    assert shipped == expected
    meta = tomllib.loads(zipfile.ZipFile(fab).read("pyproject.toml").decode())
    app = meta["tool"]["flwr"]["app"]
    assert app["fab-format-version"] == 1 and app["flwr-version-target"] == "1.42.0"
    assert "flwr[simulation]>=1.41.0,<1.43" in meta["project"]["dependencies"]
    assert "Apache License" in zipfile.ZipFile(fab).read("LICENSE").decode()[:200]


SUBCOMMANDS = ("run", "compare", "analyze", "export", "pretrain", "assets", "stop",
               "publish-layered", "node-worker")


@pytest.mark.parametrize("args", [()] + [(c,) for c in SUBCOMMANDS],
                         ids=lambda a: " ".join(a) or "top")
def test_fedtune_help(args):
    from fedtune_app.tools.cli import main

    with pytest.raises(SystemExit) as done:
        main([*args, "--help"])
    assert done.value.code == 0


def test_fedtune_console_script_lists_every_subcommand():
    out = subprocess.run([sys.executable, "-m", "fedtune_app.tools.cli", "--help"], cwd=ROOT,
                         text=True, check=True, capture_output=True, timeout=120).stdout
    for command in SUBCOMMANDS:
        assert command in out
