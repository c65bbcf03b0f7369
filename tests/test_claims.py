"""``fedtune claims``: the interval and verdict logic on hand-made per-seed numbers, the
convergence gate, the pairing of methods by seed, the run cache, and one tiny claim end to end.

Student-t quantiles with 2 degrees of freedom have a closed form, t(p, 2) = (2p - 1) /
sqrt(2 p (1 - p)), so the intervals over 3 seeds below are worked out by hand:
t(0.975, 2) = 0.95 / sqrt(0.04875) = 4.302653, t(0.8, 2) = 0.6 / sqrt(0.32) = 1.060660.
"""

import json
import math

import numpy as np
import pytest

from fedtune_app.tools import claims as cl
from fedtune_app.tools import claims_stats as cs
from fedtune_app.tools.claims_registry import CLAIMS, SETTINGS, Claim, Setting, tiers_of

T975 = 0.95 / math.sqrt(2 * 0.975 * 0.025)
T80 = 0.6 / math.sqrt(2 * 0.8 * 0.2)
HALF = T975 / math.sqrt(3)  # half-width of the 95% interval of 3 values with sample std 1


def test_t_quantiles_closed_form():
    assert T975 == pytest.approx(4.302653, abs=1e-6)
    assert T80 == pytest.approx(1.060660, abs=1e-6)


def test_interval_of_three_seeds():
    ci = cs.t_interval([1.0, 2.0, 3.0])  # mean 2, sample std 1
    assert (ci.mean, ci.std, ci.n) == (2.0, 1.0, 3)
    assert ci.low == pytest.approx(2 - HALF, rel=1e-9)
    assert ci.high == pytest.approx(2 + HALF, rel=1e-9)
    one = cs.t_interval([5.0])
    assert one.mean == 5.0 and math.isnan(one.low) and one.n == 1
    with pytest.raises(ValueError, match="finite"):
        cs.t_interval([1.0, float("nan")])


@pytest.mark.parametrize("diffs, direction, margin, expected", [
    ([4, 5, 6], "greater", 0, cs.REPRODUCED),        # (5 - 2.484, 5 + 2.484) > 0
    ([-4, -5, -6], "greater", 0, cs.REFUTED),        # wholly below 0
    ([1, 2, 3], "greater", 0, cs.INCONCLUSIVE),      # (-0.484, 4.484) spans 0
    ([-1, -2, -3], "within", 5, cs.REPRODUCED),      # (-4.484, 0.484): above -5
    ([-9, -10, -11], "within", 5, cs.REFUTED),       # (-12.48, -7.52): below -5
    ([-4, -5, -6], "within", 5, cs.INCONCLUSIVE),    # (-7.48, -2.52) spans -5
    ([0, 0.5, 1], "similar", 3, cs.REPRODUCED),      # (0.5 -/+ 1.242) inside (-3, 3)
    ([5, 6, 7], "similar", 3, cs.REFUTED),           # (3.516, 8.484) beyond 3
    ([1, 2, 3], "similar", 3, cs.INCONCLUSIVE),      # (-0.484, 4.484) crosses 3
])
def test_verdicts(diffs, direction, margin, expected):
    v = cs.verdict(diffs, direction, margin)
    assert v.verdict == expected
    mean = float(np.mean(diffs))
    std = float(np.std(diffs, ddof=1))
    assert v.difference.low == pytest.approx(mean - T975 * std / math.sqrt(3), rel=1e-9)


def test_inconclusive_prints_detectable_difference():
    v = cs.verdict([1.0, 2.0, 3.0])
    assert v.verdict == cs.INCONCLUSIVE
    assert v.detectable == pytest.approx((T975 + T80) / math.sqrt(3), rel=1e-9)  # 3.0965
    assert cs.verdict([2.0]).verdict == cs.INCONCLUSIVE  # one seed: no interval
    assert cs.REPRODUCED not in cs.verdict([2.0]).verdict
    with pytest.raises(ValueError, match="margin"):
        cs.verdict([1.0, 2.0], "similar", 0.0)


