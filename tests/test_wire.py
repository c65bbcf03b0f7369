"""The wire contract: a train task, its reply and the start-up query survive a real Flower
Message (through its protobuf, as between a SuperLink and a SuperNode) with the values put in,
and their content holds exactly the named keys, in the order they are sent."""

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

from fedtune_app.apps.inprocess import InProcessGrid
from fedtune_app.federated import wire
from fedtune_app.federated.flower_private import message_from_proto, message_to_proto
from fedtune_app.federated.records import from_record, to_record


@pytest.fixture(autouse=True)
def task_identity():
    InProcessGrid(None, [], {})  # sets Flower's task identity, which Message() needs


def over_the_wire(msg: Message) -> Message:
    msg.metadata.__dict__["_message_id"] = "m1"
    return message_from_proto(message_to_proto(msg))


TENSORS = {"blocks.0.w": np.arange(6, dtype=np.float32).reshape(2, 3),
           "head.b": np.array([0.5, -1.0], dtype=np.float32)}


def test_train_task_round_trip_and_keys():
    task = wire.TrainTask(to_record(TENSORS), (0, 2), 7, max_batches=3,
                          extras={"brick-domain": "news"})
    content = task.to_content()
    assert list(content) == ["arrays", "config"] == [wire.ARRAYS, wire.CONFIG]
    assert list(content["config"]) == ["layers", "server-round", "max-batches", "brick-domain"]
    assert list(content["config"])[:3] == [wire.LAYERS, wire.SERVER_ROUND, wire.MAX_BATCHES]

    received = over_the_wire(task.to_message(node_id=5))
    assert received.metadata.message_type == MessageType.TRAIN
    assert received.metadata.dst_node_id == 5 and received.metadata.group_id == "7"
    back = wire.TrainTask.from_message(received)
    assert (back.layers, back.server_round, back.max_batches) == ((0, 2), 7, 3)
    assert back.extras == {"brick-domain": "news"}
    arrays = from_record(back.arrays)
    assert list(arrays) == ["blocks.0.w", "head.b"]
    assert arrays["blocks.0.w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert arrays["head.b"].tolist() == [0.5, -1.0]
    assert back.config() == {"layers": [0, 2], "server-round": 7, "max-batches": 3,
                             "brick-domain": "news"}


def test_train_task_without_cap_sends_no_cap_key():
    """No cap (0) is not sent, as before the contract was named: the bytes stay the same."""
    task = wire.TrainTask(to_record(TENSORS), (1,), 2)
    assert list(task.to_content()["config"]) == ["layers", "server-round"]
    hand_built = RecordDict({"arrays": to_record(TENSORS),
                             "config": ConfigRecord({"layers": [1], "server-round": 2})})
    assert message_to_proto(Message(task.to_content(), 3, MessageType.TRAIN)).content == \
        message_to_proto(Message(hand_built, 3, MessageType.TRAIN)).content
    assert wire.TrainTask.from_message(over_the_wire(task.to_message(3))).max_batches == 0


def test_method_extras_may_not_shadow_shared_keys():
    with pytest.raises(ValueError, match="server-round"):
        wire.TrainTask(ArrayRecord(), (0,), 1, extras={"server-round": 9})


def test_train_reply_round_trip_and_keys():
    query = over_the_wire(wire.TrainTask(to_record(TENSORS), (0,), 1).to_message(5))
    reply = wire.TrainReply(to_record({"head.b": TENSORS["head.b"] * 2}), 40, 1.25,
                            {wire.FIT_SECONDS: 0.5, wire.CHECKPOINT_BYTES: 0})
    content = reply.to_content()
    assert list(content) == [wire.ARRAYS, wire.METRICS]
    assert list(content["metrics"]) == ["num-examples", "train-loss", "fit-seconds",
                                        "checkpoint-bytes"]
    back = wire.TrainReply.from_message(over_the_wire(reply.to_message(query)))
    assert (back.num_examples, back.train_loss) == (40, 1.25)
    assert back.metrics == {"fit-seconds": 0.5, "checkpoint-bytes": 0}
    assert from_record(back.arrays)["head.b"].tolist() == [1.0, -2.0]


def test_train_reply_of_the_wrong_shape_raises():
    task = over_the_wire(wire.TrainTask(ArrayRecord(), (0,), 1).to_message(5))
    bad = Message(RecordDict({"arrays": ConfigRecord({"x": 1}),
                              "metrics": MetricRecord({"num-examples": 1, "train-loss": 0.0})}),
                  reply_to=task)
    with pytest.raises(TypeError, match="ArrayRecord 'arrays'"):
        wire.TrainReply.from_message(bad)


def test_query_and_answer_round_trip_and_keys():
    query = over_the_wire(wire.query_message(9))
    assert query.metadata.message_type == MessageType.QUERY
    assert dict(query.content[wire.CONFIG]) == {wire.WANT: wire.WANT_INFO} == {"want": "info"}
    answer = wire.NodeAnswer(partition_id=2, capacity=4, num_examples=120, group="client-2",
                             label_counts=(100, 20), checkpoint_bytes=0, model_group=1,
                             num_partitions=6, memory_mb=512, rank=4)
    info = answer.to_content()[wire.INFO]
    assert list(info) == ["partition-id", "capacity", "num-partitions", "num-examples", "group",
                          "label-counts", "checkpoint-bytes", "model-group", "memory-mb",
                          "rank"]
    assert wire.NodeAnswer.from_message(over_the_wire(
        Message(answer.to_content(), reply_to=query))) == answer
    # an answer from before the optional entries existed still reads, with their defaults
    old = ConfigRecord({"partition-id": 1, "capacity": 2, "num-examples": 3, "group": "g",
                        "label-counts": [3]})
    assert wire.NodeAnswer.from_record(old) == wire.NodeAnswer(1, 2, 3, "g", (3,))
