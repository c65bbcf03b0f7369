"""The node handling's rules (fedtune_app/federated/nodes.py's docstring), fast: the in-process
grid on a virtual clock (nodes.py's ``time`` replaced, so every wait is instant and every log
line has an exact time), with devices that answer the query from their node config (the real
ClientApp's first query loads its data: about 10 s in a fresh process, per mutant under
mutmut). The same rules with the real ClientApp are in tests/test_nodes.py.

Node ids of the in-process grid: 1000, 1017, 1034, 1051, ... in the order nodes connect."""

from __future__ import annotations

import logging
import math
from collections import Counter

import pytest
from flwr.app import ConfigRecord, Error, Message, MessageType, RecordDict

from fedtune_app.federated import nodes as nodes_module
from fedtune_app.federated.flower_private import SUPERLINK_NODE_ID, ErrorCode
from fedtune_app.federated.nodes import (
    ERROR_NAMES,
    ClientInfo,
    NodeSet,
    TalkingGrid,
    client_info,
    error_of,
    error_text,
    match_replies,
)
from fedtune_app.federated.wire import INFO, NodeAnswer, query_message
from inprocess import InProcessGrid

START = 1000.0  # the virtual clock's epoch: what time.time() says when a test starts
WHY_FIRST = "start it with the node config the partition first had"
NEWEST = "newest claim wins: a restarted device gets a new id"


class Clock:
    """``time.time`` and ``time.sleep`` as nodes.py calls them; sleeping moves the clock."""

    def __init__(self):
        self.now, self.slept = START, []

    @property
    def elapsed(self) -> float:
        return self.now - START

    def time(self) -> float:
        return self.now

    def sleep(self, seconds) -> None:
        seconds = float(seconds)  # like time.sleep: TypeError for None
        if seconds < 0:
            raise ValueError("sleep length must be non-negative")
        self.slept.append(seconds)
        self.now += seconds


