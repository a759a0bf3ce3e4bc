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

The session uses it when the job's Python workers run the driver's own interpreter
(``session.worker_python``).
"""

from __future__ import annotations

import os
import runpy
import socket
import struct
import sys
from typing import Any

# The environment of a worker Spark started on its own (its connection back), by transport.
PORT = "PYTHON_WORKER_FACTORY_PORT"
SOCK_PATH = "PYTHON_WORKER_FACTORY_SOCK_PATH"
SECRET = "PYTHON_WORKER_FACTORY_SECRET"


def main() -> None:
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "-m" or not (PORT in os.environ or SOCK_PATH in os.environ):
        os.execv(sys.executable, [sys.executable, *argv])
    module = argv[1]
    sock, sockfile = _connect()
    _hand_over(sock, sockfile)
    sys.argv = [module, *argv[2:]]
    sys.path.insert(0, os.getcwd())  # as `python -m` puts the working directory first
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _connect() -> tuple[socket.socket, Any]:
    """Connect back to the JVM as PySpark's ``local_connect_and_auth`` does."""
    timeout = int(os.environ.get("SPARK_AUTH_SOCKET_TIMEOUT", 15))
    buffer = int(os.environ.get("SPARK_BUFFER_SIZE", 65536))
    secret = os.environ.get(SECRET)
    path = os.environ.get(SOCK_PATH)
    if path is not None and secret is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        sock.connect(path)
        return sock, sock.makefile("rwb", buffer)
    host = "::1" if os.environ.get("SPARK_PREFER_IPV6", "false").lower() == "true" else "127.0.0.1"
    sock = socket.create_connection((host, int(os.environ[PORT])), timeout=timeout)
    sockfile = sock.makefile("rwb", buffer)
    assert secret is not None, f"{SECRET} is not set"
    token = secret.encode("utf-8")
    sockfile.write(struct.pack("!i", len(token)) + token)
    sockfile.flush()
    (length,) = struct.unpack("!i", sockfile.read(4))
    reply = sockfile.read(length).decode("utf-8")
    if reply != "ok":
        sock.close()
        raise RuntimeError(f"the JVM refused this Python worker's secret ({reply!r})")
    return sock, sockfile


def _hand_over(sock: socket.socket, sockfile: Any) -> None:
    """Make PySpark's first ``local_connect_and_auth`` for the factory's address return the
    connection made, and every other call connect as before."""
    import pyspark.util
    import pyspark.worker_util

    original = pyspark.util.local_connect_and_auth
    address = os.environ.get(SOCK_PATH, os.environ.get(PORT))
    pending = [(sockfile, sock)]

    def local_connect_and_auth(conn_info: Any, auth_secret: Any) -> tuple:
        if pending and str(conn_info) == address:
            return pending.pop()
        return original(conn_info, auth_secret)

    pyspark.util.local_connect_and_auth = local_connect_and_auth  # type: ignore[assignment]
    pyspark.worker_util.local_connect_and_auth = local_connect_and_auth  # type: ignore[assignment]
