"""`flwr run` with the batched client engine: one simulated node trains a round's clients.

Under Flower's simulation every message is its own ClientApp call in a Ray actor, so no process
ever holds two clients' tasks at once, and the batched engine (``training.batched``) has nothing
to batch. With run-config key ``client-engine = "batched"`` the ServerApp therefore wraps its
Grid in a ``CohortGrid``: the train messages of a round travel as ONE message (a bundle) to one
node, the cohort node (the one serving the round's lowest partition), whose ClientApp trains
them together (``client.train_bundle``) and answers with one message holding every client's
reply; the Grid hands the strategy one reply per client, each from the node it was sent to, as
if every node had answered. Strategies, update screening, aggregation, byte accounting and each
client's tensors do not change: the bundle is transport.

Why a Grid and not a simulation backend: Flower 1.41 and 1.42 have one backend (Ray's) and its
actors take one message each; a backend of our own would be a home-made runtime. The Grid wrapper
adds one line to the ServerApp and none to the ClientApp (``client.handle_train`` recognises a
bundle), and the same bundle works through the in-process Grid, which tests use.

Simulation only: the cohort node reads the other partitions' data and keeps their node state
(``context.state``, e.g. FedSA-LoRA's local B) under a prefix per partition; simulated nodes all
read the same data set, a deployed device holds only its own. A deployment keeps
``client-engine = "sequential"``. Rounds of one client, query messages and methods the batched
engine does not cover go through unchanged.
"""

from __future__ import annotations

import itertools
import logging

from flwr.app import ConfigRecord, Error, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedtune_app.federated.flower_private import ErrorCode
from fedtune_app.federated.nodes import WrappedGrid

log = logging.getLogger("fedtune")
COHORT = "cohort"  # the bundle's ConfigRecord: the partition of each task, in order
ERROR = "error"


def _prefix(k: int) -> str:
    return f"client-{k}-"


def bundle(contents: list[RecordDict], partitions: list[int]) -> RecordDict:
    """Several clients' train tasks as one message's content."""
    out = RecordDict({COHORT: ConfigRecord({"partitions": list(partitions)})})
    for k, content in enumerate(contents):
        for name, record in content.items():
            out[_prefix(k) + name] = record
    return out


def is_cohort(content: RecordDict) -> bool:
    return COHORT in content


def _split(content: RecordDict, n: int) -> list[RecordDict]:
    parts = [RecordDict() for _ in range(n)]
    for name, record in content.items():
        if name.startswith("client-"):
            k, _, rest = name.removeprefix("client-").partition("-")
            parts[int(k)][rest] = record
    return parts


def unbundle_tasks(content: RecordDict) -> list[tuple[RecordDict, int]]:
    """(task content, partition id) of every client in a bundle."""
    partitions = [int(p) for p in content[COHORT]["partitions"]]
    return list(zip(_split(content, len(partitions)), partitions))


def bundle_replies(replies: list[RecordDict | str]) -> RecordDict:
    """Every client's reply content, or the text of the error its training raised."""
    out = RecordDict({COHORT: ConfigRecord({"size": len(replies)})})
    for k, reply in enumerate(replies):
        if isinstance(reply, str):
            out[_prefix(k) + ERROR] = ConfigRecord({"reason": reply})
        else:
            for name, record in reply.items():
                out[_prefix(k) + name] = record
    return out


def unbundle_replies(content: RecordDict) -> list[RecordDict | str]:
    parts = _split(content, int(content[COHORT]["size"]))
    return [str(p[ERROR]["reason"]) if ERROR in p else p for p in parts]


def partition_state(state: RecordDict, partition: int) -> RecordDict:
    """A partition's node state, as the cohort node keeps it."""
    prefix = f"partition-{partition}-"
    return RecordDict({k.removeprefix(prefix): v for k, v in state.items()
                       if k.startswith(prefix)})


def keep_partition_state(state: RecordDict, partition: int, sub: RecordDict) -> None:
    prefix = f"partition-{partition}-"
    for key in [k for k in state if k.startswith(prefix)]:
        del state[key]
    for key, value in sub.items():
        state[prefix + key] = value


class CohortGrid(WrappedGrid):
    """The run's Grid, with each round's train messages bundled to one node (module doc).
    ``partition_of(node_id)``: the partition a node serves (``NodeSet``)."""

    def __init__(self, grid: Grid, partition_of):
        self.grid, self.partition_of = grid, partition_of
        self.synchronous = getattr(grid, "synchronous", False)
        self.pull_interval = getattr(grid, "pull_interval", None) or 3.0
        self._bundles: dict[str, list[Message]] = {}  # bundle id -> the messages it carries
        self._of: dict[str, str] = {}  # a carried message's id -> its bundle's id
        self._ready: dict[str, Message] = {}  # a carried message's id -> its reply
        self._ids = itertools.count(1)

    def push_messages(self, messages):
        messages = list(messages)
        train = [m for m in messages if m.metadata.message_type == MessageType.TRAIN]
        if len(train) < 2:
            return self.grid.push_messages(messages)
        partitions = [self.partition_of(m.metadata.dst_node_id) for m in train]
        host = train[partitions.index(min(partitions))].metadata.dst_node_id
        carrier = self.grid.create_message(bundle([m.content for m in train], partitions),
                                           MessageType.TRAIN, host, train[0].metadata.group_id,
                                           train[0].metadata.ttl)
        others = [m for m in messages if m.metadata.message_type != MessageType.TRAIN]
        pushed = list(self.grid.push_messages([carrier, *others]))
        bundle_id, other_ids = pushed[0], iter(pushed[1:])
        self._bundles[bundle_id] = train
        ids = {}
        for m in train:  # the strategy matches replies by these ids: one per carried message
            mid = f"{bundle_id}/{next(self._ids)}"
            m.metadata.__dict__["_message_id"] = mid
            self._of[mid] = bundle_id
            ids[id(m)] = mid
        log.info("fedtune: client-engine batched: %d clients' tasks to node %d", len(train),
                 host)
        return [ids[id(m)] if id(m) in ids else next(other_ids) for m in messages]

    def pull_messages(self, message_ids):
        message_ids = list(message_ids)
        carried = [i for i in message_ids if i in self._of]
        direct = [i for i in message_ids if i not in self._of]
        out = list(self.grid.pull_messages(direct)) if direct else []
        bundles = sorted({self._of[i] for i in carried if i not in self._ready})
        for reply in self.grid.pull_messages(bundles) if bundles else []:
            self._answer(reply)
        for i in carried:
            if i in self._ready:
                out.append(self._ready.pop(i))
                del self._of[i]
        return out

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))

    def _answer(self, reply: Message) -> None:
        """One reply per carried message, from the node it was sent to (an error reply to
        the bundle is every carried message's)."""
        carried = self._bundles.pop(reply.metadata.reply_to_message_id, None)
        if carried is None:
            return
        if reply.has_error():
            answers = [reply.error.reason] * len(carried)
            codes = [reply.error.code] * len(carried)
        else:
            answers = unbundle_replies(reply.content)
            codes = [ErrorCode.CLIENT_APP_RAISED_EXCEPTION] * len(carried)
        for msg, answer, code in zip(carried, answers, codes):
            content = (Error(code=code, reason=answer) if isinstance(answer, str) else answer)
            self._ready[msg.metadata.message_id] = Message(content, reply_to=msg)