def _curve(values, every=3):
    return [(every * (i + 1), v) for i, v in enumerate(values)]


def test_gate_flat_and_too_short():
    flat = [_curve([40, 60, 70, 75, 78, 79, 79.5, 80.0, 80.2, 80.5 + s]) for s in (0, 0.2, 0.4)]
    g = cs.gate(flat, [50.0, 52.0, 48.0])
    # mean at 24 = 80.0, mean at 30 = 80.7: gain 0.7 < 1; finals - small = 30.5, 28.7, 32.9
    assert g.gain_last == pytest.approx(0.7) and g.passed, g.reason
    rising = [_curve([10, 20, 30, 40, 50, 60, 65, 70, 72, 75 + s]) for s in (0, 1, 2)]
    short = cs.gate(rising, [20.0, 20.0, 20.0])
    assert not short.passed and "not flattened" in short.reason  # gained 6 points
    tied = cs.gate(flat, [80.0, 81.5, 79.0])  # finals - small: 0.5, -0.8, 1.9: spans 0
    assert not tied.passed and "AllSmall" in tied.reason


def test_claim_verdict_is_too_short_when_its_setting_fails_the_gate(monkeypatch):
    monkeypatch.setitem(SETTINGS, "t-hand", Setting("t-hand", "hand-made", {"cpu": {}}))
    claim = Claim("t-hand-claim", "FedRA", "Table 1", "x beats y",
                  ((1.0, "t-hand", "fedra"), (-1.0, "t-hand", "inclusivefl")), "greater", 0.0,
                  "", 1.0)

    def rec(final, curve=None):
        points = curve or [(3, final), (6, final)]
        return {"final": final / 100,
                "curve": [{"round": r, "accuracy": v / 100} for r, v in points]}

    records = {}
    for s in range(3):
        records["t-hand", "fedra", s] = rec(60 + s)
        records["t-hand", "inclusivefl", s] = rec(50 + s)  # +10 every seed: reproduced ...
        records["t-hand", "all-small", s] = rec(30)
        records["t-hand", "all-large", s] = rec(70, [(3, 20), (6, 40), (9, 70)])  # ... rising
    gates = {"t-hand": cl.setting_gate("t-hand", records)}
    row = cl.evaluate_claim(claim, records, gates)
    assert row["verdict"].verdict == cs.TOO_SHORT
    assert row["differences"] == pytest.approx([10.0, 10.0, 10.0])
    for s in range(3):  # flatten the reference: now the same numbers are a verdict
        records["t-hand", "all-large", s] = rec(70 + s)
    gates = {"t-hand": cl.setting_gate("t-hand", records)}
    assert gates["t-hand"]["status"] == "passed"
    one_seed = {k: v for k, v in records.items() if k[2] == 0}  # flat, but no interval yet
    assert cl.setting_gate("t-hand", one_seed)["status"] == cl.PENDING
    records["t-hand", "inclusivefl", 1] = rec(49.5)  # differences 10, 11.5, 10
    row = cl.evaluate_claim(claim, records, gates)
    assert row["verdict"].verdict == cs.REPRODUCED


def test_setting_table_row_shows_each_model_group_of_a_two_group_method():
    def rec(small, large, seconds):
        point = {"round": 20, "accuracy": (small + large) / 2, "accuracy-smallest": small,
                 "accuracy-largest": large}
        return {"final": point["accuracy"], "curve": [point], "seconds": seconds,
                "rejected-replies": 0}

    # seeds: groups 0.6 / 0.2 and 0.7 / 0.3 -> headline 40 and 50; t(0.975, 1) = 12.706, the
    # half-width 12.706 * s / sqrt(2) with s = 10 / sqrt(2) for each column: 63.53
    row = cl.arm_row("homo", [rec(0.6, 0.2, 100), rec(0.7, 0.3, 300)])
    assert row == ("| homo | 2 | 45.00 ± 63.53 (smallest model 65.00 ± 63.53, largest "
                   "25.00 ± 63.53) | 45.00 | +0.00 | 0 | 200 |")
    # one model on every client (AllLarge): both groups' figures are its own, nothing to add
    assert cl.arm_row("all-large", [rec(0.9, 0.9, 10)]) == (
        "| all-large | 1 | 90.00 (n=1) | 90.00 | +0.00 | 0 | 10 |")