@pytest.fixture
def clock(monkeypatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(nodes_module, "time", c)
    return c


@pytest.fixture
def lines(clock):
    """The fedtune log as (virtual seconds, level, text)."""
    got = []

    class Keep(logging.Handler):
        def emit(self, record):
            got.append((clock.elapsed, record.levelname, record.getMessage()))

    logger, handler = logging.getLogger("fedtune"), Keep(logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield got
    logger.removeHandler(handler)
    logger.setLevel(level)


def texts(lines, level=None) -> list[str]:
    return [t for _, lv, t in lines if level in (None, lv)]


def device(msg: Message, context) -> Message:
    """A device's answer to the query, read from its node config (what nodes.py consumes; how
    the real ClientApp derives it is tests/test_nodes.py's and test_client's)."""
    nc = context.node_config
    if "answer" in nc:  # a node that answers something else: a malformed answer
        return Message(RecordDict(nc["answer"]), reply_to=msg)
    answer = NodeAnswer(int(nc["partition-id"]), int(nc.get("capacity", 2)),
                        int(nc.get("examples", 10)), str(nc.get("group", "g")),
                        tuple(nc.get("labels", (6, 4))), int(nc.get("checkpoint-bytes", 0)),
                        int(nc.get("model-group", 0)), int(nc["num-partitions"]))
    return Message(answer.to_content(), reply_to=msg)


def nc(pid: int, num: int = 3, **extra) -> dict:
    return {"partition-id": pid, "num-partitions": num} | {k.replace("_", "-"): v
                                                          for k, v in extra.items()}


class Timed(InProcessGrid):
    """The in-process grid on the virtual clock. ``at``: {second: change(grid)}, applied when
    the server next talks to the grid at or after that second (nodes join, leave, restart).
    ``delay``: {node index: seconds} after its message was pushed before its reply can be
    pulled (math.inf: never); with it the grid is asynchronous like a SuperLink's.
    ``unpushed``: node indices whose messages the grid does not take (their id is None, as
    Flower's grid returns for a message it could not push). ``calls`` counts each method."""

    def __init__(self, clock: Clock, configs: list[dict], *, at=None, delay=None,
                 unpushed=(), faults=None, pull_interval=None):
        super().__init__(device, configs, {}, faults)
        self.clock, self.at = clock, sorted((at or {}).items())
        self.delay, self.unpushed = delay or {}, set(unpushed)
        self.synchronous = delay is None
        if pull_interval is not None:
            self.pull_interval = pull_interval
        self.due: dict[str, float] = {}
        self.calls: Counter = Counter()
        self.pulled: list[list[str]] = []
        self.timeouts: list[float | None] = []  # of each send_and_receive

    def _tick(self) -> None:
        while self.at and self.at[0][0] <= self.clock.elapsed:
            self.at.pop(0)[1](self)

    def get_nodes(self):
        self.calls["get_nodes"] += 1
        self._tick()
        return super().get_nodes()

    def push_messages(self, messages):
        self.calls["push_messages"] += 1
        self._tick()
        messages = list(messages)
        ids = super().push_messages(messages)
        out = []
        for mid, msg in zip(ids, messages):
            index = self.node_ids.index(msg.metadata.dst_node_id)
            self.due[mid] = self.clock.elapsed + self.delay.get(index, 0.0)
            out.append(None if index in self.unpushed else mid)
        return out

    def pull_messages(self, message_ids):
        self.calls["pull_messages"] += 1
        self._tick()
        message_ids = list(message_ids)
        self.pulled.append(message_ids)
        ready = [m for m in message_ids if self.due.get(m, math.inf) <= self.clock.elapsed]
        return super().pull_messages(ready)

    def send_and_receive(self, messages, *, timeout=None):
        self.calls["send_and_receive"] += 1
        self.timeouts.append(timeout)
        return super().send_and_receive(messages, timeout=timeout)

    def queries_to(self) -> list[int]:
        return [m.metadata.dst_node_id for m in self.sent]


def info(node, pid, capacity=2, examples=10, group="g", labels=(6, 4), checkpoint=0,
         model_group=0, num=3) -> ClientInfo:
    return ClientInfo(node, pid, capacity, examples, group, labels, checkpoint, model_group, num)


def reply_to(grid, node: int, mid: str, *, sender=None, error=None) -> tuple[Message, Message]:
    """A query sent to ``node`` under id ``mid``, and a reply to it from ``sender`` (default:
    the node), an empty answer or Flower's ``error`` (code, reason)."""
    msg = query_message(node)
    msg.metadata.__dict__["_message_id"] = mid
    content = RecordDict() if error is None else Error(code=error[0], reason=error[1])
    reply = Message(content, reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = node if sender is None else sender
    return msg, reply


# -- Flower's errors and replies matched to messages ------------------------------------------

def test_flower_error_codes_are_named():
    assert ERROR_NAMES[0] == "UNKNOWN"
    assert ERROR_NAMES[2] == "CLIENT_APP_RAISED_EXCEPTION"
    assert ERROR_NAMES[5] == "NODE_UNAVAILABLE"
    assert ERROR_NAMES[8] == "CLIENT_APP_CRASHED"
    assert sorted(ERROR_NAMES) == list(range(9))  # Flower 1.41's and 1.42's codes, nothing else
    grid = InProcessGrid(device, [], {})  # sets Flower's task identity for Message()
    _, crashed = reply_to(grid, 1017, "m1", error=(ErrorCode.CLIENT_APP_CRASHED, "killed"))
    assert error_of(crashed) == {"code": 8, "name": "CLIENT_APP_CRASHED", "reason": "killed"}
    # sent by the node itself: no "reported by the SuperLink"
    assert error_text(crashed, 1017) == "killed (node 1017, Flower error 8 CLIENT_APP_CRASHED)"
    _, odd = reply_to(grid, 1034, "m2", error=(99, "new in a later Flower"))
    assert error_of(odd) == {"code": 99, "name": "UNKNOWN", "reason": "new in a later Flower"}
    assert error_text(odd, 1034) == "new in a later Flower (node 1034, Flower error 99 UNKNOWN)"
    _, gone = reply_to(grid, 1051, "m3", sender=SUPERLINK_NODE_ID,
                       error=(ErrorCode.NODE_UNAVAILABLE, "Error: Node Unavailable"))
    assert error_text(gone, 1051) == ("Error: Node Unavailable (node 1051, Flower error 5 "
                                      "NODE_UNAVAILABLE, reported by the SuperLink)")


def test_replies_are_matched_by_message_id_in_order_of_the_rules():
    grid = InProcessGrid(device, [], {})
    long_id = "0123456789abcdefghij"  # ids are object hashes: the log shows the first 12
    _, stray = reply_to(grid, 1000, long_id)
    _, foreign_first = reply_to(grid, 1017, "mb", sender=777)
    _, b = reply_to(grid, 1017, "mb")
    _, superlink = reply_to(grid, 1000, "ma", sender=SUPERLINK_NODE_ID,
                            error=(ErrorCode.NODE_UNAVAILABLE, "gone"))
    _, again = reply_to(grid, 1000, "ma")
    _, foreign_again = reply_to(grid, 1000, "ma", sender=1017)
    matched, ignored = match_replies({"ma": 1000, "mb": 1017},
                                     [stray, foreign_first, b, superlink, again, foreign_again])
    # a foreign sender does not use up the message: the node's own reply after it counts
    assert matched == [("mb", b), ("ma", superlink)]
    assert ignored == ["node 1000: a reply to message '0123456789ab', which this round did not "
                       "send",
                       "node 777: a reply to the message sent to node 1017",
                       "node 1000: a repeated reply (the first one counts)",
                       # a wrong sender is named as such even for an answered message
                       "node 1017: a reply to the message sent to node 1000"]
    assert match_replies({}, []) == ([], [])


def test_a_query_answer_becomes_the_client_description():
    answer = NodeAnswer(3, 4, 120, "g1", (70, 50), 2048, 1, 5, 300)
    assert client_info(1017, answer.to_content()[INFO]) == ClientInfo(
        node_id=1017, partition_id=3, capacity=4, num_examples=120, group="g1",
        label_counts=(70, 50), checkpoint_bytes=2048, model_group=1, num_partitions=5)
    # the entries older nodes do not send: no labels, no fetch, model group 0, not reported
    assert ClientInfo(1, 0, 1, 1, "g") == ClientInfo(1, 0, 1, 1, "g", (), 0, 0, 0)


# -- start-up: waiting for nodes ----------------------------------------------------------------

def said_waiting(waited: int, progress: str, left: int) -> str:
    """The wait's line in words (the quiet view of `fedtune run` shows it)."""
    return (f"waiting for the nodes to start, {waited} s so far (normal: Ray takes about 30 s "
            f"to start simulated nodes, longer on a busy machine): {progress}; giving up in "
            f"{left} s (run-config key 'round-timeout')")


def waits(lines) -> list[tuple[float, str]]:
    """The wait's lines: each in words, then its node ids (the log's)."""
    return [(t, text) for t, _, text in lines if text.startswith(("waiting", "nodes so far"))]


def test_nodes_answering_at_once_are_taken_without_waiting(clock, lines):
    grid = Timed(clock, [nc(2, capacity=4), nc(0), nc(1, capacity=1)])
    nodes = NodeSet()
    clients = nodes.gather(grid, 0, timeout=60)
    # sorted by partition, whatever order the nodes connected in
    assert clients == [info(1017, 0), info(1034, 1, capacity=1), info(1000, 2, capacity=4)]
    assert clock.slept == [] and grid.queries_to() == [1000, 1017, 1034]
    assert grid.calls == Counter(get_nodes=1, push_messages=1, pull_messages=1)
    assert lines == [(0, "INFO", "asking new node(s) [1000, 1017, 1034] which partition they "
                                 "hold"),
                     (0, "INFO", "node 1000 serves partition 2 (capacity 4)"),
                     (0, "INFO", "node 1017 serves partition 0 (capacity 2)"),
                     (0, "INFO", "node 1034 serves partition 1 (capacity 1)")]
    assert nodes.take_events() == ["node 1000 joined with partition 2",
                                   "node 1017 joined with partition 0",
                                   "node 1034 joined with partition 1"]
    assert nodes.take_events() == []  # taken
    assert nodes.num_partitions() == 3 and nodes.online == {1000, 1017, 1034}
    # every node answered: the next refresh pulls nothing
    nodes.refresh(grid)
    assert grid.calls == Counter(get_nodes=2, push_messages=1, pull_messages=1)
    assert grid.queries_to() == [1000, 1017, 1034]  # nobody asked twice


def test_the_wait_for_nodes_logs_every_5_s_and_gives_up_after_the_timeout(clock, lines):
    """min-nodes 0: every partition the nodes declare (3). Partition 1 never connects; the
    wait checks every second, says what is missing at 5 s and 10 s and gives up once past
    its 12 s: at 13 s."""
    grid = Timed(clock, [nc(0), nc(2)])
    with pytest.raises(RuntimeError) as err:
        NodeSet().gather(grid, 0, timeout=12.4)
    status = ("2 of 3 partitions served (num-partitions of the nodes), online nodes [1000, "
              "1017], serving: {0: 1000, 2: 1017}, missing partitions [1]")
    assert str(err.value) == f"gave up after 12 s (run-config key 'round-timeout'): {status}"
    assert clock.slept == [1.0] * 13 and grid.calls["get_nodes"] == 14
    assert waits(lines) == [(5, said_waiting(5, "2 of 3 partitions served so far", 7)),
                            (5, f"nodes so far: {status}"),
                            (10, said_waiting(10, "2 of 3 partitions served so far", 2)),
                            (10, f"nodes so far: {status}")]


def test_a_wait_met_exactly_returns_and_a_late_node_is_waited_for(clock, lines):
    # min-nodes 2 of 3 declared, 2 online: met (not more than needed)
    grid = Timed(clock, [nc(0), nc(1)])
    assert [c.partition_id for c in NodeSet().gather(grid, 2, timeout=10)] == [0, 1]
    assert clock.slept == []
    # min-nodes 0: the third partition's node connects at 7 s and is taken then
    grid = Timed(clock, [nc(0), nc(1)], at={7: lambda g: g.add_node(nc(2))})
    assert [c.node_id for c in NodeSet().gather(grid, 0, timeout=10)] == [1000, 1017, 1034]
    assert clock.slept == [1.0] * 7 and grid.queries_to() == [1000, 1017, 1034]
    assert [t for t, _ in waits(lines)] == [5, 5]
    # a deadline that falls on a 5 s line: the line is written, the wait gives up 1 s later
    lines.clear()
    with pytest.raises(RuntimeError, match=r"^gave up after 10 s "):
        NodeSet().gather(Timed(clock, [nc(0)]), 0, timeout=10)
    assert clock.slept == [1.0] * (7 + 11)  # this wait started at 7 s
    status = ("1 of 3 partitions served (num-partitions of the nodes), online nodes [1000], "
              "serving: {0: 1000}, missing partitions [1, 2]")
    assert waits(lines) == [(12, said_waiting(5, "1 of 3 partitions served so far", 5)),
                            (12, f"nodes so far: {status}"),
                            (17, said_waiting(10, "1 of 3 partitions served so far", 0)),
                            (17, f"nodes so far: {status}")]


def test_the_wait_status_names_min_nodes_missing_unanswered_and_refused(clock, lines):
    # min-nodes 4 of the 3 the nodes declare: 4 partitions wanted, 0..3 listed as missing;
    # node 1017 never answers; node 1034 is refused (another split), as is node 1051
    grid = Timed(clock, [nc(0), nc(1), nc(2, num=4), nc(1, num=5)],
                 faults={1: lambda msg, reply: None})
    nodes = NodeSet()
    with pytest.raises(RuntimeError) as err:
        nodes.gather(grid, 4, timeout=3)
    assert str(err.value) == (
        "gave up after 3 s (run-config key 'round-timeout'): 1 of 4 partitions served "
        "(min-nodes), online nodes [1000, 1017, 1034, 1051], serving: {0: 1000}, missing "
        "partitions [1, 2, 3], asked, no answer yet: nodes [1017], refused: it declares "
        "num-partitions=4, the federation has 3; it declares num-partitions=5, the "
        "federation has 3")
    assert clock.slept == [1.0] * 4
    # checked at 0, 1, 2, 3 s (the deadline itself: not yet past it, and no 5 s line due)
    assert not [text for _, _, text in lines if text.startswith("waiting")]
    # the unanswered query is pulled again at every check, nothing else (the in-process grid
    # numbers messages and replies from one counter: m1, its reply r2, m3 unanswered, ...)
    assert grid.pulled == [["m1", "m3", "m4", "m6"]] + [["m3"]] * 4
    # no node at all: one partition wanted; min-nodes 0 is reported as such
    with pytest.raises(RuntimeError, match=r"\): 0 of 1 partitions served \(min-nodes\), "
                                           r"online nodes \[\], no partition served yet, "
                                           r"missing partitions \[0\]$"):
        NodeSet().gather(Timed(clock, []), 0, timeout=0)
    # in words: before any node answered, the number of partitions is not known yet
    assert NodeSet().waiting_words(1) == "no node has answered yet"
    assert NodeSet().waiting_status(1) == ("0 of 1 partitions served (min-nodes), online nodes "
                                           "[], no partition served yet, missing partitions [0]")
    full = NodeSet()
    full.gather(Timed(clock, [nc(0, 2), nc(1, 2)]), 0, timeout=0)
    # min-nodes above the partitions declared: the ones beyond are missing; min-nodes equal
    # to them: nothing is missing
    assert full.waiting_status(3) == ("2 of 3 partitions served (min-nodes), online nodes "
                                      "[1000, 1017], serving: {0: 1000, 1: 1017}, missing "
                                      "partitions [2]")
    assert full.waiting_words(3) == "2 of 3 partitions served so far"
    assert full.waiting_status(2) == ("2 of 2 partitions served (num-partitions of the "
                                      "nodes), online nodes [1000, 1017], serving: {0: 1000, "
                                      "1: 1017}")


def test_a_clientapp_error_at_start_up_stops_the_run(clock, lines):
    """A configuration error is not waited out: the run stops at once, naming the node."""
    grid = Timed(clock, [nc(0), {"partition-id": 1}])  # no num-partitions: the app raises
    with pytest.raises(RuntimeError) as err:
        NodeSet().gather(grid, 0, timeout=60)
    assert str(err.value) == ("a node failed the start-up query:\n  node 1017 failed the query: "
                              "KeyError: 'num-partitions' (node 1017, Flower error 2 "
                              "CLIENT_APP_RAISED_EXCEPTION)")
    assert clock.slept == []


def test_an_unreachable_node_at_start_up_is_waited_for(clock, lines):
    """The SuperLink answers for node 1017 (gone between listing and delivery): it is logged
    and waited for; when Flower shows it activated anew (at 3 s) it is asked again."""
    unavailable = []

    def superlink_answers(msg, reply):
        if unavailable:
            return reply
        unavailable.append(msg.metadata.message_id)
        gone = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"),
                       reply_to=msg)
        gone.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
        return gone

    grid = Timed(clock, [nc(0, 2), nc(1, 2)], faults={1: superlink_answers},
                 at={3: lambda g: g.come_back(1017)})
    nodes = NodeSet()
    assert [c.node_id for c in nodes.gather(grid, 0, timeout=60)] == [1000, 1017]
    why = ("node 1017 failed the query: Error: Node Unavailable (node 1017, Flower error 5 "
           "NODE_UNAVAILABLE, reported by the SuperLink)")
    assert (0, "WARNING", why) in lines
    assert (3, "INFO", "node 1017 was activated again (a restart): asking it again") in lines
    assert clock.slept == [1.0] * 3 and grid.queries_to() == [1000, 1017, 1017]
    assert nodes.take_events() == ["node 1000 joined with partition 0", why,
                                   "node 1017 joined with partition 1"]
    assert nodes.refused == {}  # judged on its new answer


def test_a_failed_query_during_the_run_refuses_the_node_only(clock, lines):
    grid = Timed(clock, [nc(0, 2), nc(1, 2)])
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=10)
    grid.add_node({"partition-id": 1})  # a third device, misconfigured
    nodes.refresh(grid)  # not at start-up: the run goes on without it
    why = ("node 1034 failed the query: KeyError: 'num-partitions' (node 1034, Flower error 2 "
           "CLIENT_APP_RAISED_EXCEPTION)")
    assert nodes.refused == {1034: why} and nodes.take_events()[-1] == why
    assert texts(lines, "WARNING") == [why]
    assert [c.node_id for c in nodes.live()] == [1000, 1017]


def test_malformed_answers_refuse_the_node(clock, lines):
    grid = Timed(clock, [nc(0, 2),
                         {"answer": {"other": ConfigRecord({"x": 1})}},  # no info record
                         {"answer": {INFO: ConfigRecord({"partition-id": 1})}},
                         {"answer": {INFO: ConfigRecord({"partition-id": "one"})}},
                         {"answer": {INFO: ConfigRecord({"partition-id": 1, "capacity": 2,
                                                         "num-examples": 3, "group": "g",
                                                         "label-counts": 4})}}])
    nodes = NodeSet()
    nodes.refresh(grid)
    assert nodes.refused == {
        1017: "its answer is malformed (KeyError: 'info')",
        1034: "its answer is malformed (KeyError: 'capacity')",
        1051: "its answer is malformed (ValueError: invalid literal for int() with base 10: "
              "'one')",
        1068: "its answer is malformed (TypeError: 'int' object is not iterable)"}
    assert texts(lines, "WARNING") == [f"node {n} is not used: {why}"
                                       for n, why in nodes.refused.items()]
    assert nodes.take_events()[1:] == [f"node {n} refused: {why}"
                                       for n, why in nodes.refused.items()]
    assert [c.node_id for c in nodes.clients()] == [1000]


def test_ignored_replies_to_the_query_are_logged(clock, lines):
    def with_stray(msg, reply):  # the node's answer, repeated, and one sent by another node
        stray = Message(RecordDict(), reply_to=msg)
        stray.metadata.__dict__["_src_node_id"] = 4242
        return [stray, reply, reply]

    nodes = NodeSet()
    nodes.refresh(Timed(clock, [nc(0, 1)], faults={0: with_stray}))
    assert texts(lines, "WARNING") == ["ignored node 4242: a reply to the message sent to node "
                                       "1000",
                                       "ignored node 1000: a repeated reply (the first one "
                                       "counts)"]
    assert [c.node_id for c in nodes.clients()] == [1000] and nodes.pending == {}


def test_a_query_the_grid_did_not_take_is_not_waited_for_and_is_sent_again(clock, lines):
    grid = Timed(clock, [nc(0, 2), nc(1, 2)], unpushed={1})
    nodes = NodeSet()
    nodes.refresh(grid)
    assert nodes.pending == {} and nodes.asked == {1000}
    assert grid.pulled == [["m1"]] and [c.node_id for c in nodes.clients()] == [1000]
    # not marked as asked: once the grid takes it, the query goes out again and is answered
    grid.unpushed = set()
    nodes.refresh(grid)
    assert nodes.asked == {1000, 1017} and [c.node_id for c in nodes.clients()] == [1000, 1017]


# -- who serves which partition -------------------------------------------------------------

def test_the_newest_claim_wins_and_the_log_names_both(clock, lines):
    grid = Timed(clock, [nc(0, 2), nc(1, 2, group="a", labels=(9, 1), checkpoint_bytes=5)])
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=10)
    nodes.take_events()
    # a second device declaring partition 1 (its data group, labels and fetch may differ)
    grid.add_node(nc(1, 2, group="b", labels=(1, 9), checkpoint_bytes=700))
    nodes.refresh(grid)
    # it serves partition 1 with the partition's first description; its own fetch counts
    assert nodes.claims[1] == info(1034, 1, group="a", labels=(9, 1), checkpoint=700, num=2)
    assert nodes.first[1] == info(1017, 1, group="a", labels=(9, 1), checkpoint=5, num=2)
    assert [c.node_id for c in nodes.live()] == [1000, 1034]  # 1017 is sent no more work
    assert (0, "WARNING", f"node 1034 now serves partition 1 in place of node 1017 (Flower "
                          f"still lists it as online); node 1017 is sent no more work ({NEWEST})"
            ) in lines
    assert nodes.take_events() == ["node 1034 took partition 1 over from node 1017"]
    assert nodes.describe(1034) == "partition 1 (node 1034)"
    assert nodes.describe(1017) == "node 1017" and nodes.describe(1000) == "partition 0 (node 1000)"
    # a restarted device (new id) after its old instance left the list: no "still online"
    grid.go_offline(1034)
    grid.add_node(nc(1, 2))
    nodes.refresh(grid)
    assert texts(lines, "WARNING")[-1] == (f"node 1051 now serves partition 1 in place of node "
                                           f"1034; node 1034 is sent no more work ({NEWEST})")
    assert [c.node_id for c in nodes.clients()] == [1000, 1051]


