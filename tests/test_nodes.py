"""Which node serves which partition: replies matched by message id, a client set that follows
the nodes Flower lists as online (restarts, late joins, dead nodes), and waits that say what
they wait for. In-process (the real ServerApp logic and ClientApp through the in-process grid,
whose nodes come and go as on a SuperLink); tests/test_deployment.py does the same with real
SuperLink and SuperNode processes."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from flwr.app import Error, Message, MessageType, RecordDict

from fedtune_app.apps.client_app import app as client_app
from fedtune_app.apps.server import run_federation
from fedtune_app.federated import nodes as nodes_module
from fedtune_app.federated.flower_private import SUPERLINK_NODE_ID, ErrorCode
from fedtune_app.federated.nodes import NodeSet, TalkingGrid, error_text, match_replies
from fedtune_app.federated.wire import TrainTask, query_message
from fedtune_app.methods import resolve_config
from inprocess import InProcessGrid
from runs import TINY


def node_config(pid: int, num: int = 3, **extra) -> dict:
    return {"partition-id": pid, "num-partitions": num} | extra


def sent_message(grid: InProcessGrid, node: int, mid: str) -> Message:
    """A message as the grid leaves it after sending: its id stamped."""
    msg = query_message(node)
    msg.metadata.__dict__["_message_id"] = mid
    return msg


def superlink_reply(msg: Message) -> Message:
    """What Flower 1.41's and 1.42's SuperLink returns for a message to a node gone offline."""
    reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"),
                    reply_to=msg)
    reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID
    return reply


def test_replies_are_matched_by_the_message_they_answer():
    grid = InProcessGrid(client_app, [], {})  # sets Flower's task identity for Message()
    a, b = sent_message(grid, 501, "ma"), sent_message(grid, 502, "mb")
    ok = Message(RecordDict(), reply_to=a)
    ok.metadata.__dict__["_src_node_id"] = 501
    unavailable = superlink_reply(b)  # sender: node 1, not 502
    again = Message(RecordDict(), reply_to=a)
    again.metadata.__dict__["_src_node_id"] = 501
    foreign = Message(RecordDict(), reply_to=b)
    foreign.metadata.__dict__["_src_node_id"] = 777  # neither 502 nor the SuperLink
    unknown = Message(RecordDict(), reply_to=sent_message(grid, 501, "m-old"))
    unknown.metadata.__dict__["_src_node_id"] = 501
    matched, ignored = match_replies({"ma": 501, "mb": 502},
                                     [ok, unavailable, again, foreign, unknown])
    assert [(mid, reply) for mid, reply in matched] == [("ma", ok), ("mb", unavailable)]
    assert ignored == ["node 501: a repeated reply (the first one counts)",
                       "node 777: a reply to the message sent to node 502",
                       "node 501: a reply to message 'm-old', which this round did not send"]
    # the SuperLink's error is the failure of node 502, with Flower's code and reason
    assert error_text(unavailable, 502) == ("Error: Node Unavailable (node 502, Flower error 5 "
                                            "NODE_UNAVAILABLE, reported by the SuperLink)")


def train_script(grid_class):
    """An in-process grid that runs ``script[r](grid)`` just before delivering round r's
    training messages (the nodes then change as they would on a SuperLink mid-round)."""

    class Scripted(grid_class):
        def __init__(self, *args, script, **kwargs):
            super().__init__(*args, **kwargs)
            self.script = dict(script)

        def push_messages(self, messages):
            messages = list(messages)
            for m in messages:
                if m.metadata.message_type == MessageType.TRAIN:
                    self.script.pop(TrainTask.from_message(m).server_round, lambda g: 0)(self)
            return super().push_messages(messages)

    return Scripted


def test_restarted_late_and_dead_nodes_round_by_round(tmp_path, caplog):
    """Partitions 0 and 1 start (min-nodes=2 of 3 declared). During round 1 partition 2's node
    connects late; in round 2 partition 1's node dies (the SuperLink answers for it) and comes
    back under a new id; in round 3 partition 2's node dies; round 4 sends it nothing."""
    rc = TINY | {"results-dir": str(tmp_path), "num-server-rounds": 4, "min-nodes": 2}
    ids = {}

    def late(grid):
        ids["late"] = grid.add_node(node_config(2))

    def restart(grid):
        grid.go_offline(grid.node_ids[1])
        ids["restarted"] = grid.add_node(node_config(1))

    def die(grid):
        grid.go_offline(ids["late"])

    grid = train_script(InProcessGrid)(client_app, [node_config(0), node_config(1)], rc,
                                       script={1: late, 2: restart, 3: die})
    first = list(grid.node_ids)
    with caplog.at_level(logging.INFO, logger="fedtune"):
        folder = Path(run_federation(grid, resolve_config(rc)))
    metrics = json.loads((folder / "metrics.json").read_text())
    n0, n1, n2, n1b = first[0], first[1], ids["late"], ids["restarted"]
    served = [{int(p): n for p, n in m["nodes"].items()} for m in metrics]
    assert served == [{0: n0, 1: n1}, {0: n0, 1: n1, 2: n2}, {0: n0, 1: n1b, 2: n2},
                      {0: n0, 1: n1b}]
    assert [m["clients"] for m in metrics] == [[0, 1], [0, 1, 2], [0, 1, 2], [0, 1]]
    assert [m["offline"] for m in metrics] == [[], [], [], [2]]
    # round 2: the SuperLink's reply for the dead node is node n1's failure, not node 1's
    assert metrics[1]["errors"] == {"1": {"node": n1, "code": ErrorCode.NODE_UNAVAILABLE,
                                          "name": "NODE_UNAVAILABLE",
                                          "reason": "Error: Node Unavailable"}}
    assert f"node {n1}, Flower error 5 NODE_UNAVAILABLE" in metrics[1]["rejected"]["1"]
    assert metrics[1]["ignored"] == []
    assert f"rejected client 1 (node {n1})" in caplog.text and "ignored node 1" not in caplog.text
    # round 3: the restarted node trained partition 1 (its reply counted), round 4 again
    for m in metrics[2:]:
        assert "1" in m["client-metrics"] and "1" not in m["rejected"]
    assert metrics[2]["membership"] == [f"node {n1b} took partition 1 over from node {n1}"]
    assert metrics[3]["rejected"] == {}  # partition 2 was not sent work once offline
    train_to = [m.metadata.dst_node_id for m in grid.sent
                if m.metadata.message_type == MessageType.TRAIN]
    assert train_to.count(n1) == 2 and train_to.count(n1b) == 2 and train_to.count(n2) == 2
    # config.json at the end: every partition, with the node that served it last
    clients = json.loads((folder / "config.json").read_text())["clients"]
    assert [(c["partition_id"], c["node_id"]) for c in clients] == [(0, n0), (1, n1b), (2, n2)]


