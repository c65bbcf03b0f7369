"""Warm clients: a long-lived node worker serves the ClientApp's messages over a local
authenticated channel, and the ClientApp handles a message in process when no worker is there.

A worker's replies are bit-identical to the same messages handled in process by a fresh model.
Through a real SuperLink: tests/test_deployment.py, whose node 0 is served by a worker and whose
node 1 is configured with a worker that does not exist (the fallback)."""

from __future__ import annotations

import logging

import pytest

from fedtune_app.apps.node_worker import delegate, read_authkey
from fedtune_app.config import ConfigError, RunConfig
from localdeploy import served_by, start_worker, stop_worker


def test_the_authkey_file_must_be_private(tmp_path):
    key = tmp_path / "k"
    assert len(read_authkey(key, create=True)) == 64  # 32 random bytes, hex
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    key.chmod(0o644)
    with pytest.raises(ConfigError, match=r"0o644.*chmod 600"):
        read_authkey(key)


def query_message(node_config: dict):
    from flwr.app import Context, RecordDict

    from fedtune_app.federated import wire
    from fedtune_app.federated.flower_private import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 5, 1
    context = Context(run_id=1, node_id=5, node_config=node_config, state=RecordDict(),
                      run_config={"preset": "smoke"})
    msg = wire.query_message(5)
    msg.metadata.__dict__["_message_id"] = "q"
    return msg, context


def test_without_a_worker_the_clientapp_handles_the_message_itself(tmp_path, caplog):
    from fedtune_app.apps import node_worker

    node = {"partition-id": 0, "num-partitions": 2, "data-dir": str(tmp_path)}
    node_worker._SAID_NO_WORKER.clear()  # said once per process: another test may have
    with caplog.at_level(logging.INFO, logger="flwr"):
        assert delegate("query", *query_message(node)) is None
        assert "no node worker configured" in caplog.text
        gone = {**node, "worker-address": str(tmp_path / "none.sock"),
                "worker-authkey-file": str(tmp_path / "none.key")}
        assert delegate("query", *query_message(gone)) is None
        assert f"node worker at {tmp_path / 'none.sock'} not reachable" in caplog.text


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    """One worker process for the tests of this module that talk to it directly."""
    folder = tmp_path_factory.mktemp("worker")
    proc, sock, key = start_worker(folder)
    yield proc, sock, key, folder / "worker.log"
    stop_worker(proc)


def test_the_worker_answers_as_the_clientapp_would_and_refuses_a_wrong_key(tmp_path, caplog,
                                                                          worker):
    from fedtune_app.apps.client import handle_query
    from fedtune_app.federated.wire import NodeAnswer

    proc, sock, key, log = worker
    before = len(served_by(log))
    node = {"partition-id": 1, "num-partitions": 2, "capacity": 2,
            "data-dir": str(tmp_path / "node"), "worker-address": str(sock),
            "worker-authkey-file": str(key)}
    msg, context = query_message(node)
    reply = delegate("query", msg, context)
    assert reply is not None and reply.metadata.reply_to_message_id == "q"
    here = handle_query(*query_message(node))
    assert NodeAnswer.from_message(reply) == NodeAnswer.from_message(here)
    assert NodeAnswer.from_message(reply).capacity == 2
    # a ClientApp with another key is refused (and the worker keeps serving)
    other = tmp_path / "other.key"
    read_authkey(other, create=True)
    with caplog.at_level(logging.WARNING, logger="flwr"):
        assert delegate("query", *query_message({**node, "worker-authkey-file":
                                                 str(other)})) is None
    assert "refused" in caplog.text or "not reachable" in caplog.text
    assert delegate("query", *query_message(node)) is not None
    # a handler's error comes back as an error of this message, not a dead worker
    with pytest.raises(RuntimeError, match="partition-id=5 is outside 0..1"):
        delegate("query", *query_message({**node, "partition-id": 5}))
    assert delegate("query", *query_message(node)) is not None
    assert served_by(log, before + 4)[before:] == [(str(proc.pid), "query")] * 4


def train_message(cfg: RunConfig, plan: tuple, server_round: int):
    from fedtune_app.data.splits import run_num_classes
    from fedtune_app.federated.records import to_record
    from fedtune_app.federated.wire import TrainTask
    from fedtune_app.methods import recipe_for
    from fedtune_app.model.adapters import initial_state, names_for_plan
    from fedtune_app.model.backbones import ModelSpec, build_skeleton

    skeleton = recipe_for(cfg).build(ModelSpec.from_config(cfg.model, run_num_classes(cfg)),
                                     backbone=build_skeleton)
    state = initial_state(skeleton, server_round)  # stands for the server's global state
    payload = to_record({n: state[n] for n in names_for_plan(state, plan)})
    msg = TrainTask(payload, tuple(plan), server_round).to_message(5)
    msg.metadata.__dict__["_message_id"] = f"t{server_round}"
    return msg


def test_warm_worker_replies_are_bit_identical_to_fresh_in_process_ones(tmp_path, worker):
    """Three messages of one node to one worker (its model, blocks and data kept between them)
    against the same messages handled in process, each by a fresh model as a fresh
    ``flwr-clientapp`` process would (seed 0, plans (0, 2) then (1, 2, 3))."""
    from fedtune_app.apps import client
    from fedtune_app.federated.flower_private import recorddict_to_proto
    from fedtune_app.methods import resolve_config

    proc, sock, key, log = worker
    before = len(served_by(log))
    node = {"partition-id": 0, "num-partitions": 2, "capacity": 3,
            "data-dir": str(tmp_path / "node"), "worker-address": str(sock),
            "worker-authkey-file": str(key)}
    cfg = resolve_config({"preset": "smoke"})
    warm, cold = [], []
    for kind, plan, server_round in (("query", None, 0), ("train", (0, 2), 1),
                                     ("train", (1, 2, 3), 2)):
        msg, context = query_message(node)
        if kind == "train":
            msg = train_message(cfg, plan, server_round)
        reply = delegate(kind, msg, context)
        client._MODELS.clear()  # in process: a fresh model, as in a fresh process
        here = (client.handle_query if kind == "query" else client.handle_train)(msg, context)
        warm.append(reply.content)
        cold.append(here.content)
    for ours, theirs in zip(warm, cold):
        if "metrics" in theirs:  # timings and process facts differ; what was computed may not
            for name in ("fit-seconds", "train-seconds", "pid", "peak-rss-mb", "torch-threads",
                         "backbone-builds", "gpu-peak-mb"):
                del ours["metrics"][name], theirs["metrics"][name]
        assert recorddict_to_proto(ours).SerializeToString() == \
            recorddict_to_proto(theirs).SerializeToString()
    assert warm[1]["arrays"].keys() != warm[2]["arrays"].keys()  # two different plans trained
    pid = str(proc.pid)
    assert served_by(log, before + 3)[before:] == [(pid, "query"), (pid, "train"), (pid, "train")]
