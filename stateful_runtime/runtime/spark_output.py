"""Keep Spark's own chatter out of the job's terminal, in the job's log files instead.

Two kinds of lines reach ``srt run``'s terminal on stderr without being the job's (log4j
settings cannot reach them):

* The JVM itself warns on stderr as it starts, before any logging is set up: ``WARNING: Using
  incubator modules: jdk.incubator.vector`` (Spark's launcher adds that module to every JVM it
  starts). Spark's own log lines are log4j's, which a job process sends to its log file
  (:func:`stateful_runtime.runtime.session.build_session`'s ``log_file``).
* Spark's Python source runner (``pyspark.sql.streaming.python_streaming_source_runner``, one
  process per Python streaming source, its stderr copied to the JVM's) dies with a traceback
  when a stop closes its socket before it is killed: an ``EOFError`` at its read of the next
  call, and the ``BrokenPipeError`` of its reply. Its own failures reach the job through the
  socket (a query's error); an unhandled traceback through its ``<module>`` frame is the
  process dying, which is Spark's business, not the job's (:class:`RunnerTracebacks`).

:func:`divert` puts a pipe on file descriptor 2 *before* the JVM starts (so the JVM and
every worker inherit it): a thread copies each line to the original one, except those lines,
which go to the job's log file. Everything else, errors included, still reaches the
terminal.
"""

from __future__ import annotations

import atexit
import os
import re
import select
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from .registry import private_file

# How the JVM prefixes what it says on stderr itself (HotSpot's and the module system's
# warnings); the job's errors, Python's warnings and log4j's lines are written otherwise.
JVM_MARKER = b"WARNING: "
# At exit, how long the copying thread gets to pass on what is still in its pipe. The JVM holds
# the pipes' write ends until it exits; the session's own exit hook (registered after this one,
# so run before it) has ended the JVM by then, and the pipes are at their end.
DRAIN_S = 2.0

# A traceback's first line, and the lines that chain one to the next.
TRACEBACK = b"Traceback (most recent call last):"
CHAINED = (
    b"During handling of the above exception, another exception occurred:",
    b"The above exception was the direct cause of the following exception:",
)
# A frame of Spark's source runner, and one of the runpy module that runs it (``python -m``).
RUNNER_FRAME = re.compile(
    rb'^  File ".*[/\\]pyspark[/\\]sql[/\\]streaming[/\\]python_streaming_source_runner\.py",'
    rb" line \d+, in (\S+)"
)
RUNPY_FRAME = b'  File "<frozen runpy>"'
# How long a traceback that may be the source runner's is held for the rest of it, when the
# pipe goes quiet; then it reaches the terminal.
HOLD_S = 2.0

_installed: list[threading.Thread] = []


class RunnerTracebacks:
    """Picks the Spark source runner's dying tracebacks out of a stream of stderr lines.

    A traceback is held from its first line while it may be the runner's: its first frame is
    the runner's or runpy's, until a line that does not continue it (or :data:`HOLD_S` of
    quiet). It is set aside whole, chained parts included, if a frame of the runner's
    ``<module>`` shows it unhandled; any other traceback, one the runner sent to the JVM (quoted
    in a query's error) included, is shown, in order. :meth:`feed` returns each
    line it lets go with whether it goes aside."""

    def __init__(self) -> None:
        self.held: list[bytes] = []
        self.candidate = False  # the first frame says: maybe the runner's
        self.dying = False  # a frame of the runner's <module>: the runner's, unhandled
        self.ended = False  # after an exception line: a chained part may follow

    def feed(self, line: bytes) -> list[tuple[bytes, bool]]:
        text = line.rstrip()
        if not self.held:
            if text == TRACEBACK:
                self.held.append(line)
                return []
            return [(line, False)]
        if self.ended:
            if not text or text in CHAINED or text == TRACEBACK:
                self.held.append(line)
                self.ended = text != TRACEBACK and self.ended
                return []
            return self.release() + self.feed(line)
        self.held.append(line)
        if line.startswith(b" "):
            if line.startswith(b"  File "):
                frame = RUNNER_FRAME.match(text)
                if len(self.held) == 2:  # the first frame
                    self.candidate = bool(frame) or line.startswith(RUNPY_FRAME)
                self.dying = self.dying or bool(frame and frame.group(1) == b"<module>")
            return [] if self.candidate else self.release()
        if not text or text in CHAINED or text == TRACEBACK:
            return []
        # The exception line: a traceback that cannot be the runner's is shown now; one that may
        # be waits for what follows (a chained part, perhaps through the runner's <module>).
        if not self.candidate:
            return self.release()
        self.ended = True
        return []

    def release(self) -> list[tuple[bytes, bool]]:
        """Everything held, aside if it is the runner's dying traceback."""
        out = [(held, self.dying) for held in self.held]
        self.held = []
        self.candidate = self.dying = self.ended = False
        return out


def is_jvm_line(line: bytes) -> bool:
    return line.startswith(JVM_MARKER)


def _copy(
    read_fd: int,
    terminal: int,
    log: IO[bytes],
    aside: Callable[[bytes], bool],
    tracebacks: RunnerTracebacks | None = None,
) -> None:
    """Copy lines from ``read_fd`` to ``terminal``, those ``aside`` picks to ``log``, and the
    source runner's dying tracebacks that ``tracebacks`` picks."""
    buffered = b""
    reader = [True]  # False once whoever read the terminal went away (`srt run ... | head`)

    def show(data: bytes) -> None:
        # Without a reader the lines are dropped, but the pipe is still drained: its writers
        # (the job, the JVM, the workers) must never block on a full pipe.
        if reader[0]:
            try:
                os.write(terminal, data)
            except OSError:
                reader[0] = False

    def put(line: bytes, picked: bool) -> None:
        if picked or aside(line):
            log.write(line + b"\n")
            log.flush()
            return
        show(line + b"\n")

    def lines(line: bytes) -> list[tuple[bytes, bool]]:
        return tracebacks.feed(line) if tracebacks is not None else [(line, False)]

    with os.fdopen(read_fd, "rb", buffering=0) as pipe, log:
        while True:
            if tracebacks is not None and tracebacks.held:
                ready, _, _ = select.select([read_fd], [], [], HOLD_S)
                if not ready:  # quiet: what is held was not the runner's end after all
                    for line, picked in tracebacks.release():
                        put(line, picked)
                    continue
            chunk = pipe.read(65536)
            if not chunk:
                break
            buffered += chunk
            *complete, buffered = buffered.split(b"\n")
            for line in complete:
                for out, picked in lines(line):
                    put(out, picked)
        for line, picked in tracebacks.release() if tracebacks is not None else []:
            put(line, picked)
        if buffered:
            show(buffered)


def _divert(
    log_path: Path, aside: Callable[[bytes], bool], tracebacks: RunnerTracebacks | None = None
) -> None:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = private_file(log_path)  # created (0600) before any other writer of it starts
    fd, stream = 2, sys.stderr
    stream.flush()
    terminal = os.dup(fd)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, fd)
    os.close(write_fd)
    thread = threading.Thread(
        target=_copy,
        args=(read_fd, terminal, log, aside, tracebacks),
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


def divert(jvm_log: str | Path) -> None:
    """From now on, the JVM's own warnings and the source runner's dying tracebacks on this
    process's and its children's stderr go to ``jvm_log`` (appended); everything else still
    reaches the original stderr. Call it before the SparkSession (the JVM) starts; a second
    call does nothing."""
    if _installed:
        return
    _divert(Path(jvm_log), is_jvm_line, tracebacks=RunnerTracebacks())
