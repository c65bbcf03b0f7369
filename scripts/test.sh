#!/usr/bin/env bash
# The test suite (what `make test` runs after the linters), in three parts:
#   1. the `flwr run`s through Ray (-m ray), one at a time, at normal priority;
#   2. then the other real-process runs (SuperLink, SuperNodes: -m integration), two at a time;
#   3. from the start and beside both, the logic tests on TEST_WORKERS processes, in a session
#      of their own at the lowest priority (nice 19, and so their autogroup where the kernel
#      groups processes by session), taking the CPU the integration runs leave while they wait.
# Why: Ray's start-up must register its raylet within a fixed 30 s, and on a machine whose
# cores other jobs of equal priority keep busy it fails (docs/reliability.md); on a 2-core AMD
# EPYC the suite's Ray runs beside its CPU-bound tests failed to start twice in a row.
# Each part lists its slowest tests; the logic tests' output follows the integration runs'.
set -u
cd "$(dirname "$0")/.."
# bytecode caches on (a shell may turn them off): each pytest process then reads the test
# modules pytest rewrote for its assertions, not rewrites them (about 2.4 of its 15 CPU-s of
# collection); __pycache__ is in .gitignore
unset PYTHONDONTWRITEBYTECODE
PYTEST=(env OMP_NUM_THREADS=1 .venv/bin/python -m pytest -q -p no:cacheprovider)
# the machine's busy CPU seconds (all processes; Linux): the summary says how CPU-bound the run was
busy() { awk '/^cpu /{print ($2+$3+$4+$7+$8+$9)/100; exit}' /proc/stat 2>/dev/null || echo 0; }
started=$(date +%s) busy_before=$(busy)
logic_log=$(mktemp)
trap 'rm -f "$logic_log"' EXIT

setsid bash -c 'echo 19 > /proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' logic \
    "${PYTEST[@]}" -n "${TEST_WORKERS:-2}" --durations=15 -m "not integration and not stress" \
    tests > "$logic_log" 2>&1 &
logic=$!
# a Ctrl-C reaches this shell's process group, not the logic tests' new session
trap 'kill -- -$logic 2>/dev/null; exit 130' INT TERM  # (the EXIT trap removes the log)

# the integration runs collect only the files that mark tests so (`pytest.mark.integration` or
# `.ray`, as a decorator, `pytestmark` or `pytest.param`'s marks): collecting the whole suite
# imports every test module: about 18 CPU-s in each of the three processes that would do it,
# against 7 for these files
integration_files=$(grep -lE "mark\.(integration|ray)\b" tests/test_*.py)
"${PYTEST[@]}" --durations=5 -m "ray and not stress" $integration_files
ray=$?
"${PYTEST[@]}" -n 2 --durations=5 -m "integration and not ray and not stress" $integration_files
deployment=$?
wait $logic
logic_status=$?
echo "== the logic tests, run beside the integration runs above =="
cat "$logic_log"
verdict() { if [ "$1" = 0 ]; then echo passed; else echo FAILED; fi; }
echo "make test: Ray runs $(verdict $ray), other integration runs $(verdict $deployment)," \
     "logic tests $(verdict $logic_status); $(($(date +%s) - started)) s, the machine busy for" \
     "$(awk -v a="$busy_before" -v b="$(busy)" 'BEGIN{printf "%.0f", b - a}') CPU-s on $(nproc) cores"
[ $ray = 0 ] && [ $deployment = 0 ] && [ $logic_status = 0 ]