@pytest.mark.parametrize("declared, said", [
    ({"capacity": 3}, "capacity=3 (was 2)"),
    ({"examples": 11}, "num-examples=11 (was 10)"),
    ({"model_group": 1}, "model-group=1 (was 0)"),
    ({"num": 4}, "num-partitions=4 (was 2)"),
    ({"capacity": 1, "examples": 7, "model_group": 2, "num": 5},
     "capacity=1 (was 2), num-examples=7 (was 10), model-group=2 (was 0), "
     "num-partitions=5 (was 2)"),
])
def test_a_takeover_with_another_declaration_is_refused(clock, lines, declared, said):
    grid = Timed(clock, [nc(0, 2), nc(1, 2)])
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=10)
    nodes.take_events()
    declared = dict(declared)
    num = declared.pop("num", 2)
    grid.add_node(nc(1, num, **declared))
    nodes.refresh(grid)
    why = f"it declares partition 1 with {said}; {WHY_FIRST}"
    assert nodes.refused == {1034: why} and nodes.claims[1].node_id == 1017
    assert texts(lines, "WARNING") == [f"node 1034 is not used: {why}"]
    assert nodes.take_events() == [f"node 1034 refused: {why}"]
    assert [c.node_id for c in nodes.live()] == [1000, 1017]


