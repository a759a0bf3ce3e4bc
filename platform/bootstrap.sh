#!/usr/bin/env bash
# Create .venv with Python 3.11 and install the project (editable) with the given extras.
#   platform/bootstrap.sh            runtime only
#   platform/bootstrap.sh dev        + Dagster, dbt, Great Expectations, test services, Debian's
#                                    chromium for the Dagster UI test (platform/install-chromium.sh)
#                                    and clickhouse-server for the ClickHouse sink tests
#                                    (platform/install-clickhouse.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python=${PYTHON:-python3.11}
if ! command -v "$python" >/dev/null; then
  echo "bootstrap: $python not found; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
if ! command -v java >/dev/null; then
  echo "bootstrap: Spark needs Java 17 (java not on PATH); e.g. apt-get install openjdk-17-jre-headless" >&2
  exit 1
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
spec="."
case "$extras" in
  "") ;;
  dev)
    spec=".[dagster,dbt,dev]"
    platform/install-chromium.sh || echo "bootstrap: continuing without chromium (see above)" >&2
    platform/install-clickhouse.sh \
      || echo "bootstrap: continuing without clickhouse-server (see above)" >&2
    ;;
  *) echo "bootstrap: unknown extras '$extras' (use: dev)" >&2; exit 2 ;;
esac
.venv/bin/python -m pip install -q -e "$spec"
