"""Which node serves which partition, round by round: devices drop out, restart and join late.

A node declares its partition in its node config (``partition-id``); the server learns it by
asking (the query message) the first time Flower lists the node's id as online. Rules:

* Replies are matched to the message they answer (``reply_to_message_id``), never by their
  sender: for a node that went offline the SuperLink answers in its place, with its own id
  (node 1) as sender and Flower's NODE_UNAVAILABLE error. Such an error is the failure of the
  node the message was sent to, logged with that node's id and Flower's error code.
* A new node id is asked who it is; once it has answered it takes its partition's place
  whatever its id: a restarted SuperNode (a new id without authentication) or a late device
  takes part from the first round that starts after its answer. With SuperNode authentication
  a restarted device keeps its node id: it is simply online again (and asked again who it is,
  since Flower shows it was activated anew). Nodes are read, and new ones asked, at the start
  of every round and every few seconds while a round waits for replies.
* One partition, one node: the NEWEST claim wins. When a node declares a partition that another
  node serves, the new node serves it from then on and the old one is sent no more work (a
  restart whose old instance Flower still lists as online for up to a minute). Two devices
  given the same ``partition-id`` by mistake therefore do not both train: the log names both.
* A node taking over a known partition must declare it as it was first declared (capacity,
  number of partitions, examples, model group, LoRA rank); otherwise it is refused and the log
  says why.
* A partition whose node Flower no longer lists as online sits the round out: no message.
* A node whose query fails is logged with its own id; at start-up a node whose ClientApp
  raised stops the run (a configuration error), an unreachable one is waited for.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, replace
from typing import Callable, Iterable

from flwr.app import Message
from flwr.serverapp import Grid

from fedtune_app.federated.flower_private import SUPERLINK_NODE_ID, ErrorCode
from fedtune_app.federated.wire import INFO, NodeAnswer, query_message

log = logging.getLogger("fedtune")

NODE_WAIT_LOG_SECONDS = 5.0  # a line this often while waiting for nodes to connect
REPLY_WAIT_LOG_SECONDS = 15.0  # and while a round waits for replies
PULL_SECONDS = 3.0  # Flower's own pull interval (HttpGrid.send_and_receive)
ERROR_NAMES = {v: k for k, v in vars(ErrorCode).items() if isinstance(v, int)}


@dataclass(frozen=True)
class ClientInfo:
    """What a node told the server when asked who it is."""

    node_id: int
    partition_id: int
    capacity: int
    num_examples: int
    group: str
    label_counts: tuple[int, ...] = ()
    checkpoint_bytes: int = 0  # bytes of its one-time checkpoint fetch
    model_group: int = 0  # its model group (0 in a single-model run)
    num_partitions: int = 0  # the number of partitions it declares (0: not reported)
    rank: int = 0  # the LoRA rank it holds (0: not reported, i.e. 'lora-r')


def client_info(node_id: int, info) -> ClientInfo:
    """The ``info`` ConfigRecord of a node's query reply."""
    a = NodeAnswer.from_record(info)
    return ClientInfo(node_id, a.partition_id, a.capacity, a.num_examples, a.group,
                      a.label_counts, a.checkpoint_bytes, a.model_group, a.num_partitions,
                      a.rank)


def error_of(reply: Message) -> dict:
    """Flower's error of a reply: code, the code's name, reason."""
    code = int(reply.error.code)
    return {"code": code, "name": ERROR_NAMES.get(code, "UNKNOWN"), "reason": reply.error.reason}


def error_text(reply: Message, node: int) -> str:
    """'<reason> (node N, Flower error <code> <NAME>)': the node is the one the message was
    sent to, also when the SuperLink answered in its place."""
    e = error_of(reply)
    by = ", reported by the SuperLink" if reply.metadata.src_node_id == SUPERLINK_NODE_ID else ""
    return f"{e['reason']} (node {node}, Flower error {e['code']} {e['name']}{by})"