def test_num_partitions_of_a_new_partition_must_match_the_federation(clock, lines):
    grid = Timed(clock, [nc(0, 3), nc(1, 0)])  # 0: a node that does not report it
    nodes = NodeSet()
    nodes.refresh(grid)
    assert [c.node_id for c in nodes.clients()] == [1000, 1017] and nodes.num_partitions() == 3
    grid.add_node(nc(2, 4))
    nodes.refresh(grid)
    assert nodes.refused == {1034: "it declares num-partitions=4, the federation has 3"}
    assert 2 not in nodes.first  # refused: partition 2 is still free for the right node
    grid.add_node(nc(2, 3))
    nodes.refresh(grid)
    assert nodes.claims[2].node_id == 1051 and nodes.refused == {1034: nodes.refused[1034]}
    # while no node reports a number, any number is taken, and the largest one counts
    loose = NodeSet()
    assert loose.num_partitions() == 0
    loose.refresh(Timed(clock, [nc(0, 0), nc(1, 5), nc(2, 0)]))
    assert sorted(loose.claims) == [0, 1, 2] and loose.num_partitions() == 5


def test_the_strategy_admits_each_new_partition(clock, lines):
    """``admit`` raises ValueError (ConfigError) when the method cannot take a client: the
    node is refused and its partition stays free; a takeover is not admitted again."""
    seen = []

    def admit(client: ClientInfo):
        seen.append(client.node_id)
        if client.capacity < 2:
            raise ValueError(f"capacity {client.capacity} is below the method's 2")

    grid = Timed(clock, [nc(0, 2, capacity=1), nc(1, 2)])
    nodes = NodeSet(admit)
    nodes.refresh(grid)
    assert nodes.refused == {1000: "capacity 1 is below the method's 2"}
    assert sorted(nodes.first) == [1] and seen == [1000, 1017]
    assert texts(lines, "WARNING") == ["node 1000 is not used: capacity 1 is below the "
                                       "method's 2"]
    grid.add_node(nc(0, 2, capacity=3))  # the right device for partition 0
    grid.add_node(nc(1, 2))  # a restarted device of partition 1: a takeover
    nodes.refresh(grid)
    assert seen == [1000, 1017, 1034]
    assert [(c.partition_id, c.node_id, c.capacity) for c in nodes.live()] == [(0, 1034, 3),
                                                                               (1, 1051, 2)]


