"""``srt-python``: the interpreter Spark starts for the job's Python workers, which connects a
worker started on its own back to the JVM before it imports anything.

Spark starts most Python workers from one daemon, but the ones it needs on the driver — a
Python data source's planner and its streaming reader (every source of a job is one), a
streaming sink — are processes of their own (``PythonWorkerFactory.createSimpleWorker``): Spark
runs ``<python> -m <module>`` and waits a fixed 10 s, not configurable, for the process to
connect back. PySpark's modules connect only once their imports are done (pyspark, pandas,
pyarrow: ~0.3 s of CPU); on a loaded machine (a load average of 25 a core was seen on the
project's CI machine) those imports alone took longer than 10 s and the query failed at start
with "Python worker failed to connect back".

So a worker started on its own connects first: with nothing imported beyond the standard
library, it connects and authenticates as PySpark does (``pyspark.util.local_connect_and_auth``:
TCP to 127.0.0.1 with the factory's secret, or the factory's Unix socket), then imports the
module and runs it as ``python -m`` would, handing it that connection when it asks for one.
The wait Spark bounds is then the interpreter's start and a connect. Anything else
(the daemon, a worker it forks, a command that is not ``-m``) runs the interpreter unchanged.

Where the driver started a forkserver (:mod:`stateful_runtime.runtime.forkserver`), every
``-m`` start — a daemon, a worker started on its own (once connected) — is handed to it: the
child it forks has pyspark, pyarrow, pandas and the runtime's worker modules imported already,
and this process stays as the one Spark watches until the child ends. A start the server
refuses runs here, as above.

The session uses it when the job's Python workers run the driver's own interpreter
(``session.worker_python``).
"""

from __future__ import annotations

import json
import os
import runpy
import selectors
import signal
import socket
import struct
import sys
from typing import Any

# The environment of a worker Spark started on its own (its connection back), by transport.
PORT = "PYTHON_WORKER_FACTORY_PORT"
SOCK_PATH = "PYTHON_WORKER_FACTORY_SOCK_PATH"
SECRET = "PYTHON_WORKER_FACTORY_SECRET"

# The forkserver's socket path, in the environment the JVM and the processes it starts inherit;
# ``off`` before the session starts: no server (every process Spark starts imports alone).
ENV = "SRT_FORKSERVER"
OFF = "off"
# Settings an interpreter reads once, at its start: a child of the server has the server's,
# so a start asking for other values is refused (Spark sets the first two for its workers).
FIXED = (
    "PYTHONHASHSEED",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONOPTIMIZE",
    "PYTHONSAFEPATH",
    "PYTHONWARNINGS",
    "PYTHONFAULTHANDLER",
    "PYTHONMALLOC",
    "PYTHONUTF8",
    "SPARK_TESTING",
    "PYSPARK_ENABLE_NAMEDTUPLE_PATCH",
)
_STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # a child ignores those its caller did
FRAME = struct.Struct("!I")  # a start's request: its length, then JSON
MAX_FDS = 8  # file descriptors a start passes, at most


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "-m":
        os.execv(sys.executable, [sys.executable, *argv])
    simple = PORT in os.environ or SOCK_PATH in os.environ
    # the connection's descriptor alone, owned by whoever runs the module (here or a child)
    extra = [_connect().detach()] if simple else []
    code = run_forked(argv, [0, 1, 2, *extra])
    if code is not None:
        _exit_as(code)
    if not extra:
        os.execv(sys.executable, [sys.executable, *argv])
    sys.exit(run_module(argv[1:], extra))


def _exit_as(code: int) -> None:
    """End as the child did: with its exit code, or killed by the signal that ended it."""
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        code = 128 - code  # (a signal this process cannot die of)
    sys.exit(code)


def run_module(argv: list[str], extra: list[int]) -> int:
    """Run module ``argv[0]`` with arguments ``argv[1:]`` as ``python -m`` would, in this
    process; ``extra``: the connection to the JVM made for it (its file descriptor), handed
    to PySpark's first ``local_connect_and_auth`` for the factory's address. Its exit status."""
    if extra:
        _hand_over(extra[0])
    module = argv[0]
    sys.argv = [module, *argv[1:]]
    sys.path.insert(0, os.getcwd())  # as `python -m` puts the working directory first
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    return 0


