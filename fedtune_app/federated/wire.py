"""The messages between the ServerApp and a ClientApp, named once.

Two exchanges, both Flower ``Message``s whose content is a ``RecordDict``:

* the start-up **query** (``MessageType.QUERY``): ``config = {want: "info"}``; the node answers
  ``info = {partition-id, capacity, num-partitions, num-examples, group, label-counts,
  checkpoint-bytes, model-group, memory-mb, rank}`` (``NodeAnswer``);
* each round's **train task** (``MessageType.TRAIN``): ``arrays`` (the tensors the client
  receives) and ``config = {layers, server-round[, max-batches], <method extras>}``
  (``TrainTask``); the reply holds ``arrays`` (the tensors sent back) and ``metrics =
  {num-examples, train-loss, <more metrics>}`` (``TrainReply``).

A method's own entries of the train config (``LayerPlanStrategy.train_config``) travel as
``extras``: this module names only the keys every method shares. Entries keep their order on
the wire (results are compared bit for bit between versions)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict

# the records of a message's content
ARRAYS = "arrays"
CONFIG = "config"
METRICS = "metrics"
INFO = "info"

# the query and its answer
WANT = "want"
WANT_INFO = "info"
PARTITION_ID = "partition-id"
CAPACITY = "capacity"
NUM_PARTITIONS = "num-partitions"
NUM_EXAMPLES = "num-examples"  # also a train reply's metric: the client's |D_i|
GROUP = "group"
LABEL_COUNTS = "label-counts"
CHECKPOINT_BYTES = "checkpoint-bytes"  # also a train reply's metric
MODEL_GROUP = "model-group"
MEMORY_MB = "memory-mb"
RANK = "rank"

# the train task's config
LAYERS = "layers"
SERVER_ROUND = "server-round"
MAX_BATCHES = "max-batches"

# the train reply's metrics
TRAIN_LOSS = "train-loss"
FIT_SECONDS = "fit-seconds"
TRAIN_SECONDS = "train-seconds"
TRAINED_BATCHED = "trained-batched"  # 1: the batched client engine trained it; 0: sequential

TASK_KEYS = (LAYERS, SERVER_ROUND, MAX_BATCHES)


def query_message(node_id: int) -> Message:
    """The start-up question to a node: which partition, capacity and data it holds."""
    return Message(RecordDict({CONFIG: ConfigRecord({WANT: WANT_INFO})}), node_id,
                   MessageType.QUERY)


@dataclass(frozen=True)
class NodeAnswer:
    """A node's answer to the query."""

    partition_id: int
    capacity: int
    num_examples: int
    group: str
    label_counts: tuple[int, ...] = ()
    checkpoint_bytes: int = 0  # bytes of its one-time checkpoint fetch
    model_group: int = 0  # its model group (0 in a single-model run)
    num_partitions: int = 0  # the number of partitions it declares (0: not reported)
    memory_mb: int = 0  # the memory its model may use (0: not declared)
    rank: int = 0  # the LoRA rank it holds (0: not reported; 'lora-r')

    def to_content(self) -> RecordDict:
        return RecordDict({INFO: ConfigRecord({
            PARTITION_ID: self.partition_id, CAPACITY: self.capacity,
            NUM_PARTITIONS: self.num_partitions, NUM_EXAMPLES: self.num_examples,
            GROUP: self.group, LABEL_COUNTS: list(self.label_counts),
            CHECKPOINT_BYTES: self.checkpoint_bytes, MODEL_GROUP: self.model_group,
            MEMORY_MB: self.memory_mb, RANK: self.rank})})

    @classmethod
    def from_record(cls, info) -> NodeAnswer:
        """From the ``info`` ConfigRecord; the later-added entries may be missing."""
        return cls(int(info[PARTITION_ID]), int(info[CAPACITY]), int(info[NUM_EXAMPLES]),
                   str(info[GROUP]), tuple(info[LABEL_COUNTS]),
                   int(info.get(CHECKPOINT_BYTES, 0)), int(info.get(MODEL_GROUP, 0)),
                   int(info.get(NUM_PARTITIONS, 0)), int(info.get(MEMORY_MB, 0)),
                   int(info.get(RANK, 0)))

    @classmethod
    def from_message(cls, msg: Message) -> NodeAnswer:
        return cls.from_record(msg.content[INFO])


@dataclass(frozen=True)
class TrainTask:
    """One client's work for one round: the tensors it receives and the blocks it trains."""

    arrays: ArrayRecord
    layers: tuple[int, ...]  # the plan: the blocks this client trains
    server_round: int
    max_batches: int = 0  # cap on batches per local epoch (0 = none, and then not sent)
    extras: dict = field(default_factory=dict)  # the method's own entries (train_config)

    def __post_init__(self):
        clash = set(self.extras) & {LAYERS, SERVER_ROUND, MAX_BATCHES}
        if clash:
            raise ValueError(f"a method's train config may not set the shared key(s) "
                             f"{sorted(clash)}")

    def config(self) -> dict:
        """The train config as sent (and as ``Recipe.configure`` receives it)."""
        cap = {MAX_BATCHES: self.max_batches} if self.max_batches else {}
        return {LAYERS: list(self.layers), SERVER_ROUND: self.server_round} | cap | self.extras

    def to_content(self) -> RecordDict:
        return RecordDict({ARRAYS: self.arrays, CONFIG: ConfigRecord(self.config())})

    def to_message(self, node_id: int) -> Message:
        return Message(content=self.to_content(), message_type=MessageType.TRAIN,
                       dst_node_id=node_id, group_id=str(self.server_round))

    @classmethod
    def from_message(cls, msg: Message) -> TrainTask:
        return cls.from_content(msg.content)

    @classmethod
    def from_content(cls, content: RecordDict) -> TrainTask:
        config = dict(content[CONFIG])
        return cls(content[ARRAYS], tuple(int(j) for j in config[LAYERS]),
                   int(config[SERVER_ROUND]), int(config.get(MAX_BATCHES, 0)),
                   {k: v for k, v in config.items() if k not in TASK_KEYS})


@dataclass(frozen=True)
class TrainReply:
    """A client's answer to a train task: its tensors and how it trained."""

    arrays: ArrayRecord
    num_examples: int  # its |D_i|, the weight of its update
    train_loss: float
    metrics: dict = field(default_factory=dict)  # more metrics, after these two

    def to_content(self) -> RecordDict:
        return RecordDict({ARRAYS: self.arrays, METRICS: MetricRecord(
            {NUM_EXAMPLES: self.num_examples, TRAIN_LOSS: self.train_loss} | self.metrics)})

    def to_message(self, reply_to: Message) -> Message:
        return Message(self.to_content(), reply_to=reply_to)

    @classmethod
    def from_message(cls, msg: Message) -> TrainReply:
        """Raises on content of the wrong shape (a broken or hostile client): the caller
        rejects that reply. The number of examples is kept as sent, for the caller to check."""
        arrays, metrics = msg.content[ARRAYS], msg.content[METRICS]
        if not isinstance(arrays, ArrayRecord) or not isinstance(metrics, MetricRecord):
            raise TypeError(f"expected ArrayRecord '{ARRAYS}' and MetricRecord '{METRICS}'")
        rest = {k: v for k, v in metrics.items() if k not in (NUM_EXAMPLES, TRAIN_LOSS)}
        return cls(arrays, metrics[NUM_EXAMPLES], float(metrics[TRAIN_LOSS]), rest)
