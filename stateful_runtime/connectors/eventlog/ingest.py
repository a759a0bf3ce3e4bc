"""Line-protocol ingestion into a topic: from a stream (stdin) or from a TCP listener.

Each line is one record, appended byte for byte (without its ``\\n`` / ``\\r\\n``); a blank
line is appended as an empty record, which the job's decoder dead-letters ("empty record"), so
every line the sender sent is accounted for.
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

Exactly once across failures (Kafka's idempotent producer): an input has a producer id (``srt log
append``: ``--producer-id``, by default derived from the input file's identity, see
:func:`default_producer_id`; ``srt log serve``: a connection's ``@producer ID`` first line) and
its line number is the sequence. Each WriteBatch stores the producer's last handled line with
its records, atomically; a retry of the same input skips the lines at or before it (counted as
``skipped``) and resumes after it. A store that refuses a write (a full disk) stops the input
with :class:`~stateful_runtime.exceptions.AppendIncompleteError`: what went in and the line to
resume from.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import io
import json
import os
import signal
import stat
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from stateful_runtime.connectors.eventlog.store import EventLog, Record, TopicKey, TopicWriter
from stateful_runtime.contract import AppendReport
from stateful_runtime.exceptions import AppendIncompleteError, LogError, LogWriteError

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
# A blank line's reason (the job's decoder says "empty record" for it).
BLANK = "empty line"
# A `srt log serve` connection's optional first line: "@producer ID [FIRST_LINE]".
PRODUCER_HEADER = b"@producer "


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
    rejected: int = 0  # appended without a key (or blank): the job dead-letters them
    refused: int = 0  # not appended
    problems: list[LineProblem] = field(default_factory=list)  # the first MAX_REPORTED
    lines: int = 0  # lines read
    skipped: int = 0  # at or before the producer's stored sequence: already in the topic
    acked: int = 0  # the last line known to be in the topic (handled, for a refused one)
    producer_id: str | None = None

    def report(self, writer: TopicWriter, *, complete: bool = True) -> AppendReport:
        return AppendReport(
            topic=writer.info.name,
            producer_id=self.producer_id,
            lines_read=self.lines,
            appended=self.appended,
            skipped=self.skipped,
            dead_lettered=self.rejected,
            refused=self.refused,
            resume_line=self.acked + 1,
            complete=complete,
            end_offsets=writer.end_offsets(),
        )

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

    (None, reason) for a refused one; a blank line is an empty record without a key.
    """
    if not line:
        return Record(b""), BLANK
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


def key_topic(writer: TopicWriter, key_field: str | None, first: bytes | None = None) -> None:
    """Check an append keyed by ``key_field`` against the topic's key (a keyed topic takes
    appends keyed by its field only), and key a topic that holds no record by it: its values'
    type from ``first``, the first line (a string or an int; other values leave the topic
    unkeyed). See ``store.py``, "Keyed topics"."""
    topic_key = writer.info.key
    if topic_key is not None:
        if key_field != topic_key.field:
            raise LogError(
                f"topic {writer.info.name!r} is keyed by field {topic_key.field!r}: its records "
                f"are placed by that field's key groups, so every append gives "
                f"--key-field {topic_key.field}"
            )
        return
    if key_field is None or first is None or any(writer.end_offsets().values()):
        return
    obj, _ = _judge()(first)
    value = None if obj is None else obj.get(key_field)
    if isinstance(value, str):
        writer.key_by(TopicKey(key_field, "str"))
    elif isinstance(value, int) and not isinstance(value, bool):
        writer.key_by(TopicKey(key_field, "int"))


def _records(lines: Iterable[bytes], key_field: str | None) -> list[Record]:
    """Records of the lines, keyed where possible (test and benchmark helper)."""
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


