#!/usr/bin/env bash
# Install with the dev extras, check the import contracts (pyproject's [tool.importlinter]),
# and run the whole test suite (real Spark, DuckDB, Kafka-protocol broker, S3 endpoint, processes).
set -euo pipefail
cd "$(dirname "$0")/.."
platform/bootstrap.sh dev
.venv/bin/lint-imports
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
exec .venv/bin/python -m pytest -ra "$@"
