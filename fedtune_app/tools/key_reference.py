"""docs/run-config.md, the run-config reference, generated from the config classes.

    python -m fedtune_app.tools.key_reference --check   # exit 1 when the file drifted
    python -m fedtune_app.tools.key_reference --write   # rewrite it

One section per part of ``config.RunConfig`` (its own keys first, then ``config.PARTS``), then
one per owner of a method's keys (``config.KEY_OWNERS``), each a table: key, type, default,
allowed values (choices or range) and the help line of the field.
"""

from __future__ import annotations

import dataclasses
import sys

from fedtune_app import config

REFERENCE = config.CONF_DIR.parent / "docs" / "run-config.md"


def allowed(spec: config.Key) -> str:
    if spec.choices is not None:
        return ", ".join(f"`{c}`" if c != "" else '`""`' for c in spec.choices)
    low = "" if spec.minimum is None else f"≥ {spec.minimum:g}"
    high = "" if spec.maximum is None else f"≤ {spec.maximum:g}"
    return " and ".join(p for p in (low, high) if p)


def row(name: str, type_: str, spec: config.Key) -> str:
    default = f"`{spec.default}`" if spec.default != "" else '`""`'
    if isinstance(spec.default, bool):
        default = f"`{str(spec.default).lower()}`"
    text = spec.help.replace("|", "\\|")
    return f"| `{name}` | {type_} | {default} | {allowed(spec)} | {text} |"


def table(part: type[config.ConfigPart], keys=None) -> list[str]:
    lines = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(part):
        name = config.kebab(f.name)
        if "key" in f.metadata and (keys is None or name in keys):
            type_ = f.type if isinstance(f.type, str) else f.type.__name__
            lines.append(row(name, type_, f.metadata["key"]))
    return lines


def render() -> str:
    import fedtune_app.methods  # noqa: F401  (registers every method and its keys)

    out = ["# Run-config reference", "",
           "Generated from the config classes by `python -m fedtune_app.tools.key_reference "
           "--write` (a test fails when this file and the classes differ). Every key is "
           "kebab-case in Flower's `run_config` and a field of a frozen config part in code "
           "(`-` becomes `_`): `cfg.training.lr`, a method's own key `cfg.own.<field>`.", ""]
    parts = [("The run (`RunConfig`)", config.RunConfig), *(
        (f"`cfg.{name}` (`{part.__name__}`)", part) for name, part in config.PARTS.items())]
    for title, part in parts:
        out += [f"## {title}", "", part.__doc__.strip().splitlines()[0], "", *table(part), ""]
    owners: dict[str, list[str]] = {}
    for key, owner in config.KEY_OWNERS.items():
        owners.setdefault(owner, []).append(key)
    classes = {**config.METHOD_PARTS}
    for owner, keys in sorted(owners.items()):
        part = next(p for p in [*classes.values()] if keys[0] in p.key_specs())
        out += [f"## {owner[0].upper()}{owner[1:]} (`{part.__name__}`, `cfg.own`)", "",
                *table(part, set(keys)), ""]
    return "\n".join(out).rstrip("\n") + "\n"


def main(argv: list[str]) -> int:
    if argv not in (["--check"], ["--write"]):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    text = render()
    if argv == ["--write"]:
        REFERENCE.write_text(text)
        return 0
    if not REFERENCE.is_file() or REFERENCE.read_text() != text:
        print(f"{REFERENCE} drifted from the config classes: run "
              "`python -m fedtune_app.tools.key_reference --write`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
