"""The real thing: `flwr run .` through Flower's Ray-backed simulation engine."""

import contextlib
import json
import re
import socket
import subprocess
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedtune_app.methods import resolve_config
from fedtune_app.tools.local_superlink import stop
from fedtune_app.tools.startup import StartupWatch
from localdeploy import BIN, ROOT, flower_env
from runs import assert_accuracy_counts_the_test_set

# a `flwr run` through Ray: `make test` runs these one at a time (scripts/test.sh)
pytestmark = pytest.mark.ray

# Flower 1.41's local-SuperLink HTTP and Control API ports (flwr.cli.constant, a private module)
FLOWER_LOCAL_SUPERLINK_PORTS = (39091, 39093)


def flwr_run(tmp_path: Path, run_config: str, supernodes: int = 3,
             timeout: int = 600) -> tuple[Path | None, str]:
    """`flwr run .` with its own FLWR_HOME; stops the SuperLink it leaves, also on failure.
    ``run_config`` is Flower's --run-config: "key=value ..." or a TOML file path."""
    home = tmp_path / "flwr-home"
    home.mkdir()
    cmd = [str(BIN / "flwr"), "run", str(ROOT), "--stream", "--federation-config",
           f"num-supernodes={supernodes} client-resources-num-cpus=1", "--run-config", run_config]
    for _ in range(2):
        try:
            proc = subprocess.run(cmd, env=flower_env(home), capture_output=True, text=True,
                                  timeout=timeout)
        finally:
            stop(str(home))
        log = proc.stdout + proc.stderr
        if not StartupWatch().scan(log):
            break  # else it failed to start (a busy machine): once more, as `fedtune run` does
    match = re.search(r"RESULTS (\S+)", log)
    return (Path(match.group(1)) if match else None), log


@pytest.mark.integration
def test_flwr_run_trains_fedra_in_ray_actors_and_rejects_raising_and_nan_clients(tmp_path):
    """The smoke preset through Ray's engine with four supernodes; test-only key
    ``fault-injection``: partition 2 raises every round, partition 3 replies NaN. Both are
    rejected and named each round; the state comes from partitions 0 and 1, which trained in
    Ray actor processes. (One Ray run for both: Ray's start-up is most of its cost.)

    Also: our `flwr run` leaves Flower's fixed local-SuperLink ports alone. They are held by a
    listener that never answers (where free to hold), which would make a `flwr run` on them fail
    to start its SuperLink, or reuse whatever SuperLink sits there."""
    config = tmp_path / "faults.toml"  # Flower's --run-config also takes a TOML file
    config.write_text(f'preset = "smoke"\nresults-dir = "{tmp_path}"\ncapacities = "4,2,1,1"\n'
                      'fault-injection = "raise=2,nan=3"\n')
    with contextlib.ExitStack() as held:
        for port in FLOWER_LOCAL_SUPERLINK_PORTS:
            listener = held.enter_context(socket.socket())
            with contextlib.suppress(OSError):  # taken already: by something we must not use
                listener.bind(("127.0.0.1", port))
                listener.listen()
        folder, log = flwr_run(tmp_path, str(config), supernodes=4)
    started = re.search(r"Starting local SuperLink on 127\.0\.0\.1:(\d+)", log)
    assert started and int(started.group(1)) not in FLOWER_LOCAL_SUPERLINK_PORTS, log[-3000:]
    assert folder, log[-4000:]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert [m["round"] for m in metrics] == [1, 2]
    smoke = resolve_config({"preset": "smoke", "capacities": "4,2,1,1"})
    for m in metrics:
        assert sorted(m["rejected"]) == ["2", "3"], m["rejected"]
        assert m["rejected"]["2"].startswith("client error")
        assert "NaN or Inf" in m["rejected"]["3"]
        assert m["state-updated"] is True
        assert_accuracy_counts_the_test_set(m, smoke)
        # the clients trained in Ray actor processes, not in the ServerApp's, each building the
        # backbone once for the whole run
        honest = [m["client-metrics"][c] for c in ("0", "1")]
        assert m["server"]["pid"] not in {c["pid"] for c in honest}
        assert all(c["backbone-builds"] == 1 for c in honest)
    rows = json.loads((folder / "allocation.json").read_text())
    assert [np.array(r["matrix"]).sum(1).tolist() for r in rows] == [[4, 2, 1, 1]] * 2
    state = load_file(str(folder / "state.safetensors"))
    assert state and all(np.isfinite(v).all() for v in state.values())
    assert (folder / "checkpoint.safetensors").is_file()
