"""Memory of a client by capacity, and what one deployed message costs.

    .venv/bin/python benchmarks/bench_memory.py [--jobs minilm,vit-b] [--capacities 1,3,6]
        [--before PATH] [--repeats 1]

For each job (the default MiniLM text job, 6 blocks; a random-init ``vit_base_patch16_224`` on
synthetic 32x32 images, 12 blocks) and each capacity L_i, one fresh Python process plays a
deployed node: it imports the ClientApp, answers the start-up query, and handles two train
messages carrying the prefix plan 0..L_i-1 through the real ``handle_train``. It reports

* ``weights-MB``: bytes of the model's parameters and buffers that have storage (frozen blocks
  held, parts outside the blocks, adapters) after the first message; ``bound-MB``: (outside the
  blocks + L_i blocks) x 1.10, the target;
* ``peak-RSS-MB``: the process's peak resident set size (``ru_maxrss``);
* ``first-reply-s``: process start to the first train reply (what every deployed message costs:
  Flower starts a fresh ``flwr-clientapp`` process per message), ``warm-train-s``: the second
  message in the same process (what a simulation actor pays per round).

``--before PATH`` runs the same children in another checkout (e.g. a detached worktree of the
commit before capacity-true clients) for the before/after columns. The node's layered checkpoint
is written once per job into a fresh cache folder before the timed processes
(``node-setup-s``, the one-time cost of a node). The steady round time of an in-process
federation (FedRA on MiniLM, plans change every round) is measured for both checkouts with
``--rounds``. Numbers land in ``benchmarks/results/bench_memory.json``.

``--cold`` measures a node from an EMPTY cache instead (the first message a new device
answers): one child that builds the node's layered checkpoint from the model (the whole backbone
once, the default), one that fetches only its blocks from the published file
(``fedtune publish-layered``, served on 127.0.0.1 by werkzeug with Range support; run-config
``layered-url``/``layered-sha256``), with the bytes it fetched:

    .venv/bin/python benchmarks/bench_memory.py --jobs vit-b --capacities 1,12 --cold
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ROOT = HERE.parent.parent

JOBS = {
    "minilm": {"name": "default MiniLM (BBC News), 6 blocks", "blocks": 6, "run_config": {
        "train-subset": 64, "test-subset": 32, "batch-size": 32}},
    "vit-b": {"name": "vit_base_patch16_224 random init, 32x32 synthetic images, 12 blocks",
              "blocks": 12, "run_config": {
                  "model": "vit_base_patch16_224", "model-source": "random",
                  "model-args": "img_size=32", "dataset": "synthetic", "image-size": 32,
                  "train-subset": 64, "test-subset": 32, "partitioner": "iid",
                  "batch-size": 32}},
}


# -- the child: one deployed message (two, for the warm cost) --------------------------------
def resident_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.is_meta:
            continue
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
    return total


def queried_node(run_config: dict, capacity: int):
    """(the client module, the node's Context) of a node as a deployed SuperNode runs it: the
    ClientApp imported the deployed way, the start-up query answered."""
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    import client_app  # noqa: F401 - the deployed import path
    from fedtune_app.apps import client
    from fedtune_app.federated.flower_private import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
    node = {"partition-id": 0, "num-partitions": 2, "capacity": capacity}
    context = Context(run_id=1, node_id=5, node_config=node, state=RecordDict(),
                      run_config=run_config)
    query = Message(RecordDict({"config": ConfigRecord({"want": "info"})}), 5, MessageType.QUERY)
    query.metadata.__dict__["_message_id"] = "q"
    client.handle_query(query, context)
    return client, context


def train_twice(client, context, plan, payload, started: float) -> tuple[float, float]:
    """(seconds from ``started`` to the first reply, seconds of the second, warm, train)."""
    from flwr.app import ConfigRecord, Message, MessageType, RecordDict

    times = []
    for r in (1, 2):
        msg = Message(RecordDict({"arrays": payload, "config": ConfigRecord(
            {"layers": list(plan), "server-round": r})}), 5, MessageType.TRAIN)
        msg.metadata.__dict__["_message_id"] = f"t{r}"
        start = time.perf_counter()
        client.handle_train(msg, context)
        times.append(time.perf_counter() - start)
        if r == 1:
            first_reply = time.perf_counter() - started
    return first_reply, times[1]


def measured(model, first_reply: float, warm: float) -> dict:
    import resource

    return {"weights": resident_bytes(model), "peak-rss": resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss * 1024, "first-reply-s": first_reply,
            "warm-train-s": warm}


def child(run_config: dict, capacity: int, cache: str) -> dict:
    started = time.perf_counter()
    run_config = {**run_config, "checkpoint-dir": cache}
    client, context = queried_node(run_config, capacity)

    from fedtune_app.data.splits import run_num_classes
    from fedtune_app.federated.strategy import to_record
    from fedtune_app.methods import resolve_config
    from fedtune_app.model.adapters import initial_state, names_for_plan
    from fedtune_app.model.backbones import ModelSpec, build_skeleton

    cfg = resolve_config(run_config)
    plan = tuple(range(capacity))
    # the server's payload for this plan (names and shapes of the trainables; not timed: the
    # server makes it)
    made = time.perf_counter()
    skeleton = client.recipe_for(cfg).build(ModelSpec.from_config(cfg.model, run_num_classes(cfg)),
                                            backbone=build_skeleton)
    state = initial_state(skeleton, 0)
    del skeleton
    payload = to_record({n: state[n] for n in names_for_plan(state, plan)})
    started += time.perf_counter() - made
    first_reply, warm = train_twice(client, context, plan, payload, started)
    return measured(next(iter(client._MODELS.values()))[0], first_reply, warm)


def child_before(run_config: dict, capacity: int, cache: str) -> dict:
    """The same for a checkout without ``build_skeleton`` (the whole backbone is built)."""
    started = time.perf_counter()
    client, context = queried_node(run_config, capacity)

    from fedtune_app.federated.strategy import to_record
    from fedtune_app.methods import resolve_config
    from fedtune_app.model.adapters import initial_state, names_for_plan

    cfg = resolve_config(run_config)
    plan = tuple(range(capacity))
    model, _ = client.runtime(cfg)
    state = initial_state(model, 0)
    payload = to_record({n: state[n] for n in names_for_plan(state, plan)})
    first_reply, warm = train_twice(client, context, plan, payload, started)
    return measured(model, first_reply, warm)


def block_bytes(run_config: dict) -> tuple[int, int]:
    """(bytes outside the blocks, bytes of one block), from the architecture."""
    from fedtune_app.data.splits import run_num_classes
    from fedtune_app.methods import resolve_config
    from fedtune_app.model.backbones import ModelSpec
    from fedtune_app.model.block_store import frozen_bytes

    cfg = resolve_config(run_config)
    shared, blocks = frozen_bytes(ModelSpec.from_config(cfg.model, run_num_classes(cfg)))
    return shared, max(blocks)


class RangeServer:
    """A folder served on 127.0.0.1 by werkzeug (Range requests answered with 206), from a
    thread; ``body_bytes`` counts what it sent."""

    def __init__(self, folder: Path):
        import threading

        from werkzeug.serving import make_server
        from werkzeug.utils import send_from_directory
        from werkzeug.wrappers import Request

        self.body_bytes = 0

        @Request.application
        def app(request):
            reply = send_from_directory(folder, request.path.lstrip("/"), request.environ,
                                        conditional=True, max_age=0, etag=False)
            self.body_bytes += reply.content_length or 0
            return reply

        self.server = make_server("127.0.0.1", 0, app, threaded=True)
        self.url = f"http://127.0.0.1:{self.server.server_port}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def publish_job(run_config: dict, folder: Path) -> tuple[str, str]:
    """(manifest file name, its SHA-256): ``fedtune publish-layered`` in its own process."""
    out = subprocess.run([sys.executable, "-m", "fedtune_app.tools.cli", "publish-layered",
                          "--run-config", " ".join(f"{k}={json.dumps(v)}"
                                                   for k, v in run_config.items()),
                          "--out", str(folder)], capture_output=True, text=True, check=True,
                         cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1",
                                        "PYTHONPATH": str(ROOT)})
    line = out.stdout.strip().splitlines()[-1]
    url, sha = line.split('layered-url="', 1)[1].split('" layered-sha256="')
    return url.rsplit("/", 1)[1], sha.rstrip('"')


def cold_rows(run_config: dict, caps: list[int], shared: int, block: int) -> list[dict]:
    """Peak RSS of a node from an EMPTY cache, per capacity: building its layered checkpoint
    from the model (the whole backbone once) vs fetching its blocks from the published file."""
    public = Path(tempfile.mkdtemp(prefix="bench-memory-public-"))
    manifest, sha = publish_job(run_config, public)
    server = RangeServer(public)
    rows = []
    for capacity in caps:
        row = {"L_i": capacity, "bound-MB": round((shared + capacity * block) * 1.10 / 2**20, 1)}
        for label, extra in (("builds", {}), ("fetches", {"layered-url": server.url + manifest,
                                                          "layered-sha256": sha})):
            sent = server.body_bytes
            run = spawn(ROOT, "after", {**run_config, **extra}, capacity,
                        tempfile.mkdtemp(prefix="bench-memory-empty-"))
            row |= {f"peak-RSS-MB {label}": round(run["peak-rss"] / 2**20),
                    f"first-reply-s {label}": round(run["first-reply-s"], 2)}
            if extra:
                row["fetched-MB"] = round((server.body_bytes - sent) / 2**20, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    server.server.shutdown()
    return rows


def spawn(checkout: Path, mode: str, run_config: dict, capacity: int, cache: str) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(checkout), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS",
                                                                            "1")}
    out = subprocess.run([sys.executable, str(HERE), "--child", mode, json.dumps(run_config),
                          str(capacity), cache], env=env, capture_output=True, text=True,
                         cwd=checkout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"child in {checkout} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def node_setup(run_config: dict, cache: str) -> float:
    """Seconds to write the node's layered checkpoint (once per node and model)."""
    code = ("import json,sys,time; from fedtune_app.methods import resolve_config;"
            "from fedtune_app.model.backbones import ModelSpec;"
            "from fedtune_app.data.splits import run_num_classes;"
            "from fedtune_app.model.block_store import layered_checkpoint;"
            "cfg=resolve_config(json.loads(sys.argv[1])); t=time.perf_counter();"
            "layered_checkpoint(ModelSpec.from_config(cfg.model, run_num_classes(cfg)),"
            "sys.argv[2]);"
            "print(time.perf_counter()-t)")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(run_config), cache], env=env,
                         capture_output=True, text=True, check=True, cwd=ROOT)
    return float(out.stdout.strip().splitlines()[-1])


