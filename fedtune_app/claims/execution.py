"""Running a campaign: each planned run in this process or in worker processes, each finished
run stored as its small record as it ends, a campaign refused before it starts when a backbone
checkpoint is missing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from fedtune_app.claims import registry as reg
from fedtune_app.claims import stats as cs
from fedtune_app.claims.planning import (
    match_claims,
    plan_runs,
    plan_tuning,
    tier_pairs,
    tuned_rates,
)
from fedtune_app.claims.store import (
    RESULTS,
    ROOT,
    STORE,
    RunSpec,
    checkpoints_by_setting,
    estimate_cost,
    find_cached,
    git_commit,
    run_state,
    stored_paths,
)
from fedtune_app.config import ConfigError
from fedtune_app.tools.fingerprint import code_fingerprint, code_fingerprints


def tune_claims(patterns: list[str] = (), tier: str = "mini", store: Path = STORE,
                results: Path = RESULTS, log=print, arms: list[str] | None = None,
                jobs: int = 1, rerun_older: bool = False) -> dict:
    """Run the tuning runs still missing (``jobs`` at a time; ``rerun_older``: and those made
    by older code) one arm at a time, each arm's next rung while its choice sits at its grid's
    edge (rule v3's widening) planned again after each arm, so that a campaign cut short leaves
    whole choices; rewrite ``tuning/<tier>-rates.json`` after each arm and return the widened
    choices of the claims asked for."""
    ran: set = set()
    while batch := next_arm_batch(plan_tuning(patterns, tier, arms, store), ran, store,
                                  rerun_older):
        ran |= {s.hash for s in batch}
        _run_specs(batch, store, results, log, "tuning", jobs, rerun_older)
        write_rates(tier, store)
    return tuned_rates(tier, store, tier_pairs(match_claims(list(patterns), tier)), widened=True)


def next_arm_batch(specs: list[RunSpec], ran: set, store: Path = STORE,
                   rerun_older: bool = False) -> list[RunSpec]:
    """The runs of ``specs`` (planned arm by arm) not in ``ran`` of the first arm that has any
    to run: its grid, or its next rung once the grid is in. An arm whose runs are all stored is
    passed over (unless ``rerun_older``: ``_run_specs`` decides which of them are older), so
    that a tuning with most arms done does not plan again once per done arm."""
    pending = [s for s in specs if s.hash not in ran
               and (rerun_older or not stored_paths(s, store))]
    if not pending:
        return []
    first = pending[0].setting, pending[0].arm
    return [s for s in pending if (s.setting, s.arm) == first]


def write_rates(tier: str, store: Path = STORE) -> None:
    """``tuning/<tier>-rates.json``: every tuned arm of the tier, its rate and validation
    means (not only those of the last ``tune``'s claims)."""
    from fedtune_app.apps.results import write_json

    exploratory, widened = tuned_rates(tier, store), tuned_rates(tier, store, widened=True)
    write_json(store / "tuning" / f"{tier}-rates.json", {
        "rule": reg.LR_RULE, "grid": list(reg.LR_GRID[tier]), "seeds": list(reg.TUNING_SEEDS),
        "widening": reg.LR_WIDENING_RULE, "widening-date": reg.LR_WIDENING_DATE,
        "rates": {f"{s} {a}": {
            "lr": c.lr, "exploratory-lr": exploratory[s, a].lr, "best-round": c.best_round,
            "grid": [f"{x:g}" for x in c.grid], "edge": c.edge,
            "waits-for": [f"{x:g}" for x in c.next_rates],
            "diverged": {f"{k:g}": n for k, n in c.rejected.items()},
            "validation-means": {f"{k:g}": v for k, v in c.means.items()}}
            for (s, a), c in widened.items()}})


def machine() -> dict:
    """What a record's float rounding depends on beyond its key and code: the CPU (its family
    and model tell apart processors one model name covers), the vector instructions torch's
    kernels dispatch to, and the numeric libraries' versions. Two runs of one key matched bit
    for bit on one machine; across machines they can drift apart by float rounding."""
    import platform

    import numpy
    import torch

    info = {}
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            info.setdefault(name.strip(), value.strip())
            if not line.strip():  # the first processor's block is enough
                break
    cpu = info.get("model name") or platform.processor() or platform.machine()
    if "cpu family" in info:
        cpu += f" (family {info['cpu family']}, model {info.get('model')})"
    return {"cpu": cpu, "kernels": torch.backends.cpu.get_cpu_capability(),
            "torch": torch.__version__, "numpy": numpy.__version__}


def summarize_run(spec: RunSpec, folder: Path, seconds: float, commit: str,
                  fingerprint: str | None = None, cpu_seconds: float | None = None) -> dict:
    """The small record of a finished run: its curve, final metrics, rejected replies, which test
    examples its last evaluations got right (``test-correct``; those of the trend's windows
    before them: ``window-correct``), and the fingerprint of the code that ran it."""
    from fedtune_app.apps.evaluation import unpack_correct

    metrics = json.loads((folder / "metrics.json").read_text())
    curve, correct = [], []
    for m in metrics:
        if m["accuracy"] is None:
            continue
        point = {"round": m["round"], "loss": m.get("loss")}
        point |= {k: v for k, v in m.items()
                  if k.startswith("accuracy") and isinstance(v, (int, float))}
        curve.append(point)
        correct.append(m.get("test-correct"))
    record = {"tier": spec.tier, "setting": spec.setting, "arm": spec.arm, "seed": spec.seed,
              "hash": spec.hash, "run-key": spec.key, "lr": spec.keys.get("lr"), "curve": curve,
              "final": curve[-1]["accuracy"],
              "rejected-replies": sum(len(m.get("rejected") or ()) for m in metrics),
              "seconds": round(seconds, 1), "rounds": len(metrics),
              # this process's CPU time: one core's cost, whatever else shared the machine
              **({} if cpu_seconds is None else {"cpu-seconds": round(cpu_seconds, 1)}),
              "commit": commit,
              "fingerprint": fingerprint or code_fingerprint(spec.keys["method"]),
              # the engine the run asked for, and how many client-rounds each engine trained
              # (the batched one leaves a method it cannot batch to the sequential one)
              "client-engine": spec.keys.get("client-engine", "sequential"),
              "client-engines": {engine: sum(m.get("client-engines", {}).get(engine, 0)
                                             for m in metrics)
                                 for engine in ("sequential", "batched")},
              "finished": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
              "machine": machine()}
    window = correct[-cs.LAST_EVALUATIONS:]
    if window and all(window):  # the primary metric's evaluations, example by example
        record["test-correct"] = [_by_group(c) for c in window]
        first = next(iter(record["test-correct"][0].values()))
        record["test-examples"] = sum(len(unpack_correct(v)) for v in first.values())
        record |= _trend_windows_correct(curve, correct)
    return record


def _trend_windows_correct(curve: list[dict], correct: list) -> dict:
    """``window-correct``: {round: per-example correctness} of the trend windows' evaluations
    that ``test-correct`` (the last ``LAST_EVALUATIONS``) does not hold, so the trend's
    test-set error has its closed form; {} when the run has no two windows."""
    rounds = [p["round"] for p in curve]
    try:
        early, late = cs.trend_windows(rounds)
    except ValueError:
        return {}
    held = set(rounds[-cs.LAST_EVALUATIONS:])
    kept = {r: c for r, c in zip(rounds, correct) if r in early + late and r not in held}
    if not kept or not all(kept.values()):
        return {}
    return {"window-correct": {str(r): _by_group(c) for r, c in kept.items()}}


def _by_group(correct: dict) -> dict:
    """{stratum: packed} (one model) or {group: {stratum: packed}} -> the latter."""
    return correct if isinstance(next(iter(correct.values())), dict) else {"0": correct}


def execute(spec: RunSpec, results: Path = RESULTS, store: Path = STORE,
            commit: str | None = None, fingerprint: str | None = None,
            rerun_older: bool = False) -> dict:
    """Run one (setting, arm, seed) in this process and store its record; ``commit`` and
    ``fingerprint``: the code this process loaded (HEAD may move while a campaign runs). A run
    another campaign stored since this one planned is not run again (with ``rerun_older``: one
    stored by this code): its record comes back, marked ``reused``. The record names the
    checkpoints the run loaded by their digests (``checkpoints``)."""
    from fedtune_app.apps.inprocess import run_inprocess
    from fedtune_app.apps.results import write_json
    from fedtune_app.methods import resolve_config
    from fedtune_app.tools.pretrain import checkpoint_digests

    method = spec.keys["method"]
    fingerprint = fingerprint or code_fingerprint(method)
    stored = find_cached(spec, store)
    if stored is not None and not (rerun_older and run_state(spec, stored, {method: fingerprint})
                                   == "older"):
        return stored | {"reused": True}
    commit = commit or git_commit()
    started, cpu_started = time.time(), time.process_time()
    # a folder per run: runs of one method and seed (tuning's rates) start in the same second
    folder = Path(run_inprocess(spec.keys | {"results-dir": str(results / spec.tier / spec.name)}))
    record = summarize_run(spec, folder, time.time() - started, commit, fingerprint,
                           time.process_time() - cpu_started)
    record["results-folder"] = str(folder.relative_to(ROOT) if folder.is_relative_to(ROOT)
                                   else folder)
    record["checkpoints"] = checkpoint_digests(resolve_config(spec.keys))
    # a record run again (older code) replaces the one stored, under that one's name (a run
    # settings share keeps the name it has): every reader finds the new one
    old = stored_paths(spec, store)
    path = old[0] if old else store / spec.folder / spec.tier / f"{spec.name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, record)
    for duplicate in old[1:]:
        duplicate.unlink()
    return record


# what a run imports when it first needs it (seconds each): a fork server imports them once
LAZY_IMPORTS = ("timm", "peft", "transformers", "datasets", "flwr_datasets", "sklearn")


def _start_worker() -> None:
    """A worker of ``--jobs``: one torch thread, and it ends with the process that started it.
    Killed by a signal, that process runs no clean-up, and the runs it had handed out would go
    on for minutes, unseen, taking the cores and storing records (the watch is on the pipe its
    parent holds open, which closes however the parent ends)."""
    import multiprocessing
    import threading

    import torch

    torch.set_num_threads(1)
    parent = multiprocessing.parent_process()
    threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True,
                     name="exit-with-parent").start()


def worker_pool(jobs: int, preload: tuple[str, ...] = ()):
    """``jobs`` worker processes, each on one torch thread, ended with this process. Not forks
    of this process (a forked torch with its threads started can hang): a fork server that has
    imported ``preload`` once, before any torch thread exists."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(preload))
    return ProcessPoolExecutor(jobs, context, initializer=_start_worker)


def missing_checkpoints_of_runs(specs: list[RunSpec]) -> list[str]:
    """The backbone checkpoints these runs need that this machine lacks (the stand-ins are made
    offline and kept out of git), each with the command that makes it."""
    from fedtune_app.methods import resolve_config
    from fedtune_app.tools import pretrain

    one_per_arm = {(s.setting, s.arm): s for s in specs}.values()  # seeds share their files
    return sorted({m for s in one_per_arm
                   for m in pretrain.missing_checkpoints(resolve_config(s.keys))})


def check_checkpoints(specs: list[RunSpec]) -> None:
    """Refuse a campaign whose runs would stop on a missing checkpoint, before any starts."""
    if missing := missing_checkpoints_of_runs(specs):
        raise ConfigError(f"claims: {len(specs)} runs to do, and their backbone checkpoints are "
                          "missing: " + "; ".join(missing) + ". Nothing was run.")


def checkpoints_unlike_stored(todo: list[RunSpec], stored: list[dict]) -> list[str]:
    """Per setting of the runs ``todo``: the checkpoint files of this machine whose digest
    differs from the one that ``stored`` records of that setting name, and how many of those
    records name none (made before records named them: which files they loaded is unknown). A
    claim's arms must be fine-tuned from the same backbone."""
    from fedtune_app.methods import resolve_config
    from fedtune_app.tools.pretrain import checkpoint_digests

    named = checkpoints_by_setting(stored)
    unnamed: dict = {}
    for r in stored:
        unnamed[r["setting"]] = unnamed.get(r["setting"], 0) + ("checkpoints" not in r)
    here = {}
    for spec in {(s.setting, s.arm): s for s in todo}.values():
        for file, digest in checkpoint_digests(resolve_config(spec.keys)).items():
            here[(spec.setting, file)] = digest
    return [f"setting {setting}: {file} here is {digest}, its stored records loaded "
            + ", ".join(sorted(named[(setting, file)]))
            for (setting, file), digest in sorted(here.items())
            if set(named.get((setting, file), {digest: []})) != {digest}] + [
        f"setting {setting}: {unnamed[setting]} stored records name no checkpoint"
        for setting in sorted({setting for setting, _ in here}) if unnamed.get(setting)]


def print_dry_run(specs: list[RunSpec], rerun_older: bool = False, store: Path = STORE) -> None:
    """What a campaign would do: each run done, done by older code ('older': run again with
    ``rerun_older``) or to do; the core-hours left, and the checkpoints it would stop on."""
    fingerprints = code_fingerprints()
    todo, older = [], 0
    for spec in specs:
        state = run_state(spec, find_cached(spec, store), fingerprints)
        todo += [spec] if state == "todo" or (state == "older" and rerun_older) else []
        older += state == "older"
        print(f"{state} {spec.name}")
    print(estimate_cost(specs, store, todo)
          + (f"; {older} done by older code, which `--rerun-older` runs again"
             if older and not rerun_older else ""))
    if missing := missing_checkpoints_of_runs(todo):
        print("missing backbone checkpoints (the campaign would stop on them): "
              + "; ".join(missing))


def _run_specs(specs: list[RunSpec], store: Path, results: Path, log, what: str,
               jobs: int = 1, rerun_older: bool = False) -> list[dict]:
    """Run the specs not yet in ``store`` (``rerun_older``: and those stored by older code, whose
    new records replace the old); ``jobs`` > 1: that many at once, each in its own
    process on one torch thread (every run is seeded on its own, so its record does not depend
    on which process ran it). A failed run stops the campaign after the runs under way; every
    finished run is stored as it ends."""
    from fedtune_app.apps.inprocess import progress

    commit, fingerprints = git_commit(), code_fingerprints()
    done = {s.hash: find_cached(s, store) for s in specs}
    state = {s.hash: run_state(s, done[s.hash], fingerprints) for s in specs}
    todo = [s for s in specs if state[s.hash] == "todo" or rerun_older and state[s.hash] == "older"]
    check_checkpoints(todo)
    if unlike := checkpoints_unlike_stored(todo, [r for r in done.values() if r]):
        log("claims: WARNING: this machine's backbone checkpoints may not be the files the "
            "stored records of these settings loaded (pretraining on another CPU makes other "
            "files): " + "; ".join(unlike) + ". A claim compares arms fine-tuned from one "
            "backbone: run a setting's records again from one set of files.")
    older = sum(state[s.hash] == "older" for s in todo)
    log(f"claims: {len(specs)} {what} runs, {len(specs) - len(todo)} already done, "
        f"{len(todo)} to run" + (f" ({older} of them made by older code)" if older else "")
        + (f", {jobs} at a time" if jobs > 1 and todo else ""))

    def finished(i: int, spec: RunSpec, record: dict) -> None:
        reused = record.pop("reused", False)
        done[spec.hash] = record
        lr = f" lr {spec.keys['lr']:g}" if "lr" in spec.keys else ""
        outcome = ("stored meanwhile by another campaign, not run again" if reused else
                   f"accuracy {100 * record['final']:.2f}% in {record['seconds']:.0f} s, "
                   f"{record['rejected-replies']} replies rejected")
        log(f"claims: {what} run {i}/{len(todo)} {spec.setting} {spec.arm} seed "
            f"{spec.seed}{lr}: {outcome}")

    if jobs > 1 and len(todo) > 1:
        from concurrent.futures import as_completed

        with worker_pool(jobs, ("fedtune_app.apps.inprocess", "fedtune_app.methods",
                                *LAZY_IMPORTS)) as pool:
            running = {pool.submit(execute, spec, results, store, commit,
                                   fingerprints[spec.keys["method"]], rerun_older): spec
                       for spec in todo}
            try:
                for i, future in enumerate(as_completed(running), 1):
                    finished(i, running[future], future.result())
            except BaseException:
                pool.shutdown(cancel_futures=True)
                raise
    else:
        with progress([s.keys for s in todo], what):
            for i, spec in enumerate(todo, 1):
                finished(i, spec, execute(spec, results, store, commit,
                                          fingerprints[spec.keys["method"]], rerun_older))
    return [done[s.hash] for s in specs]


def run_claims(patterns: list[str] = (), tier: str = "cpu", seeds: int | None = None,
               store: Path = STORE, results: Path = RESULTS, log=print,
               extra: dict | None = None, arms: list[str] | None = None,
               lr_mode: str = "tuned", data_dirs: dict | None = None,
               jobs: int = 1, rerun_older: bool = False,
               confirmatory: bool = False) -> list[dict]:
    """Run whatever the claims still need (finished runs are found by hash and skipped;
    ``rerun_older``: not those made by older code), one progress bar with an ETA over every
    round of the runs left (``jobs`` > 1: a line per finished run); the records of all runs.
    ``extra``: keys for every run, e.g. {"device": "cuda"}; ``data_dirs``, ``confirmatory``: as
    ``plan_runs``."""
    specs = plan_runs(patterns, tier, seeds, store, extra, arms, lr_mode, data_dirs,
                      confirmatory)
    return _run_specs(specs, store, results, log, "claims", jobs, rerun_older)


