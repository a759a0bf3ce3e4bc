"""Keep Spark's Python-worker chatter out of the job's terminal, in a log file instead.

Spark's driver-side Python runner for ``transformWithStateInPandas``
(``pyspark.sql.streaming.transform_with_state_driver_worker``) prints "Streaming
TransformWithStateInPandas Python worker ..." lines to its stdout on every batch that plans the
operator. The JVM copies a Python worker's stdout to its own (``PythonWorkerFactory``'s
redirect threads), and the JVM inherited the job process's stdout: the lines land between
``srt run``'s progress lines, and log4j settings cannot reach them.

:func:`divert` puts a pipe on file descriptor 1 *before* the JVM starts (so the JVM and every
worker inherit it): a thread copies each line to the original stdout, except worker lines
(and the blank line each carries), which go to a log file.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from pathlib import Path

from .registry import private_file

# Line prefixes written by Spark's Python workers (not by the job).
WORKER_MARKERS = (
    b"Streaming TransformWithStateInPandas Python worker",
    b"Starting Streaming TransformWithStateInPandas Python worker",
)
# At exit, how long the copying thread gets to pass on what is still in the pipe. The JVM holds
# the pipe's write end until it exits; the session's own exit hook (registered after this one,
# so run before it) has ended the JVM by then, and the pipe is at its end.
DRAIN_S = 2.0

_installed: threading.Thread | None = None


def is_worker_line(line: bytes) -> bool:
    return line.lstrip().startswith(WORKER_MARKERS)


def _copy(read_fd: int, terminal: int, log_path: Path) -> None:
    buffered = b""
    after_worker = False
    with os.fdopen(read_fd, "rb", buffering=0) as pipe, private_file(log_path) as log:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if is_worker_line(line) or (after_worker and not line.strip()):
                    after_worker = bool(line.strip()) or after_worker
                    log.write(line + b"\n")
                    log.flush()
                    continue
                after_worker = False
                os.write(terminal, line + b"\n")
        if buffered:
            os.write(terminal, buffered)


def divert(log_path: str | Path) -> Path:
    """From now on, this process's and its children's stdout lines from Spark's Python workers
    go to ``log_path`` (appended); everything else still reaches the original stdout. Call it
    before the SparkSession (the JVM) starts; a second call does nothing."""
    global _installed
    path = Path(log_path)
    if _installed is not None:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    terminal = os.dup(1)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 1)
    os.close(write_fd)
    thread = threading.Thread(
        target=_copy, args=(read_fd, terminal, path), name="srt-worker-output", daemon=True
    )
    thread.start()
    _installed = thread

    def _restore() -> None:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.dup2(terminal, 1)  # our write end closes; the JVM's closes when it exits
        thread.join(DRAIN_S)

    atexit.register(_restore)
    return path
