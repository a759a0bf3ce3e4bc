"""Shared fixtures: real services and real processes, started once where they can be shared."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
VENV_BIN = Path(sys.executable).parent
sys.path.insert(0, str(EXAMPLES))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


@pytest.fixture(scope="session")
def srt_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("srt-home")
    os.environ["SRT_HOME"] = str(home)
    return home


@pytest.fixture(scope="session")
def srt_env(srt_home: Path) -> dict[str, str]:
    """Environment for `srt` subprocesses: this venv first on PATH, Spark on loopback."""
    env = dict(os.environ)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env["SRT_HOME"] = str(srt_home)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture(scope="session")
def spark(srt_home: Path):
    """One local SparkSession for the whole test session (start-up costs ~5.5 s)."""
    from stateful_runtime.runtime.session import build_session

    session = build_session(parallelism=2, master="local[2]")
    yield session
    session.stop()


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
    from stateful_runtime.checkpoints import layout

    floor = after if after is not None else -1

    def newer() -> bool:
        last = layout.last_committed(qdir)  # batch 0 is a commit too (not "or -1")
        return last is not None and last > floor

    wait_for(newer, proc, log, "new committed batch", timeout)


@dataclass
class UpiWorkspace:
    """Paths of one UPI job instance and the `--set` flags that point the job at them."""

    root: Path
    partitions: int = 4
    extra: dict[str, str] = field(default_factory=dict)

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
        return ["run", str(EXAMPLES / "upi_per_minute.py"), *self.sets(), *more]

    def table(self) -> dict:
        """upi_counts as {(merchant_id, window_start): (payments, amount_paise)}."""
        import duckdb

        con = duckdb.connect(str(self.database), read_only=True)
        try:
            rows = con.execute(
                "SELECT merchant_id, window_start, payments, amount_paise FROM upi_counts"
            ).fetchall()
        finally:
            con.close()
        return {(m, w): (p, a) for m, w, p, a in rows}


@pytest.fixture
def upi(tmp_path: Path) -> Iterator[UpiWorkspace]:
    from stateful_runtime.connectors.eventlog import EventLog

    ws = UpiWorkspace(tmp_path)
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    yield ws


def append_lines(log_dir: Path, lines: Sequence[bytes], topic: str = "upi-payments") -> None:
    """Append JSON lines keyed by merchant_id, as `srt log append --key-field` does."""
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import _records

    with EventLog(log_dir).writer(topic) as writer:
        writer.append(_records(lines, "merchant_id"))


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
    saved = {k: os.environ.get(k) for k in settings}
    os.environ.update(settings)
    srt_env.update(settings)
    endpoint = S3Endpoint(settings["AWS_ENDPOINT_URL"], "srt-test")
    endpoint.client().create_bucket(Bucket=endpoint.bucket)
    yield endpoint
    server.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


# -- warehouses (dbt_sink): real servers on 127.0.0.1 ------------------------------------------


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_binary(name: str) -> str:
    import glob
    import shutil

    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if not found:
        pytest.skip(f"PostgreSQL's {name} is not installed (Debian: postgresql)")
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
        cmd = [_pg_binary("pg_ctl"), "-D", str(self.dir / "data"), *args]
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


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """One PostgreSQL for the session; each test takes a database of its own."""
    import shutil
    import tempfile

    root = Path(tempfile.mkdtemp(prefix="srt-pg-"))
    initdb = [
        _pg_binary("initdb"),
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


@pytest.fixture(scope="session")
def clickhouse(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClickHouseServer]:
    """One ClickHouse server for the session (installed by platform/install-clickhouse.sh);
    each test takes a database of its own."""
    import shutil

    if not shutil.which("clickhouse-server"):
        pytest.skip("clickhouse-server is not installed: run platform/install-clickhouse.sh")
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
