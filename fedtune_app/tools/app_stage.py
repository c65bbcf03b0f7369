"""The app folder `fedtune run` hands to `flwr run`: a copy of the files its FAB can hold.

`flwr run APP` lists every file under APP before it selects what goes into the FAB (Flower 1.41
and 1.42 walk the whole folder and resolve each path, then drop what .gitignore excludes and keep
what pyproject's ``fab-include`` names). With `make setup`'s virtual environment inside the
checkout (``.venv``: about 83,000 files here) that listing cost about 12 s of CPU before every
run on a 2-core AMD EPYC.
Here the same selection is made while walking: a folder that .gitignore excludes is not entered
(Flower would drop every file under it), and only the files that match ``fab-include`` (with
pyproject.toml and .gitignore) are copied. `flwr run` then builds its FAB from that copy and
makes its own selection again: wherever `flwr run .` builds a FAB, the copy gives the same one,
byte for byte (tested). (`flwr run .` also refuses an app with any publishable file nested more
than 10 folders deep, even outside ``fab-include``; the copy does not hold such files.)
"""

from __future__ import annotations

import os
import shutil
import tomllib
from pathlib import Path

import pathspec

ALWAYS_COPIED = ("pyproject.toml", ".gitignore")


def fab_candidates(app: Path) -> list[str] | None:
    """The app's files (POSIX paths relative to ``app``) that can go into its FAB: those that
    match ``fab-include``, outside folders .gitignore excludes. None where only Flower's own walk
    over everything is sure to choose as Flower does: pyproject names no ``fab-include``, or a
    ``fab-exclude`` (Flower checks each of its patterns against every file of the app), or
    .gitignore re-includes a path ("!"), or either file cannot be read (`flwr run` then says
    what is wrong in its own words)."""
    try:
        config = tomllib.loads((app / "pyproject.toml").read_text(encoding="utf-8"))
        gitignore = app / ".gitignore"
        ignored = (gitignore.read_text(encoding="utf-8").splitlines()
                   if gitignore.is_file() else [])
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None
    flower_app = config.get("tool", {}).get("flwr", {}).get("app", {})
    include = flower_app.get("fab-include")
    if (not include or flower_app.get("fab-exclude")
            or any(line.lstrip().startswith("!") for line in ignored)):
        return None
    ignore = pathspec.GitIgnoreSpec.from_lines(ignored)
    wanted = pathspec.GitIgnoreSpec.from_lines(include)
    found = []
    for folder, dirs, files in os.walk(app):
        here = Path(folder).relative_to(app).as_posix()
        prefix = "" if here == "." else here + "/"
        dirs[:] = [d for d in dirs if not ignore.match_file(prefix + d + "/")]
        found += [prefix + f for f in files
                  if prefix + f in ALWAYS_COPIED or (wanted.match_file(prefix + f)
                                              and not ignore.match_file(prefix + f))]
    return sorted(found)


def staged_app(app: Path, into: Path) -> Path:
    """``app``'s FAB candidates copied into the empty folder ``into`` (returned), or ``app``
    itself where ``fab_candidates`` cannot choose them."""
    names = fab_candidates(app)
    if names is None:
        return app
    for name in names:
        target = into / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(app / name, target, follow_symlinks=False)
    return into
