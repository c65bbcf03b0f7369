"""A node's long-lived worker: torch, the model, its frozen blocks and the prepared data stay warm
between messages.

Flower 1.41 and 1.42 start a fresh ``flwr-clientapp`` process for every message, which then pays
the imports, the model build and the data load again. Beside ``flower-supernode`` a device runs

    fedtune node-worker --address /run/fedtune/worker.sock --authkey-file /etc/fedtune/worker.key

and starts its SuperNode with ``--node-config "... worker-address=\\"/run/fedtune/worker.sock\\"
worker-authkey-file=\\"/etc/fedtune/worker.key\\""``. The ClientApp then hands each message to
the worker (``delegate``) over a local channel (``multiprocessing.connection``: a Unix socket,
or ``127.0.0.1:PORT``) that both ends authenticate with the shared key (HMAC challenge). The key
file must be readable by its owner alone (0600); the worker creates it so when it is missing.
What travels is Flower's own protobuf encoding of the message and the node's context (never
pickle); the reply's content and the updated context come back the same way.

The worker answers one message at a time (a node trains one plan at a time) and keeps the
client module's per-process caches (``client.runtime``: model and held blocks; prepared data),
exactly as a simulation actor does. When no worker is configured, or the configured one cannot
be reached or authenticated, the ClientApp handles the message in its own process and says so in
the SuperNode's log.
"""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import stat
import time
import traceback
from multiprocessing.connection import Client, Listener
from pathlib import Path

from flwr.app import Context, Message, RecordDict

from fedtune_app.config import ConfigError
from fedtune_app.federated.flower_private import (
    ContextProto,
    MessageProto,
    RecordDictProto,
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
    recorddict_from_proto,
    recorddict_to_proto,
)

log = logging.getLogger("flwr")
ADDRESS_KEY, AUTHKEY_KEY = "worker-address", "worker-authkey-file"
KINDS = ("query", "train")
_SAID_NO_WORKER: list = []


def parse_address(text: str):
    """``HOST:PORT`` (loopback only: the channel is local) or a Unix socket path."""
    text = str(text)
    host, sep, port = text.rpartition(":")
    if sep and port.isdigit() and "/" not in text:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ConfigError(f"{ADDRESS_KEY}={text!r}: the worker listens on loopback only "
                              "(127.0.0.1:PORT) or on a Unix socket path")
        return host, int(port)
    return text


def read_authkey(path, create: bool = False) -> bytes:
    """The shared key; refused when others than its owner may read it."""
    path = Path(path).expanduser()
    if create and not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    if not path.is_file():
        raise ConfigError(f"{AUTHKEY_KEY}={str(path)!r} does not exist")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise ConfigError(f"{AUTHKEY_KEY}={str(path)!r} has permissions {oct(mode)}: anyone who "
                          f"can read it can run code in the worker; chmod 600 {path}")
    key = path.read_bytes().strip()
    if len(key) < 32:
        raise ConfigError(f"{AUTHKEY_KEY}={str(path)!r} holds {len(key)} bytes; use at least 32 "
                          "(e.g. `openssl rand -hex 32`)")
    return key


# -- the ClientApp's side --------------------------------------------------------------------
def delegate(kind: str, msg: Message, context: Context) -> Message | None:
    """The worker's reply to ``msg``, or None when the message must be handled in this process
    (no worker configured, or it cannot be reached); the context's state is updated as the
    handler updated it. A handler's error in the worker is raised here, as it would be in
    process."""
    node_config = context.node_config
    if ADDRESS_KEY not in node_config:
        if not _SAID_NO_WORKER:  # once per process: a simulation actor serves many messages
            _SAID_NO_WORKER.append(True)
            log.info("fedtune: no node worker configured (node config %s): handling the %s "
                     "message in this process", ADDRESS_KEY, kind)
        return None
    address = node_config[ADDRESS_KEY]
    try:
        key = read_authkey(node_config.get(AUTHKEY_KEY, ""))
        conn = Client(parse_address(address), authkey=key)
    except (OSError, EOFError, ConfigError, ValueError) as err:
        # AuthenticationError is a ProcessError, not an OSError: named apart below
        log.warning("fedtune: node worker at %s not reachable (%s: %s): handling the %s message "
                    "in this process (cold start)", address, type(err).__name__, err, kind)
        return None
    except Exception as err:  # multiprocessing.AuthenticationError: another key
        log.warning("fedtune: node worker at %s refused us (%s: %s): handling the %s message in "
                    "this process (cold start)", address, type(err).__name__, err, kind)
        return None
    with conn:
        try:
            conn.send_bytes(kind.encode())
            conn.send_bytes(message_to_proto(msg).SerializeToString())
            conn.send_bytes(context_to_proto(context).SerializeToString())
            status = conn.recv_bytes()
            first = conn.recv_bytes()
            second = conn.recv_bytes() if status == b"ok" else b""
        except (OSError, EOFError) as err:  # the worker died mid-message: nothing was kept
            log.warning("fedtune: node worker at %s dropped the %s message (%s: %s): handling "
                        "it in this process", address, kind, type(err).__name__, err)
            return None
    if status != b"ok":
        raise RuntimeError(f"node worker at {address} failed on the {kind} message:\n"
                           f"{first.decode(errors='replace')}")
    content = RecordDictProto()
    content.ParseFromString(first)
    updated = ContextProto()
    updated.ParseFromString(second)
    context.state = context_from_proto(updated).state
    return Message(recorddict_from_proto(content), reply_to=msg)