def match_replies(sent: dict[str, int], replies: Iterable[Message]):
    """Pair each reply with the message it answers. ``sent``: message id -> the node it was
    sent to. Returns ([(message id, reply)], [why each other reply was ignored]): a reply to no
    message of ours, a second reply to one message (the first counts), or a reply whose sender
    is neither that node nor the SuperLink."""
    matched, ignored, seen = [], [], set()
    for reply in replies:
        mid, sender = reply.metadata.reply_to_message_id, reply.metadata.src_node_id
        node = sent.get(mid)
        if node is None:
            ignored.append(f"node {sender}: a reply to message {mid[:12]!r}, which this round "
                           "did not send")
        elif sender not in (node, SUPERLINK_NODE_ID):
            ignored.append(f"node {sender}: a reply to the message sent to node {node}")
        elif mid in seen:
            ignored.append(f"node {node}: a repeated reply (the first one counts)")
        else:
            seen.add(mid)
            matched.append((mid, reply))
    return matched, ignored


class NodeSet:
    """The federation as the server sees it: partition id -> the node serving it."""

    def __init__(self, admit: Callable[[ClientInfo], None] | None = None):
        self.claims: dict[int, ClientInfo] = {}  # partition id -> the node now serving it
        self.first: dict[int, ClientInfo] = {}  # partition id -> its first declaration
        self.asked: set[int] = set()  # every node id we sent a query to
        self.pending: dict[str, int] = {}  # query message id -> node id, not answered yet
        self.refused: dict[int, str] = {}  # node id -> why it is not used
        self.online: set[int] = set()  # node ids Flower listed as online at the last refresh
        self.activated: dict[int, str] = {}  # node id -> when Flower last activated it
        self.admit = admit  # raises ConfigError when the strategy cannot take a new partition
        self.events: list[str] = []  # what changed since the caller last took them

    # -- reading the federation -----------------------------------------------------------
    def clients(self) -> list[ClientInfo]:
        return [self.claims[p] for p in sorted(self.claims)]

    def live(self) -> list[ClientInfo]:
        """The partitions whose node Flower listed as online at the last refresh."""
        return [c for c in self.clients() if c.node_id in self.online
                and c.node_id not in self.refused]

    def num_partitions(self) -> int:
        return max((c.num_partitions for c in self.first.values()), default=0)

    def describe(self, node_id: int) -> str:
        pid = next((p for p, c in self.claims.items() if c.node_id == node_id), None)
        return f"node {node_id}" if pid is None else f"partition {pid} (node {node_id})"

    def take_events(self) -> list[str]:
        events, self.events = self.events, []
        return events

    # -- asking and deciding ----------------------------------------------------------------
    def refresh(self, grid: Grid, startup: bool = False) -> None:
        """Read the online nodes, ask each new one who it is, take the answers that arrived."""
        nodes = list(grid.get_nodes())
        self.online = {n.node_id for n in nodes}
        for n in nodes:  # activated again since we asked: a restart under the same id
            when, before = n.last_activated_at, self.activated.get(n.node_id)
            if when and before and when != before:
                self.asked.discard(n.node_id)
                log.info("node %d was activated again (a restart): asking it again",
                         n.node_id)
            self.activated[n.node_id] = when
        new = sorted(self.online - self.asked)
        if new:
            messages = [query_message(node) for node in new]
            for node, mid in zip(new, grid.push_messages(messages)):
                if mid:  # a query the grid did not take is sent again at the next refresh
                    self.pending[mid] = node
                    self.asked.add(node)
            log.info("asking new node(s) %s which partition they hold", new)
        if not self.pending:
            return
        matched, ignored = match_replies(self.pending, grid.pull_messages(list(self.pending)))
        for why in ignored:
            log.warning("ignored %s", why)
        for mid, reply in matched:
            self._answer(self.pending.pop(mid), reply, startup)

    def _answer(self, node: int, reply: Message, startup: bool) -> None:
        if reply.has_error():
            why = f"node {node} failed the query: {error_text(reply, node)}"
            self.refused[node] = why
            if startup and reply.error.code != ErrorCode.NODE_UNAVAILABLE:
                raise RuntimeError(f"a node failed the start-up query:\n  {why}")
            log.warning("%s", why)
            self.events.append(why)
            return
        try:
            info = client_info(node, reply.content[INFO])
        except (KeyError, TypeError, ValueError) as err:  # a malformed answer refuses the node
            return self.refuse(node, f"its answer is malformed ({err.__class__.__name__}: {err})")
        self.refused.pop(node, None)  # asked again after a restart: judged on this answer
        self.claim(info)

    def refuse(self, node: int, why: str) -> None:
        self.refused[node] = why
        log.warning("node %d is not used: %s", node, why)
        self.events.append(f"node {node} refused: {why}")

    def claim(self, info: ClientInfo) -> None:
        """Apply the rules of the module docstring to one node's answer."""
        pid, node = info.partition_id, info.node_id
        held = [p for p, c in self.claims.items() if c.node_id == node and p != pid]
        if held:  # a restart under the same id with another node config
            return self.refuse(node, f"it served partition {held[0]} and now declares "
                                     f"partition {pid}; a node keeps its partition within a run")
        first = self.first.get(pid)
        if first is None:
            expected = self.num_partitions()
            if expected and info.num_partitions and info.num_partitions != expected:
                return self.refuse(node, f"it declares num-partitions={info.num_partitions}, "
                                         f"the federation has {expected}")
            if self.admit is not None:
                try:
                    self.admit(info)
                except ValueError as err:  # ConfigError: the method cannot take this client
                    return self.refuse(node, str(err))
            self.first[pid], self.claims[pid] = info, info
            log.info("node %d serves partition %d (capacity %d)", node, pid, info.capacity)
            self.events.append(f"node {node} joined with partition {pid}")
            return
        differs = {k: (v, getattr(info, k)) for k, v in asdict(first).items()
                   if k in ("capacity", "num_partitions", "num_examples", "model_group", "rank")
                   and v != getattr(info, k)}
        if differs:
            said = ", ".join(f"{k.replace('_', '-')}={new} (was {old})"
                             for k, (old, new) in differs.items())
            return self.refuse(node, f"it declares partition {pid} with {said}; start it with "
                                     "the node config the partition first had")
        old = self.claims[pid].node_id
        # the node keeps the partition's first description; only the serving node id changes
        self.claims[pid] = replace(first, node_id=node, checkpoint_bytes=info.checkpoint_bytes)
        if old == node:
            log.info("node %d serves partition %d again", node, pid)
            self.events.append(f"node {node} restarted and serves partition {pid} again")
            return
        still = " (Flower still lists it as online)" if old in self.online else ""
        log.warning("node %d now serves partition %d in place of node %d%s; node %d is sent no "
                    "more work (newest claim wins: a restarted device gets a new id)",
                    node, pid, old, still, old)
        self.events.append(f"node {node} took partition {pid} over from node {old}")

    def gather(self, grid: Grid, min_nodes: int, timeout: float) -> list[ClientInfo]:
        """Wait until ``min_nodes`` partitions (0: every partition the nodes declare) are
        served by online nodes; say every few seconds what is missing."""
        started = time.time()
        deadline, next_log = started + timeout, started + NODE_WAIT_LOG_SECONDS
        while True:
            self.refresh(grid, startup=True)
            want = min_nodes or max(self.num_partitions(), 1)
            served = self.live()
            if len(served) >= want:
                return self.clients()
            now = time.time()
            if now > deadline or now >= next_log:
                status = self.waiting_status(want)
                if now > deadline:
                    raise RuntimeError(f"gave up after {timeout:.0f} s (run-config key "
                                       f"'round-timeout'): {status}")
                log.info("waiting for the nodes to start, %.0f s so far (normal: Ray takes "
                         "about 30 s to start simulated nodes, longer on a busy machine): %s; "
                         "giving up in %.0f s (run-config key 'round-timeout')", now - started,
                         self.waiting_words(want), deadline - now)
                log.info("nodes so far: %s", status)  # the node ids: the log's, for --verbose
                next_log = now + NODE_WAIT_LOG_SECONDS
            time.sleep(1.0)

    def waiting_words(self, want: int) -> str:
        """How far the wait is, in words (``waiting_status``: in node ids)."""
        if not self.num_partitions():
            return "no node has answered yet"
        return f"{len(self.live())} of {want} partitions served so far"

    def waiting_status(self, want: int) -> str:
        served = {c.partition_id: c.node_id for c in self.live()}
        total = max(self.num_partitions(), want)
        missing = [p for p in range(total) if p not in served]
        which = "min-nodes" if want != self.num_partitions() else "num-partitions of the nodes"
        parts = [f"{len(served)} of {want} partitions served ({which})",
                 f"online nodes {sorted(self.online)}",
                 f"serving: {served}" if served else "no partition served yet"]
        if missing:
            parts.append(f"missing partitions {missing}")
        if self.pending:
            parts.append(f"asked, no answer yet: nodes {sorted(self.pending.values())}")
        if self.refused:
            parts.append("refused: " + "; ".join(self.refused.values()))
        return ", ".join(parts)


