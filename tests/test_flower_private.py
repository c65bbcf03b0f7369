"""Flower's private modules are imported in one place: ``fedtune_app/federated/flower_private.py``.

Every other Python file of the repository (package, apps, tests, benchmarks, scripts, examples,
notebooks) imports Flower only through its public API, so a Flower release that moves a private
module breaks one file, whose docstring says why each import is there. (import-linter cannot
check this: it sees an external package only as its top-level name, ``flwr``.)
"""

import ast
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Flower's public API: the modules its API reference documents for apps (1.41, 1.42)
PUBLIC = {"flwr", "flwr.app", "flwr.serverapp", "flwr.serverapp.strategy", "flwr.clientapp",
          "flwr.simulation"}
THE_MODULE = ROOT / "fedtune_app" / "federated" / "flower_private.py"
SKIP_DIRS = {".venv", ".flwr", "results", ".git", "node_modules"}


def private_flower_imports(source: str) -> list[str]:
    """The Flower modules outside ``PUBLIC`` that ``source`` imports (at any depth)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [n for n in names if (n == "flwr" or n.startswith("flwr.")) and n not in PUBLIC]
    return found


def python_sources():
    for path in sorted(ROOT.rglob("*.py")):
        if not SKIP_DIRS & set(path.relative_to(ROOT).parts):
            yield path, path.read_text()
    for path in sorted(ROOT.rglob("*.ipynb")):
        if not SKIP_DIRS & set(path.relative_to(ROOT).parts):
            cells = json.loads(path.read_text())["cells"]
            code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
            yield path, "\n".join(line for line in code.splitlines()
                                  if not line.lstrip().startswith(("%", "!")))


def test_the_checker_finds_private_imports():
    source = ("import flwr.proto.node_pb2\nfrom flwr.common.constant import ErrorCode\n"
              "def f():\n    from flwr.supercore.task_identity import TaskIdentity\n"
              "from flwr.app import Message\nfrom flwr.serverapp.strategy import FedAvg\n"
              "from flwr_datasets import FederatedDataset\n")
    assert private_flower_imports(source) == [
        "flwr.proto.node_pb2", "flwr.common.constant", "flwr.supercore.task_identity"]


def test_only_flower_private_imports_private_flower_modules():
    offenders = {str(path.relative_to(ROOT)): found for path, source in python_sources()
                 if path != THE_MODULE and (found := private_flower_imports(source))}
    assert not offenders, (
        f"private Flower modules imported outside {THE_MODULE.relative_to(ROOT)}: {offenders}; "
        "use Flower's public API, or add the name there with why it is needed")


def test_each_private_import_is_used_and_explained():
    import fedtune_app.federated.flower_private as fp

    doc = fp.__doc__
    users = "\n".join(source for path, source in python_sources() if path != THE_MODULE)
    for name in fp.__all__:
        assert name in users, f"{name} is exported by flower_private but nothing uses it"
    for name in fp.__all__:  # each with its reason in the module's docstring
        assert f"``{name}``" in doc, f"flower_private's docstring does not say why {name}"
    assert private_flower_imports(THE_MODULE.read_text())  # it is where they live


@pytest.mark.parametrize("module", sorted(PUBLIC))
def test_public_modules_import(module):
    __import__(module)