# -- the worker's side -----------------------------------------------------------------------
def handle(kind: str, msg: Message, context: Context) -> RecordDict:
    from fedtune_app.apps.client import handle_query, handle_train
    from fedtune_app.federated.flower_private import TaskIdentity

    # a reply Message takes its sender from the task identity, as in a flwr-clientapp process
    TaskIdentity.task_id, TaskIdentity.run_id = 0, context.run_id
    TaskIdentity.node_id = context.node_id
    handler = handle_query if kind == "query" else handle_train
    return handler(msg, context).content


def serve_one(conn) -> str:
    """Read one request from ``conn``, handle it, answer; returns its kind."""
    kind = conn.recv_bytes().decode()
    raw_msg, raw_context = conn.recv_bytes(), conn.recv_bytes()
    try:
        if kind not in KINDS:
            raise ValueError(f"unknown message kind {kind!r} (expected one of {KINDS})")
        proto, context_proto = MessageProto(), ContextProto()
        proto.ParseFromString(raw_msg)
        context_proto.ParseFromString(raw_context)
        context = context_from_proto(context_proto)
        content = handle(kind, message_from_proto(proto), context)
    except Exception:  # the node's error goes to the ClientApp, the worker serves on
        conn.send_bytes(b"error")
        conn.send_bytes(traceback.format_exc().encode())
        return kind
    conn.send_bytes(b"ok")
    conn.send_bytes(recorddict_to_proto(content).SerializeToString())
    conn.send_bytes(context_to_proto(context).SerializeToString())
    return kind


def serve(address: str, authkey_file: str, max_messages: int = 0) -> int:
    """Serve messages until stopped (or ``max_messages`` of them); returns how many."""
    key = read_authkey(authkey_file, create=True)
    where = parse_address(address)
    if isinstance(where, str) and os.path.exists(where):
        os.unlink(where)  # a stale socket of a previous worker
    served = 0
    with Listener(where, authkey=key, backlog=16) as listener:
        if isinstance(where, str):
            os.chmod(where, 0o600)
        print(f"fedtune node worker pid={os.getpid()} listening at {address}", flush=True)
        while not max_messages or served < max_messages:
            try:
                conn = listener.accept()
            except Exception as err:  # a peer without the key: refused, keep serving
                print(f"fedtune node worker: refused a connection ({type(err).__name__}: "
                      f"{err})", flush=True)
                continue
            with conn:
                started = time.perf_counter()
                try:
                    kind = serve_one(conn)
                except (OSError, EOFError) as err:
                    print(f"fedtune node worker: connection lost ({err})", flush=True)
                    continue
            served += 1
            print(f"fedtune node worker pid={os.getpid()} served {kind} message {served} in "
                  f"{time.perf_counter() - started:.2f} s", flush=True)
    return served


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="fedtune node-worker",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--address", required=True,
                        help="Unix socket path, or 127.0.0.1:PORT (the node config's "
                             f"{ADDRESS_KEY})")
    parser.add_argument("--authkey-file", required=True,
                        help=f"shared key (0600; created when missing; the node config's "
                             f"{AUTHKEY_KEY})")
    parser.add_argument("--max-messages", type=int, default=0, help="stop after N (0: never)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    serve(args.address, args.authkey_file, args.max_messages)