# -- steady round time of an in-process federation -------------------------------------------
def rounds_child(rounds: int) -> dict:
    import tempfile as tf

    from fedtune_app.apps.inprocess import run_inprocess

    folder = run_inprocess({"method": "fedra", "num-server-rounds": rounds, "train-subset": 240,
                            "test-subset": 60, "results-dir": tf.mkdtemp(),
                            "checkpoint-dir": tf.mkdtemp()})
    metrics = json.loads((Path(folder) / "metrics.json").read_text())
    return {"round-s": [m["seconds"] for m in metrics]}


def steady_round(checkout: Path, rounds: int) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(checkout)}
    out = subprocess.run([sys.executable, str(HERE), "--rounds-child", str(rounds)], env=env,
                         capture_output=True, text=True, cwd=checkout, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"rounds in {checkout} failed:\n{out.stderr[-3000:]}")
    seconds = json.loads(out.stdout.strip().splitlines()[-1])["round-s"]
    return {"rounds-s": seconds, "steady-s": statistics.median(seconds[1:])}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", default="minilm,vit-b")
    parser.add_argument("--capacities", default="",
                        help="comma-separated, those up to a job's L (default 1..L)")
    parser.add_argument("--before", default="", help="checkout to compare with")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=4, help="in-process FedRA rounds (0: skip)")
    parser.add_argument("--cold", action="store_true",
                        help="only the empty-cache rows: a node that builds its layered "
                             "checkpoint vs one that fetches its blocks (publish-layered)")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "CONFIG", "CAPACITY", "CACHE"))
    parser.add_argument("--rounds-child", type=int)
    args = parser.parse_args()
    if args.child:
        mode, config, capacity, cache = args.child
        run = child if mode == "after" else child_before
        print(json.dumps(run(json.loads(config), int(capacity), cache)))
        return
    if args.rounds_child:
        print(json.dumps(rounds_child(args.rounds_child)))
        return

    from common import save, table

    checkouts = {"after": ROOT} | ({"before": Path(args.before)} if args.before else {})
    results, texts = {}, []
    for job_key in args.jobs.split(","):
        job = JOBS[job_key]
        caps = [c for c in map(int, args.capacities.split(",")) if c <= job["blocks"]] \
            if args.capacities else list(range(1, job["blocks"] + 1))
        shared, block = block_bytes(job["run_config"])
        if args.cold:
            rows = cold_rows(job["run_config"], caps, shared, block)
            results[job_key] = {"name": job["name"], "cold-rows": rows}
            texts.append(table(f"{job['name']}, node from an empty cache", rows))
            continue
        cache = tempfile.mkdtemp(prefix="bench-memory-")
        setup = node_setup(job["run_config"], cache)
        rows = []
        for capacity in caps:
            row = {"L_i": capacity,
                   "bound-MB": round((shared + capacity * block) * 1.10 / 2**20, 1)}
            for label, checkout in checkouts.items():
                runs = [spawn(checkout, label, job["run_config"], capacity, cache)
                        for _ in range(args.repeats)]
                row |= {f"weights-MB {label}": round(runs[0]["weights"] / 2**20, 1),
                        f"peak-RSS-MB {label}": round(max(r["peak-rss"] for r in runs) / 2**20),
                        f"first-reply-s {label}": round(statistics.median(
                            r["first-reply-s"] for r in runs), 2),
                        f"warm-train-s {label}": round(statistics.median(
                            r["warm-train-s"] for r in runs), 2)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        results[job_key] = {"name": job["name"], "node-setup-s": setup, "rows": rows,
                            "outside-blocks-bytes": shared, "block-bytes": block}
        texts.append(table(f"{job['name']} (one-time node setup {setup:.1f} s)", rows))
    if args.rounds and not args.cold:
        results["steady-round"] = {label: steady_round(checkout, args.rounds)
                                   for label, checkout in checkouts.items()}
        print("steady in-process FedRA round (MiniLM), median of rounds 2..:",
              {k: round(v["steady-s"], 2) for k, v in results["steady-round"].items()})
    name = "bench_memory_cold" if args.cold else "bench_memory"
    print(save(name, {"results": results, "before": args.before, "tables": texts}))


if __name__ == "__main__":
    main()
