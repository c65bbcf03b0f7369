"""What the ServerApp does: ask every node who it is, build the method's strategy, run it
through Flower's ``Strategy.start`` loop, evaluate the global model, and write the results."""

from __future__ import annotations

import logging
import time

import torch
from flwr.app import MetricRecord
from flwr.serverapp import Grid

from fedtune_app.apps.cohort_grid import CohortGrid
from fedtune_app.apps.evaluation import GlobalEvaluator, GroupedEvaluator, build_global
from fedtune_app.apps.results import ResultsWriter
from fedtune_app.config import RunConfig
from fedtune_app.data.groups import num_groups
from fedtune_app.federated.checkpoint import resume, save_checkpoint
from fedtune_app.federated.nodes import NodeSet, TalkingGrid
from fedtune_app.federated.strategy import LayerPlanStrategy, to_record
from fedtune_app.methods import strategy_class
from fedtune_app.model.frozen_weights import with_checkpoint
from fedtune_app.training.batched import Cohort, NotBatchable, not_batchable
from fedtune_app.training.local import check_precision, pick_device

log = logging.getLogger("fedtune")


def query_nodes(grid: Grid, cfg: RunConfig) -> NodeSet:
    """Wait for the nodes (key 'min-nodes'; 0 = every partition they declare) and ask each its
    partition, capacity, example count and label counts."""
    nodes = NodeSet()
    nodes.gather(grid, cfg.federation.min_nodes, cfg.federation.round_timeout)
    return nodes


def with_cohorts(grid: Grid, cfg: RunConfig, model, recipe, nodes: NodeSet) -> Grid:
    """With 'client-engine = "batched"' under Flower's simulation, the Grid that sends each
    round's train messages to one node as a bundle its ClientApp trains together
    (``cohort_grid``); the in-process Grid batches them itself. A run the batched engine cannot
    take (its method's local step, its model) keeps the plain Grid and says why."""
    if cfg.training.client_engine != "batched" or getattr(grid, "synchronous", False):
        return grid
    grouped = num_groups(cfg.model) > 0  # one cohort per group's model
    recipes, models = (recipe.recipes, model.groups) if grouped else ([recipe], [model])
    why = next(filter(None, (not_batchable(cfg, r) for r in recipes)), None)
    try:
        for m in models if why is None else ():
            Cohort(m, cfg.training, torch.device("cpu"))
    except NotBatchable as err:
        why = str(err)
    if why is not None:
        log.info("fedtune: client-engine batched: clients train one after another: %s", why)
        return grid

    def partition_of(node_id: int) -> int:
        return next((p for p, c in nodes.claims.items() if c.node_id == node_id), 1 << 30)

    return CohortGrid(grid, partition_of)


def run_federation(grid: Grid, cfg: RunConfig) -> str:
    """The whole run; returns the results folder."""
    # no GPU: stop before loading
    check_precision(cfg.training.precision, pick_device(cfg.training.device))
    model_cfg, fetched = with_checkpoint(cfg)  # a bad checkpoint stops the run before any node
    model, recipe = build_global(model_cfg)  # with model groups: one model per group
    grouped = num_groups(cfg.model) > 0
    method = strategy_class(cfg)
    method.check_fleet(cfg, list(cfg.client_capacities), model.num_blocks)
    nodes = query_nodes(grid, cfg)
    clients = nodes.clients()
    fetches = {c.partition_id: c.checkpoint_bytes for c in clients if c.checkpoint_bytes}
    if fetched or fetches:  # one-time costs, kept apart from the per-round adapter bytes
        log.info("checkpoint fetched once: server %d bytes, nodes %s", fetched, fetches)
    method.check_fleet(cfg, [c.capacity for c in clients], model.num_blocks)  # node-declared
    strategy: LayerPlanStrategy = method(
        cfg, clients, model.num_blocks, recipe.initial_state(model, cfg.seed))
    strategy.attach(model, recipe)
    strategy.follow(nodes)  # every round: restarted and late nodes in, offline ones out
    done_metrics = resume(strategy, cfg) if cfg.federation.resume else []
    evaluator = (GroupedEvaluator if grouped else GlobalEvaluator)(model_cfg, model, clients,
                                                                   recipe)
    writer = ResultsWriter(cfg, strategy, clients, done_metrics)
    log.info("fedtune: %s on %s, %d clients %s, %d rounds; results in %s", cfg.method,
             cfg.model.model, len(clients), [c.capacity for c in clients],
             cfg.federation.num_server_rounds, writer.folder)

    def end_of_round(server_round: int, _arrays) -> MetricRecord | None:
        """Flower calls this before round 1 (skipped) and after every round: evaluate when
        due, record the round, and write the checkpoint when due."""
        if server_round == 0:
            return None
        evaluator.clients = strategy.clients  # a late partition's label mix counts too
        server_round += strategy.round_offset
        last = server_round == cfg.federation.num_server_rounds
        metrics = None
        if last or server_round % cfg.federation.eval_every == 0:
            started = time.perf_counter()
            metrics = evaluator(strategy.state, strategy.eval_plan())
            metrics["eval-seconds"] = time.perf_counter() - started
        writer.record_round(server_round, metrics)
        every = cfg.federation.checkpoint_every
        if every and (last or server_round % every == 0):
            save_checkpoint(writer.folder, strategy, writer.metrics, cfg)
        if metrics is None:
            return None
        return MetricRecord({"accuracy": metrics["accuracy"], "loss": metrics["loss"]})

    grid = with_cohorts(grid, cfg, model, recipe, nodes)
    grid = TalkingGrid(grid, nodes.describe, on_wait=nodes.refresh)  # says whom it waits for
    strategy.start(grid, initial_arrays=to_record(strategy.state),
                   num_rounds=cfg.federation.num_server_rounds - strategy.round_offset,
                   timeout=cfg.federation.round_timeout, evaluate_fn=end_of_round)
    writer.finish()
    return str(writer.folder)