def test_offline_partitions_sit_out(clock, lines):
    grid = Timed(clock, [nc(0), nc(1), nc(2)])
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=10)
    grid.go_offline(1017)
    nodes.refresh(grid)
    assert [c.partition_id for c in nodes.live()] == [0, 2]
    assert [c.partition_id for c in nodes.clients()] == [0, 1, 2]  # still its partition
    assert nodes.online == {1000, 1034}
    grid.come_back(1017)  # back under its id (authentication): asked again, serves again
    nodes.refresh(grid)
    assert [c.partition_id for c in nodes.live()] == [0, 1, 2]
    assert texts(lines)[-3:] == ["node 1017 was activated again (a restart): asking it again",
                                 "asking new node(s) [1017] which partition they hold",
                                 "node 1017 serves partition 1 again"]


def test_a_restart_under_the_same_id_is_asked_once(clock, lines):
    grid = Timed(clock, [nc(0, 2), nc(1, 2)])
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=10)
    nodes.take_events()
    nodes.refresh(grid)  # same activation: nobody asked again
    assert grid.queries_to() == [1000, 1017]
    grid.come_back(1017)
    nodes.refresh(grid)
    nodes.refresh(grid)
    assert grid.queries_to() == [1000, 1017, 1017]
    assert texts(lines)[-2:] == ["asking new node(s) [1017] which partition they hold",
                                 "node 1017 serves partition 1 again"]
    assert nodes.take_events() == ["node 1017 restarted and serves partition 1 again"]
    # another partition under the same id: refused, and its own partition sits out
    grid.come_back(1000, nc(1, 2))
    nodes.refresh(grid)
    why = ("it served partition 0 and now declares partition 1; a node keeps its partition "
           "within a run")
    assert nodes.refused == {1000: why} and nodes.claims[0].node_id == 1000
    assert [c.node_id for c in nodes.live()] == [1017]
    # restarted once more with its own node config: judged on that answer, serves again
    grid.come_back(1000, nc(0, 2))
    nodes.refresh(grid)
    assert nodes.refused == {} and [c.node_id for c in nodes.live()] == [1000, 1017]