class WrappedGrid(Grid):
    """A Grid that passes everything to the Grid it wraps (``self.grid``); a subclass changes
    only what it overrides."""

    grid: Grid

    def set_run(self, run) -> None:
        self.grid.set_run(run)

    @property
    def run(self):
        return self.grid.run

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self):
        return self.grid.get_node_ids()

    def get_nodes(self):
        return self.grid.get_nodes()

    def push_messages(self, messages):
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        return self.grid.send_and_receive(messages, timeout=timeout)


class TalkingGrid(WrappedGrid):
    """The run's Grid, whose ``send_and_receive`` (Flower's push, then pull every 3 s until
    every message is answered or the timeout) says every few seconds whose replies it still
    waits for. Everything else is the wrapped Grid's."""

    def __init__(self, grid: Grid, describe: Callable[[int], str] = lambda n: f"node {n}",
                 on_wait: Callable[[Grid], None] | None = None):
        """``on_wait(grid)`` is called at every pull while waiting (``NodeSet.refresh``: new
        nodes are asked who they are during a round, to join the next one)."""
        self.grid, self.describe, self.on_wait = grid, describe, on_wait

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        if getattr(self.grid, "synchronous", False) or not messages:
            return self.grid.send_and_receive(messages, timeout=timeout)  # replies are there
        pushed = list(self.push_messages(messages))  # the grid stamps each message's id
        to = {mid: m.metadata.dst_node_id for mid, m in zip(pushed, messages) if mid}
        waiting, replies = set(to), []
        pull = getattr(self.grid, "pull_interval", PULL_SECONDS)
        started = time.time()
        next_log = started + REPLY_WAIT_LOG_SECONDS
        while True:
            got = list(self.pull_messages(list(waiting)))
            replies += got
            waiting -= {r.metadata.reply_to_message_id for r in got}
            now = time.time()
            if not waiting or (timeout is not None and now >= started + timeout):
                return replies
            if self.on_wait is not None:
                self.on_wait(self.grid)
            if now >= next_log:
                left = "" if timeout is None else (
                    f", giving up in {started + timeout - now:.0f} s (run-config key "
                    "'round-timeout')")
                log.info("waiting for %d of %d replies: %s; %.0f s so far%s", len(waiting),
                         len(to), ", ".join(sorted(self.describe(to[m]) for m in waiting)),
                         now - started, left)
                next_log = now + REPLY_WAIT_LOG_SECONDS
            time.sleep(pull if timeout is None
                       else max(0.0, min(pull, started + timeout - time.time())))
