#!/usr/bin/env bash
# A local Kafka-protocol broker from the noida-db wheel (dev extras), in the foreground.
#
#   platform/kafka-broker.sh [PORT] [DATA_DIR]     # default 9092, ./srt-data/kafka
#
# Then: srt run examples/upi_per_minute.py --set source.kind=kafka \
#         --set source.bootstrap_servers=127.0.0.1:PORT --set sink.kind=kafka
# noida-db honours transactions, read_committed and producer fencing (the exactly-once sink
# needs them). Development only: single node, data in memory saved to DATA_DIR.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${SRT_PYTHON:-$ROOT/.venv/bin/python}"
PORT="${1:-9092}"
DATA="${2:-$ROOT/srt-data/kafka}"
BIN="$("$PY" -c 'from importlib.resources import files; print(files("noida_db").joinpath("noida-db"))')"
chmod +x "$BIN"
exec "$BIN" start --only kafka --kafka-port "$PORT" --data-dir "$DATA" --host 127.0.0.1