def test_an_unknown_activation_time_is_no_restart(clock, lines):
    class Unstamped(Timed):  # Flower leaves last_activated_at empty when it does not know
        def get_nodes(self):
            listed = super().get_nodes()
            if self.calls["get_nodes"] > 1:
                for n in listed:
                    n.last_activated_at = ""
            return listed

    grid = Unstamped(clock, [nc(0, 1)])
    nodes = NodeSet()
    nodes.refresh(grid)
    nodes.refresh(grid)
    nodes.refresh(grid)
    assert grid.queries_to() == [1000] and nodes.activated == {1000: ""}


# -- a round waiting for replies ----------------------------------------------------------------

def talking(clock, delay, pull_interval=None, faults=None, on_wait=None, **grid_args):
    grid = Timed(clock, [nc(0, 2), nc(1, 2)], **grid_args)
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=10)
    grid.delay, grid.synchronous = delay or {}, False
    if pull_interval is not None:
        grid.pull_interval = pull_interval
    return grid, nodes, TalkingGrid(grid, nodes.describe, on_wait)


def test_a_round_pulls_every_3_s_and_says_whose_replies_it_waits_for(clock, lines):
    waits_seen = []
    grid, nodes, tg = talking(clock, {0: 4.0, 1: 20.0}, on_wait=waits_seen.append)
    replies = tg.send_and_receive([query_message(1000), query_message(1017)])
    assert [r.metadata.src_node_id for r in replies] == [1000, 1017]
    # pulled at 0, 3, ..., 21 (Flower's own 3 s): node 1000 at 6, node 1017 at 21
    assert clock.slept == [3.0] * 7 and grid.calls["send_and_receive"] == 0
    assert waits_seen == [grid] * 7  # the wrapped grid, at every pull still waiting
    to_1000, to_1017 = [m.metadata.message_id for m in grid.sent[-2:]]
    assert [sorted(ids) for ids in grid.pulled[-8:]] == ([[to_1000, to_1017]] * 3
                                                         + [[to_1017]] * 5)
    assert [(t, text) for t, _, text in lines if "replies" in text] == [
        (15, "waiting for 1 of 2 replies: partition 1 (node 1017); 15 s so far")]


