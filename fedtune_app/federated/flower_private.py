"""The only module that imports Flower's private modules: everything else uses Flower's public API
(``flwr.app``, ``flwr.serverapp``, ``flwr.serverapp.strategy``, ``flwr.clientapp``).

Each name below has no public counterpart in Flower 1.41 or 1.42; a Flower release may move it, so a
Flower upgrade starts here (``tests/test_flower_private.py`` keeps every other module, test and
benchmark from importing these modules directly). Why each is needed:

- ``parse_config_args``: parses a ``--run-config`` string exactly as ``flwr run`` does (quoting,
  TOML values, a TOML file path), so ``fedtune`` commands read a run config as Flower will.
- ``ErrorCode``, ``SUPERLINK_NODE_ID``: the codes of a reply's ``Error`` and the id the SuperLink
  sends under when it answers for an unreachable node (NODE_UNAVAILABLE); the public ``Error``
  carries only the bare integer.
- ``NodeInfo``: what ``Grid.get_nodes`` returns; the in-process Grid must return the same type.
- ``TaskIdentity``: the run/node/task ids a ``Message`` takes its metadata from, set by Flower's
  own processes; building a Message in a process Flower did not start (the in-process Grid, a
  node's training worker, tests, benchmarks) must set it.
- ``message_to_proto``, ``message_from_proto``, ``context_to_proto``, ``context_from_proto``,
  ``recorddict_to_proto``, ``recorddict_from_proto`` and the protobuf classes ``MessageProto``,
  ``ContextProto``, ``RecordDictProto``: Flower's own wire encoding of a Message, its Context
  and a RecordDict, which the node's training worker uses to pass them between processes
  without pickle.
- ``get_all_nested_objects``: the objects a Message is split into on the wire, which the byte
  benchmark counts.
"""

from flwr.common.config import parse_config_args
from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
from flwr.common.serde import (
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)
from flwr.proto.message_pb2 import Context as ContextProto  # pylint: disable=E0611
from flwr.proto.message_pb2 import Message as MessageProto  # pylint: disable=E0611
from flwr.proto.node_pb2 import NodeInfo  # pylint: disable=E0611
from flwr.proto.recorddict_pb2 import RecordDict as RecordDictProto  # pylint: disable=E0611
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from flwr.supercore.task_identity import TaskIdentity

__all__ = [
    "SUPERLINK_NODE_ID", "ContextProto", "ErrorCode", "MessageProto", "NodeInfo",
    "RecordDictProto", "TaskIdentity", "context_from_proto", "context_to_proto",
    "get_all_nested_objects", "message_from_proto", "message_to_proto", "parse_config_args",
    "recorddict_from_proto", "recorddict_to_proto",
]
