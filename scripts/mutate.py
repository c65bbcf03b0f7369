"""`make mutate`: mutation testing (mutmut, pinned in requirements.lock) of the modules whose
silent failure would hurt users, one module at a time, each against the fast in-process tests
that cover it.

mutmut breaks one operator, constant or call at a time in a copy of the module and runs the
tests that executed the mutated function; a mutant the tests do not notice "survives". Every
survivor is either killed by a test or listed, with the reason it cannot change behaviour, in
tests/mutation_equivalents.txt.

    python scripts/mutate.py                      # every module below but the SLOW ones
    python scripts/mutate.py robust aggregation   # some of them (names = keys of MODULES)
    python scripts/mutate.py --tests OLD/tests robust   # another checkout's tests (before/after)

Each module runs in its own scratch folder .mutate/<name>/ (symlinks to this checkout plus a
pyproject.toml whose [tool.mutmut] names that module and its tests), one mutant at a time
(``--max-children 1``, one torch thread), so it can run beside other work. Scores (killed /
total, per module) are printed and written to .mutate/scores.json.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCRATCH = ROOT / ".mutate"
EQUIVALENTS = ROOT / "tests" / "mutation_equivalents.txt"

# module -> (its file, the fast tests that cover it: pytest arguments). Slow end-to-end runs
# are left out on purpose: a mutant is run against every selected test that executes it.
MODULES: dict[str, tuple[str, list[str]]] = {
    "aggregation": ("fedtune_app/federated/aggregation.py",
                    ["tests/test_aggregation.py", "tests/test_aggregation_property.py"]),
    "robust": ("fedtune_app/federated/robust.py",
               ["tests/test_robust.py", "tests/test_training_reach.py", "-k",
                "not hostile_client and not without_screening and not same_seed"
                " and not every_method and not in_bound_sign_flip"]),
    "allocation": ("fedtune_app/federated/allocation.py",
                   ["tests/test_allocation.py"]),
    "checkpoint": ("fedtune_app/federated/checkpoint.py",
                   ["tests/test_checkpoint.py"]),
    "block_store": ("fedtune_app/model/block_store.py",
                    ["tests/test_block_store_edges.py", "tests/test_block_store.py", "-k",
                     "edges or cache_is_written or truncated or gone_between or missing_model"
                     " or memory_knob or alignment or shape or part_by_part"]),
    "frozen_weights": ("fedtune_app/model/frozen_weights.py",
                       ["tests/test_frozen_weights_edges.py", "tests/test_frozen_weights.py",
                        "-k", "not nodes_fetch and not mixer"]),
    "export": ("fedtune_app/tools/export.py", ["tests/test_export_paths.py"]),
    "nodes": ("fedtune_app/federated/nodes.py",
              ["tests/test_nodes_rules.py", "tests/test_nodes.py", "-k",
               "test_nodes_rules or replies_are_matched_by_the_message"]),
    # the reply handling, round by round with hand-made replies (the whole federations that
    # also cover it take minutes per mutant)
    "strategy": ("fedtune_app/federated/strategy.py", ["tests/test_strategy_replies.py"]),
}
# Run only when named (none now: the node handling's rules run on a virtual clock).
SLOW: set[str] = set()

STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
          34: "skipped", 36: "timeout", 24: "timeout", -24: "timeout", 152: "timeout",
          255: "timeout", None: "not checked"}


def equivalents() -> set[str]:
    """Mutant names listed as equivalent (first word of each non-comment line)."""
    if not EQUIVALENTS.is_file():
        return set()
    return {line.split()[0] for line in EQUIVALENTS.read_text().splitlines()
            if line.strip() and not line.startswith("#")}


def prepare(name: str, path: str, tests: list[str], tests_dir: Path) -> Path:
    """A scratch folder that looks like this checkout (its tests from ``tests_dir``), with a
    mutmut config for one module."""
    folder = SCRATCH / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for entry in ROOT.iterdir():
        if entry.name not in ("pyproject.toml", ".mutate", ".git", ".venv", "results", ".flwr"):
            (folder / entry.name).symlink_to(tests_dir if entry.name == "tests" else entry)
    files = [t for t in tests if t.startswith("tests/") and (folder / t).exists()]
    if not files:  # mutmut would run the whole suite
        sys.exit(f"none of the tests of {name} ({', '.join(tests)}) is in {tests_dir}")
    options = [t for t in tests if not t.startswith("tests/")]
    config = ("\n[tool.mutmut]\n"
              'source_paths = ["fedtune_app"]\n'
              f"only_mutate = [{json.dumps(path)}]\n"
              f"pytest_add_cli_args_test_selection = {json.dumps(files + options)}\n"
              'pytest_add_cli_args = ["-p", "no:cacheprovider"]\n'
              'also_copy = ["conf", "examples"]\n'
              "use_git_change_detection = false\n")
    (folder / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text() + config)
    return folder


def score(folder: Path, path: str) -> dict:
    meta = json.loads((folder / "mutants" / (path + ".meta")).read_text())
    status = {k: STATUS.get(v, "suspicious") for k, v in meta["exit_code_by_key"].items()}
    listed = equivalents()
    # a mutant that makes the tests hang (an endless loop) is caught: mutmut stops it at its
    # timeout, and the tests never pass with it
    survivors = sorted(k for k, s in status.items() if s not in ("killed", "timeout"))
    # a mutant of a function none of the selected tests runs ("no tests", unless listed): not
    # tested here, counted apart from the survivors
    return {"total": len(status),
            "killed": sum(s in ("killed", "timeout") for s in status.values()),
            "equivalent": sorted(k for k in survivors if k in listed),
            "survived": [f"{k} ({status[k]})" for k in survivors
                         if k not in listed and status[k] != "no tests"],
            "no tests": [k for k in survivors if k not in listed and status[k] == "no tests"]}


def main(names: list[str]) -> int:
    tests_dir = ROOT / "tests"
    if names[:1] == ["--tests"]:
        tests_dir, names = Path(names[1]).resolve(), names[2:]
    mutmut = Path(sys.executable).with_name("mutmut")
    env = os.environ | {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": "",
                        "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    results_file = SCRATCH / "scores.json"
    results = json.loads(results_file.read_text()) if results_file.is_file() else {}
    for name in names or [m for m in MODULES if m not in SLOW]:
        if name not in MODULES:
            sys.exit(f"unknown module {name!r}; choose from {', '.join(MODULES)}")
        path, tests = MODULES[name]
        folder = prepare(name, path, tests, tests_dir)
        start = time.monotonic()
        run = subprocess.run([str(mutmut), "run", "--max-children", "1"], cwd=folder, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        (folder / "mutmut.log").write_text(run.stdout)
        if run.returncode != 0 or not (folder / "mutants" / (path + ".meta")).is_file():
            print(run.stdout[-3000:])
            sys.exit(f"mutmut failed on {name} (exit {run.returncode}); log: {folder}/mutmut.log")
        results[name] = score(folder, path) | {"module": path, "tests": tests,
                                               "minutes": round((time.monotonic() - start) / 60, 1)}
        results_file.write_text(json.dumps(results, indent=1) + "\n")
        r = results[name]
        untested = f", not run by these tests {len(r['no tests'])}" if r["no tests"] else ""
        print(f"{path}: killed {r['killed']}/{r['total']}, listed equivalent "
              f"{len(r['equivalent'])}, surviving {len(r['survived'])}{untested}, "
              f"{r['minutes']} min")
        for mutant in r["survived"]:
            print(f"    {mutant}")
        if r["survived"]:
            print(f"    (one: cd {folder.relative_to(ROOT)} && ../../.venv/bin/mutmut show NAME)")
    print(f"scores: {results_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
