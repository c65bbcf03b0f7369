"""The fingerprint of the code a claim run executes, so that a report can name the records made
by older code, and only those.

A method's fingerprint hashes, by content, every Python source of the package but its tools and
its claims harness (which plan, store and report runs; what a run computes is in its config
hash) and but the method modules the method does not import: its own module (the one that calls
``register_method`` with its name) and the method modules that one imports, transitively, are in
it, the other methods' are not. A fix to FedBRICK thus leaves FedRA's records current, while a
fix to FedRA (which FedBRICK extends) or to any shared module (training, aggregation, data) makes
every record that ran it older. Everything is read from the sources, so a checkout of the same
code on another machine, or an older commit's tree, has the same fingerprints.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
METHODS = "methods/"


def _sources(root: Path) -> dict[str, bytes]:
    """The package's sources but its tools and claims harness: path relative to the package ->
    content."""
    package = root / "fedtune_app"
    return {p.relative_to(package).as_posix(): p.read_bytes()
            for p in sorted(package.rglob("*.py"))
            if not p.relative_to(package).as_posix().startswith(("tools/", "claims/"))}


def _method_module(relative: str) -> str | None:
    """'methods/name.py' -> 'name'; None for the package's other files and its __init__ (it
    imports every method to register them: importing it is not using them)."""
    if not relative.startswith(METHODS) or relative == METHODS + "__init__.py":
        return None
    return relative.removeprefix(METHODS).removesuffix(".py")


def _imports_and_registrations(source: bytes, modules: set[str]) -> tuple[set[str], set[str]]:
    """The method modules a source imports, and the method names it registers."""
    imported, registered = set(), set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.startswith("fedtune_app.methods."):
                imported.add(node.module.split(".")[2])
            elif node.module == "fedtune_app.methods":  # `from fedtune_app.methods import name`
                imported |= {a.name for a in node.names} & modules
        elif isinstance(node, ast.Import):
            imported |= {a.name.split(".")[2] for a in node.names
                         if a.name.startswith("fedtune_app.methods.")}
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") == "register_method"
              and node.args and isinstance(node.args[0], ast.Constant)):
            registered.add(node.args[0].value)
    return imported & modules, registered


def code_fingerprints(root: Path = ROOT) -> dict[str, str]:
    """Method name -> the fingerprint of the code its runs execute (12 hex digits)."""
    sources = _sources(root)
    by_module = {m: rel for rel in sources if (m := _method_module(rel))}
    imports, owner = {}, {}
    for module, relative in by_module.items():
        imports[module], names = _imports_and_registrations(sources[relative], set(by_module))
        owner |= {name: module for name in names}
    out = {}
    for name, module in owner.items():
        closure, todo = set(), [module]
        while todo:
            m = todo.pop()
            if m not in closure:
                closure.add(m)
                todo += imports[m]
        digest = hashlib.sha256()
        for relative, content in sources.items():
            if _method_module(relative) in (None, *closure):
                digest.update(relative.encode() + b"\0" + content + b"\0")
        out[name] = digest.hexdigest()[:12]
    return out


def code_fingerprint(method: str, root: Path = ROOT) -> str:
    """The fingerprint of the code a run of ``method`` executes."""
    return code_fingerprints(root)[method]