def test_two_live_nodes_claiming_one_partition_the_newest_serves_it(caplog):
    """The documented rule: the node that declared a partition last serves it; the one it
    replaces is sent no more work, and the log names both."""
    rc = TINY | {"capacities": "4,2"}
    grid = InProcessGrid(client_app, [node_config(0, 2), node_config(1, 2)], rc)
    nodes = NodeSet()
    with caplog.at_level(logging.INFO, logger="fedtune"):
        assert [c.node_id for c in nodes.gather(grid, 0, timeout=60)] == grid.node_ids
        old = grid.node_ids[1]
        new = grid.add_node(node_config(1, 2))  # a second device declaring partition 1
        nodes.refresh(grid)
    assert sorted(grid.get_node_ids()) == sorted([grid.node_ids[0], old, new])  # all online
    assert [c.node_id for c in nodes.live()] == [grid.node_ids[0], new]
    assert f"node {new} now serves partition 1 in place of node {old}" in caplog.text
    assert "(Flower still lists it as online)" in caplog.text
    # a node taking a partition over must declare it as it was first declared
    other = grid.add_node(node_config(1, 2, capacity=1))  # partition 1 started with capacity 2
    nodes.refresh(grid)
    assert nodes.claims[1].node_id == new
    assert nodes.refused[other] == ("it declares partition 1 with capacity=1 (was 2); start it "
                                    "with the node config the partition first had")
    wrong = grid.add_node(node_config(2, 4, capacity=1))  # a partition of another split
    nodes.refresh(grid)
    assert nodes.refused[wrong] == "it declares num-partitions=4, the federation has 2"
    assert sorted(nodes.claims) == [0, 1]


