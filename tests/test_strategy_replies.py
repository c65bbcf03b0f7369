"""The server's reply handling, one round at a time without training: a strategy of the smoke
preset's config over a hand-made 3-block state sends its train tasks (``configure_train``) and
gets back hand-made replies, real Flower ``Message``s built with the wire helpers
(``aggregate_train``). Which replies are rejected and why, what the round's metrics say, and the
new global state, a masked example-weighted mean worked out by hand below.

The clients: partition 0 (node 101, 30 examples) trains blocks 0, 1, 2; partition 1 (node 102,
20 examples) blocks 0, 1; partition 2 (node 103, 10 examples) block 0; everyone the head."""

from __future__ import annotations

import logging
import math

import numpy as np
import pytest
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from fedtune_app.federated.aggregation import ClientUpdate
from fedtune_app.federated.allocation import prefix_plans, random_plans
from fedtune_app.federated.flower_private import SUPERLINK_NODE_ID, ErrorCode, TaskIdentity
from fedtune_app.federated.nodes import NodeSet
from fedtune_app.federated.records import from_record, to_record
from fedtune_app.federated.robust import dp_combine, dp_epsilon, dp_noise_entropy
from fedtune_app.federated.strategy import ClientInfo, LayerPlanStrategy
from fedtune_app.federated.wire import NodeAnswer, TrainReply, TrainTask
from fedtune_app.methods import recipe_for, resolve_config, strategy_class
from inprocess import InProcessGrid

B0, B1, B2, HEAD = "blocks.0.w", "blocks.1.w", "blocks.2.w", "head.bias"
CLIENTS = [ClientInfo(101, 0, 3, 30, "a"), ClientInfo(102, 1, 2, 20, "b"),
           ClientInfo(103, 2, 1, 10, "c")]
EXAMPLES = {0: 30, 1: 20, 2: 10}
LOSSES = {0: 0.9, 1: 0.6, 2: 0.3}


def f32(*values) -> np.ndarray:
    return np.array(values, np.float32)


STATE = {B0: f32(1, 2), B1: f32(0, 4), B2: f32(3, 3), HEAD: f32(0.5, -0.5)}
# what each client sends back (values, not updates); every update passes screening
TRAINED = {0: {B0: f32(1.5, 2), B1: f32(2, 4), B2: f32(2, 5), HEAD: f32(1, 0)},
           1: {B0: f32(0, 2.5), B1: f32(-1.5, 4.5), HEAD: f32(0.5, 0.25)},
           2: {B0: f32(4.5, 1), HEAD: f32(0.5, -1.5)}}
# the masked mean weighted by 30, 20, 10 examples over each tensor's holders
ALL = {B0: [(30 * 1.5 + 20 * 0 + 10 * 4.5) / 60, (30 * 2 + 20 * 2.5 + 10 * 1) / 60],  # 1.5, 2
       B1: [(30 * 2 - 20 * 1.5) / 50, (30 * 4 + 20 * 4.5) / 50],  # 0.6, 4.2 (0 and 1 hold it)
       B2: [2, 5],  # partition 0 alone
       HEAD: [(30 * 1 + 20 * 0.5 + 10 * 0.5) / 60, (0 + 20 * 0.25 - 10 * 1.5) / 60]}  # .75, -1/6
# partition 1's reply rejected: 0 and 2 only, weights 30 and 10
WITHOUT_1 = {B0: [(30 * 1.5 + 10 * 4.5) / 40, (30 * 2 + 10 * 1) / 40],  # 2.25, 1.75
             B1: [2, 4],  # partition 0 alone
             B2: [2, 5],
             HEAD: [(30 * 1 + 10 * 0.5) / 40, (0 - 10 * 1.5) / 40]}  # 0.875, -0.375
# the .npy bytes of a 2-vector of float32 (128-byte header + 8 bytes) plus the name's length
BYTES = {0: 4 * 136 + 3 * len(B0) + len(HEAD), 1: 3 * 136 + 2 * len(B0) + len(HEAD),
         2: 2 * 136 + len(B0) + len(HEAD)}  # 583, 437, 291


class Prefix(LayerPlanStrategy):
    """Fixed plans (the depth baselines' allocation: client i trains its first L_i blocks), so
    that every mean below is worked out by hand."""

    name = "prefix"

    def plan_round(self, server_round, clients):
        return prefix_plans([c.capacity for c in clients], self.num_layers)


def config(**keys):
    return resolve_config({"preset": "smoke", "capacities": "3,2,1", "seed": 7, **keys})


def start(cls=Prefix, clients=CLIENTS, cfg=None, server_round=1, **keys):
    """A strategy that has sent round ``server_round``'s tasks: (strategy, partition -> task)."""
    strategy = cls(cfg or config(**keys), list(clients), 3, dict(STATE))
    return strategy, send(strategy, server_round)


def send(strategy, server_round=1, grid=None) -> dict[int, Message]:
    messages = strategy.configure_train(server_round, ArrayRecord(), ConfigRecord(), grid)
    for m in messages:  # what the SuperLink does on pushing a message
        m.metadata.__dict__["_message_id"] = m.object_id
    pid = {c.node_id: c.partition_id for c in strategy.clients}
    return {pid[m.metadata.dst_node_id]: m for m in messages}


def stamped(reply: Message) -> Message:
    reply.metadata.__dict__["_message_id"] = reply.object_id
    return reply


def answer(task: Message, tensors: dict, num_examples, loss=0.5, metrics=None) -> Message:
    return stamped(TrainReply(to_record(tensors), num_examples, loss,
                              metrics or {}).to_message(task))


def sound(task: Message, pid: int, tensors=None) -> Message:
    return answer(task, TRAINED[pid] if tensors is None else tensors, EXAMPLES[pid],
                  LOSSES[pid], {"fit-seconds": 2.0 + pid})


def sound_replies(tasks) -> list[Message]:
    return [sound(task, pid) for pid, task in tasks.items()]


def assert_state(state: dict, expected: dict, ulps: float = 0.5) -> None:
    assert sorted(state) == sorted(STATE)
    for name, value in state.items():
        assert value.dtype == np.float32, name
        want = expected.get(name, STATE[name])
        # a float64 mean rounded once to float32: within half a float32 ulp (2^-24 relative)
        np.testing.assert_allclose(value, want, rtol=ulps * 2.0 ** -23, atol=0, err_msg=name)