def default_producer_id(stream: BinaryIO) -> str | None:
    """The producer id of an input that is a regular file (``srt log append ... < FILE``): its
    device, inode, the position it is read from and a digest of its first line from there. The
    natural retry of the same command reads the same file and gets the same id, so it skips what
    went in; a file rewritten with other content (another first line) gets a new id. None for a
    pipe or terminal, which has no identity: give ``--producer-id``."""
    try:
        fd = stream.fileno()
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        pos = os.lseek(fd, 0, os.SEEK_CUR)
        head = os.pread(fd, MAX_LINE_BYTES + 2, pos)
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    digest = hashlib.sha256(head.split(b"\n", 1)[0]).hexdigest()[:16]
    return f"file-{info.st_dev}-{info.st_ino}-{pos}-{digest}"


def ingest_stream(
    writer: TopicWriter,
    stream: BinaryIO,
    key_field: str | None,
    producer_id: str | None = None,
    batch_size: int = APPEND_BATCH,
) -> IngestResult:
    """Append every line of ``stream`` (one WriteBatch per APPEND_BATCH records).

    With ``producer_id``, each WriteBatch also stores the last line it covers as the producer's
    sequence, and lines at or before the stored sequence are skipped (an earlier attempt put
    them in). Raises :class:`AppendIncompleteError` if the store refuses a write: lines up to
    ``resume_line - 1`` are in, none after (the refused batch is not acknowledged).
    """
    result = IngestResult(producer_id=producer_id)
    done = (writer.producer_sequence(producer_id) or 0) if producer_id is not None else 0
    result.acked = done
    batch: list[Record] = []
    batch_rejected = 0  # rejected lines in `batch`, counted once it is in

    def flush(upto: int) -> None:
        nonlocal batch, batch_rejected
        try:
            if producer_id is None:
                result.appended += writer.append(batch)
            else:
                result.appended += writer.append(batch, producer_id=producer_id, sequence=upto)
        except LogWriteError as exc:
            result.rejected -= batch_rejected
            raise _incomplete(writer, result, upto, exc) from None
        result.acked = upto
        batch, batch_rejected = [], 0

    number = 0
    for number, (line, oversize) in enumerate(_stream_lines(stream), 1):
        result.lines = number
        if number <= done:
            result.skipped += 1
            continue
        why: str | None
        if oversize:
            record, why = None, _too_long(oversize)
        else:
            if not result.appended and not batch:  # the append's first line
                key_topic(writer, key_field, line)
            record, why = _record(line, key_field)
        if why is not None:
            result.add(LineProblem(number, why, appended=record is not None))
            batch_rejected += record is not None
        if record is not None:
            batch.append(record)
            if len(batch) >= batch_size:
                flush(number)
    if number > result.acked:  # the last records, or refused lines after the last batch
        flush(number)
    return result


def _incomplete(
    writer: TopicWriter, result: IngestResult, stopped_at: int, exc: LogWriteError
) -> AppendIncompleteError:
    """The error of an input the store stopped taking: what went in, where to resume, what to
    do."""
    first = result.acked + 1
    fix = "Free space on that disk" if exc.disk_full else "Fix the disk"
    name = writer.info.name
    if result.producer_id is not None:
        retry = (
            f"{fix}, then run the same command again: producer id {result.producer_id!r} "
            f"skips lines 1-{result.acked} and resumes at line {first}."
        )
    else:
        retry = (
            f"{fix}, then append the lines from {first} on (e.g. `tail -n +{first} FILE | srt "
            f"log append {name} ...`). This input had no producer id (not a regular file, no "
            f"--producer-id), so a plain retry would append lines 1-{result.acked} again."
        )
    what = "the disk holding the topic is full" if exc.disk_full else "the store failed"
    return AppendIncompleteError(
        f"append to topic {name!r} stopped while appending lines {first}-{stopped_at}: {what} "
        f"({exc.reason}). "
        f"Lines 1-{result.acked} are in the topic ({result.skipped} from an earlier attempt, "
        f"{result.appended} appended now, {result.rejected} of them to be dead-lettered, "
        f"{result.refused} refused); line {first} and after are not. {retry}",
        topic=name,
        producer_id=result.producer_id,
        lines_read=result.lines,
        appended=result.appended,
        skipped=result.skipped,
        dead_lettered=result.rejected,
        refused=result.refused,
        resume_line=first,
        disk_full=exc.disk_full,
        reason=exc.reason,
    )