# ---------------------------------------------------------------- runs on the smoke preset

SMOKE = {"preset": "smoke", "num-server-rounds": 2, "screen-updates": False,
         "checkpoint-every": 0}


@pytest.fixture
def smoke_claim(monkeypatch):
    """A tiny claim on the smoke preset (random-init 4-block Mixer on UCI digits, 3 clients)."""
    monkeypatch.setitem(cl.DEPTH, "smoke", 4)
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {"smoke": dict(SMOKE)}))
    claim = Claim("t-smoke-claim", "FedRA", "Table 1", "FedRA beats AllSmall",
                  ((1.0, "t-smoke", "fedra"), (-1.0, "t-smoke", "all-small")), "greater", 0.0,
                  "hand-made", 1.0, seeds=2)
    monkeypatch.setitem(CLAIMS, claim.id, claim)
    return claim


def test_pairing_same_seed_same_partition_and_draws(tmp_path, monkeypatch):
    """One seed gives every method the same partitions, sampled clients and dynamic capacity
    draws, although FedRA draws its allocation from the same seed and InclusiveFL does not."""
    monkeypatch.setitem(cl.DEPTH, "smoke", 4)
    keys = SMOKE | {"capacities": "4*4", "dynamic-capacities": True, "clients-per-round": 3,
                    "num-server-rounds": 3}
    monkeypatch.setitem(SETTINGS, "t-pair", Setting("t-pair", "smoke", {"smoke": keys}))
    from fedtune_app.apps.inprocess import run_inprocess

    def run(arm, seed):
        config = cl.run_config("smoke", "t-pair", arm, seed)
        folder = run_inprocess(config | {"results-dir": str(tmp_path)})
        clients = json.load(open(f"{folder}/config.json"))["clients"]
        rounds = json.load(open(f"{folder}/allocation.json"))
        return config, ([(c["partition_id"], c["num_examples"], c["label_counts"])
                         for c in clients],
                        [(r["clients"], [sum(row) for row in r["matrix"]]) for r in rounds])

    fedra_cfg, fedra = run("fedra", 3)
    incl_cfg, inclusivefl = run("inclusivefl", 3)
    assert {k: v for k, v in fedra_cfg.items() if k != "method"} == \
        {k: v for k, v in incl_cfg.items() if k != "method"}
    assert fedra == inclusivefl  # partitions; per round: sampled clients, blocks held
    _, other_seed = run("fedra", 4)
    assert other_seed != fedra  # the comparison can fail: another seed draws otherwise


def test_a_tier_only_key_reaches_that_tier_and_that_arm_alone():
    """FedDF's CPU-tier distillation budget changes FedDF's CPU runs and nothing else."""
    cpu, gpu = (cl.run_config(t, "heterotune-groups", "feddf", 0) for t in ("cpu", "gpu"))
    assert cpu["feddf-distillation"] == "epochs" and "feddf-distillation" not in gpu
    assert cl.config_hash(cpu) != cl.config_hash(cpu | {"feddf-distillation": "paper"})
    assert "feddf-distillation" not in cl.run_config("cpu", "heterotune-groups", "fedmd", 0)