@pytest.fixture(autouse=True)
def server_process():
    """Who creates the messages: a ServerApp of run 7 (as Flower's server runtime sets it)."""
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 7, SUPERLINK_NODE_ID, 1


class Said(logging.Handler):
    """fedtune's log lines during a test (its own handler: the logger may not propagate to the
    root, ``setup_logging``)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    @property
    def warnings(self) -> list[str]:
        """The warnings."""
        return [r.getMessage() for r in self.records if r.levelno == logging.WARNING]

    @property
    def infos(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno == logging.INFO]


@pytest.fixture
def logged():
    said, logger = Said(), logging.getLogger("fedtune")
    level = logger.level
    logger.addHandler(said)
    logger.setLevel(logging.INFO)
    yield said
    logger.removeHandler(said)
    logger.setLevel(level)


# -- what is sent ----------------------------------------------------------------------------

def test_each_client_is_sent_its_planned_blocks_and_the_head():
    # clients given out of order: the strategy keeps them by partition id
    strategy, tasks = start(clients=CLIENTS[::-1])
    entry = strategy.history[-1]
    assert entry.round == 1 and entry.method_metrics == {}
    assert entry.plans == {0: (0, 1, 2), 1: (0, 1), 2: (0,)}
    assert entry.capacities == {0: 3, 1: 2, 2: 1}
    assert entry.nodes == {0: 101, 1: 102, 2: 103}
    assert entry.bytes_down == sum(BYTES.values()) == 1311
    names = {0: [B0, B1, B2, HEAD], 1: [B0, B1, HEAD], 2: [B0, HEAD]}
    assert strategy.payload_names(entry) == names
    for pid, msg in tasks.items():
        task = TrainTask.from_message(msg)
        assert msg.metadata.dst_node_id == 101 + pid
        assert msg.metadata.group_id == "1"
        assert task.layers == entry.plans[pid] and task.server_round == 1
        assert task.max_batches == 0 and "max-batches" not in task.config()
        received = from_record(task.arrays)
        assert list(received) == names[pid]
        for name, value in received.items():
            np.testing.assert_array_equal(value, STATE[name])
            assert value.dtype == np.float32


def test_a_resumed_run_numbers_its_rounds_on(logged):
    strategy = Prefix(config(**{"dp-noise-multiplier": 1.0, "dp-noise-seed": 5}),
                      CLIENTS, 3, dict(STATE))
    strategy.round_offset = 4  # 4 rounds done before this process started
    tasks = send(strategy, 1)
    assert strategy.history[-1].round == 5
    assert {TrainTask.from_message(m).server_round for m in tasks.values()} == {5}
    del tasks[2]
    strategy.aggregate_train(1, sound_replies(tasks))
    # the DP budget after 5 rounds, every client sampled
    assert strategy.history[-1].method_metrics["dp-epsilon"] == pytest.approx(
        dp_epsilon(strategy.cfg.robust, 5, 1.0), rel=1e-12)
    assert logged.warnings == [
        "round 5: no reply from client 2 (node 103)"]


def test_the_batch_cap_is_the_smallest_clients_batches_plus_one():
    # the smallest client has 10 examples: ceil(10 / 4) + 1 = 4 batches of 4 per epoch
    _, tasks = start(**{"fedra-repo-batch-cap": True, "batch-size": 4})
    assert {TrainTask.from_message(m).max_batches for m in tasks.values()} == {4}
    _, tasks = start(**{"fedra-repo-batch-cap": True, "batch-size": 3})  # ceil(10 / 3) + 1
    assert {TrainTask.from_message(m).max_batches for m in tasks.values()} == {5}


def test_sampled_clients_and_dynamic_capacities_come_from_their_own_seeded_streams():
    # 2 of the 3 clients: a draw without replacement from the sampling stream [seed, 1]
    strategy, tasks = start(**{"clients-per-round": 2})
    picked = sorted(np.random.default_rng([7, 1]).choice(3, size=2, replace=False).tolist())
    assert sorted(tasks) == sorted(strategy.history[-1].plans) == picked
    # as many as there are clients, or 0: all of them, in partition order
    for k in (3, 0):
        strategy, tasks = start(**{"clients-per-round": k})
        assert list(tasks) == [0, 1, 2]
    # dynamic capacities ~ U[1, L_i] from the capacity stream [seed, 2], two rounds
    strategy, tasks = start(**{"dynamic-capacities": True})
    rng = np.random.default_rng([7, 2])
    for server_round in (1, 2):
        drawn = [int(rng.integers(1, c + 1)) for c in (3, 2, 1)]
        entry = strategy.history[-1]
        assert entry.capacities == dict(enumerate(drawn))
        assert entry.plans == {p: tuple(range(k)) for p, k in enumerate(drawn)}
        tasks = send(strategy, server_round + 1)


def test_per_domain_sampling_draws_one_client_of_each_domain():
    # domains in order of their first partition: z (partitions 0, 1), then a (2, 3)
    clients = [ClientInfo(110 + p, p, 1, 10, g) for p, g in enumerate("zzaa")]
    cfg = config().replace(**{"client-sampling": "per-domain"})  # smoke data has no domains
    strategy = Prefix(cfg, clients[::-1], 3, dict(STATE))
    rng = np.random.default_rng([7, 1])
    for server_round in (1, 2, 3):
        expected = [0 + rng.integers(2), 2 + rng.integers(2)]
        assert sorted(send(strategy, server_round)) == expected


class Hooks(LayerPlanStrategy):
    """A method that uses every hook with its arguments."""

    name = "hooks"

    def begin_round(self, server_round):
        return {"began": server_round}

    def plan_round(self, server_round, clients):  # a curriculum: at most server_round blocks
        return [tuple(range(min(c.capacity, server_round))) for c in clients]

    def client_payload(self, client, plan):  # partition 2 has a head of its own
        return [n for n in self.payload(plan) if (client.partition_id, n) != (2, HEAD)]

    def reply_names(self, client, names):  # partition 1 keeps block 0 frozen: not sent back
        return [n for n in names if (client.partition_id, n) != (1, B0)]

    def train_config(self, client, plan):
        return {"depth": len(plan), "partition": client.partition_id}


def test_a_method_decides_plans_payloads_replies_and_config_per_client_and_round():
    strategy = Hooks(config(), CLIENTS, 3, dict(STATE))
    strategy.round_offset = 1  # Flower's round 1 is the run's round 2
    tasks = send(strategy, 1)
    entry = strategy.history[-1]
    assert entry.method_metrics == {"began": 2}
    assert entry.plans == {0: (0, 1), 1: (0, 1), 2: (0,)}
    sent = {p: list(from_record(TrainTask.from_message(t).arrays)) for p, t in tasks.items()}
    assert sent == {0: [B0, B1, HEAD], 1: [B0, B1, HEAD], 2: [B0]}
    assert strategy.payload_names(entry) == {0: [B0, B1, HEAD], 1: [B1, HEAD], 2: [B0]}
    for p, t in tasks.items():
        task = TrainTask.from_message(t)
        assert task.extras == {"depth": len(entry.plans[p]), "partition": p}
        assert task.layers == entry.plans[p] and task.server_round == 2
    replies = [sound(tasks[0], 0, {n: TRAINED[0][n] for n in (B0, B1, HEAD)}),
               sound(tasks[1], 1, {n: TRAINED[1][n] for n in (B1, HEAD)}),
               sound(tasks[2], 2, {B0: TRAINED[2][B0]})]
    strategy.aggregate_train(1, replies)
    assert entry.rejected == {}
    assert_state(strategy.state, {B0: WITHOUT_1[B0], B1: ALL[B1],  # B0: partitions 0 and 2
                                  HEAD: [(30 * 1 + 20 * 0.5) / 50, (20 * 0.25) / 50]})
    # block 0 back from partition 1 anyway, the head from partition 2: not theirs to send
    strategy = Hooks(config(), CLIENTS, 3, dict(STATE))
    tasks = send(strategy, 2)
    strategy.aggregate_train(2, [sound(tasks[1], 1, TRAINED[1]),
                                 sound(tasks[2], 2, TRAINED[2])])
    assert strategy.history[-1].rejected == {
        0: "no reply (failed, timed out or dropped)",
        1: f"tensors outside its plan ['{B0}']", 2: f"tensors outside its plan ['{HEAD}']"}


def test_a_method_is_told_its_blocks_and_seeded_for_its_own_draws():
    # FedRA draws its plans from the run's seed (its own stream); clients are sampled from
    # another, so FedRA and a method that draws nothing sample the same clients every round
    cfg = config(**{"clients-per-round": 2})
    fedra = strategy_class(cfg)(cfg, CLIENTS, 3, dict(STATE))
    other = Prefix(cfg, CLIENTS, 3, dict(STATE))
    assert fedra.name == "fedra" and fedra.eval_plan() == (0, 1, 2)
    rng = np.random.default_rng(7)
    for server_round in (1, 2, 3):
        tasks = send(fedra, server_round)
        assert sorted(tasks) == sorted(send(other, server_round))
        expected = random_plans([CLIENTS[p].capacity for p in sorted(tasks)], 3, rng)
        assert [fedra.history[-1].plans[p] for p in sorted(tasks)] == expected


# -- a sound round ---------------------------------------------------------------------------

def test_sound_replies_are_aggregated_by_the_masked_example_weighted_mean(logged):
    strategy, tasks = start()
    arrays, metrics = strategy.aggregate_train(1, sound_replies(tasks)[::-1])  # any order
    entry = strategy.history[-1]
    assert_state(strategy.state, ALL)
    assert_state(from_record(arrays), ALL)
    assert entry.rejected == {} and entry.errors == {} and entry.ignored == []
    assert entry.state_updated
    assert entry.bytes_up == 1311
    assert entry.client_metrics == {
        p: {"num-examples": EXAMPLES[p], "train-loss": LOSSES[p], "fit-seconds": 2.0 + p}
        for p in (0, 1, 2)}
    loss = (30 * 0.9 + 20 * 0.6 + 10 * 0.3) / 60  # 0.7, weighted by examples
    assert entry.train_loss == pytest.approx(loss, rel=1e-15)
    assert dict(metrics) == pytest.approx({"train-loss": loss, "valid-replies": 3,
                                           "rejected-replies": 0, "ignored-replies": 0,
                                           "state-updated": 1}, rel=1e-15)
    assert "dp-epsilon" not in entry.method_metrics and logged.warnings == []


def test_the_next_round_starts_from_the_new_state():
    strategy, tasks = start()
    strategy.aggregate_train(1, sound_replies(tasks))
    tasks = send(strategy, 2)
    assert len(strategy.history) == 2 and strategy.history[-1].round == 2
    received = from_record(TrainTask.from_message(tasks[0]).arrays)
    assert_state(received, ALL)
    # round 2: partition 0 moves block 2 to (1, 1); the rest replay round 1's values
    replies = [sound(tasks[0], 0, TRAINED[0] | {B2: f32(1, 1)}), sound(tasks[1], 1),
               sound(tasks[2], 2)]
    _, metrics = strategy.aggregate_train(2, replies)
    assert metrics["valid-replies"] == 3
    assert strategy.history[0].rejected == {} and strategy.history[1].rejected == {}
    assert_state(strategy.state, ALL | {B2: [1, 1]})


def test_every_client_counts_once_with_unweighted_means():
    strategy, tasks = start(**{"fedra-repo-unweighted": True})
    _, metrics = strategy.aggregate_train(1, sound_replies(tasks))
    assert_state(strategy.state, {B0: [(1.5 + 0 + 4.5) / 3, (2 + 2.5 + 1) / 3],
                                  B1: [(2 - 1.5) / 2, (4 + 4.5) / 2], B2: [2, 5],
                                  HEAD: [(1 + 0.5 + 0.5) / 3, (0 + 0.25 - 1.5) / 3]})
    # the reported train loss is still the example-weighted one
    assert metrics["train-loss"] == pytest.approx(0.7, rel=1e-15)


# -- rejected replies ------------------------------------------------------------------------

def _outside(task):
    return sound(task, 1, TRAINED[1] | {B2: f32(3, 3)})


def _missing(task):
    return sound(task, 1, {n: v for n, v in TRAINED[1].items() if n != HEAD})


def _shape(task):
    return sound(task, 1, TRAINED[1] | {B0: f32(0, 2.5, 1)})


def _dtype(task):
    return sound(task, 1, TRAINED[1] | {B0: np.array([0, 2.5])})


def _nan(task):
    return sound(task, 1, TRAINED[1] | {HEAD: f32(np.nan, 0)})


def _inf(task):
    return sound(task, 1, TRAINED[1] | {B1: f32(0, -np.inf)})


def _error(task):
    return stamped(Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION,
                                 reason="ValueError: boom"), reply_to=task))


def _unavailable(task):
    reply = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"),
                    reply_to=task)
    reply.metadata.__dict__["_src_node_id"] = SUPERLINK_NODE_ID  # the SuperLink answers
    return stamped(reply)


def _config_metrics(task):
    content = RecordDict({"arrays": to_record(TRAINED[1]),
                          "metrics": ConfigRecord({"num-examples": 20, "train-loss": 0.6})})
    return stamped(Message(content, reply_to=task))


def _no_loss(task):
    content = RecordDict({"arrays": to_record(TRAINED[1]),
                          "metrics": MetricRecord({"num-examples": 20})})
    return stamped(Message(content, reply_to=task))


REJECTED = {
    "outside-plan": (_outside, f"tensors outside its plan ['{B2}']"),
    "missing": (_missing, f"missing tensors ['{HEAD}']"),
    "shape": (_shape, f"'{B0}' has shape (3,) dtype float32, expected (2,) float32"),
    "dtype": (_dtype, f"'{B0}' has shape (2,) dtype float64, expected (2,) float32"),
    "nan": (_nan, f"'{HEAD}' has NaN or Inf values"),
    "inf": (_inf, f"'{B1}' has NaN or Inf values"),
    "more-examples": (lambda t: answer(t, TRAINED[1], 21, 0.6),
                      "num-examples = 21 exceeds the 20 it declared at start"),
    "no-examples": (lambda t: answer(t, TRAINED[1], 0, 0.6),
                    "num-examples = 0, expected a positive integer"),
    "nan-loss": (lambda t: answer(t, TRAINED[1], 20, float("nan")),
                 "train-loss = nan, expected a finite number"),
    "inf-loss": (lambda t: answer(t, TRAINED[1], 20, float("-inf")),
                 "train-loss = -inf, expected a finite number"),
    "error": (_error, "client error: ValueError: boom (node 102, Flower error 2 "
                      "CLIENT_APP_RAISED_EXCEPTION)"),
    "unavailable": (_unavailable, "client error: Error: Node Unavailable (node 102, Flower "
                                  "error 5 NODE_UNAVAILABLE, reported by the SuperLink)"),
    "config-metrics": (_config_metrics, "malformed reply (TypeError: expected ArrayRecord "
                                        "'arrays' and MetricRecord 'metrics')"),
    "no-loss": (_no_loss, "malformed reply (KeyError: 'train-loss')"),
    "dropped": (lambda t: None, "no reply (failed, timed out or dropped)"),
}


@pytest.mark.parametrize("fault", list(REJECTED))
def test_a_rejected_reply_never_reaches_the_state(fault, logged):
    make, why = REJECTED[fault]
    strategy, tasks = start()
    bad = make(tasks[1])
    replies = [sound(tasks[0], 0)] + ([] if bad is None else [bad]) + [sound(tasks[2], 2)]
    arrays, metrics = strategy.aggregate_train(1, replies)
    entry = strategy.history[-1]
    assert entry.rejected == {1: why}
    assert_state(strategy.state, WITHOUT_1)
    assert_state(from_record(arrays), WITHOUT_1)
    assert entry.bytes_up == BYTES[0] + BYTES[2]
    assert sorted(entry.client_metrics) == [0, 2]
    loss = (30 * 0.9 + 10 * 0.3) / 40  # 0.75
    assert dict(metrics) == pytest.approx({"train-loss": loss, "valid-replies": 2,
                                           "rejected-replies": 1, "ignored-replies": 0,
                                           "state-updated": 1}, rel=1e-15)
    errors = {"error": {1: {"node": 102, "code": 2, "name": "CLIENT_APP_RAISED_EXCEPTION",
                            "reason": "ValueError: boom"}},
              "unavailable": {1: {"node": 102, "code": 5, "name": "NODE_UNAVAILABLE",
                                  "reason": "Error: Node Unavailable"}}}
    assert entry.errors == errors.get(fault, {})
    said = ("round 1: no reply from client 1 (node 102)" if fault == "dropped" else
            f"round 1: rejected client 1 (node 102): {why}")
    assert logged.warnings == [said]


def test_repeated_and_stray_replies_are_ignored_and_the_first_one_counts(logged):
    strategy, tasks = start()
    replies = sound_replies(tasks)
    # partition 1 answers again (other values); node 102 answers partition 0's task too
    replies.append(sound(tasks[1], 1, TRAINED[1] | {B0: f32(9, 9)}))
    stray = sound(tasks[0], 0)
    stray.metadata.__dict__["_src_node_id"] = 102
    replies.append(stray)
    _, metrics = strategy.aggregate_train(1, replies)
    entry = strategy.history[-1]
    ignored = ["node 102: a repeated reply (the first one counts)",
               "node 102: a reply to the message sent to node 101"]
    assert entry.ignored == ignored
    assert entry.rejected == {}
    assert_state(strategy.state, ALL)
    assert metrics["ignored-replies"] == 2 and metrics["valid-replies"] == 3
    assert logged.warnings == [f"round 1: ignored {why}" for why in ignored]
    # round 2: a late reply to round 1's task is no answer to this round's
    tasks2 = send(strategy, 2)
    late = sound(tasks[2], 2)
    _, metrics = strategy.aggregate_train(2, [sound(tasks2[0], 0), sound(tasks2[1], 1), late])
    entry = strategy.history[-1]
    assert entry.ignored == [f"node 103: a reply to message "
                             f"{tasks[2].metadata.message_id[:12]!r}, which this round did not "
                             "send"]
    assert entry.rejected == {2: "no reply (failed, timed out or dropped)"}


def test_too_few_valid_replies_keep_the_state(logged):
    strategy, tasks = start(**{"min-valid-replies": 3})
    arrays, metrics = strategy.aggregate_train(1, [sound(tasks[0], 0), _nan(tasks[1]),
                                                   sound(tasks[2], 2)])
    entry = strategy.history[-1]
    assert not entry.state_updated
    assert_state(strategy.state, STATE)
    assert_state(from_record(arrays), STATE)
    assert dict(metrics) == pytest.approx({"train-loss": 0.75, "valid-replies": 2,
                                           "rejected-replies": 1, "ignored-replies": 0,
                                           "state-updated": 0}, rel=1e-15)
    assert logged.warnings[-1] == ("round 1: 2 valid replies < min-valid-replies = 3; the "
                                     "global state is unchanged")
    # exactly min-valid-replies valid replies: the state is taken
    strategy, tasks = start(**{"min-valid-replies": 3})
    _, metrics = strategy.aggregate_train(1, sound_replies(tasks))
    assert metrics["state-updated"] == 1
    assert_state(strategy.state, ALL)


def test_without_any_valid_reply_the_train_loss_is_nan():
    strategy, tasks = start()
    _, metrics = strategy.aggregate_train(1, [])
    assert math.isnan(metrics["train-loss"]) and metrics["state-updated"] == 0
    assert metrics["rejected-replies"] == 3
    assert_state(strategy.state, STATE)


# -- screening and the state guard -----------------------------------------------------------

# block 0's updates: (0.25, 0), (0, 0.25), (3, 0): partition 2's norm 3 is above 10 x the median
# 0.25 of its 3 holders; its rms 2.12 is within 5 x rms(1, 2) = 7.9 of the global tensor
OUTLIER = {0: TRAINED[0] | {B0: f32(1.25, 2)}, 1: TRAINED[1] | {B0: f32(1, 2.25)},
           2: TRAINED[2] | {B0: f32(4, 2)}}
OUTLIER_WHY = f"screening: '{B0}': update norm 3 > 10 x the median 0.25 of its 3 holders"


def outlier_replies(tasks):
    return [sound(tasks[p], p, OUTLIER[p]) for p in (0, 1, 2)]


def test_screening_rejects_an_update_far_above_its_peers(logged):
    strategy, tasks = start()
    _, metrics = strategy.aggregate_train(1, outlier_replies(tasks))
    entry = strategy.history[-1]
    assert entry.rejected == {2: OUTLIER_WHY}
    assert metrics["valid-replies"] == 2 and metrics["rejected-replies"] == 1
    # partitions 0 and 1 only, weights 30 and 20
    assert_state(strategy.state, {B0: [(30 * 1.25 + 20 * 1) / 50, (30 * 2 + 20 * 2.25) / 50],
                                  B1: ALL[B1], B2: [2, 5],
                                  HEAD: [(30 * 1 + 20 * 0.5) / 50, (20 * 0.25) / 50]})
    assert metrics["train-loss"] == pytest.approx((30 * 0.9 + 20 * 0.6) / 50, rel=1e-15)
    assert logged.warnings == [f"round 1: rejected client 2: {OUTLIER_WHY}"]


def test_unscreened_tensors_and_screening_off_let_the_outlier_in():
    class Unscreened(Prefix):
        unscreened = (B0,)

    weighted = {B0: [(30 * 1.25 + 20 * 1 + 10 * 4) / 60, (30 * 2 + 20 * 2.25 + 10 * 2) / 60],
                B1: ALL[B1], B2: [2, 5], HEAD: ALL[HEAD]}
    for strategy, tasks in (start(Unscreened), start(**{"screen-updates": False})):
        strategy.aggregate_train(1, outlier_replies(tasks))
        assert strategy.history[-1].rejected == {}
        assert_state(strategy.state, weighted)


def dp_keys(**more):
    return {"dp-noise-multiplier": 0.5, "dp-noise-seed": 5, **more}


def test_under_dp_an_update_is_judged_against_the_global_tensor_only():
    # no peer rule under DP: the outlier's rms 2.12 is within 5 x 1.58
    strategy, tasks = start(**dp_keys())
    _, metrics = strategy.aggregate_train(1, outlier_replies(tasks))
    entry = strategy.history[-1]
    assert entry.rejected == {}
    # DP-FedAvg of the three updates with the run's noise seed, round 1
    cfg = strategy.cfg
    updates = [ClientUpdate(str(p), OUTLIER[p], EXAMPLES[p]) for p in (0, 1, 2)]
    expected = dp_combine(STATE, updates, cfg.robust, dp_noise_entropy(cfg.robust), 1)
    for name in STATE:
        np.testing.assert_array_equal(strategy.state[name], expected[name], err_msg=name)
    assert entry.method_metrics["dp-epsilon"] == pytest.approx(
        dp_epsilon(cfg.robust, 1, 1.0), rel=1e-12)
    # 2 of the 3 clients sampled: the sampling rate 2/3 (round 2 here)
    strategy, tasks = start(server_round=2, **dp_keys(**{"clients-per-round": 2}))
    strategy.aggregate_train(2, [sound(t, p) for p, t in tasks.items()])
    assert strategy.history[-1].method_metrics["dp-epsilon"] == pytest.approx(
        dp_epsilon(cfg.robust, 2, 2 / 3), rel=1e-12)


class Jumps(Prefix):
    """A method whose aggregate moves block 2 by 100 (a broken server step)."""

    def aggregate(self, updates):
        new = super().aggregate(updates)
        return new | {B2: new[B2] + np.float32(100)}


class NaNs(Prefix):
    """A method whose aggregate is not finite."""

    def aggregate(self, updates):
        return super().aggregate(updates) | {HEAD: f32(np.nan, 0)}


# block 2 moves by (99, 102) - rms 100.5 - from (3, 3): rms 3, largest accepted update (-1, 2)
JUMP_WHY = (f"'{B2}' moved by rms 101 > max(5 x max(rms before 3, 0.1), the largest accepted "
            "update's rms 1.58)")


def test_a_new_state_that_jumps_or_is_not_finite_is_not_taken(logged):
    for cls, why in ((Jumps, JUMP_WHY), (NaNs, f"'{HEAD}' has NaN or Inf values")):
        strategy, tasks = start(cls)
        arrays, metrics = strategy.aggregate_train(1, sound_replies(tasks))
        entry = strategy.history[-1]
        assert entry.method_metrics == {"state-kept": why}
        assert not entry.state_updated and metrics["state-updated"] == 0
        assert metrics["valid-replies"] == 3 and entry.rejected == {}
        assert_state(strategy.state, STATE)
        assert_state(from_record(arrays), STATE)
        assert logged.warnings[-1] == (f"round 1: the new global state is not taken, {why}; "
                                         "the previous state is kept")
    strategy, tasks = start(NaNs, **{"screen-updates": False})  # never a non-finite state
    strategy.aggregate_train(1, sound_replies(tasks))
    assert strategy.history[-1].method_metrics == {"state-kept": f"'{HEAD}' has NaN or Inf values"}


def test_the_jump_bound_is_off_with_screening_under_dp_and_for_unscreened_tensors():
    class JumpsUnscreened(Jumps):
        unscreened = (B2,)

    cases = [(Jumps, {"screen-updates": False}), (JumpsUnscreened, {}), (Jumps, dp_keys())]
    for cls, keys in cases:
        strategy, tasks = start(cls, **keys)
        _, metrics = strategy.aggregate_train(1, sound_replies(tasks))
        assert metrics["state-updated"] == 1, (cls, keys)
        assert "state-kept" not in strategy.history[-1].method_metrics
        assert strategy.state[B2].min() > 100  # moved by 100


def test_a_jump_that_every_accepted_update_makes_is_taken():
    # all three move block 0 by (10, 10): rms 10 > 5 x rms(1, 2) = 7.9, but no further than
    # the largest accepted update (screening's peer rule accepted them: equal norms)
    strategy, tasks = start()
    strategy.aggregate_train(1, [sound(t, p, TRAINED[p] | {B0: f32(11, 12)})
                                 for p, t in tasks.items()])
    assert strategy.history[-1].state_updated
    assert_state(strategy.state, ALL | {B0: [11, 12]})


# -- server steps after the mean -------------------------------------------------------------

def test_feddyn_corrects_the_mean_by_its_server_state():
    # h = -alpha * held/N * (mean - state); new = mean - h / alpha = mean + held/3 (mean - state)
    strategy, tasks = start(**{"local-objective": "feddyn"})
    strategy.aggregate_train(1, sound_replies(tasks))
    old = {n: v.astype(np.float64) for n, v in STATE.items()}
    mean = {n: np.array(v) for n, v in ALL.items()}
    held = {B0: 3, B1: 2, B2: 1, HEAD: 3}
    # the step starts from the mean rounded to float32 (half an ulp, scaled by 1 + held/3 <= 2
    # and relative to a result at least as large here) and is rounded once more: 1.5 ulps
    assert_state(strategy.state, {n: mean[n] + held[n] / 3 * (mean[n] - old[n]) for n in STATE},
                 ulps=1.5)
    np.testing.assert_allclose(strategy.h[B2], -0.1 * 1 / 3 * (mean[B2] - old[B2]),
                               rtol=1e-7)  # mean[B2] from float32 values: exact


def test_centred_clipping_keeps_each_tensors_step_for_the_next_round():
    strategy, tasks = start(**{"aggregator": "centred-clip"})
    strategy.aggregate_train(1, sound_replies(tasks))
    assert sorted(strategy.centres) == sorted(STATE)
    # blocks 1 (2 holders) and 2 (one) take the radius of their role blocks.*.w: each
    # client's median distance to centre 0 over its blocks, partition 0: (0.5, 2, sqrt 5) -> 2,
    # 1: (sqrt 1.25, sqrt 2.5) -> 1.349, 2: sqrt 13.25 = 3.64; their median 2. Block 2's
    # update (-1, 2), of norm sqrt 5, is clipped to norm 2
    np.testing.assert_allclose(strategy.centres[B2], np.array([-1, 2]) * 2 / np.sqrt(5),
                               rtol=1e-12)
    # block 1: (2, 0) and (-1.5, 0.5) are within 2: their mean
    np.testing.assert_allclose(strategy.centres[B1], [0.25, 0.25], rtol=1e-12)


def test_tensors_that_share_a_key_get_one_value():
    # blocks 0 and 1 share key "k": the weighted mean of every value sent under either name
    # (tensors that share a key hold one value: block 1 starts as block 0 here)
    keys = {B0: "k", B1: "k", B2: B2, HEAD: HEAD}
    updates = [ClientUpdate(str(p), TRAINED[p], EXAMPLES[p]) for p in (0, 1, 2)]
    shared_state = STATE | {B1: STATE[B0]}
    strategy = Prefix(config(), CLIENTS, 3, shared_state)
    send(strategy)
    new = strategy.combine(updates, keys)
    shared = [(30 * (1.5 + 2) + 20 * (0 - 1.5) + 10 * 4.5) / 110,  # 1.0909
              (30 * (2 + 4) + 20 * (2.5 + 4.5) + 10 * 1) / 110]  # 3
    assert_state(new, {B0: shared, B1: shared, B2: [2, 5], HEAD: ALL[HEAD]})
    # under DP too: one noisy update per key
    strategy = Prefix(config(**dp_keys()), CLIENTS, 3, shared_state)
    send(strategy)
    new = strategy.combine(updates, keys)
    np.testing.assert_array_equal(new[B0], new[B1])
    assert not np.array_equal(new[B0], STATE[B0])


@pytest.fixture(scope="module")
def smoke_model():
    """The smoke preset's model and recipe (a tiny random-init MLP-Mixer) for an FLTrust run."""
    from fedtune_app.apps.evaluation import build_global

    cfg = config(aggregator="fltrust")
    model, recipe = build_global(cfg)
    return cfg, model, recipe, recipe.initial_state(model, 7)


