"""A Flower ``Grid`` that delivers each message straight to the real ClientApp in this process.

Everything above the transport is the real thing: the real ServerApp logic, Strategy.start loop,
ClientApp handlers, Message/ArrayRecord serialisation of every payload. Only Ray/SuperLink are
skipped, so tests and notebooks run a federation in seconds. ``faults`` lets a test replace a
node's reply: a fault gets (message, reply) and returns the reply to deliver, None (dropped /
timed out), or a list of replies (a repeated reply, a stray one from another node).
Nodes can come and go as on a real SuperLink: ``add_node`` (a late device, or a restarted one
without authentication: a new node id), ``go_offline`` (no longer listed; a message to it gets
the SuperLink's NODE_UNAVAILABLE reply, sent from node 1 as Flower 1.41 and 1.42 do), ``come_back``
(a restart under the same id, as with SuperNode authentication: activated anew).
``run_inprocess`` writes the same results folder as ``flwr run`` with the same run config
(simulation nodes get ``partition-id``/``num-partitions`` exactly as here).
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Callable

from flwr.app import Context, Error, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from fedtune_app.federated.flower_private import (
    SUPERLINK_NODE_ID,
    ErrorCode,
    NodeInfo,
    TaskIdentity,
)

RUN_ID = 7
# (message, reply) -> the reply to deliver, None (dropped / timed out), or a list of replies
Fault = Callable[[Message, Message], "Message | list[Message] | None"]


class InProcessGrid(Grid):
    synchronous = True  # every reply exists once ``push_messages`` returns: no waiting loop

    def __init__(self, client_app, node_configs: list[dict], run_config: dict,
                 faults: dict[int, Fault] | None = None, keep_sent: bool = True,
                 engine: str = "sequential"):
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = RUN_ID, 0, 1
        self.client_app, self.run_config = client_app, dict(run_config)
        self.node_ids: list[int] = []  # every node ever connected; faults index this list
        self.online: set[int] = set()
        self.activations: dict[int, int] = {}  # node id -> times it was activated
        self.contexts: dict[int, Context] = {}
        for nc in node_configs:
            self.add_node(nc)
        self.faults = faults or {}
        # every message sent, which tests read; ``run_inprocess`` keeps none: each holds the
        # arrays sent to one client, so a whole-model run would keep a model per client and round
        self.keep_sent = keep_sent
        self.sent: list[Message] = []
        self._replies: dict[str, list[Message]] = {}
        self._ids = itertools.count(1)
        # 'batched': the train messages of one push go to the batched client engine first
        # (``client.handle_train_cohort``); what it does not answer goes to ``client_app``
        self.engine = engine
        if engine != "sequential":
            from fedtune_app.apps.client_app import app

            if client_app is not app:  # the engine would answer in its place, unseen
                raise ValueError(f"client-engine {engine!r} trains with the app's own ClientApp "
                                 "(fedtune_app.apps.client_app.app), not a replacement")

    def set_run(self, run) -> None:
        pass

    @property
    def run(self):
        raise NotImplementedError

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def add_node(self, node_config: dict) -> int:
        """A node connects (late, or restarted: a new node id); returns its id."""
        nid = 1000 + 17 * len(self.node_ids)
        self.node_ids.append(nid)
        self.online.add(nid)
        self.activations[nid] = 1
        self.contexts[nid] = Context(run_id=RUN_ID, node_id=nid, node_config=dict(node_config),
                                     state=RecordDict(), run_config=dict(self.run_config))
        return nid

    def go_offline(self, node_id: int) -> None:
        self.online.discard(node_id)

    def come_back(self, node_id: int, node_config: dict | None = None) -> None:
        """The node restarts under its id (optionally with another node config)."""
        self.online.add(node_id)
        self.activations[node_id] += 1
        if node_config is not None:
            self.contexts[node_id].node_config = dict(node_config)

    def get_nodes(self):
        return [NodeInfo(node_id=n, status="online", last_activated_at=str(self.activations[n]))
                for n in self.get_node_ids()]

    def get_node_ids(self):
        return [n for n in self.node_ids if n in self.online]

    def push_messages(self, messages):
        messages = list(messages)
        numbered = self.engine != "sequential"  # the cohort's replies refer to every id at once
        for msg in messages if numbered else ():
            msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
        batched = self._batched(messages)
        ids = []
        for index, msg in enumerate(messages):
            if not numbered:  # one counter for messages and replies: m1, its reply r2, m3 ...
                msg.metadata.__dict__["_message_id"] = f"m{next(self._ids)}"
            if self.keep_sent:
                self.sent.append(msg)
            if msg.metadata.dst_node_id not in self.online:  # the SuperLink answers for it
                reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE,
                                      reason="Error: Node Unavailable"), reply_to=msg)
                reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
                reply.metadata.__dict__["_message_id"] = f"r{next(self._ids)}"
                self._replies[msg.metadata.message_id] = [reply]
                ids.append(msg.metadata.message_id)
                continue
            try:
                reply = batched.get(index) or self.client_app(
                    msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as err:  # what the real runtime does: an Error reply
                reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                      reason=f"{err.__class__.__name__}: {err}"), reply_to=msg)
            fault = self.faults.get(self.node_ids.index(msg.metadata.dst_node_id))
            if fault is not None:
                reply = fault(msg, reply)
            replies = [] if reply is None else reply if isinstance(reply, list) else [reply]
            for r in replies:
                r.metadata.__dict__["_message_id"] = f"r{next(self._ids)}"
            self._replies[msg.metadata.message_id] = replies
            ids.append(msg.metadata.message_id)
        return ids

    def _batched(self, messages) -> dict:
        """Replies of the batched engine to the train messages among ``messages``, by
        position (none with the sequential engine)."""
        if self.engine == "sequential":
            return {}
        from fedtune_app.apps.client import handle_train_cohort

        train = [(i, m) for i, m in enumerate(messages)
                 if m.metadata.message_type == MessageType.TRAIN
                 and m.metadata.dst_node_id in self.online]
        replies = handle_train_cohort([(m, self.contexts[m.metadata.dst_node_id])
                                       for _, m in train])
        return {train[k][0]: reply for k, reply in replies.items()}

    def pull_messages(self, message_ids):
        return [r for i in message_ids for r in self._replies.pop(i, [])]

    def send_and_receive(self, messages, *, timeout=None):
        return self.pull_messages(self.push_messages(messages))


def simulation_nodes(n: int) -> list[dict]:
    """The node configs Flower's simulation engine gives its supernodes."""
    return [{"partition-id": i, "num-partitions": n} for i in range(n)]


