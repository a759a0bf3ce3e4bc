"""Line-protocol ingestion into a topic: from a stream (stdin) or from a TCP listener.

Each non-empty line is one record, appended byte for byte. The key comes from a JSON field of
the line; a line that is not JSON or lacks the field is still appended (with no key), so that
the job downstream can route it to its dead-letter topic: ingestion never drops input.
"""

from __future__ import annotations

import asyncio
import json
import signal
from collections.abc import Callable, Iterable
from typing import BinaryIO

from stateful_runtime.connectors.eventlog.store import Record, TopicWriter

# One WriteBatch per this many lines: ~330k rec/s measured at 5k per batch, and a batch is the
# unit a crash can lose before it is acknowledged.
APPEND_BATCH = 5_000
# A TCP connection's buffered lines are appended at least this often, even if fewer than a batch.
FLUSH_INTERVAL_S = 0.02


def key_of(line: bytes, key_field: str | None) -> bytes | None:
    if key_field is None:
        return None
    try:
        value = json.loads(line)[key_field]
    except (ValueError, TypeError, KeyError, IndexError):
        return None
    if value is None:
        return None
    return (value if isinstance(value, str) else json.dumps(value)).encode()


def _records(lines: Iterable[bytes], key_field: str | None) -> list[Record]:
    out = []
    for raw in lines:
        line = raw.rstrip(b"\r\n")
        if line:
            out.append(Record(line, key_of(line, key_field)))
    return out


def append_stream(writer: TopicWriter, stream: BinaryIO, key_field: str | None) -> int:
    """Append every line of ``stream``; returns the number of records appended."""
    total = 0
    chunk: list[bytes] = []
    for line in stream:
        chunk.append(line)
        if len(chunk) >= APPEND_BATCH:
            total += writer.append(_records(chunk, key_field))
            chunk = []
    if chunk:
        total += writer.append(_records(chunk, key_field))
    return total


async def _serve(
    writer: TopicWriter,
    host: str,
    port: int,
    key_field: str | None,
    on_ready: Callable[[int], None],
) -> None:
    pending: list[bytes] = []
    wake = asyncio.Event()
    stop = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, conn: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                pending.append(line)
                if len(pending) >= APPEND_BATCH:
                    wake.set()
        finally:
            wake.set()
            conn.close()

    async def flusher() -> None:
        while not stop.is_set():
            try:
                await asyncio.wait_for(wake.wait(), FLUSH_INTERVAL_S)
            except TimeoutError:
                pass
            wake.clear()
            if pending:
                batch = pending[:]
                del pending[:]
                writer.append(_records(batch, key_field))

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    server = await asyncio.start_server(handle, host, port, limit=1 << 20)
    on_ready(server.sockets[0].getsockname()[1])
    flush_task = asyncio.create_task(flusher())
    async with server:
        await stop.wait()
    server.close()
    await flush_task
    if pending:
        writer.append(_records(pending, key_field))


def serve_lines(
    writer: TopicWriter,
    *,
    host: str = "127.0.0.1",
    port: int = 9000,
    key_field: str | None = None,
    on_ready: Callable[[int], None] = lambda port: None,
) -> None:
    """Accept line-protocol connections (``nc HOST PORT``) until SIGINT/SIGTERM."""
    asyncio.run(_serve(writer, host, port, key_field, on_ready))