def test_fltrust_weighs_each_update_by_its_agreement_with_the_servers_update(smoke_model):
    cfg, model, recipe, state = smoke_model
    strategy = Prefix(cfg, CLIENTS, model.num_blocks, state)
    strategy.attach(model, recipe)
    send(strategy, 1)
    send(strategy, 2)
    tasks = send(strategy, 3)  # round 3: the server's update of round 3
    server = recipe.root_update(model, state, 3)  # name -> trained - state, on the root set
    # partitions 0 and 1 move along the server's update (trust 1), partition 2 against it
    # (trust 0): every tensor held moves by exactly the server's update
    sign = {0: 1.0, 1: 1.0, 2: -1.0}
    replies = []
    for p, t in tasks.items():
        received = from_record(TrainTask.from_message(t).arrays)
        replies.append(sound(t, p, {n: (v + sign[p] * server[n]).astype(np.float32)
                                    for n, v in received.items()}))
    strategy.aggregate_train(3, replies)
    assert strategy.history[-1].rejected == {}
    held = {n for n in state if not n.startswith("blocks.3.")}  # capacity 3 of 4 blocks
    for name, value in strategy.state.items():
        if name not in held:
            assert value is state[name]
            continue
        moved = value.astype(np.float64) - state[name]
        # float32 replies and state: the update and its rescaling to the server's norm are
        # exact to a few float32 ulps of the values involved
        tol = 8 * 2.0 ** -24 * float(np.abs(state[name]).max() + np.abs(server[name]).max())
        np.testing.assert_allclose(moved, server[name], rtol=0, atol=tol, err_msg=name)


