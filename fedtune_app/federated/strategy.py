"""The Flower strategy every layer-allocation method shares.

Each round: sample clients (seeded, by partition id), ask the method for their layer plans,
send each client its plan and ONLY the trainable tensors of its planned blocks plus the head,
check every reply, screen the sound ones' updates (``robust.screen``), and aggregate the rest
with the run's masked aggregator (``combine``; default the example-weighted mean); a new state
that is not finite or jumps too far is not taken (``robust.state_problem``). A method is a
subclass that overrides ``plan_round`` (and, if it needs to, ``eval_plan`` or ``aggregate``).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedtune_app.config import RunConfig
from fedtune_app.federated.aggregation import ClientUpdate, reply_problem
from fedtune_app.federated.allocation import (
    Plan,
    allocation_matrix,
    check_capacities,
    draw_round_capacities,
)
from fedtune_app.federated.nodes import ClientInfo, NodeSet, error_of, error_text, match_replies
from fedtune_app.federated.objectives import feddyn_server_step
from fedtune_app.federated.records import from_record, to_record
from fedtune_app.federated.robust import (
    combine,
    dp_combine,
    dp_epsilon,
    dp_noise_entropy,
    largest_updates,
    screen,
    state_problem,
)
from fedtune_app.federated.wire import ARRAYS, METRICS, TRAIN_LOSS, TrainReply, TrainTask
from fedtune_app.model.adapters import names_for_plan

log = logging.getLogger("fedtune")


@dataclass
class RoundLog:
    round: int
    plans: dict[int, Plan] = field(default_factory=dict)  # partition id -> plan
    capacities: dict[int, int] = field(default_factory=dict)  # partition id -> this round's L_i
    bytes_down: int = 0
    bytes_up: int = 0
    rejected: dict[int, str] = field(default_factory=dict)  # partition id -> reason
    nodes: dict[int, int] = field(default_factory=dict)  # partition id -> node id sent its task
    offline: list[int] = field(default_factory=list)  # partitions whose node was not online
    errors: dict[int, dict] = field(default_factory=dict)  # partition id -> Flower error of reply
    membership: list[str] = field(default_factory=list)  # nodes that joined, took over, failed
    ignored: list[str] = field(default_factory=list)  # replies nobody asked for (stray, repeated)
    state_updated: bool = True  # False: too few valid replies, the previous state was kept
    train_loss: float = float("nan")
    started: float = field(default_factory=time.time)
    client_metrics: dict[int, dict] = field(default_factory=dict)  # partition id -> reply metrics
    # a method's own (FedBRICK's overheads), the DP budget spent, why the state was kept
    method_metrics: dict = field(default_factory=dict)


class LayerPlanStrategy(Strategy):
    """Base of FedRA, AllLarge, AllSmall (and the depth baselines later)."""

    name = "layer-plan"
    # its aggregation reads the clients' updates only through ``combine`` (client-level DP
    # protects nothing if a server step reads them in the clear: FedMD, FedDF, FedBRICK, ...)
    private_aggregation = True
    # clients may fine-tune their blocks' full weights (run-config key 'client-trains'); False
    # for methods whose algorithm is defined on adapters (FedRA, FedBRICK, HeteroTune, ...)
    full_fine_tuning = False
    # tensors that are no parameters (FedMD's consensus scores): screening and the state guard's
    # jump bound skip them (they must still be finite)
    unscreened: tuple[str, ...] = ()
    # its aggregate ends with ``server_objective`` (FedDyn's server step): local-objective
    # feddyn is allowed
    feddyn_server_step = True
    # its allocation can draw every block k times (key 'min-holders')
    draws_k_cover = False
    # its clients may hold LoRA of different ranks (key 'ranks', node config 'rank')
    rank_heterogeneous = False

    def __init__(self, cfg: RunConfig, clients: list[ClientInfo], num_layers: int,
                 initial_state: dict[str, np.ndarray]):
        self.cfg = cfg
        self.clients = sorted(clients, key=lambda c: c.partition_id)
        self.num_layers = num_layers
        self.state = dict(initial_state)
        self.rng = np.random.default_rng(cfg.seed)  # the method's own draws (allocation)
        # draws every method makes alike, on streams of their own: a method's own draws (FedRA's
        # allocation) never shift them, so one seed gives every method the same sampled clients
        # and the same dynamic capacities each round (paired comparisons)
        self.sampling_rng = np.random.default_rng([cfg.seed, 1])
        self.capacity_rng = np.random.default_rng([cfg.seed, 2])
        self.history: list[RoundLog] = []
        # partition id -> the tensors sent this round that it must send back
        self._sent: dict[int, dict[str, np.ndarray]] = {}
        self._outbox: list[tuple[Message, ClientInfo]] = []  # this round's messages
        # deployment: which node serves which partition, refreshed every round (``follow``)
        self.nodes: NodeSet | None = None
        # rounds done before this process started (resume): Flower's loop counts from 1 again
        self.round_offset = 0
        self.model, self.recipe = None, None  # the server's model(s) and recipe (``attach``)
        self.objective = cfg.objective  # (plain|fedprox|feddyn, coefficient)
        self.h: dict[str, np.ndarray] = {}  # FedDyn's server state h, per tensor name
        self.dp = cfg.robust.dp_noise_multiplier > 0
        self.dp_entropy = dp_noise_entropy(cfg.robust) if self.dp else None  # the DP noise's seed
        self.centres: dict[str, np.ndarray] = {}  # centred-clip: last aggregated update per key

    @classmethod
    def check_fleet(cls, cfg: RunConfig, capacities: list[int], num_layers: int) -> None:
        """Refuse (ConfigError) clients of these capacities on a model of ``num_layers`` blocks.
        The ServerApp checks the configured and the node-declared capacities with it, `fedtune
        run` and `fedtune compare` the configured ones before any training
        (``tools/preflight.py``). A method with rules of its own extends it."""
        check_capacities(capacities, num_layers)

    # -- what a method decides ------------------------------------------------------------
    def plan_round(self, server_round: int, clients: list[ClientInfo]) -> list[Plan]:
        raise NotImplementedError

    def eval_plan(self) -> Plan:
        """Blocks the global model runs at evaluation (all L by default)."""
        return tuple(range(self.num_layers))

    def aggregate(self, updates: list[ClientUpdate]) -> dict[str, np.ndarray]:
        return self.server_objective(updates, self.combine(updates))

    def combine(self, updates: list[ClientUpdate], keys: dict[str, str] | None = None,
                state: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """The new state by the run's masked aggregator (key 'aggregator'), or DP-FedAvg with
        client-level DP; tensors with the same key share one value (``keys``: name -> key).
        Every method aggregates its clients' tensors through this. ``state``: the tensors the
        updates are named after when they are not ``self.state``'s (LoRA rank components)."""
        state = self.state if state is None else state
        if self.dp:
            return dp_combine(state, updates, self.cfg.robust, self.dp_entropy,
                              self.history[-1].round, keys)
        reference = (self.recipe.root_update(self.model, state, self.history[-1].round)
                     if self.cfg.robust.aggregator == "fltrust" else None)
        return combine(state, updates, self.cfg.robust, keys, reference, self.centres)

    def server_objective(self, updates: list[ClientUpdate],
                         mean: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The local objective's server step after the method's aggregate ``mean`` (FedDyn's
        correction by h; FedProx and plain: ``mean`` itself). A method overriding ``aggregate``
        ends with it."""
        kind, alpha = self.objective
        if kind != "feddyn":
            return mean
        return feddyn_server_step(self.h, self.state, mean, updates, alpha, len(self.clients))

    def payload(self, plan: Plan) -> list[str]:
        """Names of the tensors a client with this plan gets: its planned blocks + the head."""
        return names_for_plan(self.state, plan)

    def client_payload(self, client: ClientInfo, plan: Plan) -> list[str]:
        """Names of the tensors this client gets (a method whose payload depends on the client
        overrides it; model groups: those of its group)."""
        return self.payload(plan)

    def client_tensors(self, client: ClientInfo, plan: Plan) -> dict[str, np.ndarray]:
        """The tensors this client is sent (default: its payload's global tensors as they are;
        a client of LoRA rank r gets the first r components of each factor)."""
        return {n: self.state[n] for n in self.client_payload(client, plan)}

    def expected_reply(self, client: ClientInfo,
                       sent: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Name -> the tensor the client's reply is checked against (shape, dtype) and its
        update measured from: the sent tensors it trains (``reply_names``)."""
        return {n: sent[n] for n in self.reply_names(client, list(sent))}

    def received_tensors(self, client: ClientInfo,
                         tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A reply's tensors as the checks and the aggregation take them (default: as they
        came; HetLoRA: a client that pruned its rank is zero-padded back)."""
        return tensors

    def train_config(self, client: ClientInfo, plan: Plan) -> dict:
        """A method's own entries in the client's train config (the recipe's ``configure``)."""
        return {}

    def reply_names(self, client: ClientInfo, names: list[str]) -> list[str]:
        """Of the tensors sent, those the client trains and sends back (default: all)."""
        return names

    def payload_names(self, entry: RoundLog) -> dict[int, list[str]]:
        """Partition id -> names of the tensors it trained (sent and returned)."""
        by_pid = {c.partition_id: c for c in self.clients}
        return {pid: self.reply_names(by_pid[pid], self.client_payload(by_pid[pid], plan))
                for pid, plan in entry.plans.items()}

    def trained_size(self, partition_id: int, name: str) -> int:
        """How many of tensor ``name``'s values partition ``partition_id`` trained this round
        (default: all of the global tensor; a client of lower LoRA rank holds fewer)."""
        return int(self.state[name].size)

    def export_state(self) -> dict[str, np.ndarray]:
        """The global model as saved in the results folder (HeteroTune: fused, Eq. 6)."""
        return self.state

    def attach(self, model, recipe) -> None:
        """The server's global model(s) and recipe, for a method that computes on the server
        (FedBRICK's and FedDF's distillation); the same objects the evaluator uses."""
        self.model, self.recipe = model, recipe

    def extra_state(self) -> dict[str, np.ndarray]:
        """Server-side tensors a method keeps besides ``state`` (e.g. a momentum buffer): they
        go into the checkpoint so that a resumed run continues exactly. A method with its own
        extends this one's (FedDyn's h; the DP noise seed)."""
        dp = {} if self.dp_entropy is None else {"dp-noise-seed": self.dp_entropy}
        return ({f"feddyn-h/{n}": v for n, v in self.h.items()} | dp
                | {f"cc-centre/{k}": v for k, v in self.centres.items()})

    def load_extra_state(self, tensors: dict[str, np.ndarray]) -> None:
        """Inverse of ``extra_state`` (resume)."""
        self.h = {k.removeprefix("feddyn-h/"): v for k, v in tensors.items()
                  if k.startswith("feddyn-h/")}
        self.centres = {k.removeprefix("cc-centre/"): v for k, v in tensors.items()
                        if k.startswith("cc-centre/")}
        if self.dp:
            self.dp_entropy = tensors["dp-noise-seed"]

    def round_clients(self, clients: list[ClientInfo]) -> list[ClientInfo]:
        """Dynamic heterogeneity: this round's capacities ~ U[1, L_i] from the seeded capacity
        stream, the same for every method (the plan hooks only see ``capacity``)."""
        if not self.cfg.federation.dynamic_capacities:
            return clients
        drawn = draw_round_capacities([c.capacity for c in clients], self.capacity_rng)
        return [replace(c, capacity=k) for c, k in zip(clients, drawn)]

    # -- the living client set (deployment) ------------------------------------------------
    def follow(self, nodes: NodeSet) -> None:
        """Every round, take the nodes Flower lists as online from ``nodes``: a restarted or
        late node takes its partition's place, an offline one sits the round out."""
        self.nodes = nodes
        nodes.admit = self.admit

    def admit(self, client: ClientInfo) -> None:
        """A partition not seen at start joins (a late device). A method that keeps per-client
        state built at start extends it here, or raises ConfigError to refuse the client."""

    def live_clients(self) -> list[ClientInfo]:
        """The clients that may be sent work this round (all of them without ``follow``)."""
        if self.nodes is None:
            return list(self.clients)
        return self.nodes.live()

    def refresh_clients(self, grid: Grid, entry: RoundLog) -> None:
        if self.nodes is None:
            return
        self.nodes.refresh(grid)
        self.clients = self.nodes.clients()
        entry.membership = self.nodes.take_events()
        live = {c.partition_id for c in self.nodes.live()}
        entry.offline = [c.partition_id for c in self.clients if c.partition_id not in live]
        if entry.offline:
            log.warning("round %d: partitions %s have no online node and sit the round out",
                        entry.round, entry.offline)

    # -- Flower Strategy API --------------------------------------------------------------
    def sample_clients(self) -> list[ClientInfo]:
        if self.cfg.federation.client_sampling == "per-domain":
            return self.one_client_per_domain()
        live = self.live_clients()
        k = self.cfg.federation.clients_per_round
        if not k or k >= len(live):
            return live
        picked = sorted(self.sampling_rng.choice(len(live), size=k, replace=False))
        return [live[i] for i in picked]

    def one_client_per_domain(self) -> list[ClientInfo]:
        """One client drawn uniformly from each domain's clients (domains in order of their
        first partition id), as the official FedRA code samples its Table 2 rounds."""
        domains: dict[str, list[ClientInfo]] = {}
        for c in self.live_clients():
            domains.setdefault(c.group, []).append(c)
        picked = [group[self.sampling_rng.integers(len(group))] for group in domains.values()]
        return sorted(picked, key=lambda c: c.partition_id)

    def max_batches(self) -> int:
        """Cap on a client's batches per local epoch (0 = none): the official FedRA code's
        m + 1, m = the smallest client's number of batches (``fedra-repo-batch-cap``)."""
        if not self.cfg.training.fedra_repo_batch_cap:
            return 0
        smallest = min(c.num_examples for c in self.clients)
        return math.ceil(smallest / self.cfg.training.batch_size) + 1

    def begin_round(self, server_round: int) -> dict:
        """The method's own step before the round's clients are drawn (FedBRICK: the server's
        distillation); returns its metrics of the round."""
        return {}

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> list[Message]:
        server_round += self.round_offset
        begun = self.begin_round(server_round)
        entry = RoundLog(server_round, method_metrics=begun)
        self.refresh_clients(grid, entry)
        clients = self.round_clients(self.sample_clients())
        plans = self.plan_round(server_round, clients) if clients else []
        max_batches = self.max_batches()
        self._sent, self._outbox = {}, []
        messages = []
        for client, plan in zip(clients, plans):
            payload = self.client_tensors(client, plan)
            record = to_record(payload)
            entry.plans[client.partition_id] = plan
            entry.capacities[client.partition_id] = client.capacity
            entry.bytes_down += record.count_bytes()
            entry.nodes[client.partition_id] = client.node_id
            self._sent[client.partition_id] = self.expected_reply(client, payload)
            task = TrainTask(record, tuple(plan), server_round, max_batches,
                             self.train_config(client, plan))
            messages.append(task.to_message(client.node_id))
            self._outbox.append((messages[-1], client))
        self.history.append(entry)
        return messages

    def aggregate_train(self, server_round: int, replies) -> tuple[ArrayRecord, MetricRecord]:
        """Check every reply, screen the sound ones' updates, aggregate those that pass. A
        rejected reply never reaches the state; with fewer than ``min-valid-replies`` of them,
        or a new state that is not finite or jumps too far, the round keeps the previous state."""
        server_round += self.round_offset
        entry = self.history[-1]
        # the grid stamped every message's id on sending: a reply names the one it answers
        by_message = {m.metadata.message_id: c for m, c in self._outbox if m.metadata.message_id}
        matched, ignored = match_replies({mid: c.node_id for mid, c in by_message.items()},
                                         replies)
        for stray in ignored:
            entry.ignored.append(stray)
            log.warning("round %d: ignored %s", server_round, stray)
        updates, losses, answered = [], {}, set()
        for mid, reply in matched:
            client = by_message[mid]
            answered.add(client.partition_id)
            if reply.has_error():  # the node's own failure, or the SuperLink's word for it
                entry.errors[client.partition_id] = {"node": client.node_id} | error_of(reply)
            update, loss, problem = self._check_reply(reply, client)
            if problem:
                entry.rejected[client.partition_id] = problem
                log.warning("round %d: rejected client %d (node %d): %s", server_round,
                            client.partition_id, client.node_id, problem)
                continue
            entry.bytes_up += reply.content[ARRAYS].count_bytes()
            entry.client_metrics[client.partition_id] = dict(reply.content[METRICS])
            updates.append(update)
            losses[update.client] = loss
        for pid in entry.plans:
            if pid not in answered:
                entry.rejected[pid] = "no reply (failed, timed out or dropped)"
                log.warning("round %d: no reply from client %d (node %d)", server_round, pid,
                            entry.nodes[pid])
        if self.cfg.robust.screen_updates:
            sent = {str(pid): tensors for pid, tensors in self._sent.items()}
            # under DP only the bound against the global tensor: the peer rule would let one
            # client's data decide another's fate (module docstring of robust)
            judged = [ClientUpdate(u.client, {n: v for n, v in u.tensors.items()
                                              if n not in self.unscreened}, u.num_examples)
                      for u in updates]
            cap = self.max_batches()
            reach = ({u.client: self.recipe.update_bounds(sent[u.client], u.num_examples,
                                                          server_round, cap)
                      for u in judged} if self.recipe is not None else {})
            for client, why in screen(judged, sent, self.cfg.robust, peers=not self.dp,
                                      reach=reach).items():
                entry.rejected[int(client)] = why
                log.warning("round %d: rejected client %s: %s", server_round, client, why)
            updates = [u for u in updates if int(u.client) not in entry.rejected]
        if updates:
            entry.train_loss = float(np.average([losses[u.client] for u in updates],
                                                weights=[u.num_examples for u in updates]))
        if self.cfg.federation.fedra_repo_unweighted:  # every mean counts each client once
            updates = [replace(u, num_examples=1) for u in updates]
        if len(updates) >= self.cfg.federation.min_valid_replies:
            new_state = self.aggregate(updates)
            # the jump bound belongs to screening (off with it); a non-finite state never passes
            problem = state_problem(self.state, new_state, self.cfg.robust,
                                    check_jump=self.cfg.robust.screen_updates and not self.dp,
                                    skip_jump=self.unscreened,
                                    accepted=largest_updates(updates, self.state))
            if problem:
                entry.state_updated = False
                entry.method_metrics["state-kept"] = problem
                log.warning("round %d: the new global state is not taken, %s; the previous "
                            "state is kept", server_round, problem)
            else:
                self.state = new_state
            if self.dp:
                entry.method_metrics["dp-epsilon"] = dp_epsilon(
                    self.cfg.robust, server_round, len(entry.plans) / len(self.clients))
        else:
            entry.state_updated = False
            log.warning("round %d: %d valid replies < min-valid-replies = %d; the global state "
                        "is unchanged", server_round, len(updates),
                        self.cfg.federation.min_valid_replies)
        metrics = MetricRecord({TRAIN_LOSS: entry.train_loss, "valid-replies": len(updates),
                                "rejected-replies": len(entry.rejected),
                                "ignored-replies": len(entry.ignored),
                                "state-updated": int(entry.state_updated)})
        return to_record(self.state), metrics

    def _check_reply(self, reply: Message, client: ClientInfo):
        """(update, train loss, None) for a sound reply, else (None, None, why not)."""
        if reply.has_error():
            return None, None, f"client error: {error_text(reply, client.node_id)}"
        try:  # hostile or broken content: failing to decode it rejects the reply, nothing more
            answer = TrainReply.from_message(reply)
            tensors = self.received_tensors(client, from_record(answer.arrays))
            num_examples, loss = answer.num_examples, answer.train_loss
        except Exception as err:  # noqa: BLE001 - any decoding failure is the client's fault
            return None, None, f"malformed reply ({err.__class__.__name__}: {err})"
        problem = reply_problem(tensors, self._sent[client.partition_id], num_examples,
                                client.num_examples)
        if problem is None and not np.isfinite(loss):
            problem = f"train-loss = {loss}, expected a finite number"
        if problem:
            return None, None, problem
        return ClientUpdate(str(client.partition_id), tensors, int(num_examples)), loss, None

    def configure_evaluate(self, server_round, arrays, config, grid) -> list[Message]:
        return []  # the global model is evaluated on the server (evaluate_fn)

    def aggregate_evaluate(self, server_round, replies) -> MetricRecord | None:
        return None

    def summary(self) -> None:
        log.info("%s: %d clients, capacities %s, %d blocks", self.name, len(self.clients),
                 [c.capacity for c in self.clients], self.num_layers)

    def allocation_matrices(self) -> list[dict]:
        """Per round: the sampled clients and M in {0,1}^{N x L} (for allocation.json)."""
        out = []
        for entry in self.history:
            pids = sorted(entry.plans)
            out.append({"round": entry.round, "clients": pids,
                        "matrix": allocation_matrix([entry.plans[p] for p in pids],
                                                    self.num_layers).tolist()})
        return out
