#!/usr/bin/env bash
# Create .venv with Python 3.11 and install the project (editable) with the given extras.
#   platform/bootstrap.sh            runtime only
#   platform/bootstrap.sh dev        + Dagster, dbt, Great Expectations, test services, Debian's
#                                    chromium for the Dagster UI test (platform/install-chromium.sh)
#                                    and clickhouse-server for the ClickHouse sink tests
#                                    (platform/install-clickhouse.sh), then Airflow (the `airflow`
#                                    extra, for srt_airflow) constrained to what those resolved
#   platform/bootstrap.sh airflow    runtime + Airflow only (the provider without Dagster)
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
  airflow) spec=".[airflow]" ;;
  *) echo "bootstrap: unknown extras '$extras' (use: dev, airflow)" >&2; exit 2 ;;
esac
# The editable build prints setuptools' notice about same-named folders (InformationOnly, a
# UserWarning) into the user's first terminal; the project has none, so it is silenced.
PYTHONWARNINGS=ignore::UserWarning .venv/bin/python -m pip install -q -e "$spec"
if [ "$extras" = dev ]; then
  # Airflow shares the venv with Dagster, Spark and dbt only if it moves none of their versions:
  # it is installed constrained to everything the dev extras resolved (pip freeze), the way
  # Airflow's own constraint files pin an install. A conflict stops here with pip's reason
  # rather than downgrading a Dagster or Spark dependency (NOTES.md, "Airflow beside Dagster").
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  # (a package installed from a direct URL cannot be a constraint: left out)
  .venv/bin/python -m pip freeze --exclude-editable | grep -v ' @ ' > "$constraints" || true
  if ! PYTHONWARNINGS=ignore::UserWarning .venv/bin/python -m pip install -q -e ".[airflow]" \
      -c "$constraints"; then
    echo "bootstrap: apache-airflow does not install beside the versions the dev extras" \
      "resolved (see pip's reason above); install it in a venv of its own:" \
      "python3.11 -m venv .venv-airflow && .venv-airflow/bin/pip install -e '.[airflow,dev]'" >&2
    exit 1
  fi
fi
if [ "$extras" = dev ]; then
  # The example dbt project's manifest, made once here so that loading the Dagster definitions
  # parses nothing (dagster_defs.dbt.prepare_manifest parses only a missing or older one).
  (cd examples/dbt_upi && ../../.venv/bin/dbt parse --quiet --profiles-dir .) \
    || echo "bootstrap: continuing without the dbt manifest (the definitions parse it at load)" >&2
fi
# Spark puts pyspark.zip and py4j's zip first on its Python workers' PYTHONPATH, and modules
# imported from a zip are compiled from source in every new worker (no bytecode cache): 0.4-0.5 s
# per worker process on a quiet machine, most of a planning worker's life. The same pyspark and
# py4j are installed in this venv with their bytecode cached, so the venv drops those two zips
# from sys.path at start-up (site's .pth hook) and workers import the installed copies.
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
zips="$site/pyspark/python/lib/"
echo "import sys; sys.path[:] = [p for p in sys.path if not p.startswith('$zips')]" \
  > "$site/srt-pyspark-bytecode.pth"
# Spark's driver JVM starts ~2 s faster from a class archive (stateful_runtime/runtime/session.py);
# built once per venv (delete .venv/share/stateful-runtime to rebuild after a Spark upgrade).
if [ ! -s .venv/share/stateful-runtime/spark-classes.jsa.sealed ]; then
  platform/class-archive.sh \
    || echo "bootstrap: continuing without Spark's class archive (slower start-up)" >&2
fi