def test_the_server_state_a_checkpoint_keeps(logged):
    # FedDyn's h and the centred-clip centres after one round; no DP seed without DP
    strategy, tasks = start(**{"local-objective": "feddyn", "aggregator": "centred-clip"})
    strategy.aggregate_train(1, sound_replies(tasks))
    extra = strategy.extra_state()
    assert sorted(extra) == sorted([f"feddyn-h/{n}" for n in STATE] +
                                   [f"cc-centre/{n}" for n in STATE])
    # block 2 (one holder of 3): its centre is the step, (-1, 2) clipped to its role's radius
    # 2 (test_centred_clipping_keeps_each_tensors_step_for_the_next_round); h: -0.1 x 1/3 x
    # the step the float32 state took (3 + the step rounded to float32, values in [2, 8):
    # half an ulp, 2^-22, each; and h's own float32 rounding, far smaller): 0.1 / 3 x 2^-21
    step = np.array([-1, 2]) * 2 / np.sqrt(5)
    np.testing.assert_allclose(extra[f"cc-centre/{B2}"], step, rtol=1e-12)
    np.testing.assert_allclose(extra[f"feddyn-h/{B2}"], -0.1 / 3 * step, rtol=0,
                               atol=0.1 / 3 * 2.0 ** -21)
    fresh, _ = start(**{"local-objective": "feddyn", "aggregator": "centred-clip"})
    fresh.load_extra_state(extra | {"dp-noise-seed": np.array([1, 2, 3, 4], np.uint32)})
    assert sorted(fresh.h) == sorted(fresh.centres) == sorted(STATE)
    for name in STATE:
        assert fresh.h[name] is extra[f"feddyn-h/{name}"]
        assert fresh.centres[name] is extra[f"cc-centre/{name}"]
    assert fresh.dp_entropy is None and fresh.extra_state().keys() == extra.keys()
    # DP: the noise seed, dp-noise-seed = 5 as four 32-bit words, low first
    strategy, _ = start(**dp_keys())
    extra = strategy.extra_state()
    assert list(extra) == ["dp-noise-seed"]
    np.testing.assert_array_equal(extra["dp-noise-seed"], [5, 0, 0, 0])
    fresh, _ = start(**dp_keys(**{"dp-noise-seed": 9}))
    fresh.load_extra_state({"dp-noise-seed": np.array([1, 2, 3, 4], np.uint32)})
    np.testing.assert_array_equal(fresh.dp_entropy, [1, 2, 3, 4])
    assert fresh.h == {} and fresh.centres == {}
    # and what the log says of the run at start
    strategy.summary()
    assert logged.infos == ["prefix: 3 clients, capacities [3, 2, 1], 3 blocks"]