def test_a_restart_under_the_same_id_is_asked_again(caplog):
    """With SuperNode authentication a restarted device keeps its node id; Flower shows it
    activated anew, so the server asks it again: same partition, it serves again; another
    partition, it is refused (a node keeps its partition within a run) and sent no work."""
    grid = InProcessGrid(client_app, [node_config(0, 2), node_config(1, 2)],
                         TINY | {"capacities": "4,2"})
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=60)
    n0, n1 = grid.node_ids
    grid.go_offline(n1)
    nodes.refresh(grid)
    assert [c.partition_id for c in nodes.live()] == [0]
    queries = len(grid.sent)
    grid.come_back(n1)
    with caplog.at_level(logging.INFO, logger="fedtune"):
        nodes.refresh(grid)
    assert len(grid.sent) == queries + 1 and grid.sent[-1].metadata.dst_node_id == n1
    assert nodes.take_events()[-1] == f"node {n1} restarted and serves partition 1 again"
    assert [c.node_id for c in nodes.live()] == [n0, n1]
    grid.go_offline(n0)
    grid.come_back(n0, node_config(1, 2))  # same key, the node config of another device
    nodes.refresh(grid)
    assert nodes.refused[n0] == ("it served partition 0 and now declares partition 1; a node "
                                 "keeps its partition within a run")
    assert [c.node_id for c in nodes.live()] == [n1]


def test_waiting_for_nodes_says_what_is_missing(monkeypatch, caplog):
    """min-nodes=0 waits for every partition the nodes declare; the wait logs how many are
    served, which are missing and the deadline, and gives up at 'round-timeout'."""
    monkeypatch.setattr(nodes_module, "NODE_WAIT_LOG_SECONDS", 0.5)
    grid = InProcessGrid(client_app, [node_config(0), node_config(2)], TINY)
    with caplog.at_level(logging.INFO, logger="fedtune"), \
            pytest.raises(RuntimeError, match=r"gave up after 2 s \(run-config key "
                                              r"'round-timeout'\): 2 of 3 partitions served"):
        NodeSet().gather(grid, 0, timeout=2.0)
    said = [r.getMessage() for r in caplog.records if "waiting for the nodes" in r.getMessage()]
    assert said and all("2 of 3 partitions served so far" in w and "giving up in" in w
                        for w in said)
    ids = [r.getMessage() for r in caplog.records if r.getMessage().startswith("nodes so far")]
    assert len(ids) == len(said) and all("missing partitions [1]" in w for w in ids)
    grid.add_node(node_config(1))
    assert [c.partition_id for c in NodeSet().gather(grid, 0, timeout=2.0)] == [0, 1, 2]
    assert len(NodeSet().gather(grid, 2, timeout=2.0)) == 3  # met: takes what answered


def test_a_failing_start_up_query_names_its_node():
    grid = InProcessGrid(client_app, [node_config(0, 2), {"partition-id": 1}],
                         TINY | {"capacities": "4,2"})
    with pytest.raises(RuntimeError, match=rf"node {grid.node_ids[1]} failed the query: "
                                           r"ConfigError: node config lacks 'num-partitions'"):
        NodeSet().gather(grid, 0, timeout=60)


def test_a_round_waiting_for_replies_says_whose(monkeypatch, caplog):
    """Flower's push-then-pull wait, with a line naming the partitions it still waits for."""
    monkeypatch.setattr(nodes_module, "REPLY_WAIT_LOG_SECONDS", 0.2)

    class Slow(InProcessGrid):
        synchronous, pull_interval = False, 0.1

    silent = []  # once set, node 1 never answers
    grid = Slow(client_app, [node_config(0, 2), node_config(1, 2)], TINY | {"capacities": "4,2"},
                faults={1: lambda msg, reply: None if silent else reply})
    nodes = NodeSet()
    nodes.gather(grid, 0, timeout=60)
    silent.append(True)
    talking = TalkingGrid(grid, nodes.describe)
    messages = [sent_message(grid, n, "") for n in grid.node_ids]
    with caplog.at_level(logging.INFO, logger="fedtune"):
        replies = talking.send_and_receive(messages, timeout=1.0)
    assert [r.metadata.src_node_id for r in replies] == [grid.node_ids[0]]
    waits = [r.getMessage() for r in caplog.records if "replies" in r.getMessage()]
    assert waits and all(w.startswith(f"waiting for 1 of 2 replies: partition 1 (node "
                                      f"{grid.node_ids[1]})") for w in waits)
