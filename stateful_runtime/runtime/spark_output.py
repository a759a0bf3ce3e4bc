"""Keep Spark's own chatter out of the job's terminal, in the job's log files instead.

Two kinds of lines reach ``srt run``'s terminal without being the job's:

* Spark's driver-side Python runner for ``transformWithStateInPandas``
  (``pyspark.sql.streaming.transform_with_state_driver_worker``) prints "Streaming
  TransformWithStateInPandas Python worker ..." lines to its stdout on every batch that plans
  the operator. The JVM copies a Python worker's stdout to its own (``PythonWorkerFactory``'s
  redirect threads), and the JVM inherited the job process's stdout: the lines land between
  ``srt run``'s progress lines, and log4j settings cannot reach them.
* The JVM itself warns on stderr as it starts, before any logging is set up: ``WARNING: Using
  incubator modules: jdk.incubator.vector`` (Spark's launcher adds that module to every JVM it
  starts). Spark's own log lines are log4j's, which a job process sends to its log file
  (:func:`stateful_runtime.runtime.session.build_session`'s ``log_file``).

:func:`divert` puts a pipe on file descriptors 1 and 2 *before* the JVM starts (so the JVM and
every worker inherit them): a thread per descriptor copies each line to the original one,
except those lines, which go to a log file. Everything else, errors included, still reaches the
terminal.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .registry import private_file

# Line prefixes written by Spark's Python workers (not by the job).
WORKER_MARKERS = (
    b"Streaming TransformWithStateInPandas Python worker",
    b"Starting Streaming TransformWithStateInPandas Python worker",
)
# How the JVM prefixes what it says on stderr itself (HotSpot's and the module system's
# warnings); the job's errors, Python's warnings and log4j's lines are written otherwise.
JVM_MARKER = b"WARNING: "
# At exit, how long each copying thread gets to pass on what is still in its pipe. The JVM holds
# the pipes' write ends until it exits; the session's own exit hook (registered after this one,
# so run before it) has ended the JVM by then, and the pipes are at their end.
DRAIN_S = 2.0

_installed: list[threading.Thread] = []


def is_worker_line(line: bytes) -> bool:
    return line.lstrip().startswith(WORKER_MARKERS)


def is_jvm_line(line: bytes) -> bool:
    return line.startswith(JVM_MARKER)


def _copy(
    read_fd: int, terminal: int, log: IO[bytes], aside: Callable[[bytes], bool], blank: bool
) -> None:
    """Copy lines from ``read_fd`` to ``terminal``, those ``aside`` picks to ``log`` (with
    ``blank``: and the blank lines right after one)."""
    buffered = b""
    after = False
    reader = [True]  # False once whoever read the terminal went away (`srt run ... | head`)

    def show(data: bytes) -> None:
        # Without a reader the lines are dropped, but the pipe is still drained: its writers
        # (the job, the JVM, the workers) must never block on a full pipe.
        if reader[0]:
            try:
                os.write(terminal, data)
            except OSError:
                reader[0] = False

    with os.fdopen(read_fd, "rb", buffering=0) as pipe, log:
        while True:
            chunk = pipe.read(65536)
            if not chunk:
                break
            buffered += chunk
            *lines, buffered = buffered.split(b"\n")
            for line in lines:
                if aside(line) or (blank and after and not line.strip()):
                    after = bool(line.strip()) or after
                    log.write(line + b"\n")
                    log.flush()
                    continue
                after = False
                show(line + b"\n")
        if buffered:
            show(buffered)


def _divert(fd: int, log_path: Path, aside: Callable[[bytes], bool], blank: bool) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = private_file(log_path)  # created (0600) before any other writer of it starts
    stream = sys.stdout if fd == 1 else sys.stderr
    stream.flush()
    terminal = os.dup(fd)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, fd)
    os.close(write_fd)
    thread = threading.Thread(
        target=_copy,
        args=(read_fd, terminal, log, aside, blank),
        name=f"srt-spark-output-{fd}",
        daemon=True,
    )
    thread.start()
    _installed.append(thread)

    def _restore() -> None:
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        os.dup2(terminal, fd)  # our write end closes; the JVM's closes when it exits
        thread.join(DRAIN_S)

    atexit.register(_restore)


def divert(workers_log: str | Path, jvm_log: str | Path) -> None:
    """From now on, this process's and its children's stdout lines from Spark's Python workers
    go to ``workers_log``, and the JVM's own warnings on stderr to ``jvm_log`` (both appended);
    everything else still reaches the original stdout and stderr. Call it before the
    SparkSession (the JVM) starts; a second call does nothing."""
    if _installed:
        return
    _divert(1, Path(workers_log), is_worker_line, blank=True)
    _divert(2, Path(jvm_log), is_jvm_line, blank=False)