def test_the_allocation_matrix_of_every_round():
    strategy, _ = start(**{"clients-per-round": 2})
    send(strategy, 2)
    rng = np.random.default_rng([7, 1])
    rows = {0: [1, 1, 1], 1: [1, 1, 0], 2: [1, 0, 0]}
    expected = []
    for server_round in (1, 2):
        picked = sorted(rng.choice(3, size=2, replace=False).tolist())
        expected.append({"round": server_round, "clients": picked,
                         "matrix": [rows[p] for p in picked]})
    assert strategy.allocation_matrices() == expected


# -- the living client set -------------------------------------------------------------------

nodes_app = ClientApp()


@nodes_app.query()
def who(msg: Message, context: Context) -> Message:
    c = context.node_config
    answer = NodeAnswer(c["partition-id"], c["capacity"], c["num-examples"], "g",
                        num_partitions=3)
    return Message(answer.to_content(), reply_to=msg)


def node_grid():
    configs = [{"partition-id": p, "capacity": c, "num-examples": n}
               for p, c, n in ((0, 3, 30), (1, 2, 20), (2, 1, 10))]
    grid = InProcessGrid(nodes_app, configs, {})
    nodes = NodeSet()
    clients = nodes.gather(grid, 0, 10.0)
    return grid, nodes, clients


