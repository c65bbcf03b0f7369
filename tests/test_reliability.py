"""Hostile and failed replies: each is rejected with its reason, counted, and never
touches the global state; the round aggregates the others; too few valid replies keep the
previous state. Every case runs the real ClientApp through the in-process grid."""

import json
from dataclasses import replace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, RecordDict

from fedtune_app.apps.faults import parse_faults
from fedtune_app.config import ConfigError
from fedtune_app.data.splits import run_num_classes
from fedtune_app.federated.records import from_record, to_record
from fedtune_app.federated.wire import (
    ARRAYS,
    METRICS,
    NUM_EXAMPLES,
    TRAIN_LOSS,
    TrainReply,
    TrainTask,
)
from fedtune_app.methods import resolve_config
from fedtune_app.model.adapters import AdapterSpec, attach_adapters, initial_state
from fedtune_app.model.backbones import ModelSpec, build_backbone
from runs import TINY, assert_same_tensors, final_state, run


def on_train(fault):
    """Leave the start-up query alone: these faults hit training rounds."""
    return lambda msg, reply: fault(msg, reply) if msg.metadata.message_type == \
        MessageType.TRAIN else reply


def drop(msg, reply):  # a crashed, stalled or disconnected node: no reply within the timeout
    return None


def rebuilt(msg, reply, tensors=None, **metrics):
    """The client's reply with its tensors and/or metrics replaced."""
    sent = TrainReply.from_message(reply)
    tensors = from_record(sent.arrays) if tensors is None else tensors
    return replace(sent, arrays=to_record(tensors),
                   num_examples=metrics.pop(NUM_EXAMPLES, sent.num_examples),
                   train_loss=metrics.pop(TRAIN_LOSS, sent.train_loss),
                   metrics=sent.metrics | metrics).to_message(msg)


def changed(fn):
    """A fault that maps every tensor of the reply through ``fn``."""
    return lambda msg, reply: rebuilt(msg, reply, {n: fn(v) for n, v in
                                                   from_record(reply.content[ARRAYS]).items()})


def tensor_of_another_plan(msg, reply):
    tensors = from_record(reply.content[ARRAYS])
    plan = list(TrainTask.from_message(msg).layers)
    other = next(j for j in range(4) if j not in plan)
    name = next(n for n in tensors if n.startswith(f"blocks.{plan[0]}."))
    extra = name.replace(f"blocks.{plan[0]}.", f"blocks.{other}.", 1)
    return rebuilt(msg, reply, tensors | {extra: tensors[name]})


def not_an_array_record(msg, reply):
    return Message(RecordDict({ARRAYS: ConfigRecord({"x": 1}),
                               METRICS: reply.content[METRICS]}), reply_to=msg)


def repeated(msg, reply):  # the first reply counts; a second, very different one is ignored
    return [reply, changed(lambda v: v * 100)(msg, reply)]


def plus_stray(msg, reply):  # plus a reply claiming to come from a node nobody knows
    stray = rebuilt(msg, reply)
    stray.metadata.__dict__["_src_node_id"] = 424242
    return [reply, stray]


# partition id -> (fault made by the grid or None, expected reason; None = the reply counts)
CASES = {
    0: (None, None),
    1: (None, "client error: InjectedFault"),  # via fault-injection: the ClientApp raises
    2: (None, "NaN or Inf"),  # via fault-injection: the ClientApp sends NaN
    3: (drop, "no reply"),
    4: (tensor_of_another_plan, "outside its plan"),
    5: (changed(lambda v: v.astype(np.float64)), "dtype float64"),
    6: (changed(lambda v: v.reshape(-1)[:1]), "has shape (1,)"),
    7: (changed(lambda v: np.full_like(v, np.inf)), "NaN or Inf"),
    8: (lambda msg, reply: rebuilt(msg, reply, **{NUM_EXAMPLES: 10**9}), "exceeds the"),
    9: (lambda msg, reply: rebuilt(msg, reply, **{NUM_EXAMPLES: 0}), "positive integer"),
    10: (lambda msg, reply: rebuilt(msg, reply, **{TRAIN_LOSS: float("nan")}), "train-loss"),
    11: (not_an_array_record, "malformed reply (TypeError"),
    12: (repeated, None),
    13: (plus_stray, None),
}
CAPACITIES = "4," + ",".join(["2"] * (len(CASES) - 1))


def test_hostile_replies_are_rejected_and_never_reach_the_state(tmp_path):
    faults = {pid: on_train(fault) for pid, (fault, _) in CASES.items() if fault}
    folder = run(tmp_path / "hostile", faults=faults, capacities=CAPACITIES,
                 **{"num-server-rounds": 1, "fault-injection": "raise=1,nan=2"})
    [record] = json.loads((folder / "metrics.json").read_text())
    bad = {pid: why for pid, (_, why) in CASES.items() if why}
    assert sorted(map(int, record["rejected"])) == sorted(bad)
    for pid, why in bad.items():
        assert why in record["rejected"][str(pid)], (pid, record["rejected"][str(pid)])
    assert len(record["ignored"]) == 2  # the repeated reply of 12, the stray one of 13
    assert record["state-updated"] is True and np.isfinite(record["train-loss"])
    # the same round with every rejected client simply silent gives the same state, bit for bit
    silent = {pid: on_train(drop) for pid in bad}
    reference = run(tmp_path / "reference", faults=silent, capacities=CAPACITIES,
                    **{"num-server-rounds": 1})
    assert_same_tensors(final_state(folder), final_state(reference))


def test_too_few_valid_replies_keep_the_previous_state(tmp_path):
    keys = {"num-server-rounds": 1, "min-valid-replies": 3, "fault-injection": "raise=2"}
    folder = run(tmp_path, **keys)
    [record] = json.loads((folder / "metrics.json").read_text())
    assert record["state-updated"] is False
    assert "client error" in record["rejected"]["2"]
    assert np.isfinite(record["train-loss"])  # the two sound replies are still reported
    cfg = resolve_config(TINY | keys)
    model = attach_adapters(build_backbone(ModelSpec.from_config(cfg.model, run_num_classes(cfg))),
                            AdapterSpec.from_config(cfg.adapter))
    assert_same_tensors(final_state(folder), initial_state(model, cfg.seed))


def test_fault_injection_key_is_parsed_and_checked():
    assert parse_faults("raise=1, nan=2") == {1: "raise", 2: "nan"}
    assert parse_faults("") == {}
    for bad in ("explode=1", "raise=x", "raise"):
        with pytest.raises(ConfigError, match="'fault-injection'.*faults: raise, nan"):
            resolve_config({"fault-injection": bad})
