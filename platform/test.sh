#!/usr/bin/env bash
# Install with the dev extras; check the import contracts (pyproject's [tool.importlinter]), lint
# and format (ruff) and types (mypy on the packages); then run the whole test suite (real Spark,
# DuckDB, Kafka-protocol broker, S3 endpoint, PostgreSQL, ClickHouse, Dagster, processes).
#
#   platform/test.sh [pytest args]   the whole suite (what CI runs, through .ci/run)
#   platform/test.sh --quick [args]  a developer's loop: the same checks, then only the tests
#                                    that start no Spark and are no fault trial (a few minutes)
set -euo pipefail
quick=()
if [ "${1:-}" = "--quick" ]; then
  shift
  quick=(-m "not (spark or slow or cluster or airflow or faults)")
fi
cd "$(dirname "$0")/.."
platform/bootstrap.sh dev
.venv/bin/lint-imports
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$PWD/.venv/bin/python"
# Three workers (pytest-xdist), each test file on one of them: the suite's tests wait on JVMs,
# brokers, servers and polled conditions a good part of their time, so on 2 cores three of
# them keep both busy (the whole suite: 2,071 s of pytest with two, 1,816 s with three; NOTES).
# The longest files go first (tests/conftest.py, LONGEST_FILES), in the order collection gives.
exec .venv/bin/python -m pytest -ra --durations=25 -n 3 --dist loadfile --no-loadscope-reorder \
  "${quick[@]}" "$@"