def test_an_offline_node_sits_the_round_out_and_a_late_one_joins(logged):
    grid, nodes, clients = node_grid()
    ids = [c.node_id for c in clients]
    admitted = []

    class Admits(Prefix):
        def admit(self, client):
            admitted.append(client.partition_id)

    strategy = Admits(config(**{"clients-per-round": 3}), clients, 3, dict(STATE))
    strategy.follow(nodes)
    tasks = send(strategy, 1, grid)
    entry = strategy.history[-1]
    assert sorted(tasks) == [0, 1, 2] and entry.offline == []
    assert entry.membership == [f"node {n} joined with partition {p}" for p, n in enumerate(ids)]
    assert logged.warnings == []
    # round 2: node 1 is offline, a fourth device joins late: three of them online, all sent
    grid.go_offline(ids[1])
    late = grid.add_node({"partition-id": 3, "capacity": 2, "num-examples": 5})
    tasks = send(strategy, 2, grid)
    entry = strategy.history[-1]
    assert admitted == [3]
    assert [c.partition_id for c in strategy.clients] == [0, 1, 2, 3]
    assert sorted(tasks) == sorted(entry.plans) == [0, 2, 3]
    assert entry.offline == [1]
    assert entry.membership == [f"node {late} joined with partition 3"]
    assert entry.plans[3] == (0, 1) and tasks[3].metadata.dst_node_id == late
    assert logged.warnings == ["round 2: partitions [1] have no online node and sit the "
                                 "round out"]
    strategy.aggregate_train(2, [sound(tasks[0], 0), sound(tasks[2], 2)])
    assert entry.rejected == {3: "no reply (failed, timed out or dropped)"}  # not 1: sent none
    # round 3: node 1 is back (activated anew: asked again); from now on 3 of the 4 are drawn,
    # the sampling stream's first draws (no round before sampled)
    grid.come_back(ids[1])
    rng = np.random.default_rng([7, 1])
    for server_round in (3, 4, 5):
        tasks = send(strategy, server_round, grid)
        picked = sorted(rng.choice(4, size=3, replace=False).tolist())
        assert sorted(tasks) == picked and strategy.history[-1].offline == []
    assert strategy.history[2].membership == [
        f"node {ids[1]} restarted and serves partition 1 again"]
    assert len(logged.warnings) == 2


