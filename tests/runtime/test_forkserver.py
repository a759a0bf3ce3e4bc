"""The forkserver behind ``srt-python`` (``runtime/forkserver.py``): a start Spark asks of
``srt-python`` runs in a child of the server, with the caller's streams, environment, working
directory, connection to the JVM and exit status; anything the server cannot serve as the
interpreter would runs the interpreter itself.

The server is the real one (``python -m stateful_runtime.runtime.forkserver``), the caller the
installed ``srt-python``; the module it runs is a probe that reports what it sees."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pyspark
import pytest

from stateful_runtime.runtime import forkserver
from stateful_runtime.runtime.python_worker import ENV
from tests.helpers import VENV_BIN, poll

PROBE = """
import json, os, sys, time

mode = sys.argv[1]
print(json.dumps({
    "pid": os.getpid(),
    "ppid": os.getppid(),
    "name": __name__,
    "argv": sys.argv[1:],
    "cwd": os.getcwd(),
    "probe_env": os.environ.get("PROBE"),
    "hash": hash("srt"),
    "preloaded": "pyarrow" in sys.modules,
    "path": sys.path,
    "sigterm_ignored": __import__("signal").getsignal(15) == __import__("signal").SIG_IGN,
}), flush=True)
if mode == "exit":
    sys.exit(int(sys.argv[2]))
if mode == "stdin":
    print(sys.stdin.read().upper(), flush=True)
if mode == "wait":
    time.sleep(120)
if mode == "connect":
    import pyspark.util

    sockfile, sock = pyspark.util.local_connect_and_auth(
        int(os.environ["PYTHON_WORKER_FACTORY_PORT"]), os.environ["PYTHON_WORKER_FACTORY_SECRET"]
    )
    (n,) = __import__("struct").unpack("!i", sockfile.read(4))
    print(sockfile.read(n).decode(), flush=True)
    sockfile.write(b"bye")
    sockfile.flush()
