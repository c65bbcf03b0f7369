"""(e) Server cost per round of update screening, the robust aggregators, client-level DP and
the state guard, next to today's masked mean.

Builds the job's real trainable state and FedRA's real plans for its capacities, gives every
sampled client an honest-looking update (its tensors + N(0, 0.01^2)), and times each step of
``LayerPlanStrategy.aggregate_train`` after the reply checks, per round (median of 7 rounds).

    python benchmarks/bench_screening.py                 # default (MiniLM) and smoke (Mixer)
"""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np  # noqa: E402

from common import DEFAULT_JOB, SMOKE_JOB, save, table
from fedtune_app.apps.evaluation import build_global  # noqa: E402
from fedtune_app.federated.aggregation import ClientUpdate  # noqa: E402
from fedtune_app.federated.robust import combine, dp_combine, screen, state_problem  # noqa: E402
from fedtune_app.federated.strategy import ClientInfo  # noqa: E402
from fedtune_app.methods import resolve_config, strategy_class  # noqa: E402

ROUNDS = 7


def timed(fn, *args) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


def bench(job: dict) -> dict:
    cfg = resolve_config(job["run_config"])
    model, recipe = build_global(cfg)
    robust = cfg.robust
    state = recipe.initial_state(model, cfg.seed)
    capacities = cfg.federation.capacity_list
    clients = [ClientInfo(i, i, c, 100, "all") for i, c in enumerate(capacities)]
    strategy = strategy_class(cfg)(cfg, clients, model.num_blocks, state)
    rng = np.random.default_rng(0)
    rules = ("mean", "median", "trimmed-mean", "clipped-mean", "fltrust", "centred-clip",
             "multi-krum", "bulyan")
    steps = {"screening": []} | {r: [] for r in rules} | {"dp (clip + noise)": [],
                                                           "state guard": []}
    # FLTrust's aggregation given the server's update (its root-set training is not timed)
    reference = {n: rng.normal(0, 0.01, v.shape) for n, v in state.items()}
    for r in range(ROUNDS):
        plans = strategy.plan_round(r + 1, clients)
        sent = {str(c.partition_id): {n: state[n] for n in strategy.payload(p)}
                for c, p in zip(clients, plans)}
        updates = [ClientUpdate(pid, {n: (v + rng.normal(0, 0.01, v.shape)).astype(v.dtype)
                                      for n, v in tensors.items()}, 100)
                   for pid, tensors in sent.items()]
        steps["screening"].append(timed(screen, updates, sent, robust))
        for rule in rules:
            rule_cfg = dataclasses.replace(robust, aggregator=rule)
            steps[rule].append(timed(combine, state, updates, rule_cfg, None, reference, {}))
        steps["dp (clip + noise)"].append(timed(
            dp_combine, state, updates, dataclasses.replace(robust, dp_noise_multiplier=1.0),
            np.arange(4, dtype=np.uint32), r))
        new = combine(state, updates, robust)
        steps["state guard"].append(timed(state_problem, state, new, robust))
    mean = statistics.median(steps["mean"])
    size = sum(v.size for v in state.values())
    return {"job": job["name"], "clients": len(clients), "trainable": size,
            "rows": [{"step": k, "ms per round": 1e3 * statistics.median(v),
                      "x masked mean": statistics.median(v) / mean} for k, v in steps.items()]}


def main() -> None:
    results = []
    for job in (DEFAULT_JOB, SMOKE_JOB):
        result = bench(job)
        table(f"{result['job']}: {result['clients']} clients, {result['trainable']} trainable "
              "values, server seconds per round", result["rows"])
        results.append(result)
    save("screening", {"jobs": results})


if __name__ == "__main__":
    main()