def test_a_round_without_any_online_node_sends_nothing_and_keeps_the_state(logged):
    # FedRA's cover-all allocation cannot plan for no client: it is not asked to
    grid, nodes, clients = node_grid()
    cfg = config(**{"missing-layer-policy": "cover-all"})
    strategy = strategy_class(cfg)(cfg, clients, 3, dict(STATE))
    strategy.follow(nodes)
    for c in clients:
        grid.go_offline(c.node_id)
    assert send(strategy, 1, grid) == {}
    assert strategy.history[-1].plans == {} and strategy.history[-1].offline == [0, 1, 2]
    _, metrics = strategy.aggregate_train(1, [])
    assert dict(metrics) | {"train-loss": 0} == {
        "train-loss": 0, "valid-replies": 0, "rejected-replies": 0, "ignored-replies": 0,
        "state-updated": 0}
    assert_state(strategy.state, STATE)
    assert logged.warnings == [
        "round 1: partitions [0, 1, 2] have no online node and sit the round out",
        "round 1: 0 valid replies < min-valid-replies = 1; the global state is unchanged"]


# the training reach of the head's bias: lr 0.1, momentum 0.5, batch 4, 2 local epochs, no decay,
# no clipping; SGD moves it at most lr sqrt(2) sum_{k=1..S} (1 - 0.5^k) / 0.5
# = 0.2 sqrt(2) (S - 1 + 0.5^S), S = 2 x ceil(examples / 4)
REACH_KEYS = {"lr": 0.1, "momentum": 0.5, "batch-size": 4, "local-epochs": 2,
              "weight-decay": 0.0, "grad-clip": 0.0, "lr-schedule": "constant",
              "lr-warmup-rounds": 0}
