"""What one deployed message costs before any training: in deployment every message starts a
fresh ``flwr-clientapp`` process that imports the ClientApp, builds the frozen backbone and
loads the node's data again (a simulation actor pays this once and reuses its cache).

    .venv/bin/python benchmarks/clientapp_startup.py [--repeats 3] [--preset smoke]

Each repeat is a fresh Python process that times, in order: importing Flower's ClientApp
module, importing our ClientApp and its handlers, the first query (data + partition), the first
train message (backbone + adapters + one local epoch), and a second train message in the same
process (the warm cost a simulation actor pays per round). Prints the median of each.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(preset: str) -> dict:
    t0 = time.perf_counter()
    import flwr.clientapp  # noqa: F401
    t1 = time.perf_counter()
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict
    from flwr.supercore.task_identity import TaskIdentity

    import client_app  # noqa: F401
    from fedtune_app.apps.client import handle_query, handle_train
    t2 = time.perf_counter()
    from fedtune_app.data.scenarios import client_capacities
    from fedtune_app.methods import resolve_config

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    run_config = {"preset": preset}
    clients = len(client_capacities(resolve_config(run_config)))
    context = Context(run_id=1, node_id=5,
                      node_config={"partition-id": 0, "num-partitions": clients},
                      state=RecordDict(), run_config=run_config)
    query = Message(RecordDict({"config": ConfigRecord({"want": "info"})}), 5, MessageType.QUERY)
    query.metadata.__dict__["_message_id"] = "q"
    handle_query(query, context)
    t3 = time.perf_counter()

    from fedtune_app.model.adapters import initial_state, names_for_plan
    from fedtune_app.apps.client import runtime
    from fedtune_app.federated.strategy import to_record

    cfg = resolve_config(run_config)
    model, _ = runtime(cfg)
    plan = tuple(range(model.num_blocks))
    state = initial_state(model, 0)
    payload = to_record({n: state[n] for n in names_for_plan(state, plan)})
    times = []
    for r in (1, 2):
        msg = Message(RecordDict({"arrays": payload, "config": ConfigRecord(
            {"layers": list(plan), "server-round": r})}), 5, MessageType.TRAIN)
        msg.metadata.__dict__["_message_id"] = f"t{r}"
        start = time.perf_counter()
        handle_train(msg, context)
        times.append(time.perf_counter() - start)
    return {"import-flower": t1 - t0, "import-clientapp": t2 - t1, "first-query": t3 - t2,
            "first-train (incl. backbone build)": times[0],
            "warm-train": times[1], "process-total-to-first-reply": t3 - t0}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--app", default=str(ROOT), help="checkout to measure (default: this)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.preset)))
        return
    app = Path(args.app).resolve()  # the checkout whose ClientApp is measured
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(app)}
    runs = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--child", "--preset", args.preset],
                             env=env, capture_output=True, text=True, check=True, cwd=app)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["python-process-wall"] = time.perf_counter() - start
        runs.append(result)
    print(f"preset {args.preset}, {args.repeats} fresh processes, load {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} cores; median seconds:")
    for key in runs[0]:
        print(f"  {key:38s} {statistics.median(r[key] for r in runs):7.2f}")


if __name__ == "__main__":
    main()
