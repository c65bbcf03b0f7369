"""What a node does: answer the start-up query, and train the sub-network it is given.

The node's model and data are built once per process (``runtime``) and reused every round: a
round makes the model hold its plan's frozen blocks (read by name from the node's layered
checkpoint on disk; the others are not in memory, ``model.block_store``), copies the received
trainable tensors into it, trains the planned blocks, and replies with the same names. Frozen
weights never travel (with 'client-trains = full' nothing is frozen: the received weights
replace the checkpoint's).
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import replace

import numpy as np
from flwr.app import Context, Error, Message, RecordDict

from fedtune_app.apps.cohort_grid import (
    bundle_replies,
    is_cohort,
    keep_partition_state,
    partition_state,
    unbundle_tasks,
)
from fedtune_app.apps.faults import after_training, before_training
from fedtune_app.config import ConfigError, RunConfig, parse_faults
from fedtune_app.data.groups import group_config, node_model_group, num_groups
from fedtune_app.data.scenarios import check_rank
from fedtune_app.data.splits import client_examples, client_group, run_num_classes, run_splits
from fedtune_app.federated.flower_private import ErrorCode
from fedtune_app.federated.objectives import LocalObjective
from fedtune_app.federated.records import from_record, to_record
from fedtune_app.federated.wire import (
    CHECKPOINT_BYTES,
    FIT_SECONDS,
    TRAIN_SECONDS,
    TRAINED_BATCHED,
    NodeAnswer,
    TrainReply,
    TrainTask,
)
from fedtune_app.methods import recipe_for, resolve_config
from fedtune_app.model.adapters import AdapterSpec
from fedtune_app.model.backbones import ModelSpec
from fedtune_app.model.block_store import (
    allows_whole_model,
    build_on_demand,
    check_memory,
    checkpoint_path,
    hold_blocks,
    place,
    whole_model_refusal,
)
from fedtune_app.model.frozen_weights import cache_dir, with_checkpoint
from fedtune_app.model.perf import process_stats
from fedtune_app.model.published_blocks import PublishedBlocks
from fedtune_app.training.batched import Cohort, NotBatchable, not_batchable
from fedtune_app.training.local import check_precision, pick_device, round_lr

log = logging.getLogger("flwr")
_MODELS: dict = {}  # (model, adapters, device, precision, method extension) -> (model, device)


def runtime(cfg: RunConfig, recipe=None, node_config: dict | None = None):
    """(model with adapters on all blocks and the method's extra modules, device), cached per
    process (the two most recent, or one per model group) and per method extension. The model
    holds no frozen block until ``hold_blocks(model, plan)``; its frozen weights come from the
    node's cache folder (``frozen_weights.cache_dir``)."""
    recipe = recipe or recipe_for(cfg)
    spec = ModelSpec.from_config(cfg.model, run_num_classes(cfg))
    adapters = AdapterSpec.from_config(cfg.adapter)
    folder = cache_dir(cfg.model, node_config)
    key = (spec, adapters, cfg.training.device, cfg.training.precision, type(recipe).__name__,
           recipe.cache_key(), recipe.group, folder, cfg.model.layered_url,
           cfg.model.layered_sha256)
    if key not in _MODELS:
        while len(_MODELS) >= max(2, num_groups(cfg.model)):
            _MODELS.pop(next(iter(_MODELS)))
        device = pick_device(cfg.training.device)
        check_precision(cfg.training.precision, device)
        files = None
        if cfg.model.layered_url:  # fetch the planned blocks alone, never the whole model
            files = PublishedBlocks(cfg.model.layered_url, cfg.model.layered_sha256, spec,
                                    folder).local_file
        backbone = functools.partial(build_on_demand, cache_dir=folder, device=device,
                                     files=files, allow_build=allows_whole_model(node_config),
                                     publish_hint=publish_command(cfg))
        model = recipe.build(spec, backbone=backbone)
        _MODELS[key] = place(model, device), device
    return _MODELS[key]


def publish_command(cfg: RunConfig) -> str:
    """The `fedtune publish-layered` command that publishes this run's backbone block by
    block (its model keys and data set: the number of classes shapes the head)."""
    model = cfg.model
    keys = {"model": model.model, "model-source": model.model_source,
            "model-args": model.model_args, "model-seed": model.model_seed,
            "dataset": cfg.data.dataset}
    text = " ".join(f'{k}="{v}"' if isinstance(v, str) else f"{k}={v}"
                    for k, v in keys.items() if v not in ("", 0) or k == "model-source")
    return f"fedtune publish-layered --run-config '{text}' --out DIR --base-url URL"


def check_whole_model(cfg: RunConfig, node_config: dict) -> None:
    """At the start-up query: a node whose config forbids building the whole backbone
    (``build-whole-model=false``) and that would have to (no ``layered-url``, no layered
    checkpoint in its cache yet) stops here, before any training."""
    if cfg.model.layered_url or allows_whole_model(node_config):
        return
    spec = ModelSpec.from_config(cfg.model, run_num_classes(cfg))
    path = checkpoint_path(spec, cache_dir(cfg.model, node_config))
    if not path.is_file():
        raise ConfigError(whole_model_refusal(spec, path, publish_command(cfg)))


def node_config_int(node_config: dict, key: str) -> int:
    value = node_config[key]
    try:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"node config {key}={value!r} is not an integer; start the SuperNode "
                          f"with --node-config '{key}=<int> ...'") from None


