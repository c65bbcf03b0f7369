"""The quiet view of `fedtune run` (tools/run_view.py) on lines of a real smoke run's log
(`$FLWR_HOME/last-run.log`, ANSI colours and all), and on the warnings and errors a run can
print."""

from fedtune_app.tools.run_view import WAIT_SECONDS, QuietView, tail

G, Y, R, C, E = "\x1b[92m", "\x1b[93m", "\x1b[91m", "\x1b[36m", "\x1b[0m"  # Flower's, Ray's
ACTOR = f"{C}(ClientAppActor pid=15639){E} "
WAIT = ("00:45:32 fedtune waiting for the nodes to start, 5 s so far (normal: Ray takes about "
        "30 s to start simulated nodes, longer on a busy machine): no node has answered yet; "
        "giving up in 3595 s (run-config key 'round-timeout')")
HIDDEN = [
    "Starting local SuperLink on 127.0.0.1:46483...",
    "Successfully started run 664336772847134395",
    f"{G}INFO {E}:      Starting Flower Simulation",
    f"{Y}WARNING {E}:   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2.",
    f"{G}INFO {E}:      \tflwr federation simulation-config @none/default <superlink> "
    "--num-supernodes <N>",
    "Successfully installed fedtune to /work/app/.flwr/apps/fedtune.fedtune.0.1.0.ceea5af1.",
    "00:45:27 fedtune asking new node(s) [3253752127183839882, 7117401641311345425] which "
    "partition they hold",
    "00:45:32 fedtune nodes so far: 0 of 1 partitions served (min-nodes), online nodes "
    "[3253752127183839882, 7117401641311345425], no partition served yet",
    "/venv/lib/python3.11/site-packages/ray/_private/worker.py:2051: FutureWarning: Tip: In "
    "future versions of Ray, Ray will no longer override accelerator visible devices env var",
    "  warnings.warn(",
    '  File "/venv/lib/python3.11/site-packages/flwr/clientapp/client_app.py", line 144, in '
    "__call__",
    f"{ACTOR}{G}INFO {E}:      fedtune: no node worker configured (node config "
    "worker-address): handling the query message in this process",
    "00:46:54 fedtune node 3253752127183839882 serves partition 2 (capacity 1)",
    "00:46:54 fedtune fedtune: fedra on mixer_s16_224, 3 clients [4, 2, 1], 2 rounds; results "
    "in /tmp/r/fedra-seed0-20261207-004654",
    f"{G}INFO {E}:      [ROUND 1/2]",
    f"{G}INFO {E}:      \t└──> Aggregated MetricRecord: {{'train-loss': 2.21}}",
    f"{ACTOR}{Y}WARNING {E}:   Manually terminating ClientAppActor",
    "00:47:00 fedtune fedtune: results in /tmp/r/fedra-seed0-20261207-004654",
    "RESULTS /tmp/r/fedra-seed0-20261207-004654",
]
SHOWN = [
    "00:46:59 fedtune round 1/2 | accuracy 0.2700 | loss 2.282 | train-loss 2.210 | down 0.05 "
    "MB | up 0.05 MB | rejected 0 | 5.2 s | elapsed 0:05 | ETA 0:05",
    "00:46:59 fedtune warning: round 1: rejected client 3 (node 7): client error: "
    "ValueError: boom",
    f"{R}ERROR {E}:     ServerApp thread raised an exception",
    f"{ACTOR}{Y}WARNING {E}:   fedtune: the node's batch does not fit its memory",
    # a traceback printed raw by a node: its first line and the error, not the frames
    f"{ACTOR}Traceback (most recent call last):",
    f"{ACTOR}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
]


def test_the_quiet_view_shows_rounds_waits_warnings_and_errors_only():
    view = QuietView(clock=lambda: 0.0)
    assert [line for line in HIDDEN + SHOWN if view(line + "\n")] == SHOWN
    assert view(WAIT + "\n")  # the first wait's line


def test_a_wait_shows_once_per_30_s_the_log_keeps_each_5_s_line():
    now = [100.0]
    view = QuietView(clock=lambda: now[0])
    shown = []
    for second in range(0, 95, 5):  # a wait's line every 5 s, as ``NodeSet.gather`` logs them
        now[0] = 100.0 + second
        shown += [second] if view(WAIT) else []
    assert WAIT_SECONDS == 30 and shown == [0, 30, 60, 90]


def test_a_failed_run_shows_the_end_of_its_log(tmp_path):
    log = tmp_path / "last-run.log"
    log.write_text("".join(f"line {i}\n" for i in range(50)))
    assert tail(log) == "".join(f"line {i}\n" for i in range(30, 50))
    log.write_text("only\n")
    assert tail(log) == "only\n"
