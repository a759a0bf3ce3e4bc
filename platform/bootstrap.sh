#!/usr/bin/env bash
# Create .venv with Python 3.11 and install the project (editable) with the given extras.
#   platform/bootstrap.sh            runtime only, with Hadoop's S3A jars for checkpoints on S3
#                                    (the pinned JVM artifact set `s3`, platform/jvm-artifacts.sh)
#   platform/bootstrap.sh dev        + Dagster, dbt, Great Expectations, the test services'
#                                    Python packages, Debian's chromium, clickhouse-server and
#                                    postgresql (platform/install-services.sh), the pinned JVM
#                                    artifacts from Maven Central (platform/jvm-artifacts.sh:
#                                    every set, Apache Kafka's broker too), then Airflow (the `airflow` extra,
#                                    for srt_airflow) constrained to what those resolved
#   platform/bootstrap.sh airflow    runtime + Airflow only (the provider without Dagster)
#
# Under CI (CI=true) a service or artifact that does not install stops the bootstrap: the suite
# must not run without it. Elsewhere it carries on, and the tests that need it skip saying why.
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
# What the suite needs but a local run can do without: fatal under CI, a warning elsewhere.
optional() {
  if [ "${CI:-}" = true ]; then
    echo "bootstrap: $1 did not install; under CI the suite needs it (see above)" >&2
    exit 1
  fi
  echo "bootstrap: continuing without $1; the tests that need it skip" >&2
}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
spec="."
case "$extras" in
  "") ;;
  dev)
    spec=".[dagster,dbt,dev]"
    platform/install-services.sh || optional "the services above (install-services.sh)"
    ;;
  airflow) spec=".[airflow]" ;;
  *) echo "bootstrap: unknown extras '$extras' (use: dev, airflow)" >&2; exit 2 ;;
esac
# The editable build prints setuptools' notice about same-named folders (InformationOnly, a
# UserWarning) into the user's first terminal; the project has none, so it is silenced.
PYTHONWARNINGS=ignore::UserWarning .venv/bin/python -m pip install -q -e "$spec"
if [ "$extras" = dev ]; then
  # Airflow shares the venv with Dagster, Spark and dbt only if it moves none of their versions:
  # it is resolved together with the dev extras, constrained to the versions of Spark, Dagster,
  # dbt and their data libraries (pandas, numpy, pyarrow) that the dev extras resolved, the way
  # Airflow's own constraint files pin an install. A conflict stops here with pip's reason
  # rather than downgrading one of them (NOTES.md, "Airflow beside Dagster"). Everything else
  # may move to what both need: constraining every package the dev extras resolved left pip
  # nothing when one of them was a release whose companions were not out yet (opentelemetry-api
  # 1.45.3 before its SDK 1.45.3), and pip gave up after 9 minutes of backtracking.
  constraints=$(mktemp)
  trap 'rm -f "$constraints"' EXIT
  # (a package installed from a direct URL cannot be a constraint: left out)
  .venv/bin/python -m pip freeze --exclude-editable | grep -v ' @ ' \
    | grep -i -E '^(pyspark|dagster|dbt|pandas|numpy|pyarrow)' > "$constraints" || true
  if ! PYTHONWARNINGS=ignore::UserWarning .venv/bin/python -m pip install -q \
      -e "${spec%]},airflow]" -c "$constraints"; then
    echo "bootstrap: apache-airflow does not install beside the versions the dev extras" \
      "resolved (see pip's reason above); install it in a venv of its own:" \
      "python3.11 -m venv .venv-airflow && .venv-airflow/bin/pip install -e '.[airflow,dev]'" >&2
    exit 1
  fi
fi
if [ "$extras" != dev ]; then
  # Checkpoints on S3 need them; a run with local checkpoints does not (it says so if asked).
  platform/jvm-artifacts.sh s3 || optional "Hadoop's S3A jars (jvm-artifacts.sh s3)"
fi
if [ "$extras" = dev ]; then
  platform/jvm-artifacts.sh || optional "the pinned JVM artifacts (jvm-artifacts.sh)"
  # The example dbt project's manifest, made once here so that loading the Dagster definitions
  # parses nothing (dagster_defs.dbt.prepare_manifest parses only a missing or older one).
  (cd examples/dbt_upi && ../../.venv/bin/dbt parse --quiet --profiles-dir .) \
    || echo "bootstrap: continuing without the dbt manifest (the definitions parse it at load)" >&2
fi
# The project is installed editable, so its modules are imported from this tree, where pip
# compiles nothing; and where PYTHONDONTWRITEBYTECODE is set (some images set it) no process
# caches what it compiled, so every `srt` command, job driver and forkserver compiled the
# runtime again (~0.3 CPU-s each; NOTES.md, "Start-up and the job process"). Compiled once here
# instead; a module edited since is compiled again in memory (its bytecode no longer matches).
.venv/bin/python -m compileall -q -j 0 stateful_runtime dagster_defs dbt_sink srt_airflow \
  examples >/dev/null
# Spark puts pyspark.zip and py4j's zip first on its Python workers' PYTHONPATH, and modules
# imported from a zip are compiled from source in every new worker (no bytecode cache): 0.4-0.5 s
# per worker process on a quiet machine, most of a planning worker's life. The same pyspark and
# py4j are installed in this venv with their bytecode cached, so the venv drops those two zips
# from sys.path at start-up (site's .pth hook) and workers import the installed copies (a driver
# started from the merged jars names them under its Spark home, where they are not: dropped too).
site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
zips="$site/pyspark/python/lib/"
merged="$(.venv/bin/python -m stateful_runtime.runtime.spark_home --path)/python/"
echo "import sys; sys.path[:] = [p for p in sys.path if not p.startswith(('$zips', '$merged'))]" \
  > "$site/srt-pyspark-bytecode.pth"
# The runtime's JVM classes (a local master's file system without a `chmod` process per
# checkpoint file: stateful_runtime/runtime/session.py), built with the JDK's javac once per venv
# and again when their source is newer.
share=.venv/share/stateful-runtime
if [ ! -s "$share/srt-jvm.jar" ] || [ -n "$(find platform/jvm -name '*.java' -newer "$share/srt-jvm.jar")" ]; then
  if command -v javac >/dev/null; then
    platform/jvm-classes.sh || echo "bootstrap: continuing without the runtime's JVM classes" >&2
  else
    echo "bootstrap: no javac (a JRE, not a JDK): jobs write checkpoints through Hadoop's" \
      "own local file system (a chmod process per file)" >&2
  fi
fi
# A local master's driver JVM starts from PySpark's jars merged into one
# (stateful_runtime/runtime/spark_home.py: a lookup of a missing class searches one jar, not
# 280); built once per venv, and again when PySpark's jars change.
.venv/bin/python -m stateful_runtime.runtime.spark_home \
  || echo "bootstrap: continuing with PySpark's own jars (a slower start)" >&2
# Spark's driver JVM starts ~2 s faster from a class archive (stateful_runtime/runtime/session.py);
# built once per venv, and again when the JVM classes on the driver's class path change (delete
# .venv/share/stateful-runtime to rebuild both after a Spark upgrade).
if [ ! -s "$share/spark-classes.jsa.sealed" ] || [ "$share/srt-jvm.jar" -nt "$share/spark-classes.jsa.sealed" ] \
  || [ "$share/spark-home/stamp" -nt "$share/spark-classes.jsa.sealed" ]; then
  platform/class-archive.sh \
    || echo "bootstrap: continuing without Spark's class archive (slower start-up)" >&2
fi