def node_identity(cfg: RunConfig, node_config: dict) -> tuple[int, int, int]:
    """(partition id, number of partitions, capacity) from the node config (deployment:
    ``--node-config 'partition-id=2 num-partitions=6 capacity=4'``) or the scenario
    (simulation: capacity = capacities[partition-id])."""
    try:
        pid = node_config_int(node_config, "partition-id")
        num = node_config_int(node_config, "num-partitions")
    except KeyError as err:
        raise ConfigError(f"node config lacks {err}; start the SuperNode with --node-config "
                          "'partition-id=<i> num-partitions=<n>' (and optionally "
                          "capacity=<L_i> memory-mb=<MB>)") from None
    if not 0 <= pid < num:
        raise ConfigError(f"node config partition-id={pid} is outside 0..{num - 1}")
    if "capacity" in node_config:  # a deployed device declares its own
        return pid, num, node_config_int(node_config, "capacity")
    capacities = cfg.client_capacities
    if len(capacities) != num:
        raise ConfigError(
            f"the capacity profile ({cfg.federation.capacity_profile}, run-config key "
            "'capacities') "
            f"describes {len(capacities)} clients but the federation has {num} nodes; simulate "
            f"{len(capacities)} with --federation-config 'num-supernodes={len(capacities)}' "
            f"(make run does), or describe {num} clients")
    return pid, num, capacities[pid]


def node_rank(cfg: RunConfig, node_config: dict) -> int:
    """This node's LoRA rank: its own declaration (deployment: ``--node-config rank=4``), else
    key 'ranks' (simulation: ranks[partition-id]), else 'lora-r'."""
    if "rank" in node_config:
        rank = node_config_int(node_config, "rank")
        check_rank(rank, cfg.adapter.lora_r, f"node config rank={rank}")
        return rank
    pid = node_config_int(node_config, "partition-id")
    ranks = cfg.client_ranks
    return ranks[pid] if pid < len(ranks) else cfg.adapter.lora_r


def node_group(cfg: RunConfig, context: Context) -> int | None:
    """This node's model group (None: a single-model run)."""
    pid, num, capacity = node_identity(cfg, context.node_config)
    return node_model_group(cfg, pid, num, capacity)


def local_data(cfg: RunConfig, context: Context):
    pid, num, capacity = node_identity(cfg, context.node_config)
    splits = run_splits(cfg, node_folder=cache_dir(cfg.model, context.node_config))
    return pid, capacity, client_examples(cfg, splits, pid, num), splits


def node_config_of(context: Context) -> tuple[dict, int]:
    """The resolved run config as this node sees it (``model-source`` = its verified local
    checkpoint when ``checkpoint-url`` is set) and the bytes it fetched for it just now."""
    return with_checkpoint(resolve_config(context.run_config), context.node_config)


def handle_query(msg: Message, context: Context) -> Message:
    cfg, fetched = node_config_of(context)  # the one-time checkpoint fetch happens here
    group = node_group(cfg, context)
    cfg = group_config(cfg, group)
    pid, capacity, examples, splits = local_data(cfg, context)
    counts = np.bincount(examples.labels.numpy(), minlength=splits.num_classes)
    data_group = client_group(cfg.data, splits, pid, int(context.node_config["num-partitions"]))
    memory_mb = 0
    if "memory-mb" in context.node_config:  # a device declares how much its model may use
        memory_mb = node_config_int(context.node_config, "memory-mb")
        check_memory(ModelSpec.from_config(cfg.model, run_num_classes(cfg)), capacity, memory_mb)
    check_whole_model(cfg, context.node_config)
    answer = NodeAnswer(pid, capacity, len(examples), data_group, tuple(counts.tolist()),
                        fetched, 0 if group is None else group,
                        int(context.node_config["num-partitions"]), memory_mb,
                        node_rank(cfg, context.node_config))
    return Message(answer.to_content(), reply_to=msg)