def run_inprocess(run_config: dict, client_app=None) -> str:
    """One federation of ``len(capacities)`` simulated nodes in this process; returns the results
    folder. ``client_app`` defaults to the app's own ClientApp (``fedtune_app.apps.client_app``)."""
    from fedtune_app.apps.server import run_federation
    from fedtune_app.data.scenarios import num_clients
    from fedtune_app.methods import resolve_config

    if client_app is None:
        from fedtune_app.apps.client_app import app as client_app
    cfg = resolve_config(run_config)
    nodes = simulation_nodes(num_clients(cfg))
    grid = InProcessGrid(client_app, nodes, run_config, keep_sent=False,
                         engine=cfg.training.client_engine)
    return run_federation(grid, cfg)


@contextlib.contextmanager
def progress(run_configs: list[dict], desc: str = "runs"):
    """One tqdm bar over every round of these runs (methods x seeds x rounds), advanced by the
    results writer after each round of any run in this process."""
    from tqdm.auto import tqdm

    from fedtune_app.apps.results import round_listener
    from fedtune_app.methods import resolve_config

    total = sum(resolve_config(rc).federation.num_server_rounds for rc in run_configs)
    with tqdm(total=total, desc=desc, unit="round") as bar, round_listener(
            lambda cfg, record: (bar.set_postfix_str(f"{cfg.method} seed {cfg.seed}"),
                                 bar.update())):
        yield bar


def run_all(run_configs: list[dict], desc: str = "runs", client_app=None) -> list[str]:
    """``run_inprocess`` of each run config in turn, with one progress bar; their folders."""
    with progress(run_configs, desc):
        return [run_inprocess(rc, client_app) for rc in run_configs]