def test_a_round_with_a_timeout_gives_up_on_time(clock, lines):
    grid, nodes, tg = talking(clock, {0: 0.0, 1: math.inf})
    grid.add_node(nc(1, 2))  # partition 1 moves to node 1034, which then never answers either
    nodes.refresh(grid)
    grid.delay[2] = math.inf
    messages = [query_message(1000), query_message(1017), query_message(1034)]
    replies = tg.send_and_receive(messages, timeout=31)
    assert [r.metadata.src_node_id for r in replies] == [1000]
    # pulls at 0, 3, ..., 30, then 1 s to the deadline: the last pull exactly at 31 s
    assert clock.slept == [3.0] * 10 + [1.0] and clock.elapsed == 31
    assert [(t, text) for t, _, text in lines if "replies" in text] == [
        (15, "waiting for 2 of 3 replies: node 1017, partition 1 (node 1034); 15 s so far, "
             "giving up in 16 s (run-config key 'round-timeout')"),
        (30, "waiting for 2 of 3 replies: node 1017, partition 1 (node 1034); 30 s so far, "
             "giving up in 1 s (run-config key 'round-timeout')")]


def test_a_slow_refresh_does_not_sleep_past_the_deadline(clock, lines):
    # reading the nodes between pulls takes 2 s here: the wait to a 1 s deadline is 0 s, not
    # negative (time.sleep would raise) nor a pull interval
    def slow_refresh(grid):
        clock.now += 2

    grid, nodes, tg = talking(clock, {0: math.inf, 1: math.inf}, pull_interval=0.5,
                              on_wait=slow_refresh)
    assert tg.send_and_receive([query_message(1000)], timeout=1) == []
    assert clock.slept == [0.0] and clock.elapsed == 2


