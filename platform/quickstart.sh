#!/usr/bin/env bash
# Install, generate 200k UPI payments into the embedded log, and run the UPI job on them:
# no Kafka, S3 or PostgreSQL; everything lives under ./srt-data.
set -euo pipefail
cd "$(dirname "$0")/.."
platform/bootstrap.sh
export PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
data=srt-data
srt log create upi-payments --partitions 4 --log-dir "$data/log" --exist-ok \
  --schema "txn_id string, merchant_id string, amount_paise bigint, ts_ms bigint"
python examples/upi_events.py --count "${EVENTS:-200000}" --bad-every 50000 --seed "$RANDOM" \
  | srt log append upi-payments --key-field merchant_id --log-dir "$data/log"
srt run examples/upi_per_minute.py --available-now
