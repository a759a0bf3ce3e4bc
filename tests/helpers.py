"""What the tests share besides fixtures: the real `srt` as a subprocess, polling a job's log and
checkpoint, the UPI workspace, and the servers the fixtures in conftest.py start.

Importing this module puts examples/ on sys.path (``upi_events`` is the tests' event generator
and oracle) and points PySpark at this interpreter, for pytest and for the scripts that import
it (tests/faults/killtrials.py, benchmarks/).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

    from stateful_runtime import StreamJob

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(EXAMPLES))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


# The files that take longest (a full run's --durations, summed per file: 100-320 s each), in
# that order. The suite runs files on three workers (--dist loadfile); these start first, so
# the short files fill the other workers around them instead of one of these running last
# beside an idle worker (tests/conftest.py orders the collection and platform/test.sh passes
# --no-loadscope-reorder to keep it; the other files follow, most tests first, as xdist would
# order them).
LONGEST_FILES = (
    "tests/faults/test_kill_trials.py",
    "tests/dbt_sink/test_upi_warehouses.py",
    "tests/dagster_defs/test_ui.py",
    "tests/srt_airflow/test_lifecycle.py",
    "tests/faults/test_kafka_outage.py",
    "tests/faults/test_cluster_kills.py",
    "tests/faults/test_overflow.py",
    "tests/faults/test_sink_tables.py",
    "tests/faults/test_connected_kill.py",
    "tests/runtime/test_cluster.py",
    "tests/faults/test_event_time.py",
    "tests/checkpoints/test_savepoints_spark.py",
    "tests/operators/test_keyed_spark.py",
    "tests/checkpoints/test_migrate.py",
)


_INHERITED = (signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM)


def signal_state() -> tuple[dict[int, Any], set[int]]:
    """This (main) thread's handlers of the signals a child inherits as ignored, and its
    blocked signals: what :func:`restore_signals` puts back."""
    handlers = {sig: signal.getsignal(sig) for sig in _INHERITED}
    return handlers, set(signal.pthread_sigmask(signal.SIG_BLOCK, []))


def restore_signals(state: tuple[dict[int, Any], set[int]]) -> None:
    """Put back what :func:`signal_state` saw (a library's native handler included: each is
    set again, whatever Python believes it is)."""
    handlers, blocked = state
    for sig, handler in handlers.items():
        if handler is not None:
            signal.signal(sig, handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def require(available: object, what: str, how: str) -> None:
    """A service, tool or privilege the test needs. Under CI (``CI=true``) its absence fails the
    test, naming what is missing: a green run must have checked what it claims. Elsewhere the
    test skips, saying what to do."""
    if available:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is missing, and under CI the suite needs it: {how}", pytrace=False)
    pytest.skip(f"{what} is missing: {how}")


@contextmanager
def environment(settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in this process's environment (and so its children's) for the block; each
    name as it was before afterwards, whatever else changed meanwhile."""
    before = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def small_tmpfs(mnt: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` mounted at the new directory ``mnt`` (root with CAP_SYS_ADMIN), for
    the disk-full trials; unmounted afterwards."""
    mnt.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mnt)],
        capture_output=True,
        text=True,
    )
    require(
        done.returncode == 0,
        "a tmpfs mount",
        f"{(done.stderr or done.stdout).strip()}; the disk-full trials need root with "
        "CAP_SYS_ADMIN",
    )
    try:
        yield mnt
    finally:
        if subprocess.run(["umount", str(mnt)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def srt(
    args: Sequence[str],
    env: dict[str, str],
    *,
    cwd: Path | None = None,
    input: bytes | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run the real `srt` console script and capture its output."""
    return subprocess.run(
        [str(VENV_BIN / "srt"), *args],
        env=env,
        cwd=cwd,
        input=input,
        capture_output=True,
        timeout=timeout,
        **({} if input is not None else {"text": True}),
    )


def srt_background(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start the real `srt` in a session of its own (one killpg reaches its driver, JVM and
    Python workers, as a machine crash would), its output going to ``log``."""
    with log.open("w") as out:
        return subprocess.Popen(
            [str(VENV_BIN / "srt"), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def kill_group(proc: subprocess.Popen) -> None:
    """kill -9 a process started by :func:`srt_background`, with everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def poll(cond: Callable[[], Any], timeout: float, what: str) -> Any:
    """Poll ``cond`` until it returns something true (returned); fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = cond()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def wait_for(
    cond: Callable[[], bool], proc: subprocess.Popen, log: Path, what: str, timeout: float = 240
) -> None:
    """Poll ``cond``; fail with the end of the job's log if it exits or time runs out first."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(
                f"no {what} (job exit code {proc.poll()}):\n{log.read_text()[-4000:]}"
            )
        time.sleep(0.05)


def wait_for_commit(
    qdir: Path, after: int | None, proc: subprocess.Popen, log: Path, timeout: float = 240
) -> None:
    """Poll the checkpoint until a batch newer than ``after`` is committed."""
    from stateful_runtime.checkpoints.layout import QueryLayout

    floor = after if after is not None else -1

    def newer() -> bool:
        last = QueryLayout(qdir).last_committed()  # batch 0 is a commit too (not "or -1")
        return last is not None and last > floor

    wait_for(newer, proc, log, "new committed batch", timeout)


def _upi_schema() -> StructType:
    from upi_per_minute import PAYMENT

    from stateful_runtime.connectors.formats.json import to_struct

    return to_struct(PAYMENT)


# The UPI example's record schema: the `upi` fixture's and the kill trials' topics store their
# records parsed into it (a topic with a schema); other tests' topics have none.
UPI_SCHEMA = _upi_schema()


@dataclass
class UpiWorkspace:
    """Paths of one UPI job instance and the `--set` flags that point the job at them."""

    root: Path
    partitions: int = 4
    extra: dict[str, str] = field(default_factory=dict)
    job: Path = EXAMPLES / "upi_per_minute.py"  # or a job of the same input, query and table

    @property
    def log_dir(self) -> Path:
        return self.root / "log"

    @property
    def database(self) -> Path:
        return self.root / "upi.duckdb"

    @property
    def checkpoint_dir(self) -> Path:
        return self.root / "checkpoints"

    def sets(self) -> list[str]:
        values = {
            "source.log_dir": str(self.log_dir),
            "sink.database": str(self.database),
            "checkpoint.dir": str(self.checkpoint_dir),
            **self.extra,
        }
        return [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]

    def run_args(self, *more: str) -> list[str]:
        return ["run", str(self.job), *self.sets(), *more]

    def table(self) -> dict:
        """upi_counts as {(merchant_id, window_start UTC naive): (payments, amount_paise)}."""
        from tests.faults.harness import duckdb_counts

        return duckdb_counts(self.database)


def append_lines(
    log_dir: Path, lines: Sequence[bytes], topic: str = "upi-payments", key: str = "merchant_id"
) -> None:
    """Append JSON lines keyed by field ``key``, as `srt log append --key-field` does."""
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import _records

    with EventLog(log_dir).writer(topic) as writer:
        writer.append(_records(lines, key))


def read_topic(log_dir: Path, topic: str) -> list:
    """Every record of an event-log topic, partition by partition ([] if there is none)."""
    from stateful_runtime.connectors.eventlog import EventLog

    log = EventLog(log_dir)
    if topic not in {t.name for t in log.topics()}:
        return []
    reader = log.reader(topic)
    try:
        return [r for p, end in reader.end_offsets().items() for r in reader.read(p, 0, end)]
    finally:
        reader.close()


def windowed_job(tmp_path: Path, sink_upsert: bool = True) -> StreamJob:
    """Job "j": a 2-partition event-log source, a filter, a keyed 10 s tumbling window with
    Count and Sum (operator "agg"), to a DuckDB upsert sink or (``sink_upsert=False``) an
    append-only log sink ("out")."""
    from datetime import timedelta

    from dbt_sink import DuckDBUpsertSink
    from stateful_runtime import (
        CheckpointConfig,
        Count,
        LogSource,
        StreamJob,
        Sum,
        TumblingEventTimeWindows,
        WatermarkStrategy,
    )
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.sink import LogSink

    EventLog(tmp_path / "log").create_topic("in", 2, exist_ok=True)
    job = StreamJob("j", CheckpointConfig(str(tmp_path / "ck")), parallelism=3)
    stream = job.from_source(
        LogSource(str(tmp_path / "log"), "in", {"k": str, "v": int, "ts": int}),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2)).with_timestamp_field(
            "ts"
        ),
        name="src",
    )
    sink = (
        DuckDBUpsertSink(str(tmp_path / "db"), "t", key=("k", "window_start"))
        if sink_upsert
        else LogSink(str(tmp_path / "log"), "out")
    )
    (
        stream.filter("v > 0")
        .key_by("k")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
        .aggregate({"n": Count(), "total": Sum("v")}, name="agg")
        .sink_to(sink, name="out")
    )
    return job


@dataclass
class S3Endpoint:
    """A real S3 API endpoint (moto's server) on 127.0.0.1 with one bucket."""

    url: str
    bucket: str

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url)

    def keys(self, prefix: str = "") -> list[str]:
        pages = (
            self.client()
            .get_paginator("list_objects_v2")
            .paginate(Bucket=self.bucket, Prefix=prefix)
        )
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


# -- warehouses (dbt_sink): real servers on 127.0.0.1 ------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pg_binary(name: str) -> str:
    import glob
    import shutil

    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    require(
        found, f"PostgreSQL's {name}", "platform/install-services.sh installs Debian's postgresql"
    )
    assert found
    return found


@dataclass
class PostgresServer:
    """A PostgreSQL cluster of its own (initdb + pg_ctl), trust auth for user ``srt``."""

    dir: Path
    port: int

    @property
    def dsn(self) -> str:
        return f"postgresql://srt@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        cmd = [pg_binary("pg_ctl"), "-D", str(self.dir / "data"), *args]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=60)

    def start(self) -> None:
        self._ctl(
            "-o",
            f"-p {self.port} -k {self.dir / 'data'} -c listen_addresses=127.0.0.1 "
            "-c fsync=off -c max_connections=50",
            "-l",
            str(self.dir / "log"),
            "-w",
            "start",
        )

    def stop(self) -> None:
        self._ctl("-m", "immediate", "-w", "stop")  # as a crash would: no checkpoint

    def database(self, name: str) -> str:
        """A fresh database; its DSN."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as con:
            con.execute(f'DROP DATABASE IF EXISTS "{name}"')
            con.execute(f'CREATE DATABASE "{name}"')
        return f"postgresql://srt@127.0.0.1:{self.port}/{name}"


@dataclass
class ClickHouseServer:
    """Debian's clickhouse-server (18.16) as a plain process on 127.0.0.1."""

    dir: Path
    tcp_port: int
    http_port: int
    interserver_port: int
    proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"clickhouse://default@127.0.0.1:{self.tcp_port}/default"

    def start(self) -> None:
        import urllib.request

        d = self.dir
        for sub in ("tmp", "uf", "fs"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        with (d / "out").open("a") as out:
            self.proc = subprocess.Popen(
                [
                    "clickhouse-server",
                    "--config-file=/etc/clickhouse-server/config.xml",
                    "--",
                    f"--path={d}/",
                    f"--tmp_path={d}/tmp/",
                    f"--user_files_path={d}/uf/",
                    f"--format_schema_path={d}/fs/",
                    f"--http_port={self.http_port}",
                    f"--tcp_port={self.tcp_port}",
                    "--listen_host=127.0.0.1",
                    # 9009 by default: a second server on the machine would fail to bind it.
                    f"--interserver_http_port={self.interserver_port}",
                    f"--logger.log={d}/log",
                    f"--logger.errorlog={d}/err",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.http_port}/ping", timeout=1
                ) as r:
                    if r.read().strip() == b"Ok.":
                        return
            except OSError:
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"clickhouse-server did not start:\n{(d / 'out').read_text()[-2000:]}"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # as a crash would
            self.proc.wait()

    def database(self, name: str) -> str:
        from clickhouse_driver import Client

        c = Client(host="127.0.0.1", port=self.tcp_port)
        c.execute(f"DROP DATABASE IF EXISTS {name}")
        c.execute(f"CREATE DATABASE {name}")
        c.disconnect()
        return f"clickhouse://default@127.0.0.1:{self.tcp_port}/{name}"


def utc_naive(value):  # noqa: ANN001, ANN201  (datetime or anything)
    """A timestamp as the oracle keys it: naive UTC (ClickHouse returns aware ones)."""
    from datetime import UTC, datetime

    if isinstance(value, datetime) and value.tzinfo is not None:
        return value.astimezone(UTC).replace(tzinfo=None)
    return value


def read_counts(kind: str, where: str, table: str = "upi_counts") -> dict:
    """A UPI counts table as {(merchant_id, window_start): (payments, amount_paise)}: from
    DuckDB (a file), PostgreSQL (a DSN), ClickHouse (a URL; with FINAL) or Delta (a path)."""
    sql = f"SELECT merchant_id, window_start, payments, amount_paise FROM {table}"
    if kind == "duckdb":
        import duckdb

        con = duckdb.connect(where, read_only=True)
        try:
            rows = con.execute(sql).fetchall()
        finally:
            con.close()
    elif kind == "postgres":
        import psycopg

        with psycopg.connect(where) as con:
            rows = con.execute(sql).fetchall()
    elif kind == "clickhouse":
        from dbt_sink.clickhouse import ClickHouseUpsertSink

        sink = ClickHouseUpsertSink(where, table, ("merchant_id", "window_start"))
        client = sink._client()
        try:
            rows = client.query(sql + " FINAL")
        finally:
            client.close()
    elif kind == "delta":
        from dbt_sink.delta import DeltaUpsertSink

        t = DeltaUpsertSink(where, table, ("merchant_id",)).read_arrow()
        rows = (
            list(
                zip(
                    *(
                        t.column(c).to_pylist()
                        for c in ("merchant_id", "window_start", "payments", "amount_paise")
                    ),
                    strict=True,
                )
            )
            if t.num_rows
            else []
        )
    else:
        raise ValueError(kind)
    out = {(m, utc_naive(w)): (p, a) for m, w, p, a in rows}
    assert len(out) == len(rows), f"{kind}: duplicate keys in {table}"
    return out


# -- Spark standalone cluster (platform/spark-cluster.sh) -------------------------------------

CLUSTER_SCRIPT = ROOT / "platform" / "spark-cluster.sh"


@dataclass
class Cluster:
    dir: Path
    master_url: str
    webui_url: str
    worker_dir: Path

    def state(self) -> dict:
        with urllib.request.urlopen(f"{self.webui_url}/json/", timeout=10) as resp:
            return json.load(resp)

    def wait_for_completed_app(self, app_id: str, timeout_s: float = 30) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.state()
            for app in state["completedapps"]:
                if app["id"] == app_id:
                    return app
            if time.monotonic() > deadline:
                raise AssertionError(f"{app_id} not among the master's completed apps: {state}")
            time.sleep(0.2)  # poll interval


def env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def cluster_cmd(
    cmd: str, cluster_dir: Path, env: dict[str, str], timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), cmd, str(cluster_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