def test_a_round_uses_the_grids_pull_interval_and_the_default_names(clock, lines):
    grid, nodes, _ = talking(clock, {0: 1.0, 1: 1.2}, pull_interval=0.5)
    tg = TalkingGrid(grid)  # no describe: nodes by id; no on_wait
    replies = tg.send_and_receive([query_message(1017), query_message(1000)], timeout=None)
    assert [r.metadata.src_node_id for r in replies] == [1000, 1017]
    assert clock.slept == [0.5] * 3 and not [text for _, _, text in lines if "replies" in text]
    grid.delay = {0: 16.0, 1: 0.0}
    tg.send_and_receive([query_message(1000)])
    assert [text for _, _, text in lines if "replies" in text] == [
        "waiting for 1 of 1 replies: node 1000; 15 s so far"]


def test_a_round_waits_only_for_messages_the_grid_took(clock, lines):
    grid, nodes, tg = talking(clock, {0: 0.0, 1: 6.0})
    grid.unpushed = {1}  # Flower's grid returns None for a message it could not push
    replies = tg.send_and_receive([query_message(1000), query_message(1017)], timeout=60)
    assert [r.metadata.src_node_id for r in replies] == [1000] and clock.slept == []


def test_a_synchronous_grid_or_no_message_is_handed_to_the_grid(clock, lines):
    grid, nodes, tg = talking(clock, None)
    grid.synchronous = True  # the in-process grid: every reply is there after the push
    replies = tg.send_and_receive([query_message(1017)], timeout=5)
    assert [r.metadata.src_node_id for r in replies] == [1017]
    assert grid.timeouts == [5] and clock.slept == []  # with the round's timeout
    grid.synchronous = False
    assert tg.send_and_receive([], timeout=7) == []
    assert grid.timeouts == [5, 7] and clock.slept == []


class Remote:
    """A grid as Flower's own (HttpGrid): no ``synchronous`` attribute; it relays to a Timed
    grid."""

    def __init__(self, grid: Timed):
        self.grid = grid

    def push_messages(self, messages):
        return self.grid.push_messages(messages)

    def pull_messages(self, message_ids):
        return self.grid.pull_messages(message_ids)

    def send_and_receive(self, messages, *, timeout=None):
        return self.grid.send_and_receive(messages, timeout=timeout)


def test_a_grid_that_does_not_say_it_is_synchronous_is_waited_on(clock, lines):
    grid, nodes, _ = talking(clock, {0: 5.0, 1: 0.0})
    tg = TalkingGrid(Remote(grid), nodes.describe)
    replies = tg.send_and_receive([query_message(1000)], timeout=60)
    assert [r.metadata.src_node_id for r in replies] == [1000]
    assert grid.timeouts == [] and clock.slept == [3.0, 3.0]  # pulled at 0, 3 and 6 s


def test_a_node_connecting_during_a_round_is_asked_then(clock, lines):
    """``on_wait`` is NodeSet.refresh in the server: a device that connects while a round
    waits (here partition 1's, restarted under a new id at 4 s) is asked at the next pull (6 s)
    and serves from the next round."""
    grid, nodes, _ = talking(clock, {0: 0.0, 1: 9.0})
    grid.at = [(4, lambda g: g.add_node(nc(1, 2)))]
    tg = TalkingGrid(grid, nodes.describe, nodes.refresh)
    tg.send_and_receive([query_message(1000), query_message(1017)], timeout=60)
    assert clock.elapsed == 9 and grid.queries_to()[-1] == 1034
    assert (6, "INFO", "asking new node(s) [1034] which partition they hold") in lines
    assert [c.node_id for c in nodes.live()] == [1000, 1034]


def test_the_talking_grid_passes_everything_else_through(clock):
    class WithRun(Timed):
        def set_run(self, run):
            self._run = run

        @property
        def run(self):
            return self._run

    grid = WithRun(clock, [nc(0, 2)])
    tg = TalkingGrid(grid)
    tg.set_run("run 7")
    assert tg.run == "run 7"
    content = RecordDict({"config": ConfigRecord({"want": "info"})})
    msg = tg.create_message(content, MessageType.QUERY, 1000, "g4", ttl=90.0)
    assert (msg.content, msg.metadata.message_type, msg.metadata.dst_node_id,
            msg.metadata.group_id, msg.metadata.ttl) == (content, "query", 1000, "g4", 90.0)
    assert tg.get_node_ids() == [1000]
    assert [(n.node_id, n.last_activated_at) for n in tg.get_nodes()] == [(1000, "1")]
    assert tg.push_messages([msg]) == ["m1"]
    [reply] = tg.pull_messages(["m1"])
    assert NodeAnswer.from_message(reply).partition_id == 0
