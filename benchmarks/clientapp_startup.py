"""What one deployed message costs before any training: in deployment every message starts a
fresh ``flwr-clientapp`` process that imports the ClientApp, builds the frozen backbone and
loads the node's data again (a simulation actor pays this once and reuses its cache).

    .venv/bin/python benchmarks/clientapp_startup.py [--repeats 3] [--preset smoke]

Each repeat is a fresh Python process that times, in order: importing Flower's ClientApp
module, importing our ClientApp and its handlers, the first query (data + partition), the first
train message (backbone + adapters + one local epoch), and a second train message in the same
process (the warm cost a simulation actor pays per round). Prints the median of each.

    .venv/bin/python benchmarks/clientapp_startup.py --messages --preset "" --repeats 3

times one node's train messages end to end instead (a fresh process per message, as
``flwr-clientapp``): cold, the process imports the app and does the work; warm, it hands the
message to a ``fedtune node-worker`` that kept the model and data. Overhead = wall - the
reply's fit seconds (the local training itself).
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

    import client_app  # noqa: F401
    from fedtune_app.apps.client import handle_query, handle_train
    from fedtune_app.federated.flower_private import TaskIdentity
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

    from fedtune_app.apps.client import runtime
    from fedtune_app.federated.strategy import to_record
    from fedtune_app.model.adapters import initial_state, names_for_plan

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


# -- one node's per-message overhead, cold (a fresh process does the work) and warm (a fresh
#    process hands the message to the node worker) ------------------------------------------
def node_context(preset: str, node_config: dict):
    """The context Flower gives the ClientApp (built without importing torch, as Flower does:
    ``node_config`` carries num-partitions)."""
    from flwr.app import Context, RecordDict

    return Context(run_id=1, node_id=5, state=RecordDict(), run_config={"preset": preset},
                   node_config={"partition-id": 0, **node_config})


def write_train_message(preset: str, path: Path) -> None:
    """A train message of the full plan, as Flower's protobuf (the message children read)."""
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict

    from fedtune_app.apps.client import recipe_for
    from fedtune_app.data.splits import run_num_classes
    from fedtune_app.federated.flower_private import TaskIdentity, message_to_proto
    from fedtune_app.federated.strategy import to_record
    from fedtune_app.methods import resolve_config
    from fedtune_app.model.adapters import initial_state, names_for_plan
    from fedtune_app.model.backbones import ModelSpec, build_skeleton

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    cfg = resolve_config({"preset": preset})
    model = recipe_for(cfg).build(ModelSpec.from_config(cfg.model, run_num_classes(cfg)),
                                  backbone=build_skeleton)
    plan = tuple(range(model.num_blocks))
    state = initial_state(model, 0)
    msg = Message(RecordDict({"arrays": to_record({n: state[n] for n in names_for_plan(
        state, plan)}), "config": ConfigRecord({"layers": list(plan), "server-round": 1})}),
        5, MessageType.TRAIN)
    msg.metadata.__dict__["_message_id"] = "t1"
    path.write_bytes(message_to_proto(msg).SerializeToString())


def message_child(preset: str, message: str, node_config: str) -> dict:
    """What a fresh ``flwr-clientapp`` process does with one train message: import the
    ClientApp, handle (or hand over) the message. Returns the reply's fit seconds."""
    from client_app import app  # the deployed import path: the top-level shim
    from fedtune_app.federated.flower_private import MessageProto, TaskIdentity, message_from_proto

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 5, 1
    proto = MessageProto()
    proto.ParseFromString(Path(message).read_bytes())
    reply = app(message_from_proto(proto), node_context(preset, json.loads(node_config)))
    return {"fit-seconds": float(reply.content["metrics"]["fit-seconds"]),
            "pid": int(reply.content["metrics"]["pid"])}


def per_message(args, app: Path, env: dict) -> None:
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="clientapp-messages-"))
    message = work / "train.pb"
    write_train_message(args.preset, message)
    from fedtune_app.data.scenarios import client_capacities
    from fedtune_app.methods import resolve_config

    clients = len(client_capacities(resolve_config({"preset": args.preset})))
    base = {"data-dir": str(work / "node"), "num-partitions": clients}

    def send(node_config: dict) -> dict:
        start = time.perf_counter()
        out = subprocess.run([sys.executable, __file__, "--message-child", args.preset,
                              str(message), json.dumps(node_config)], env=env,
                             capture_output=True, text=True, check=True, cwd=app)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        result["wall"] = time.perf_counter() - start
        result["overhead"] = result["wall"] - result["fit-seconds"]
        return result

    send(base)  # the node's one-time setup: layered checkpoint, prepared data (not counted)
    cold = [send(base) for _ in range(args.repeats)]
    worker_cfg = {**base, "worker-address": str(work / "worker.sock"),
                  "worker-authkey-file": str(work / "worker.key")}
    worker = subprocess.Popen([sys.executable, "-m", "fedtune_app.tools.cli", "node-worker",
                               "--address", worker_cfg["worker-address"], "--authkey-file",
                               worker_cfg["worker-authkey-file"]], env=env, cwd=app,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        while not (work / "worker.sock").exists():
            time.sleep(0.1)
        first = send(worker_cfg)  # the worker's own cold start, once per node
        warm = [send(worker_cfg) for _ in range(args.repeats)]
    finally:
        worker.terminate()
        worker.wait(timeout=30)
    assert len({r["pid"] for r in warm + [first]}) == 1, "warm messages by several processes"
    print(f"preset {args.preset!r}, one node, train message of the full plan, {args.repeats} "
          f"messages each, load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; median s:")
    rows = {"cold (fresh process does the work)": cold, "warm (fresh process -> worker)": warm,
            "first message to a fresh worker": [first]}
    for name, runs in rows.items():
        print(f"  {name:38s} wall {statistics.median(r['wall'] for r in runs):6.2f}  fit "
              f"{statistics.median(r['fit-seconds'] for r in runs):6.2f}  overhead "
              f"{statistics.median(r['overhead'] for r in runs):6.2f}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--preset", default="smoke")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--messages", action="store_true",
                        help="one node's per-message overhead (wall - fit seconds) of a train "
                             "message, cold (a fresh process per message) and warm (handed to "
                             "a node worker)")
    parser.add_argument("--message-child", nargs=3, help=argparse.SUPPRESS)
    parser.add_argument("--app", default=str(ROOT), help="checkout to measure (default: this)")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.preset)))
        return
    if args.message_child:
        print(json.dumps(message_child(*args.message_child)))
        return
    app = Path(args.app).resolve()  # the checkout whose ClientApp is measured
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(app)}
    if args.messages:
        sys.path.insert(0, str(app))
        per_message(args, app, env)
        return
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
