"""Method knowledge lives in ``methods/``: no other module of the package names a method or
reads a key a method owns. The import contracts (pyproject.toml) keep other layers from
importing a method's module; this test catches what they cannot see, a method's name or key in
a string."""

import re
from pathlib import Path

import fedtune_app.methods  # noqa: F401  (registers every method and its keys)
from fedtune_app.config import KEY_OWNERS, KEYS
from fedtune_app.methods import METHODS

PACKAGE = Path(fedtune_app.methods.__file__).resolve().parents[1]
# (file, name) -> why it may name it
ALLOWED = {
    ("config.py", "fedra"): "the default of key 'method'",
    ("config.py", "heterotune"): "a value of key 'client-trains': HeteroTune's Table 2 reading",
    **{("claims/registry.py", m): "the papers' claims name the methods they compare"
       for m in METHODS},
    **{("claims/registry.py", k): "a claim's arm sets a method's key"
       for k in ("all-small-layers", "depthfl-headline", "distill-lr", "feddf-distillation",
                 "flexifed-aggregation", "heterotune-learnable-weights", "heterotune-reg",
                 "heterotune-sharing", "pfedlora-passes")},
    ("claims/store.py", "all-large"): "the claims' shared AllLarge run (its canonical depth)",
    ("claims/store.py", "all-small"): "the claims' shared AllSmall run (its canonical depth)",
    ("claims/store.py", "all-small-layers"): "a dynamic setting's AllSmall depth, folded into "
    "the shared run's canonical capacities",
    ("claims/cli.py", "all-large"): "--arms help's example: the gate's arms first",
    ("claims/entries.py", "all-large"): "a setting's default gate: the papers' AllLarge",
    ("claims/entries.py", "all-small"): "a setting's default gate: the papers' AllSmall",
    ("tools/compare.py", "all-large"): "the comparison's default methods: FedRA Table 1's",
}


def leaks() -> dict[tuple[str, str], int]:
    method_keys = set(KEY_OWNERS) | {k.replace("-", "_") for k in KEY_OWNERS}
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel.startswith("methods/"):
            continue
        text = path.read_text()
        for name in [*METHODS, *method_keys]:
            hits = len(re.findall(rf"[\"'.]{re.escape(name)}[\"'\s,)]", text))
            if hits and (rel, name) not in ALLOWED:
                found[(rel, name)] = hits
    return found


def test_no_module_outside_methods_names_a_method_or_reads_its_keys():
    assert leaks() == {}


def test_the_check_sees_a_leak():
    # the patterns above match the ways a leak is written: a quoted name, an attribute
    sample = "if cfg.method == \"depthfl\": x = cfg.own.depthfl_exit_every"
    assert re.search(r"[\"'.]depthfl[\"'\s,)]", sample)
    assert re.search(r"[\"'.]depthfl_exit_every[\"'\s,)]", sample + " ")
    assert "depthfl-exit-every" in KEYS and KEY_OWNERS["depthfl-exit-every"] == "method depthfl"