def _connect() -> socket.socket:
    """Connect back to the JVM as PySpark's ``local_connect_and_auth`` does, reading no byte
    past the JVM's reply (the connection may be handed to another process)."""
    timeout = int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    secret = os.environ.get(SECRET)
    path = os.environ.get(SOCK_PATH)
    if path is not None and secret is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(path)
        return sock
    host = "::1" if os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
    sock = socket.create_connection((host, int(os.environ[PORT])), timeout=timeout)
    assert secret is not None, f"{SECRET} is not set"
    token = secret.encode("utf-8")
    sock.sendall(struct.pack("!i", len(token)) + token)
    (length,) = struct.unpack("!i", _read(sock, 4))
    reply = _read(sock, length).decode("utf-8")
    if reply != "ok":
        sock.close()
        raise RuntimeError(f"the JVM refused this Python worker's secret ({reply!r})")
    return sock


def _read(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = sock.recv(n - len(data))
        if not more:
            raise RuntimeError("the JVM closed the connection while this worker authenticated")
        data += more
    return data


def _hand_over(fd: int) -> None:
    """Make PySpark's first ``local_connect_and_auth`` for the factory's address return the
    connection made (file descriptor ``fd``), and every other call connect as before."""
    import pyspark.util
    import pyspark.worker_util

    sock = socket.socket(fileno=fd)
    sock.settimeout(int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15)))
    sockfile = sock.makefile("rwb", int(os.environ.get("SPARK_BUFFER_SIZE", 65536)))
    original = pyspark.util.local_connect_and_auth
    address = os.environ.get(SOCK_PATH, os.environ.get(PORT))
    pending = [(sockfile, sock)]

    def local_connect_and_auth(conn_info: Any, auth_secret: Any) -> tuple:
        if pending and str(conn_info) == address:
            return pending.pop()
        return original(conn_info, auth_secret)

    pyspark.util.local_connect_and_auth = local_connect_and_auth  # type: ignore[assignment]
    pyspark.worker_util.local_connect_and_auth = local_connect_and_auth  # type: ignore[assignment]


# -- the forkserver's client ------------------------------------------------------------------
def interpreter_settings(env: dict[str, str]) -> dict[str, Any]:
    """What of ``env`` an interpreter fixes at its start (a flag set to any non-empty value
    counts as set)."""
    flags = ("PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "PYTHONSAFEPATH")
    out: dict[str, Any] = {}
    for name in FIXED:
        value = env.get(name) or None
        out[name] = (value is not None) if name in flags else value
    return out


# -- the client side (``srt-python``) -------------------------------------------------------------
def run_forked(argv: list[str], streams: list[int]) -> int | None:
    """Start ``python <argv>`` as a child of the server with file descriptors ``streams``
    (stdin, stdout, stderr, then any the command's module expects) and this process's
    environment and working directory; wait for it and return its exit status
    (:func:`os.waitstatus_to_exitcode`). None when the server is not there or refuses (the
    caller runs the interpreter itself; nothing was started)."""
    path = os.environ.get(ENV)
    if not path or path == OFF:
        return None
    try:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.connect(path)
        ignored = [s for s in _STOPS if signal.getsignal(s) == signal.SIG_IGN]
        request = json.dumps(
            {
                "argv": argv,
                "env": dict(os.environ),
                "cwd": os.getcwd(),
                "python": sys.executable,
                "ignored": ignored,
                "blocked": sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ())),
            }
        ).encode()
        socket.send_fds(conn, [FRAME.pack(len(request)) + request], streams)
        reply = conn.makefile("rb")
        first = reply.readline().split()
    except OSError:
        return None
    if len(first) != 2 or first[0] != b"pid":
        conn.close()
        return None  # refused (or the server is ending): no child was started
    pid = int(first[1])

    def forward(signum: int, frame: Any) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    # Spark stops what it started with SIGTERM to the process. A daemon leaves the job's
    # process group at once (pyspark.daemon): so does this process for it, and then only a
    # SIGTERM meant for it arrives, to be passed on. Any other child stays in the group, as
    # this process does, and takes the group's signals as this one would have.
    if argv[1] == "pyspark.daemon":
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, forward)
    elif signal.SIGTERM not in ignored:
        signal.signal(signal.SIGTERM, forward)
    # The child has the streams now: this process holds no end of them, so a reader of the
    # child's output sees its end when the child ends.
    null = os.open(os.devnull, os.O_RDWR)
    for fd in streams:
        if fd <= 2:
            os.dup2(null, fd)
        else:
            os.close(fd)
    os.close(null)
    try:
        last = reply.readline().split()
    except OSError:
        last = []
    if len(last) == 2 and last[0] == b"exit":
        return os.waitstatus_to_exitcode(int(last[1]))
    return _wait_gone(pid)  # the server ended first: the child's status went with it


def _wait_gone(pid: int) -> int:
    """Wait for ``pid`` (not this process's child) to end; its status is unknown: 1."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return 1
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        sel.select()
    os.close(fd)
    return 1
