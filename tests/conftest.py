"""Shared fixtures: real services and real processes, started once where they can be shared.

Helpers the tests import (``srt``, ``wait_for_commit``, the workspaces and servers) are in
``tests/helpers.py``; this file holds only fixtures, which pytest injects by name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests check what a function returns, never how fast: Hypothesis's default 200 ms
# deadline per example (and its too-slow health check) failed them on a busy 2-core machine
# (an example of tests/operators/test_arrow_keyed.py took 383 ms at load ~20, passed on replay).
settings.register_profile("srt", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("srt")

# Helpers modules are plain modules: without this, a failing assert inside one would say only
# "AssertionError" (pytest rewrites the asserts of test files and conftest.py by itself).
pytest.register_assert_rewrite(
    "tests.helpers",
    "tests.connectors.kafka.helpers",
    "tests.dagster_defs.helpers",
    "tests.dbt_sink.helpers",
    "tests.srt_airflow.helpers",
    "tests.operators.helpers",
)

from tests.helpers import (  # noqa: E402  (after the assert-rewrite registration)
    LONGEST_FILES,
    UPI_SCHEMA,
    VENV_BIN,
    ClickHouseServer,
    Cluster,
    PostgresServer,
    S3Endpoint,
    UpiWorkspace,
    cluster_cmd,
    env_file,
    environment,
    free_port,
    pg_binary,
    require,
    restore_signals,
    signal_state,
)

# Tests that start Spark (a session in the test's process, or `srt` processes that run jobs),
# by the fixtures that give them one: marked ``spark`` here, so that the quick loop
# (`platform/test.sh --quick`) can leave them out without a marker on each.
SPARK_FIXTURES = frozenset({"spark", "srt_env", "upi", "cluster"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if SPARK_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)
    by_file: dict[str, list[pytest.Item]] = {}
    for item in items:
        by_file.setdefault(item.nodeid.split("::")[0], []).append(item)
    rank = {f: n for n, f in enumerate(LONGEST_FILES)}
    files = sorted(by_file, key=lambda f: (rank.get(f, len(rank)), -len(by_file[f])))
    items[:] = [item for f in files for item in by_file[f]]


_SIGNALS_AT_START = signal_state()


@pytest.fixture(autouse=True)
def _signals_as_found() -> Iterator[None]:
    """Every process a test or fixture starts inherits the test process's ignored and blocked
    signals. Dagster's in-process interrupt handling sets SIGTERM's handler to SIGINT's, which
    is "ignore" in a suite started in the background, and chdb blocks SIGPIPE: Spark daemons
    and brokers started later in the same worker ignored their SIGTERM (each stop waited out
    its timeout; a broker's "clean stop" became a kill). Each test leaves them as the session
    found them (``tests.helpers.restore_signals``)."""
    yield
    restore_signals(_SIGNALS_AT_START)


@pytest.fixture(scope="session")
def srt_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("srt-home")
    os.environ["SRT_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def srt_env(srt_home: Path) -> dict[str, str]:
    """Environment for `srt` subprocesses: this venv first on PATH, Spark on loopback, and the
    driver JVM's JIT at C1 only (``SRT_JVM_JIT=quick``, unless the environment chooses).

    A test's job runs seconds on a few thousand events: C2, even at the default mode's raised
    thresholds, compiles for its whole life on a core of the 2-core machine and never pays
    back (a 3,000-event UPI run: 9.4-10.2 s of CPU in the default mode, 6.9-7.6 s with C1
    only; NOTES.md). The in-process session (``spark``) runs so as well; the default mode's
    options are tested on a JVM of their own (tests/runtime/test_start_up.py)."""
    from stateful_runtime.runtime.session import JIT_ENV

    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["SRT_HOME"] = str(srt_home)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault(JIT_ENV, "quick")
    return env


@pytest.fixture(scope="session")
def spark(srt_home: Path):
    """One local SparkSession for the whole test session (start-up costs ~5.5 s). Its JVM
    compiles with C1 only, as a short run's (``short_run``): the tests' queries run seconds
    each, and C2 compiling for the session's life on a core of the 2-core machine never paid
    back (seven files of its tests: 78-84 CPU-s in the default mode, 63-68 with C1 only)."""
    from stateful_runtime.runtime.session import build_session

    session = build_session(parallelism=2, master="local[2]", short_run=True)
    yield session
    session.stop()


@pytest.fixture
def upi(tmp_path: Path) -> Iterator[UpiWorkspace]:
    from stateful_runtime.connectors.eventlog import EventLog

    ws = UpiWorkspace(tmp_path)
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions, schema=UPI_SCHEMA)
    yield ws


@pytest.fixture(scope="session")
def s3(srt_env: dict[str, str]) -> Iterator[S3Endpoint]:
    """moto's S3 server (conditional writes and multipart uploads work): boto3 reaches it via
    AWS_ENDPOINT_URL, here and in `srt` subprocesses."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    settings = {
        "AWS_ENDPOINT_URL": f"http://{host}:{port}",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    srt_env.update(settings)
    with environment(settings):
        endpoint = S3Endpoint(settings["AWS_ENDPOINT_URL"], "srt-test")
        endpoint.client().create_bucket(Bucket=endpoint.bucket)
        yield endpoint
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session; each test takes a database of its own."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="srt-pg-"))
    initdb = [
        pg_binary("initdb"),
        "-D",
        str(root / "data"),
        "-U",
        "srt",
        "--auth=trust",
        "--no-sync",
    ]
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        initdb = ["runuser", "-u", "postgres", "--", *initdb]
    subprocess.run(initdb, check=True, capture_output=True, timeout=120)
    server = PostgresServer(root, free_port())
    server.start()
    yield server
    try:
        server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pg_dsn(postgres: PostgresServer, request: pytest.FixtureRequest) -> str:
    import re

    return postgres.database("t_" + re.sub(r"\W", "_", request.node.name.lower())[:50])


@pytest.fixture(scope="session")
def clickhouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    """One ClickHouse server for the session (installed by platform/install-services.sh);
    each test takes a database of its own."""
    import shutil

    require(shutil.which("clickhouse-server"), "clickhouse-server", "platform/install-services.sh")
    server = ClickHouseServer(
        tmp_path_factory.mktemp("clickhouse"), free_port(), free_port(), free_port()
    )
    server.start()
    yield server
    server.stop()


@pytest.fixture
def ch_url(clickhouse: ClickHouseServer, request: pytest.FixtureRequest) -> str:
    import re

    return clickhouse.database("t_" + re.sub(r"\W", "_", request.node.name.lower())[:50])


@pytest.fixture(scope="session")
def chdb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory of in-process ClickHouse (chdb): chdb opens one per process, for the
    process's life, so every test of the session shares it (one database per test)."""
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, srt_env: dict[str, str]) -> Iterator[Cluster]:
    """A Spark standalone master and worker (platform/spark-cluster.sh), one per test module."""
    cluster_dir = tmp_path_factory.mktemp("spark-cluster")
    # The daemons get PYSPARK_PYTHON = this interpreter; executors get it from the job's
    # spark.executorEnv.PYSPARK_PYTHON (session.py, from srt_env's PYSPARK_PYTHON).
    env = {**srt_env, "SRT_PYTHON": sys.executable, "SRT_CLUSTER_DIR": str(cluster_dir)}
    try:
        started = cluster_cmd("start", cluster_dir, env)
        assert started.returncode == 0, started.stderr[-4000:]
        info = env_file(cluster_dir / "cluster.env")
        assert started.stdout.strip() == info["MASTER_URL"]
        yield Cluster(
            cluster_dir, info["MASTER_URL"], info["MASTER_WEBUI_URL"], Path(info["WORKER_DIR"])
        )
    finally:
        # 3 s a daemon, not the script's 30 s: no test needs their graceful exit. One that
        # does not exit in time is named by the warning, its thread dump in its log.
        stopped = cluster_cmd("stop", cluster_dir, {**env, "SRT_CLUSTER_STOP_TIMEOUT": "3"})
        assert stopped.returncode == 0, stopped.stderr[-4000:]
        if "did not exit" in stopped.stderr:
            import warnings

            warnings.warn(f"slow cluster stop: {stopped.stderr.strip()}", stacklevel=1)