def append_stream(
    writer: TopicWriter,
    stream: BinaryIO,
    key_field: str | None,
    report: Callable[[str], None] | None = None,
    producer_id: str | None = None,
) -> AppendReport:
    """``srt log append``: append every line of ``stream``; returns what went in.

    Rejected and refused lines are reported through ``report`` (stderr by default), one line
    each and a count. Raises :class:`LogError` after appending everything else if any line was
    refused, so the command exits nonzero; :class:`AppendIncompleteError` if the store stopped
    taking lines.
    """
    if report is None:

        def report(text: str) -> None:
            print(text, file=sys.stderr)

    result = ingest_stream(writer, stream, key_field, producer_id)
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
    return result.report(writer)


def append_input(
    log: EventLog,
    topic: str,
    stream: BinaryIO,
    key_field: str | None,
    *,
    producer_id: str | None = None,
    fsync: bool = False,
    report: Callable[[str], None] | None = None,
) -> AppendReport:
    """``srt log append`` from opening the topic to closing it: :func:`append_stream` with the
    producer id given or :func:`default_producer_id`. A close that fails after every line went
    in (RocksDB flushing on a full disk) is :class:`AppendIncompleteError` with
    ``resume_line`` past the input: the records are in the store's log; a retry appends
    nothing."""
    if producer_id is None:
        producer_id = default_producer_id(stream)
    writer = log.writer(topic, fsync=fsync)
    try:
        out = append_stream(writer, stream, key_field, report, producer_id)
    except BaseException:
        writer.close()  # quiet after a failed write: the write's error is the one to tell
        raise
    try:
        writer.close()
    except LogWriteError as exc:
        retry = (
            f"running the same command again appends nothing (producer id {producer_id!r})"
            if producer_id is not None
            else "do not append this input again (it has no producer id, so it would be "
            "appended twice)"
        )
        raise AppendIncompleteError(
            f"every line is in topic {topic!r} ({out.lines_read} lines read, {out.appended} "
            f"appended, {out.skipped} skipped as already there), but closing the store failed: "
            f"{exc.reason}. Free space on the disk holding the topic; {retry}.",
            topic=topic,
            producer_id=producer_id,
            lines_read=out.lines_read,
            appended=out.appended,
            skipped=out.skipped,
            dead_lettered=out.dead_lettered,
            refused=out.refused,
            resume_line=out.resume_line,
            disk_full=exc.disk_full,
            reason=exc.reason,
        ) from None
    return out


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


@dataclass(eq=False)
class _Connection:
    """A ``srt log serve`` connection's progress: lines handled (queued or skipped) and the
    last line known to be in the topic."""

    producer_id: str | None = None
    queued: int = 0
    acked: int = 0


def _producer_header(line: bytes) -> tuple[str, int | None] | str:
    """``@producer ID [FIRST_LINE]`` → (id, first line or None), or why it is not valid."""
    parts = line[len(PRODUCER_HEADER) :].decode(errors="replace").split()
    if len(parts) not in (1, 2) or not parts[0].isprintable():
        return "expected '@producer ID' or '@producer ID FIRST_LINE'"
    if len(parts) == 2:
        if not parts[1].isdigit() or int(parts[1]) < 1:
            return f"first line must be a positive integer, got {parts[1]!r}"
        return parts[0], int(parts[1])
    return parts[0], None