def test_group_ratio_settings_share_only_the_runs_that_ignore_the_ratio():
    """AllLarge / AllSmall put every client in one model group, so the two HeteroTune settings
    (groups 1:1 and 3:1) share their gate runs; HeteroTune itself splits the clients by the
    ratio, so its runs differ, and every share of the campaign picked by ``arms`` is a subset."""
    t1, t5 = "heterotune-groups", "heterotune-groups-small-heavy"
    for arm in ("all-large", "all-small"):
        assert cl.config_hash(cl.run_config("cpu", t1, arm, 0)) == \
            cl.config_hash(cl.run_config("cpu", t5, arm, 0))
    assert cl.config_hash(cl.run_config("cpu", t1, "heterotune", 0)) != \
        cl.config_hash(cl.run_config("cpu", t5, "heterotune", 0))
    ids = ["heterotune-t1-vs-homo", "heterotune-t5-small-heavy-vs-homo"]
    every = cl.plan_runs(ids, "cpu")
    # 3 seeds x (2 shared gate arms + HeteroTune and Homo in each of the 2 settings)
    assert len(every) == 3 * (2 + 2 * 2)
    gate = cl.plan_runs(ids, "cpu", arms=["all-large", "all-small"])
    assert [(s.arm, s.seed) for s in gate] == [(a, s) for s in range(3)
                                               for a in ("all-large", "all-small")]
    rest = cl.plan_runs(ids, "cpu", arms=["heterotune", "homo"])
    assert {s.hash for s in gate} | {s.hash for s in rest} == {s.hash for s in every}
    with pytest.raises(SystemExit, match="no arm 'homo2'"):
        cl.plan_runs(ids, "cpu", arms=["homo2"])


def test_a_glob_selects_the_claims_of_the_tier_and_an_id_without_it_is_an_error():
    """'heterotune-*' matches the GPU-only LLaMA rows too; on the CPU tier it runs the rest."""
    cpu_only = [c.id for c in CLAIMS.values() if c.id.startswith("heterotune-")
                and "cpu" in tiers_of(c)]
    gpu_only = [c.id for c in CLAIMS.values() if c.id.startswith("heterotune-")
                and "cpu" not in tiers_of(c)]
    assert cpu_only and gpu_only  # the glob below spans both kinds
    assert sorted(c.id for c in cl.match_claims(["heterotune-*"], "cpu")) == sorted(cpu_only)
    with pytest.raises(SystemExit, match=f"{gpu_only[0]}' matches no claim with a 'cpu' tier"):
        cl.match_claims([gpu_only[0]], "cpu")
    with pytest.raises(SystemExit, match="no claim matches 'nope-\\*'"):
        cl.match_claims(["nope-*"], "cpu")


def test_the_paper_tier_reads_each_data_set_from_its_own_folder():
    """NICO++ and DomainNet runs get their own ``data-dir``; one folder for both is refused."""
    specs = cl.plan_runs([], "paper", 1, data_dirs={"nico++": "/n", "domainnet": "/d"})
    by_data = {}
    for spec in specs:
        by_data.setdefault(spec.keys["dataset"], set()).add(spec.keys.get("data-dir"))
    assert by_data["nico++"] == {"/n"} and by_data["domainnet"] == {"/d"}
    assert by_data.keys() - {"nico++", "domainnet"} and all(
        v == {None} for k, v in by_data.items() if k not in ("nico++", "domainnet"))
    with pytest.raises(SystemExit, match="--data-dir domainnet=DIR --data-dir nico"):
        cl.plan_runs([], "paper", 1, extra={"data-dir": "/both"})
    with pytest.raises(SystemExit, match="expected DATASET=DIR"):
        cl.parse_data_dirs(["nico=/n"])
    assert cl.parse_data_dirs(["nico++=/a=b"]) == {"nico++": "/a=b"}


