"""The forkserver behind ``srt-python``: the Python processes Spark starts are forked from one
that has already imported what they import.

A job's JVM starts a Python process of its own for each part of the work PySpark does in
Python: a daemon per worker module (the executors' workers, and a data source's
creation and planning), and one runner per Python streaming source. Each is a fresh
interpreter that imports pyspark, pyarrow and pandas (0.2-0.5 s of CPU), one after another on
the query's start, and every worker the daemon forks imports the job's modules again
(another ~0.7 s each). The driver starts this server next to its JVM (:func:`start`): it
imports them once, and ``srt-python`` (:mod:`stateful_runtime.runtime.python_worker`) hands
it each start instead of running the interpreter — the command line, environment and working
directory, and its standard streams (and, for a worker that connects back, its connection to
the JVM) passed over a Unix socket. The server forks a child that takes them and runs the
module as ``python -m`` would; ``srt-python`` stays as the process Spark watches: it forwards
SIGTERM to the child, and exits with the child's status. If ``srt-python`` dies (SIGKILL),
the server kills the child.

A start the server cannot serve as the interpreter would — other interpreter settings
(``PYTHONHASHSEED`` and the like, which take effect at an interpreter's start), another
interpreter, a server gone — is refused, and ``srt-python`` runs the interpreter itself as
before. The server ends when the driver does (its stdin closes).

``srt-python``'s side of it (the request, the wait, the fallback) is in
:mod:`~stateful_runtime.runtime.python_worker`, which imports nothing heavy.
"""

from __future__ import annotations

import gc
import json
import os
import selectors
import signal
import socket
import sys
from typing import Any

from stateful_runtime._process import import_ahead
from stateful_runtime.runtime import spark_home
from stateful_runtime.runtime.python_worker import (
    ENV,
    FRAME,
    MAX_FDS,
    OFF,
    interpreter_settings,
    run_module,
)

# The server's interpreter settings, as Spark sets them for the processes it starts.
SERVER_SETTINGS = {"PYTHONHASHSEED": "0", "PYTHONUNBUFFERED": "YES"}
# What the processes Spark starts import: PySpark's daemon, workers and data source runners,
# Arrow and pandas, and the runtime's modules its workers run.
PRELOAD = (
    "pyspark.daemon",
    "pyspark.worker",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.python_streaming_sink_runner",
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyarrow",
    "pyarrow.compute",
    "pandas",
    "stateful_runtime.connectors.eventlog.source",
    "stateful_runtime.operators.arrow_keyed",
    "stateful_runtime.operators.keyed_read",
    "stateful_runtime.operators.ticks",
    "stateful_runtime.runtime.batch_writes",
)
_SOCKET_PATH_MAX = 100  # bytes of a Unix socket's path (108 on Linux, with its NUL)

# -- the server ------------------------------------------------------------------------------------
_started: list[Any] = []  # this process's server (its Popen), once started
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}  # the job's: never the server's


def start(
    directory: str | os.PathLike[str] | None = None, log: str | os.PathLike[str] | None = None
) -> str | None:
    """Start this process's forkserver (once) and name its socket in the environment
    (:data:`ENV`), so that a JVM started after this finds it; the socket's path, or None on a
    platform without one. ``directory``: a private directory of this process for the socket
    (the session's scratch; else one of its own). ``log``: where the server's own errors go
    (appended; else nowhere: it holds none of this process's streams, whose readers wait for
    their end)."""
    if _started:
        return os.environ.get(ENV)
    if os.environ.get(ENV) == OFF:
        return None
    if os.name != "posix" or not hasattr(socket, "send_fds"):
        return None
    import subprocess

    from stateful_runtime._process import process_dir

    try:  # this process's (0700), removed when it ends, or by a later one if it is killed
        path = os.path.join(directory or process_dir("srt-forkserver"), "forkserver.sock")
    except OSError:
        return None
    if len(path.encode()) > _SOCKET_PATH_MAX:
        return None  # a temp directory too deep for a Unix socket: every start imports alone
    env = {**os.environ, **SERVER_SETTINGS}
    env.pop(ENV, None)
    errors = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    # The server starts with the stop signals blocked (a blocked mask survives exec): a stop
    # sent to the job's group while its interpreter starts stays pending until main() has set
    # them ignored, instead of interrupting its imports with a traceback. This thread's own
    # mask is back as it was right after, and what arrived meanwhile is delivered then.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", __name__, path],
            stdin=subprocess.PIPE,  # closed when this process ends: the server ends then
            stdout=subprocess.DEVNULL,
            stderr=errors,
            env=env,
            close_fds=True,
        )
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
        if log is not None:
            errors.close()  # type: ignore[union-attr]
    _started.append(proc)
    os.environ[ENV] = path
    return path


