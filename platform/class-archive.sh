#!/usr/bin/env bash
# Build the Spark driver JVM's class archive for this venv (stateful_runtime/runtime/session.py):
# small runs of two examples in one process, after which the JVM writes the classes it loaded; sealed
# (moved into place with its size recorded) only when the run and the write completed.
#   platform/class-archive.sh        (platform/bootstrap.sh runs it when the venv has none)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
srt log create upi-payments --partitions 2 --log-dir "$tmp/log" >/dev/null
# (with two malformed records, which the append reports: the job's dead-letter path runs too)
python examples/upi_events.py --count 5000 --bad-every 1000 --seed 1 \
  | srt log append upi-payments --key-field merchant_id --log-dir "$tmp/log" >"$tmp/append.log" 2>&1 \
  || { cat "$tmp/append.log" >&2; echo "class-archive: could not write the warm-up input" >&2; exit 1; }
# The UPI example (native window, DuckDB sink) and a keyed process function in one JVM.
warm_up='
import io, sys
from pathlib import Path
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
tmp = Path(sys.argv[1])
for job in ("upi_per_minute", "fraud_rate_limit"):
    values = {"source.log_dir": str(tmp / "log"), "checkpoint.dir": str(tmp / "ck" / job),
              "sink.database": str(tmp / f"{job}.duckdb"), "parallelism": "2"}
    out = io.StringIO()
    if JobRunner(load_job_file(f"examples/{job}.py", values), available_now=True, out=out).run():
        sys.exit(out.getvalue()[-3000:])
'
if ! SRT_HOME="$tmp/home" SRT_CLASS_ARCHIVE=off SRT_CLASS_ARCHIVE_DUMP="$tmp/spark-classes.jsa" \
    python -c "$warm_up" "$tmp" >"$tmp/run.log" 2>&1; then
  tail -20 "$tmp/run.log" >&2
  echo "class-archive: the warm-up run failed (above); Spark starts without the archive" >&2
  exit 1
fi
python -c 'import sys; from stateful_runtime.runtime.session import seal_class_archive as seal
print("class archive:", seal(sys.argv[1]))' "$tmp/spark-classes.jsa"
