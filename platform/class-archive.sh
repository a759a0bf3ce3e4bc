#!/usr/bin/env bash
# Build the Spark driver JVM's class archive for this venv (stateful_runtime/runtime/session.py):
# one small run of the UPI example, after which the JVM writes the classes it loaded; sealed
# (moved into place with its size recorded) only when the run and the write completed.
#   platform/class-archive.sh        (platform/bootstrap.sh runs it when the venv has none)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
srt log create upi-payments --partitions 2 --log-dir "$tmp/log" >/dev/null
python examples/upi_events.py --count 5000 --bad-every 1000 --seed 1 \
  | srt log append upi-payments --key-field merchant_id --log-dir "$tmp/log" >/dev/null
if ! SRT_HOME="$tmp/home" SRT_CLASS_ARCHIVE=off SRT_CLASS_ARCHIVE_DUMP="$tmp/spark-classes.jsa" \
    srt run examples/upi_per_minute.py --available-now --set source.log_dir="$tmp/log" \
    --set checkpoint.dir="$tmp/ck" --set sink.database="$tmp/upi.duckdb" --set parallelism=2 \
    >"$tmp/run.log" 2>&1; then
  tail -20 "$tmp/run.log" >&2
  echo "class-archive: the warm-up run failed (above); Spark starts without the archive" >&2
  exit 1
fi
python -c 'import sys; from stateful_runtime.runtime.session import seal_class_archive as seal
print("class archive:", seal(sys.argv[1]))' "$tmp/spark-classes.jsa"