def handle_train(msg: Message, context: Context) -> Message:
    if is_cohort(msg.content):  # several clients' tasks in one message (``cohort_grid``)
        return Message(train_bundle(msg.content, context), reply_to=msg)
    return train_reply(msg.content, context).to_message(msg)


def train_reply(content: RecordDict, context: Context) -> TrainReply:
    """One client's round: its task (a train message's content) trained on the sequential path."""
    started = time.perf_counter()
    cfg, fetched = node_config_of(context)  # 0 bytes unless the cache was lost since the query
    group = node_group(cfg, context)
    task = TrainTask.from_content(content)
    round_ = task.server_round
    cfg = group_config(cfg, group).replace(lr=round_lr(cfg, round_))  # this round's rate
    pid, _, examples, _ = local_data(cfg, context)
    before_training(cfg, pid)
    recipe = recipe_for(cfg, group)
    model, device = runtime(cfg, recipe, context.node_config)
    plan = task.layers
    if list(plan) != sorted(set(plan)) or not all(0 <= j < model.num_blocks for j in plan):
        raise ValueError(f"plan {plan} is not an ascending set of blocks in "
                         f"0..{model.num_blocks - 1}")
    hold_blocks(model, plan)
    recipe.configure(task.config())
    # the official FedRA code's per-round cap (``fedra-repo-batch-cap``); |D_i| stays the same
    num_examples = len(examples)
    examples = replace(examples, max_batches=task.max_batches)
    params = recipe.trainables(model, plan)
    received = from_record(task.arrays)
    recipe.assign(model, plan, received)
    objective = LocalObjective(cfg)  # FedProx / FedDyn term on top of the method's loss
    objective.begin(params, context)
    recipe.begin(params, context)
    fit_started = time.perf_counter()
    loss = recipe.fit(model, plan, params, examples,
                      seed=cfg.seed * 1_000_003 + round_ * 1009 + pid, device=device,
                      loss_fn=lambda inputs, labels: recipe.loss(model, plan, inputs, labels)
                      + objective.penalty(), server_round=round_)
    fit_seconds = time.perf_counter() - fit_started
    objective.end(params, context)
    updated = after_training(cfg, pid, recipe.trained(params) | recipe.reply(), received, round_)
    metrics = {FIT_SECONDS: fit_seconds, TRAIN_SECONDS: time.perf_counter() - started,
               CHECKPOINT_BYTES: fetched, TRAINED_BATCHED: 0, **process_stats()}
    return TrainReply(to_record(updated), num_examples, loss, metrics)


def handle_train_cohort(items: list[tuple[Message, Context]]) -> dict[int, Message]:
    """The batched client engine (run-config key ``client-engine = "batched"``) for the train
    messages of one round delivered in one process (the in-process runner): their replies by
    position in ``items`` (an error reply where the engine failed); a message it does not
    answer goes to ``handle_train``."""
    replies = train_cohort([(msg.content, context) for msg, context in items])
    return {k: reply.to_message(items[k][0]) if isinstance(reply, TrainReply)
            else Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reply),
                         reply_to=items[k][0])
            for k, reply in replies.items()}


def train_bundle(content: RecordDict, context: Context) -> RecordDict:
    """A cohort node's answer to a bundle of several clients' tasks (``cohort_grid``): each
    task runs with its partition's node config and node state (kept in this node's state under
    the partition's prefix); trained together where the batched engine can, else one by one;
    one reply or error per task, bundled."""
    tasks = []
    for task, partition in unbundle_tasks(content):
        sub = Context(run_id=context.run_id, node_id=context.node_id,
                      node_config=dict(context.node_config) | {"partition-id": partition},
                      state=partition_state(context.state, partition),
                      run_config=context.run_config)
        tasks.append((task, sub, partition))
    batched = train_cohort([(task, sub) for task, sub, _ in tasks])
    replies: list[RecordDict | str] = []
    for k, (task, sub, partition) in enumerate(tasks):
        try:
            reply = batched[k] if k in batched else train_reply(task, sub)
            replies.append(reply.to_content() if isinstance(reply, TrainReply) else reply)
        except Exception as err:  # noqa: BLE001 - what the runtime does: an error reply
            replies.append(f"{err.__class__.__name__}: {err}")
        keep_partition_state(context.state, partition, sub.state)
    return bundle_replies(replies)