REACH = {0: 0.2 * math.sqrt(2) * (15 + 0.5 ** 16),  # 30 examples: 8 batches, 16 steps; 4.243
         1: 0.2 * math.sqrt(2) * (9 + 0.5 ** 10),  # 20 examples: 10 steps; 2.546
         2: 0.2 * math.sqrt(2) * (5 + 0.5 ** 6)}  # 10 examples: 3 batches, 6 steps; 1.419


def reach_start():
    cfg = config(**REACH_KEYS)
    strategy, tasks = start(cfg=cfg)
    strategy.attach(None, recipe_for(cfg))
    return strategy, tasks


def head_moves(tasks, far: float) -> list[Message]:
    """Partitions 0 and 1 move the head by 0.1, partition 2 (one class, say) by ``far``."""
    heads = {0: f32(0.6, -0.5), 1: f32(0.5, -0.4), 2: f32(0.5 + far, -0.5)}
    return [sound(t, p, TRAINED[p] | {HEAD: heads[p]}) for p, t in tasks.items()]


def test_the_head_bias_is_judged_by_how_far_local_training_can_move_it():
    strategy, tasks = reach_start()
    assert strategy.recipe.update_bounds(STATE, 10, 1) == {HEAD: pytest.approx(REACH[2],
                                                                                 rel=1e-12)}
    # 1.4: 14 x the holders' median 0.1 (the peer rule would reject it), within the reach 1.419
    _, metrics = strategy.aggregate_train(1, head_moves(tasks, 1.4))
    assert strategy.history[-1].rejected == {}
    x = (30 * 0.6 + 20 * 0.5 + 10 * 1.9) / 60  # 47 / 60
    y = (30 * -0.5 + 20 * -0.4 + 10 * -0.5) / 60  # -28 / 60
    assert_state(strategy.state, ALL | {HEAD: [x, y]})


def test_a_head_bias_update_beyond_its_training_reach_is_rejected():
    strategy, tasks = reach_start()
    strategy.aggregate_train(1, head_moves(tasks, 1.5))
    assert strategy.history[-1].rejected == {
        2: "screening: 'head.bias': update norm 1.5 > 1.42, the farthest its local training "
           "can move it"}
    # the same move is within reach of partition 1's 10 steps
    strategy, tasks = reach_start()
    moves = head_moves(tasks, 0.1)
    moves[1] = sound(tasks[1], 1, TRAINED[1] | {HEAD: f32(0.5, -0.5 + 2.5)})
    strategy.aggregate_train(1, moves)
    assert strategy.history[-1].rejected == {}


def test_the_reach_counts_only_the_batches_a_client_may_train():
    # 'fedra-repo-batch-cap': at most ceil(10 / 4) + 1 = 4 batches an epoch (the smallest
    # client's 3, plus one), so partition 0 trains 2 x 4 = 8 steps, not 16: its reach is
    # 0.2 sqrt(2) (7 + 0.5^8) = 1.98, and a head move of 3 (within 16 steps' 4.24) is too far
    cfg = config(**REACH_KEYS, **{"fedra-repo-batch-cap": True})
    strategy, tasks = start(cfg=cfg)
    strategy.attach(None, recipe_for(cfg))
    moves = head_moves(tasks, 0.1)
    moves[0] = sound(tasks[0], 0, TRAINED[0] | {HEAD: f32(0.5 + 3.0, -0.5)})
    strategy.aggregate_train(1, moves)
    assert strategy.history[-1].rejected == {
        0: "screening: 'head.bias': update norm 3 > 1.98, the farthest its local training "
           "can move it"}
