#!/usr/bin/env bash
# Fault-injection trials outside CI, each compared with an oracle computed from the input.
#
#   platform/fault-trials.sh [N] [--seed S]
#
# 1. N kill -9 trials of the UPI job (default 100): one input log, one job restarted N times,
#    each killed (its whole process group) at a random moment after a random number of
#    committed batches; a summary table (trial, seed, kill point, batches committed before,
#    result) at the end. Replay a run with --seed.
# 2. The rest of the pytest fault suite in its slower variants (SRT_FAULT_FULL=1: the Kafka
#    broker down 30 s instead of 10 s).
# 3. RELIABILITY.md rendered from every run recorded in tests/artifacts/faults/.
#
# Exit status: non-zero if any trial lost or duplicated anything.
set -uo pipefail
cd "$(dirname "$0")/.."
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
N="${1:-100}"
shift || true

status=0
.venv/bin/python -m tests.faults.killtrials --trials "$N" "$@" || status=$?
SRT_FAULT_FULL=1 .venv/bin/python -m pytest -m faults tests/faults -p no:cacheprovider -q \
    -k "not kill_dash_nine" --durations=15 || status=$?
.venv/bin/python -m tests.faults.report
exit "$status"
