"""A real Flower deployment on loopback: one SuperLink and N SuperNodes, each its own process.

Used by the deployment tests. Everything binds to 127.0.0.1 on free ports of a private range
(never Flower's defaults), Flower's state lives in a temporary FLWR_HOME, and ``stop`` ends
exactly the process groups this object started (each process is started in a new session, so
its group holds it and the helpers it spawns: SuperExec, ServerApp, ClientApp processes).
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from fedtune_app.tools import cli

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PORT_RANGE = (19000, 19999)


def free_port(taken: set[int]) -> int:
    for port in random.sample(range(*PORT_RANGE), 200):
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {PORT_RANGE}")


def flower_env(home: Path) -> dict[str, str]:
    """What `fedtune run` gives Flower (the Makefile's settings, local-SuperLink ports of its own:
    `flwr run` would reuse any SuperLink already on Flower's fixed ones), with this test's
    FLWR_HOME and the hub offline whatever the caller's shell says."""
    return cli.flower_env(ROOT) | {"FLWR_HOME": str(home), "HF_HUB_OFFLINE": "1"}


class LocalDeployment:
    """``tls``: a dict with ca/cert/key paths (secure), or None (``--insecure``).
    ``auth_keys``: SuperNode authentication, one (private, public) key pair per node; the
    public keys of the nodes in ``registered`` (default: all) are registered first."""

    def __init__(self, workdir: Path, node_configs: list[str], tls: dict | None = None,
                 auth_keys: list[tuple[Path, Path]] | None = None,
                 registered: list[int] | None = None, name: str = "fedtune-test",
                 started: list[int] | None = None):
        """``started``: the nodes ``start`` starts (default: all); ``start_node`` starts the
        others later (a late device)."""
        self.workdir, self.node_configs, self.tls, self.name = workdir, node_configs, tls, name
        self.auth_keys = auth_keys
        self.registered = range(len(node_configs)) if registered is None else registered
        self.started = range(len(node_configs)) if started is None else started
        self.node_ids: dict[int, int] = {}  # node index -> node id the SuperLink gave it
        self.home = workdir / "flwr-home"
        self.home.mkdir(parents=True, exist_ok=True)
        self.env = flower_env(self.home)
        taken: set[int] = set()
        self.link_port = free_port(taken)
        self.node_ports = [free_port(taken) for _ in node_configs]
        self.procs: list[subprocess.Popen] = []
        self.nodes: dict[int, subprocess.Popen] = {}  # node index -> its SuperNode process
        self.launches: dict[int, int] = {}  # node index -> SuperNode processes started

    def _spawn(self, name: str, args: list[str]) -> subprocess.Popen:
        log = (self.workdir / f"{name}.log").open("wb")
        proc = subprocess.Popen([str(BIN / args[0]), *args[1:]], env=self.env, stdout=log,
                                stderr=subprocess.STDOUT, cwd=self.workdir,
                                start_new_session=True)
        self.procs.append(proc)
        return proc

    def _security(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        return ["--ssl-ca-certfile", str(self.tls["ca"]), "--ssl-certfile", str(self.tls["cert"]),
                "--ssl-keyfile", str(self.tls["key"])]

    def flwr(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(BIN / "flwr"), *args], env=self.env, cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)

    def start(self) -> "LocalDeployment":
        address = f"127.0.0.1:{self.link_port}"
        link = ["flower-superlink", *self._security(), "--host", "127.0.0.1",
                "--port", str(self.link_port), "--disable-runtime-dependency-installation"]
        if self.auth_keys:
            link.append("--enable-supernode-auth")
        self._wait_port(self.link_port, "superlink", self._spawn("superlink", link))
        entry = [f"[superlink.{self.name}]", f'address = "{address}"']
        entry += ([f'root-certificates = "{self.tls["ca"]}"'] if self.tls else ["insecure = true"])
        (self.home / "config.toml").write_text("\n".join(entry) + "\n")
        if self.auth_keys:  # the SuperLink only accepts SuperNodes whose public key it knows
            for i in self.registered:
                done = self.flwr("supernode", "register", str(self.auth_keys[i][1]), self.name,
                                 "--format", "json")
                if done.returncode:
                    raise RuntimeError("flwr supernode register failed:\n"
                                       f"{done.stdout}{done.stderr}")
                self.node_ids[i] = json.loads(done.stdout)["node-id"]
        for i in self.started:
            self._launch_node(i)
        for i in self.started:  # an unregistered node is refused and exits: not waited for
            if i in self.registered:
                self._wait_port(self.node_ports[i], f"supernode {i}", self.nodes[i])
        return self

    def _launch_node(self, i: int) -> subprocess.Popen:
        security = (["--root-certificates", str(self.tls["ca"])] if self.tls else ["--insecure"])
        if self.auth_keys:
            security += ["--auth-supernode-private-key", str(self.auth_keys[i][0])]
        self.launches[i] = self.launches.get(i, 0) + 1
        name = f"supernode-{i}" + (f"-{self.launches[i]}" if self.launches[i] > 1 else "")
        self.nodes[i] = self._spawn(name, [
            "flower-supernode", *security, "--superlink", f"127.0.0.1:{self.link_port}",
            "--host", "127.0.0.1", "--port", str(self.node_ports[i]),
            "--node-config", self.node_configs[i]])
        return self.nodes[i]

    def start_node(self, i: int, timeout: float = 180) -> float:
        """Start SuperNode ``i`` (late, or again after ``kill_node``) and wait until it runs.
        While the SuperLink still lists its previous instance as online it refuses the key
        ("Failed to activate SuperNode", exit code 305): start it again every 2 s. Returns
        the seconds until one instance stayed up."""
        started = time.time()
        while True:
            proc = self._launch_node(i)
            try:
                code = proc.wait(timeout=8)  # refused instances exit within a second or two
            except subprocess.TimeoutExpired:
                self._wait_port(self.node_ports[i], f"supernode {i}", proc)
                return time.time() - started
            if time.time() - started > timeout:
                raise RuntimeError(f"supernode {i} kept exiting (last code {code}) for "
                                   f"{timeout} s; logs:\n{self.logs()}")
            time.sleep(2)

    def launch_once(self, i: int, wait: float = 30) -> int | None:
        """Start SuperNode ``i`` once: its exit code if it exits within ``wait`` s, else None
        (it runs)."""
        try:
            return self._launch_node(i).wait(timeout=wait)
        except subprocess.TimeoutExpired:
            return None

    def kill_node(self, i: int) -> None:
        """SIGKILL SuperNode ``i`` and the ClientApp processes it started: a device that dies."""
        try:
            os.killpg(self.nodes[i].pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.nodes[i].wait(timeout=30)

    def _wait_port(self, port: int, what: str, proc: subprocess.Popen,
                   timeout: float = 120) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline and proc.poll() is None:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"{what} did not open 127.0.0.1:{port}; logs:\n{self.logs()}")

    def run(self, run_config: str, timeout: float) -> subprocess.CompletedProcess:
        """``flwr run . NAME --stream``: returns when the run has finished."""
        return self.flwr("run", ".", self.name, "--stream", "--run-config", run_config,
                         timeout=timeout)

    def run_in_background(self, run_config: str) -> tuple[subprocess.Popen, Path]:
        """``flwr run . NAME --stream`` started; its output goes to the returned file, which a
        test reads while the run goes on: unbuffered, else the lines reach the file in 8 KB
        blocks, minutes after the events they report."""
        out = self.workdir / "flwr-run.log"
        proc = subprocess.Popen([str(BIN / "flwr"), "run", ".", self.name, "--stream",
                                 "--run-config", run_config],
                                env=self.env | {"PYTHONUNBUFFERED": "1"}, cwd=ROOT,
                                stdout=out.open("wb"), stderr=subprocess.STDOUT,
                                start_new_session=True)
        self.procs.append(proc)
        return proc, out

    def logs(self) -> str:
        return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.workdir.glob("*.log")))

    def stop(self) -> None:
        """SIGTERM to each group we started, SIGKILL to what is left after 10 s."""
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for proc in self.procs:
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            for proc in self.procs:
                try:
                    proc.wait(timeout=max(0.1, deadline - time.time()))
                except subprocess.TimeoutExpired:
                    pass
            if all(_group_gone(p.pid) for p in self.procs):
                return

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