class _Server:
    def __init__(self, path: str) -> None:
        self.settings = interpreter_settings(dict(os.environ))
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen(64)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.listener, selectors.EVENT_READ, ("accept", None))
        self.sel.register(sys.stdin.fileno(), selectors.EVENT_READ, ("stdin", None))
        self.running: dict[int, tuple[socket.socket, int]] = {}  # pid → (client, pidfd)

    def serve(self) -> None:
        while True:
            for key, _ in self.sel.select():
                kind, data = key.data
                if kind == "accept":
                    self._accept()
                elif kind == "stdin":
                    if not os.read(sys.stdin.fileno(), 4096):
                        return  # the driver is gone
                elif kind == "client":
                    self._client_event(*data)
                elif kind == "exit":
                    self._reap(data)

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        conn.settimeout(10)
        try:
            request, fds = _receive(conn)
        except (OSError, ValueError):
            conn.close()
            return
        refusal = self._refusal(request)
        if refusal is not None:
            for fd in fds:
                os.close(fd)
            _send(conn, f"refused {refusal}")
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(self, conn, request, fds)  # never returns
        for fd in fds:
            os.close(fd)
        pidfd = os.pidfd_open(pid)
        self.running[pid] = (conn, pidfd)
        self.sel.register(pidfd, selectors.EVENT_READ, ("exit", pid))
        self.sel.register(conn, selectors.EVENT_READ, ("client", (pid, conn)))
        if not _send(conn, f"pid {pid}"):
            self._client_gone(pid, conn)

    def _refusal(self, request: dict[str, Any]) -> str | None:
        if os.path.realpath(request.get("python", "")) != os.path.realpath(sys.executable):
            return "another-interpreter"
        if interpreter_settings(request.get("env", {})) != self.settings:
            return "other-interpreter-settings"
        argv = request.get("argv", [])
        if len(argv) < 2 or argv[0] != "-m":
            return "not-a-module"
        return None

    def _client_event(self, pid: int, conn: socket.socket) -> None:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:
            self._client_gone(pid, conn)

    def _client_gone(self, pid: int, conn: socket.socket) -> None:
        """The ``srt-python`` Spark watches died: its child goes too."""
        self.sel.unregister(conn)
        conn.close()
        if pid in self.running:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _reap(self, pid: int) -> None:
        conn, pidfd = self.running.pop(pid)
        self.sel.unregister(pidfd)
        os.close(pidfd)
        _, status = os.waitpid(pid, 0)
        if conn.fileno() != -1:
            self.sel.unregister(conn)
            _send(conn, f"exit {status}")
            conn.close()

    def close_in_child(self) -> None:
        for conn, pidfd in self.running.values():
            os.close(pidfd)
            if conn.fileno() != -1:
                conn.close()
        self.sel.close()
        self.listener.close()


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 65536, MAX_FDS)
    if len(data) < FRAME.size:
        raise ValueError("short request")
    (length,) = FRAME.unpack_from(data)
    body = data[FRAME.size :]
    while len(body) < length:
        more = conn.recv(length - len(body))
        if not more:
            raise ValueError("short request")
        body += more
    return json.loads(body), list(fds)


def _send(conn: socket.socket, line: str) -> bool:
    try:
        conn.sendall(line.encode() + b"\n")
        return True
    except OSError:
        return False


def _child(server: _Server, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    """In the forked child: become the process ``python <argv>`` would have been, run it, and
    exit with its status."""
    code = 1
    try:
        conn.close()
        server.close_in_child()
        # the signals as the caller had them (the JVM starts its Python processes ignoring
        # the job's stop signals, which go to the whole process group)
        ignored = set(request.get("ignored", ()))
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGINT):
            if sig in ignored:
                signal.signal(sig, signal.SIG_IGN)
            elif sig == signal.SIGINT:
                signal.signal(sig, signal.default_int_handler)
            else:
                signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, request.get("blocked", ()))
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
            if fd > 2 and fd not in fds[:target]:
                os.close(fd)
        extra = fds[3:]
        env = request["env"]
        os.environ.clear()
        os.environ.update(env)
        os.chdir(request["cwd"])
        # PYTHONPATH's entries, as an interpreter puts them first, but for those inside the
        # pyspark imported here or the merged Spark home (Spark puts its zips of pyspark first;
        # a worker's interpreter drops them too, platform/bootstrap.sh)
        pyspark = sys.modules.get("pyspark")
        inside = [os.path.join(spark_home.home(), "")]
        if pyspark is not None:
            inside.append(os.path.dirname(pyspark.__file__ or "/") + os.sep)
        for entry in reversed([p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]):
            if entry not in sys.path and not entry.startswith(tuple(inside)):
                sys.path.insert(0, entry)
        # run as __main__ as `python -m` runs it, not over the copy imported here
        sys.modules.pop(request["argv"][1], None)

        code = run_module(request["argv"][1:], extra)  # (its SystemExit is its status)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        try:
            import atexit

            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _reseed_numpy() -> None:
    """A forked child draws its own numpy random numbers (``random`` reseeds itself)."""
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def main() -> None:
    path = sys.argv[1]
    # The driver's stop signals are the driver's to handle; this server ends with it. They
    # arrive blocked (start()): ignored first, then unblocked, any pending one is dropped.
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    server = _Server(path)  # listening before the imports: an early start waits, it is not refused
    import_ahead(PRELOAD)
    os.register_at_fork(after_in_child=_reseed_numpy)
    # What the imports made is never garbage: a child's collections skip it, and leave its
    # pages shared with the server's (freeze_worker_heap does the same in a worker).
    gc.freeze()
    try:
        server.serve()
    finally:
        server.listener.close()
        try:
            os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    main()