"""


_SPARK_ZIP = str(Path(pyspark.__file__).parent / "python" / "lib" / "pyspark.zip")


class Server:
    def __init__(self, tmp_path: Path) -> None:
        self.path = str(tmp_path / "fs" / "socket")
        (tmp_path / "fs").mkdir()
        env = {**os.environ, **forkserver.SERVER_SETTINGS}
        env.pop(ENV, None)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stateful_runtime.runtime.forkserver", self.path],
            stdin=subprocess.PIPE,
            env=env,
        )
        poll(lambda: os.path.exists(self.path), 30, "the server's socket")
        (tmp_path / "probe.py").write_text(PROBE)
        self.env = {
            **env,
            ENV: self.path,
            # Spark puts its zips of pyspark first: the preloaded pyspark stands
            "PYTHONPATH": os.pathsep.join([_SPARK_ZIP, str(tmp_path)]),
            "PROBE": "passed",
        }
        self.cwd = tmp_path

    def start(self, *args: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
        return subprocess.Popen(
            [str(VENV_BIN / "srt-python"), "-m", "probe", *args],
            env={**self.env, **(env or {})},
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            **kw,
        )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    s = Server(tmp_path)
    yield s
    s.proc.kill()
    s.proc.wait()


def _report(proc: subprocess.Popen) -> dict:
    assert proc.stdout is not None
    return json.loads(proc.stdout.readline())


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


def test_a_start_is_forked_from_the_server_with_the_callers_streams_and_status(server):
    proc = server.start("exit", "7")
    seen = _report(proc)
    assert proc.wait(timeout=30) == 7
    assert seen["ppid"] == server.proc.pid  # forked by the server, not run by srt-python
    assert seen["preloaded"]  # with the server's imports
    assert seen["name"] == "__main__" and seen["argv"] == ["exit", "7"]
    assert seen["cwd"] == str(server.cwd) and seen["probe_env"] == "passed"
    fresh = subprocess.run(
        [sys.executable, "-c", "print(hash('srt'))"],
        env={**os.environ, "PYTHONHASHSEED": "0"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert seen["hash"] == int(fresh.stdout)  # Spark's PYTHONHASHSEED=0, as a fresh one
    assert str(server.cwd) in seen["path"] and _SPARK_ZIP not in seen["path"]

    proc = server.start("stdin", stdin=subprocess.PIPE)
    out, _ = proc.communicate(b"through the server", timeout=30)
    assert out.decode().splitlines()[1] == "THROUGH THE SERVER"
    assert proc.returncode == 0


@pytest.mark.parametrize("case", ["other hash seed", "no server"])
def test_a_start_the_server_cannot_serve_runs_the_interpreter_itself(server, case):
    env = {"PYTHONHASHSEED": "1"} if case == "other hash seed" else {ENV: "/nowhere"}
    proc = server.start("exit", "3", env=env)
    seen = _report(proc)
    assert proc.wait(timeout=30) == 3
    assert seen["pid"] == proc.pid and seen["ppid"] == os.getpid()
    assert not seen["preloaded"]


def test_sigterm_reaches_the_child_and_a_killed_srt_python_takes_its_child(server):
    proc = server.start("wait")
    child = _report(proc)["pid"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM  # ended as its child was
    poll(lambda: _gone(child), 10, "the child's end")

    proc = server.start("wait")
    child = _report(proc)["pid"]
    proc.kill()
    proc.wait()
    poll(lambda: _gone(child), 10, "the child of a killed srt-python ending")


@pytest.mark.parametrize("case", ["forked", "no server"])
def test_the_connection_to_the_jvm_is_handed_over_with_nothing_read_past_the_reply(server, case):
    """A worker Spark starts on its own connects and authenticates in ``srt-python``; the
    JVM's first message may follow its reply at once, and the module reads it whole, in a
    child of the server or, without one, in ``srt-python`` itself."""
    secret = "s3cret"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    got: list[bytes] = []

    def jvm() -> None:
        conn, _ = listener.accept()
        with conn:
            (n,) = struct.unpack("!i", conn.recv(4))
            assert conn.recv(n).decode() == secret
            # the reply and the first message in one write
            conn.sendall(struct.pack("!i", 2) + b"ok" + struct.pack("!i", 5) + b"hello")
            got.append(conn.recv(16))

    thread = threading.Thread(target=jvm, daemon=True)
    thread.start()
    env = {"PYTHON_WORKER_FACTORY_PORT": str(port), "PYTHON_WORKER_FACTORY_SECRET": secret}
    if case == "no server":
        env[ENV] = "/nowhere"
    proc = server.start("connect", env=env)
    seen = _report(proc)
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"hello"
    assert proc.wait(timeout=30) == 0
    thread.join(10)
    assert got == [b"bye"]
    assert seen["ppid"] == (server.proc.pid if case == "forked" else os.getpid())
    listener.close()


def test_the_server_ends_with_its_driver(server):
    assert server.proc.stdin is not None
    server.proc.stdin.close()  # the driver ended
    assert server.proc.wait(timeout=30) == 0
    assert not os.path.exists(server.path)


def test_a_child_takes_the_groups_stop_signals_as_its_caller_would(server):
    """The JVM starts its Python processes ignoring SIGINT and SIGTERM, and a stop of the job
    signals its whole process group: the child ignores them as the caller did (the job stops
    its queries first), and a SIGKILL of the caller still takes it."""

    def ignoring() -> None:
        os.setpgid(0, 0)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)

    proc = server.start("wait", preexec_fn=ignoring)
    seen = _report(proc)
    child = seen["pid"]
    assert seen["sigterm_ignored"] and seen["ppid"] == server.proc.pid
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.killpg(proc.pid, sig)  # srt-python's group, as a job's stop reaches it
        os.kill(child, sig)  # and the child's own
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=2)
    assert not _gone(child)
    proc.kill()
    proc.wait()
    poll(lambda: _gone(child), 10, "the child of a killed srt-python ending")


def test_the_jobs_python_processes_come_from_the_server(spark):
    """The session's server: a worker of the job is forked by the daemon the server forked."""
    import pyarrow as pa

    def where(batches):
        for _ in batches:
            daemon = os.getppid()
            stat = Path(f"/proc/{daemon}/stat").read_text()
            yield pa.record_batch({"server": [int(stat.rsplit(")", 1)[1].split()[1])]})

    rows = spark.range(1, numPartitions=1).mapInArrow(where, "server long").collect()
    assert forkserver._started, "the session started a forkserver"
    assert rows[0]["server"] == forkserver._started[0].pid
