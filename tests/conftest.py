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


def srt(args: Sequence[str], env: dict[str, str], *, cwd: Path | None = None,
        input: bytes | None = None, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """Run the real `srt` console script and capture its output."""
    return subprocess.run(
        [str(VENV_BIN / "srt"), *args], env=env, cwd=cwd, input=input,
        capture_output=True, timeout=timeout, **({} if input is not None else {"text": True}),
    )


def srt_background(args: Sequence[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start the real `srt` in a session of its own (one killpg reaches its driver, JVM and
    Python workers, as a machine crash would), its output going to ``log``."""
    with log.open("w") as out:
        return subprocess.Popen([str(VENV_BIN / "srt"), *args], env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    """kill -9 a process started by :func:`srt_background`, with everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(cond: Callable[[], bool], proc: subprocess.Popen, log: Path, what: str,
             timeout: float = 240) -> None:
    """Poll ``cond``; fail with the end of the job's log if it exits or time runs out first."""
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"no {what} (job exit code {proc.poll()}):\n"
                                 f"{log.read_text()[-4000:]}")
        time.sleep(0.05)


def wait_for_commit(qdir: Path, after: int | None, proc: subprocess.Popen, log: Path,
                    timeout: float = 240) -> None:
    """Poll the checkpoint until a batch newer than ``after`` is committed."""
    from stateful_runtime.checkpoints import layout

    floor = after if after is not None else -1
    wait_for(lambda: (layout.last_committed(qdir) or -1) > floor, proc, log,
             "new committed batch", timeout)


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
        pages = self.client().get_paginator("list_objects_v2").paginate(
            Bucket=self.bucket, Prefix=prefix)
        return [o["Key"] for page in pages for o in page.get("Contents", [])]


@pytest.fixture(scope="session")
def s3(srt_env: dict[str, str]) -> Iterator[S3Endpoint]:
    """moto's S3 server (conditional writes and multipart uploads work): boto3 reaches it via
    AWS_ENDPOINT_URL, here and in `srt` subprocesses."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    settings = {"AWS_ENDPOINT_URL": f"http://{host}:{port}", "AWS_ACCESS_KEY_ID": "testing",
                "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
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