async def _serve(
    writer: TopicWriter,
    host: str,
    port: int,
    key_field: str | None,
    on_ready: Callable[[int], None],
) -> None:
    pending: list[Record] = []
    pending_sequences: dict[str, int] = {}  # producer → last line handled, for the next batch
    sequences: dict[str, int] = {}  # producer → last line handled (queued or in the log)
    producing: set[str] = set()  # producer ids with an open connection
    connections: set[_Connection] = set()
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

    def start_producing(pid: str, first: int | None) -> int | str:
        """The line number before the connection's first line, or why it is refused."""
        if pid in producing:
            return f"producer id {pid!r} is in use by another open connection"
        last = sequences.get(pid)
        if last is None:
            last = sequences[pid] = writer.producer_sequence(pid) or 0
        if first is not None and first > last + 1:
            return (
                f"producer {pid!r} has lines up to {last} in the topic; starting at line "
                f"{first} would leave lines {last + 1}-{first - 1} out: resend from line "
                f"{last + 1} or before"
            )
        producing.add(pid)
        return 0 if first is None else first - 1

    async def handle(reader: asyncio.StreamReader, conn: asyncio.StreamWriter) -> None:
        nonlocal queued
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        result = IngestResult()
        state = _Connection()
        connections.add(state)
        number = 0
        first = True
        try:
            while True:
                line, oversize = await _read_line(reader)
                if line is None:
                    break
                if first and line.startswith(PRODUCER_HEADER) and not oversize:
                    first = False
                    header = _producer_header(line)
                    started = header if isinstance(header, str) else start_producing(*header)
                    if isinstance(started, str):
                        send(conn, json.dumps({"done": False, "error": started}))
                        await conn.drain()
                        return
                    assert not isinstance(header, str)
                    state.producer_id = result.producer_id = header[0]
                    number = state.queued = state.acked = started
                    resume = sequences[header[0]] + 1
                    send(conn, json.dumps({"producer_id": header[0], "resume_line": resume}))
                    continue
                first = False
                number += 1
                result.lines += 1
                pid = state.producer_id
                if pid is not None and number <= sequences[pid]:
                    result.skipped += 1  # in the log, or queued by an earlier connection
                    state.queued = number
                    continue
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
                state.queued = number
                if pid is not None:
                    sequences[pid] = pending_sequences[pid] = number
            # The sender finished (EOF): answer once its lines are in the log.
            target = queued
            wake.set()
            async with progress:
                await progress.wait_for(
                    lambda: (appended >= target and state.acked >= state.queued) or bool(failure)
                )
            summary: dict[str, object] = {
                "done": not failure,
                "appended": result.appended,
                "rejected": result.rejected,
                "refused": result.refused,
                "lines_read": result.lines,
                "skipped": result.skipped,
                "resume_line": state.acked + 1,
            }
            if state.producer_id is not None:
                summary["producer_id"] = state.producer_id
            if failure:
                summary["error"] = f"appending to the topic failed: {failure[0]}"
            send(conn, json.dumps(summary))
            await conn.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass  # the sender went away, or the server is stopping: what was read is queued
        finally:
            handlers.discard(task)
            connections.discard(state)
            if state.producer_id is not None:
                producing.discard(state.producer_id)
            conn.close()

    async def flush() -> None:
        nonlocal appended
        behind = [(c, c.queued) for c in connections if c.acked < c.queued]
        if (not pending and not pending_sequences and not behind) or failure:
            return
        batch = pending[:]
        del pending[:]
        marks = dict(pending_sequences)
        pending_sequences.clear()
        try:
            if not appended and batch:  # the first records key an empty topic
                key_topic(writer, key_field, batch[0].value)
            if marks:
                writer.append_sequenced(batch, marks)
            else:
                writer.append(batch)
        except Exception as exc:  # the store failed, not a line: stop rather than go on
            failure.append(exc)
            stop.set()
        else:
            appended += len(batch)
            for c, mark in behind:
                c.acked = max(c.acked, mark)
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
    A line over MAX_LINE_BYTES is refused alone; the connection's other lines are kept. The
    summary also says ``lines_read``, ``skipped`` and ``resume_line``.

    Idempotent connections: a first line ``@producer ID`` (or ``@producer ID FIRST_LINE``:
    the next line is that line of the sender's input) makes the line numbers the producer's
    sequence, stored with the records. The server answers ``{"producer_id": ID,
    "resume_line": n}`` at once; lines at or before ``n - 1`` are skipped (counted in
    ``skipped``), so a client reconnecting after a failure resends from any line up to ``n``
    and nothing is appended twice. One open connection per producer id.
    """
    key_topic(writer, key_field)  # a keyed topic serves appends keyed by its field only
    asyncio.run(_serve(writer, host, port, key_field, on_ready))