def start_worker(tmp_path: Path, name: str = "worker") -> tuple[subprocess.Popen, Path, Path]:
    """A ``fedtune node-worker`` listening on ``NAME.sock`` with the key ``NAME.key`` (created),
    logging to ``NAME.log``; returns once it listens."""
    sock, key = tmp_path / f"{name}.sock", tmp_path / f"{name}.key"
    log = (tmp_path / f"{name}.log").open("wb")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "fedtune_app.tools.cli", "node-worker",
                             "--address", str(sock), "--authkey-file", str(key)], env=env,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.time() + 120
    while not sock.exists():
        if proc.poll() is not None or time.time() > deadline:
            raise RuntimeError((tmp_path / f"{name}.log").read_text())
        time.sleep(0.2)
    return proc, sock, key


def stop_worker(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def served_by(log: Path, at_least: int = 0, wait_s: float = 20) -> list[tuple[str, str]]:
    """The worker's "served" lines. It writes one after the reply has left, so a caller that
    expects ``at_least`` of them waits (bounded) for the last ones to be written."""
    deadline = time.monotonic() + wait_s
    while True:
        served = re.findall(r"pid=(\d+) served (\w+) message", log.read_text())
        if len(served) >= at_least or time.monotonic() > deadline:
            return served
        time.sleep(0.1)


def kinds_served(log: Path, pid: int, at_least: int) -> list[str]:
    """The kinds of message ("query", "train") the worker logged, in order, once it has logged
    ``at_least`` of them, each served by its one process ``pid``."""
    served = served_by(log, at_least)
    assert {p for p, _ in served} == {str(pid)}, served
    return [kind for _, kind in served]
