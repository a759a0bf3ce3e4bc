"""Line-protocol ingestion into a topic: from a stream (stdin) or from a TCP listener.

Each non-empty line is one record, appended byte for byte (without its ``\\n`` / ``\\r\\n``).
With a key field, the key comes from that JSON field of the line. Every line ends one of three
ways, and the sender is told about the last two:

* **appended** with its key (or with none if the field is missing or null);
* **rejected**: the line is not a valid JSON record (malformed, two objects, invalid UTF-8,
  nested deeper than ``formats.json.MAX_DEPTH``, a lone surrogate...) so it has no key: it is
  appended as-is *without* a key, and the job's decoder dead-letters it with the same reason
  (:func:`stateful_runtime.connectors.formats.json.parse_record` is that decoder's judge);
* **refused**: longer than :data:`MAX_LINE_BYTES`; not appended (the decoder would reject it
  too, and holding it would let one line exhaust memory).

Nothing else is dropped: a bad line is handled alone and never takes its neighbours with it.
``srt log append`` reports rejected and refused lines on stderr and exits nonzero only if a line
was refused; ``srt log serve`` answers each on the connection (:func:`serve_lines`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import signal
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from stateful_runtime.connectors.eventlog.store import Record, TopicWriter
from stateful_runtime.exceptions import LogError

# One WriteBatch per this many lines: ~330k rec/s measured at 5k per batch, and a batch is the
# unit a crash can lose before it is acknowledged.
APPEND_BATCH = 5_000
# A TCP connection's buffered lines are appended at least this often, even if fewer than a batch.
FLUSH_INTERVAL_S = 0.02
# The decoder's formats.json.MAX_RECORD_BYTES (a test keeps them equal): a longer line could
# only ever be a dead letter. Not imported: see _judge.
MAX_LINE_BYTES = 1 << 20
# Problems reported one by one (per stream, per connection); the rest are counted only, so a
# client that never reads its socket cannot make the server buffer without bound.
MAX_REPORTED = 1_000


@dataclass(frozen=True)
class LineProblem:
    """A line that was rejected (appended without a key) or refused (not appended)."""

    line: int  # 1-based, counting every line the sender sent (blank ones too)
    reason: str
    appended: bool

    def message(self) -> str:
        what = (
            "appended without a key; the job's decoder will dead-letter it"
            if self.appended
            else "not appended"
        )
        return f"line {self.line}: {self.reason} ({what})"

    def to_json(self) -> str:
        return json.dumps({"line": self.line, "error": self.reason, "appended": self.appended})


@dataclass
class IngestResult:
    """What one stream or connection became."""

    appended: int = 0
    rejected: int = 0  # appended without a key
    refused: int = 0  # not appended
    problems: list[LineProblem] = field(default_factory=list)  # the first MAX_REPORTED

    def add(self, problem: LineProblem) -> bool:
        """Count a problem; True if it is among the reported ones."""
        if problem.appended:
            self.rejected += 1
        else:
            self.refused += 1
        if len(self.problems) < MAX_REPORTED:
            self.problems.append(problem)
            return True
        return False


def _too_long(size: int) -> str:
    return f"line is {size} bytes, over the {MAX_LINE_BYTES}-byte limit"


def key_of(line: bytes, key_field: str | None) -> bytes | None:
    """The key of a line: its ``key_field`` (a string as is, other values as JSON), or None."""
    record, _ = _record(line, key_field)
    return None if record is None else record.key


@functools.cache
def _judge() -> Callable[[bytes], tuple[dict[str, Any] | None, str | None]]:
    """The decoder's per-record judge, imported on first use: formats.json brings pyarrow and
    pyspark (0.4-1 s at start), which `srt log create/info/read` and keyless appends never need."""
    from stateful_runtime.connectors.formats.json import parse_record

    return parse_record


def _record(line: bytes, key_field: str | None) -> tuple[Record | None, str | None]:
    """One line (without its line end) → (record to append, why it has no key) ; never raises.

    (None, None) for a blank line, (None, reason) for a refused one.
    """
    if not line:
        return None, None
    if len(line) > MAX_LINE_BYTES:
        return None, _too_long(len(line))
    if key_field is None:
        return Record(line), None
    obj, why = _judge()(line)
    if obj is None:
        return Record(line), why
    value = obj.get(key_field)
    if value is None:
        return Record(line), None
    key = value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
    return Record(line, key.encode()), None


def _records(lines: Iterable[bytes], key_field: str | None) -> list[Record]:
    """Records of the non-blank lines, keyed where possible (test and benchmark helper)."""
    out = []
    for raw in lines:
        record, _ = _record(raw.rstrip(b"\r\n"), key_field)
        if record is not None:
            out.append(record)
    return out


def _stream_lines(stream: BinaryIO) -> Iterator[tuple[bytes, int]]:
    """(line without its line end, 0), or (b"", size) for a line over MAX_LINE_BYTES, which
    is read past without being held."""
    limit = MAX_LINE_BYTES + 2  # room for "\r\n"
    while True:
        raw = stream.readline(limit)
        if not raw:
            return
        if raw.endswith(b"\n") or len(raw) < limit:
            yield raw.rstrip(b"\r\n"), 0
            continue
        size = len(raw)
        while raw and not raw.endswith(b"\n"):
            raw = stream.readline(1 << 16)
            size += len(raw)
        yield b"", size - (1 if raw.endswith(b"\n") else 0)


def ingest_stream(writer: TopicWriter, stream: BinaryIO, key_field: str | None) -> IngestResult:
    """Append every line of ``stream`` (one WriteBatch per APPEND_BATCH records)."""
    result = IngestResult()
    batch: list[Record] = []
    for number, (line, oversize) in enumerate(_stream_lines(stream), 1):
        why: str | None
        if oversize:
            record, why = None, _too_long(oversize)
        else:
            record, why = _record(line, key_field)
        if why is not None:
            result.add(LineProblem(number, why, appended=record is not None))
        if record is not None:
            batch.append(record)
            if len(batch) >= APPEND_BATCH:
                result.appended += writer.append(batch)
                batch = []
    if batch:
        result.appended += writer.append(batch)
    return result


def append_stream(
    writer: TopicWriter,
    stream: BinaryIO,
    key_field: str | None,
    report: Callable[[str], None] | None = None,
) -> int:
    """``srt log append``: append every line of ``stream``; returns the records appended.

    Rejected and refused lines are reported through ``report`` (stderr by default), one line
    each and a count. Raises :class:`LogError` after appending everything else if any line was
    refused, so the command exits nonzero.
    """
    if report is None:

        def report(text: str) -> None:
            print(text, file=sys.stderr)

    result = ingest_stream(writer, stream, key_field)
    for problem in result.problems:
        report(f"srt log append: {problem.message()}")
    if result.rejected:
        report(
            f"srt log append: {result.rejected} line(s) rejected: appended without a key; "
            f"the job will dead-letter them with the reasons above"
        )
    if result.refused:
        raise LogError(
            f"{result.refused} line(s) refused and not appended (see above); the other "
            f"{result.appended} records were appended to {writer.info.name!r} (end offsets "
            f"{writer.end_offsets()}). Split or fix those lines and append them again."
        )
    return result.appended


async def _read_line(reader: asyncio.StreamReader) -> tuple[bytes | None, int]:
    """The next line without its line end (None at the end of the connection), or (b"", size)
    for one over MAX_LINE_BYTES, which is read past without being held."""
    try:
        raw = await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:  # the last line had no "\n"
        raw = exc.partial
        if not raw:
            return None, 0
    except asyncio.LimitOverrunError as exc:
        return b"", await _skip_line(reader, exc.consumed)
    line = raw.rstrip(b"\r\n")
    return line, (len(line) if len(line) > MAX_LINE_BYTES else 0)


async def _skip_line(reader: asyncio.StreamReader, buffered: int) -> int:
    """Drop the rest of an over-long line; returns its length (without the "\\n")."""
    size = 0
    while True:
        size += len(await reader.readexactly(buffered))
        try:
            return size + len(await reader.readuntil(b"\n")) - 1
        except asyncio.IncompleteReadError as exc:
            return size + len(exc.partial)
        except asyncio.LimitOverrunError as exc:
            buffered = exc.consumed


async def _serve(
    writer: TopicWriter,
    host: str,
    port: int,
    key_field: str | None,
    on_ready: Callable[[int], None],
) -> None:
    pending: list[Record] = []
    queued = 0  # records ever put in pending
    appended = 0  # of those, how many are in the log (in order)
    failure: list[BaseException] = []
    wake = asyncio.Event()
    stop = asyncio.Event()
    progress = asyncio.Condition()
    handlers: set[asyncio.Task[None]] = set()

    def send(conn: asyncio.StreamWriter, text: str) -> None:
        if not conn.is_closing():
            conn.write(text.encode() + b"\n")

    async def handle(reader: asyncio.StreamReader, conn: asyncio.StreamWriter) -> None:
        nonlocal queued
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        result = IngestResult()
        number = 0
        try:
            while True:
                line, oversize = await _read_line(reader)
                if line is None:
                    break
                number += 1
                why: str | None
                if oversize:
                    record, why = None, _too_long(oversize)
                else:
                    record, why = _record(line, key_field)
                if why is not None:
                    problem = LineProblem(number, why, appended=record is not None)
                    if result.add(problem):
                        send(conn, problem.to_json())
                if record is not None:
                    pending.append(record)
                    queued += 1
                    result.appended += 1
                    if len(pending) >= APPEND_BATCH:
                        wake.set()
            # The sender finished (EOF): answer once its lines are in the log.
            target = queued
            wake.set()
            async with progress:
                await progress.wait_for(lambda: appended >= target or bool(failure))
            summary: dict[str, object] = {
                "done": not failure,
                "appended": result.appended,
                "rejected": result.rejected,
                "refused": result.refused,
            }
            if failure:
                summary["error"] = f"appending to the topic failed: {failure[0]}"
            send(conn, json.dumps(summary))
            await conn.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the sender went away, or the server is stopping: what was read is queued
        finally:
            handlers.discard(task)
            conn.close()

    async def flush() -> None:
        nonlocal appended
        if not pending or failure:
            return
        batch = pending[:]
        del pending[:]
        try:
            writer.append(batch)
        except Exception as exc:  # the store failed, not a line: stop rather than go on
            failure.append(exc)
            stop.set()
        else:
            appended += len(batch)
        async with progress:
            progress.notify_all()

    async def flusher() -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(wake.wait(), FLUSH_INTERVAL_S)
            except TimeoutError:
                pass
            wake.clear()
            await flush()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # The reader's limit is one line: a longer one raises LimitOverrunError and is skipped.
    server = await asyncio.start_server(handle, host, port, limit=MAX_LINE_BYTES + 1)
    on_ready(server.sockets[0].getsockname()[1])
    flush_task = asyncio.create_task(flusher())
    await stop.wait()
    server.close()
    await flush_task
    for task in list(handlers):  # stop reading; every line already read is in `pending`
        task.cancel()
    await asyncio.gather(*handlers, return_exceptions=True)
    await flush()
    if failure:
        raise LogError(
            f"srt log serve stopped: appending to topic {writer.info.name!r} failed "
            f"({failure[0]}); lines read after the last successful append were not "
            f"appended and their connections were closed without a summary"
        )


def serve_lines(
    writer: TopicWriter,
    *,
    host: str = "127.0.0.1",
    port: int = 9000,
    key_field: str | None = None,
    on_ready: Callable[[int], None] = lambda port: None,
) -> None:
    """Accept line-protocol connections (``nc HOST PORT``) until SIGINT/SIGTERM.

    Answers on each connection, one JSON line each: ``{"line": n, "error": ..., "appended":
    true|false}`` for a rejected or refused line (as soon as it is read; the first
    MAX_REPORTED per connection), and, once the sender closes its side (``nc -N``) and every
    line it sent is in the log, ``{"done": true, "appended": a, "rejected": r, "refused": f}``.
    A line over MAX_LINE_BYTES is refused alone; the connection's other lines are kept.
    """
    asyncio.run(_serve(writer, host, port, key_field, on_ready))