def test_the_gpu_tier_plans_in_a_fresh_process():
    """The GPU tier's presets set method-owned keys (DepthFL's headline): planning it must not
    depend on something else having registered the methods first."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "fedtune_app.tools.cli", "claims", "run",
                           "--tier", "gpu", "--dry-run"], capture_output=True, text=True,
                          cwd=cl.ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    listed = [ln.split()[1] for ln in done.stdout.splitlines()
              if ln.startswith(("todo ", "done "))]
    assert listed == [s.name for s in cl.plan_runs([], "gpu")] and len(listed) > 100


@pytest.mark.parametrize("tier", ["cpu", "gpu"])
def test_every_claim_run_with_its_data_here_can_partition_its_clients(tier):
    """Every run a claim needs (each seed, each arm's held-out data) splits its training data
    over its clients with each client at least 'min-partition-size' examples; a Dirichlet(0.1)
    split that cannot (20 clients of BBC News) would only fail once the run has started."""
    from fedtune_app.data.scenarios import num_clients
    from fedtune_app.data.splits import client_examples, run_splits
    from fedtune_app.methods import resolve_config

    checked = set()
    for spec in cl.plan_runs([], tier):
        cfg = resolve_config(spec.keys | {"model-source": "random",
                                          "model-group-sources": "random"})
        key = (cfg.data, cfg.held_out, cfg.seed)
        if cfg.data.dataset != "bbc-news" or key in checked:
            continue  # the LLaMA rows' GLUE data is not on this machine
        checked.add(key)
        splits, clients = run_splits(cfg), num_clients(cfg)
        sizes = [len(client_examples(cfg, splits, i, clients).labels) for i in range(clients)]
        assert min(sizes) >= cfg.data.min_partition_size, (spec.name, sizes)
    assert len(checked) >= 3 * 2  # several seeds and held-out variants were partitioned


def test_tiny_claim_end_to_end_and_cache(tmp_path, monkeypatch, smoke_claim):
    store, results = tmp_path / "store", tmp_path / "results"
    executed = []
    real = cl.execute
    monkeypatch.setattr(cl, "execute", lambda spec, *a: executed.append(spec.name) or
                        real(spec, *a))
    heads = iter(f"commit{i}" for i in range(100))  # HEAD moves while the campaign runs
    monkeypatch.setattr(cl, "git_commit", lambda: next(heads))
    records = cl.run_claims([smoke_claim.id], "smoke", None, store, results, log=lambda t: None)
    # gate arms (all-large, all-small) and fedra, seeds 0 and 1: six runs, each stored once
    assert len(executed) == 6 and len(records) == 6
    assert {r["commit"] for r in records} == {"commit0"}  # the code the process loaded
    assert len(list((store / "runs" / "smoke").glob("*.json"))) == 6
    assert all(r["rejected-replies"] == 0 and r["rounds"] == 2 for r in records)

    executed.clear()  # unchanged keys: every run is found by its hash and reused
    again = cl.run_claims([smoke_claim.id], "smoke", None, store, results, log=lambda t: None)
    assert executed == [] and [r["hash"] for r in again] == [r["hash"] for r in records]

    # a bookkeeping key (how a run writes) keeps the hash; a key that changes training does not
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {
        "smoke": SMOKE | {"eval-batch-size": 17}}))
    cl.run_claims([smoke_claim.id], "smoke", 1, store, results, log=lambda t: None)
    assert executed == []
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {
        "smoke": SMOKE | {"lr": 0.1}}))
    cl.run_claims([smoke_claim.id], "smoke", 1, store, results, log=lambda t: None)
    assert len(executed) == 3  # seed 0 of all-large, all-small, fedra again
    monkeypatch.setitem(SETTINGS, "t-smoke", Setting("t-smoke", "smoke", {"smoke": SMOKE}))

    # the verdict from the stored records, recomputed here from their final accuracies
    by_arm = {(r["arm"], r["seed"]): 100 * r["final"] for r in records}
    diffs = [by_arm["fedra", s] - by_arm["all-small", s] for s in (0, 1)]
    row = next(r for r in cl.evaluate("smoke", store) if r["claim"].id == smoke_claim.id)
    assert row["seeds"] == [0, 1] and row["differences"] == pytest.approx(diffs)
    expected = cs.verdict(diffs).verdict
    gate = cl.setting_gate("t-smoke", cl.load_records("smoke", store))
    if gate["status"] != "passed":
        expected = cs.TOO_SHORT
    assert row["verdict"].verdict == expected

    report = tmp_path / "claims.md"
    cl.write_report(("smoke",), report, store, readme=None)
    text = report.read_text()
    assert f"`{smoke_claim.id}`" in text and expected in text
    assert (store / "smoke-t-smoke.png").stat().st_size > 1000
