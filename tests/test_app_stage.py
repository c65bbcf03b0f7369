"""`fedtune run` hands `flwr run` a copy of the files the FAB can hold (tools/app_stage.py): the
FAB Flower builds from that copy is the one it builds from the app itself, byte for byte, and
the folders .gitignore excludes (the virtual environment) are never walked."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fedtune_app.tools import app_stage
from localdeploy import ROOT

FILES = {  # a small app with this repo's pyproject.toml and .gitignore
    "server_app.py": "app = None\n", "client_app.py": "app = None\n", "README.md": "# app\n",
    "LICENSE": "MIT\n", "conf/smoke.toml": "a = 1\n", "fedtune_app/__init__.py": "",
    "fedtune_app/methods/m.py": "x = 1\n",
    # matched by fab-include, but under a folder .gitignore excludes: Flower leaves it out
    "fedtune_app/results/r.py": "y = 2\n",
    # outside fab-include: never in the FAB
    "tests/test_a.py": "", "docs/usage.md": "", "notes.json": "{}",
    # what `make setup` puts in the checkout, excluded by .gitignore
    ".venv/lib/python3.11/site-packages/torch/__init__.py": "", ".venv/pyvenv.cfg": "",
    "results/run/metrics.json": "[]", "fedtune_app/__pycache__/m.cpython-311.pyc": "",
}


@pytest.fixture
def app(tmp_path):
    folder = tmp_path / "app"
    for name, text in FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    for name in ("pyproject.toml", ".gitignore"):
        shutil.copy(ROOT / name, folder / name)
    return folder


def fab(app: Path, out: Path) -> bytes:
    out.mkdir()
    done = subprocess.run([str(Path(sys.executable).parent / "flwr"), "build", "--app", str(app)],
                          cwd=out, capture_output=True, text=True, timeout=120,
                          env=os.environ | {"FLWR_HOME": str(out / ".flwr")})
    assert done.returncode == 0, done.stdout + done.stderr
    [built] = out.glob("*.fab")
    return built.read_bytes()


def test_the_staged_copy_builds_the_same_fab_and_skips_ignored_folders(app, tmp_path,
                                                                       monkeypatch):
    walked = []
    real_walk = os.walk

    def walk(top, *args, **kwargs):
        for folder, dirs, files in real_walk(top, *args, **kwargs):
            walked.append(Path(folder).relative_to(app).as_posix())
            yield folder, dirs, files

    monkeypatch.setattr(app_stage.os, "walk", walk)
    stage = tmp_path / "stage"
    stage.mkdir()
    assert app_stage.staged_app(app, stage) == stage
    copied = sorted(p.relative_to(stage).as_posix() for p in stage.rglob("*") if p.is_file())
    assert copied == sorted([".gitignore", "pyproject.toml", "server_app.py", "client_app.py",
                             "README.md", "LICENSE", "conf/smoke.toml", "fedtune_app/__init__.py",
                             "fedtune_app/methods/m.py"])
    # .venv, results/, fedtune_app/results/ and __pycache__/ are pruned, not walked
    assert sorted(walked) == [".", "conf", "docs", "fedtune_app", "fedtune_app/methods", "tests"]
    assert fab(stage, tmp_path / "from-stage") == fab(app, tmp_path / "from-app")


def test_where_only_flowers_walk_chooses_as_flower_does_the_app_itself_is_used(app,
                                                                                  tmp_path):
    with (app / ".gitignore").open("a") as ignore:
        ignore.write("!results/keep.json\n")  # re-included: only Flower's own walk is sure
    assert app_stage.staged_app(app, tmp_path) == app
    (app / ".gitignore").write_text((ROOT / ".gitignore").read_text())
    text = (app / "pyproject.toml").read_text()
    excluding = text.replace("fab-include = [", 'fab-exclude = ["/x"]\nfab-include = [', 1)
    (app / "pyproject.toml").write_text(excluding)
    assert app_stage.fab_candidates(app) is None  # Flower checks excludes against every file
    without = re.sub(r"\nfab-include = \[.*?\]\n", "\n", text, count=1, flags=re.S)
    assert "fab-include" not in without
    (app / "pyproject.toml").write_text(without)
    assert app_stage.fab_candidates(app) is None
    assert app_stage.staged_app(app, tmp_path) == app
    (app / "pyproject.toml").write_text("[tool.flwr.app\n")  # not TOML: flwr run says so
    assert app_stage.fab_candidates(app) is None
    (app / "pyproject.toml").unlink()
    assert app_stage.fab_candidates(app) is None