def train_cohort(items: list[tuple[RecordDict, Context]]) -> dict[int, TrainReply | str]:
    """The tasks of one round (train messages' contents, each with its node's context)
    trained as cohorts (one per shared model: same method, backbone and training config) by
    ``training.batched.Cohort``. Returns the replies by position in ``items``; a task it does
    not answer (its method's step is not plain local training, a fault, a payload its recipe
    refuses, a model the cohort cannot split) is left to ``train_reply``, which answers it
    exactly as before. Each reply is built as ``train_reply`` builds it. Where the engine
    itself fails, each client of that cohort gets the failure as its reply (a string: the
    error's reason), never a sequential retry: the round counts it as that client's error,
    and a record made by the batched engine is never quietly the sequential engine's."""
    started = time.perf_counter()
    cohorts: dict = {}
    for index, (content, context) in enumerate(items):
        try:
            prepared = _cohort_member(content, context)
        except Exception:  # noqa: BLE001 - no training yet: ``train_reply`` does the same
            continue  # preparation and raises the same error, as the client's error reply
        if prepared is not None:
            key = (id(prepared["model"]), prepared["cfg"].training)
            cohorts.setdefault(key, []).append((index, prepared))
    replies: dict[int, TrainReply] = {}
    for members in cohorts.values():
        try:
            replies |= _train_cohort(members, started)
        except NotBatchable as why:  # every member goes the sequential way
            log.info("fedtune: client-engine batched: %d clients train one after another: %s",
                     len(members), why)
        except Exception as err:  # noqa: BLE001 - the engine failed: its clients' error replies
            log.exception("fedtune: client-engine batched failed for %d clients", len(members))
            reason = f"client-engine batched failed: {err.__class__.__name__}: {err}"
            replies |= {index: reason for index, _ in members}
    return replies


def _cohort_member(content: RecordDict, context: Context) -> dict | None:
    """What ``train_reply`` works out before training, for one task (None: the sequential
    path trains it)."""
    cfg, fetched = node_config_of(context)
    group = node_group(cfg, context)
    task = TrainTask.from_content(content)
    cfg = group_config(cfg, group).replace(lr=round_lr(cfg, task.server_round))
    recipe = recipe_for(cfg, group)
    if not_batchable(cfg, recipe) is not None or parse_faults(cfg.federation.fault_injection):
        return None
    pid, _, examples, _ = local_data(cfg, context)
    model, device = runtime(cfg, recipe, context.node_config)
    plan = task.layers
    if list(plan) != sorted(set(plan)) or not all(0 <= j < model.num_blocks for j in plan):
        return None  # the sequential path says what is wrong with it
    return dict(context=context, cfg=cfg, fetched=fetched, task=task, recipe=recipe,
                pid=pid, examples=examples, model=model, device=device)


def _train_cohort(members: list[tuple[int, dict]], started: float) -> dict[int, TrainReply]:
    first = members[0][1]
    model, device = first["model"], first["device"]
    # first the blocks (a fresh node builds its adapters' tensors here), then the cohort,
    # which lists the model's tensors
    hold_blocks(model, sorted({j for _, m in members for j in m["task"].layers}))
    cohort = Cohort(model, first["cfg"].training, device)
    joined = []
    for index, m in members:  # each client prepared by its own recipe on the shared model
        recipe, plan, task = m["recipe"], m["task"].layers, m["task"]
        try:
            recipe.configure(task.config())
            m["params"] = params = recipe.trainables(model, plan)
            recipe.assign(model, plan, from_record(task.arrays))
            recipe.begin(params, m["context"])
        except (ValueError, KeyError):  # a payload it refuses: its error comes from
            continue  # the sequential path
        seed = m["cfg"].seed * 1_000_003 + task.server_round * 1009 + m["pid"]
        cohort.add(plan, params, replace(m["examples"], max_batches=task.max_batches), seed)
        joined.append((index, m))
    if not joined:
        return {}
    fit_started = time.perf_counter()
    losses = cohort.train()
    fit_seconds = (time.perf_counter() - fit_started) / len(joined)  # each client's share
    replies = {}
    for k, (index, m) in enumerate(joined):
        cohort.load(k)
        updated = m["recipe"].trained(m["params"]) | m["recipe"].reply()
        metrics = {FIT_SECONDS: fit_seconds,
                   TRAIN_SECONDS: (time.perf_counter() - started) / len(joined),
                   CHECKPOINT_BYTES: m["fetched"], TRAINED_BATCHED: 1, **process_stats()}
        replies[index] = TrainReply(to_record(updated), len(m["examples"]), losses[k], metrics)
    return replies
