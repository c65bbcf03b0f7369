"""No pickle anywhere data is read: received tensors travel as ArrayRecords (numpy's
format, allow_pickle=False), checkpoints are safetensors. Unpickling runs arbitrary code, so a
hostile client or file must never reach it; this scan keeps it out of the package for good."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted((ROOT / "fedtune_app").rglob("*.py")) + [ROOT / "server_app.py",
                                                          ROOT / "client_app.py"]
UNSAFE = [
    (re.compile(r"\b(?:import|from)\s+(?:c?pickle|cloudpickle|dill|joblib|shelve)\b"),
     "a pickle module"),
    (re.compile(r"allow_pickle\s*=\s*True"), "numpy with allow_pickle=True"),
    (re.compile(r"weights_only\s*=\s*False"), "torch.load with weights_only=False"),
    (re.compile(r"torch\.load\((?![^)]*weights_only\s*=\s*True)[^)]*\)"),
     "torch.load without weights_only=True"),
]


def unsafe_lines(text: str) -> list[str]:
    return [f"{line.strip()}  <- {why}" for line in text.splitlines()
            for pattern, why in UNSAFE if pattern.search(line)]


def test_the_scan_catches_each_unsafe_form():
    for bad in ("import pickle", "from cloudpickle import loads", "np.load(f, allow_pickle=True)",
                "torch.load(path)", "torch.load(path, map_location='cpu')",
                "torch.load(path, weights_only=False)"):
        assert unsafe_lines(bad), bad
    assert not unsafe_lines("torch.load(path, map_location='cpu', weights_only=True)")
    assert not unsafe_lines("np.load(buffer, allow_pickle=False)")


def test_the_package_never_unpickles():
    assert len(SOURCES) > 10
    found = {str(p.relative_to(ROOT)): unsafe_lines(p.read_text()) for p in SOURCES}
    assert {p: lines for p, lines in found.items() if lines} == {}
