"""pyproject.toml's ``[tool.flwr.app.config]``, generated from the run-config key registry.

    python -m fedtune_app.tools.pyproject_keys --check   # exit 1 and show the diff when it drifted
    python -m fedtune_app.tools.pyproject_keys --write   # rewrite the table in place

Flower gives a run only the keys this table lists (``--run-config`` cannot add one), so every
registered key must be in it: first the keys every run has (the fields of ``config.RunConfig``
and its parts, under each part's docstring), then each owner's keys (the fields of a method's
``register_method(config=...)``), owners in name order, each with its default: `flwr run .`
runs the documented defaults, and a job of other sizes is a preset (the main job: conf/main.toml),
so nothing of one job silently applies to another data set.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
import tomllib

from fedtune_app import config
from fedtune_app.config import KEY_OWNERS, KEYS, ConfigError

PYPROJECT = config.CONF_DIR.parent / "pyproject.toml"
TABLE = "[tool.flwr.app.config]"


def base_sections() -> dict[str, str]:
    """Key every run has -> the first line of its config part's docstring (its section)."""
    return {name: part.__doc__.splitlines()[0]
            for part in (config.RunConfig, *config.PARTS.values())
            for name in part.key_specs()}


def toml_value(value) -> str:
    """A run-config value as TOML (pyproject's table, ``--run-config``, a run's config copy)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        mantissa, e, exponent = repr(value).partition("e")
        return f"{mantissa}e{int(exponent)}" if e else mantissa  # 1e-05 -> 1e-5
    return json.dumps(str(value))  # a JSON string is a TOML basic string


def render_table(table: str) -> str:
    """The table as generated from the registry: every key at its default."""
    current = tomllib.loads(table.replace(TABLE, "", 1))
    unknown = sorted(set(current) - set(KEYS))
    if unknown:
        raise ConfigError(f"pyproject.toml {TABLE} has unknown run-config key(s) "
                          f"{', '.join(unknown)}: remove them or register them")
    sections = base_sections()
    base = [k for k in KEYS if k not in KEY_OWNERS]
    owned = sorted((k for k in KEYS if k in KEY_OWNERS), key=lambda k: KEY_OWNERS[k])
    lines, heading = [TABLE], ""
    for key in base + owned:
        section = KEY_OWNERS.get(key) or sections.get(key, heading)
        if section != heading:
            lines.append(f"# {section}")
            heading = section
        lines.append(f"{key} = {toml_value(KEYS[key].default)}")
    return "\n".join(lines) + "\n"


def split_pyproject(text: str) -> tuple[str, str, str]:
    """(before, the table, after) of pyproject.toml's text."""
    start = text.index(TABLE + "\n")
    end = re.search(r"^\[", text[start + len(TABLE):], re.MULTILINE)
    stop = start + len(TABLE) + end.start() if end else len(text)
    table = text[start:stop].rstrip("\n") + "\n"
    return text[:start], table, text[start + len(table):]


def main(argv: list[str]) -> int:
    if argv not in (["--check"], ["--write"]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    import fedtune_app.methods  # noqa: F401  (registers every method and its keys)

    before, table, after = split_pyproject(PYPROJECT.read_text())
    generated = render_table(table)
    if argv == ["--write"]:
        PYPROJECT.write_text(before + generated + after)
        return 0
    if generated != table:
        sys.stdout.writelines(difflib.unified_diff(
            table.splitlines(True), generated.splitlines(True), "pyproject.toml",
            "generated from the key registry"))
        print(f"{TABLE} drifted from the key registry: run "
              "`python -m fedtune_app.tools.pyproject_keys --write`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
