"""Sinks into the embedded event log: results as JSON records, and dead letters."""

from __future__ import annotations

import json

import pyarrow as pa

from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW, Sink, SinkSummary
from stateful_runtime.connectors.eventlog import EventLog, Record, TopicWriter, cached_reader
from stateful_runtime.exceptions import TopicNotFoundError


class LogSink(Sink):
    """Appends each output row as a JSON record to a topic of the embedded log.

    Exactly-once: every batch is one atomic append carrying the producer id ``job/query`` and the
    batch id as its sequence, so a re-executed batch appends nothing.

    Args:
        log_dir: the event log directory.
        topic: the output topic; created with ``partitions`` partitions if missing.
        key_field: output column whose value keys the record (partitioning), or None.
        partitions: partition count used when the topic has to be created.
    """

    def __init__(
        self, log_dir: str, topic: str, *, key_field: str | None = None, partitions: int = 1
    ) -> None:
        self.log_dir, self.topic, self.key_field, self.partitions = (
            log_dir, topic, key_field, partitions,
        )
        self._writer: TopicWriter | None = None
        self._producer = ""

    def default_name(self) -> str:
        return f"log-{self.topic}"

    def describe(self) -> str:
        return f"event log topic {self.topic!r} in {self.log_dir} (exactly-once appends)"

    def open(self, job: str, query: str) -> None:
        log = EventLog(self.log_dir)
        log.create_topic(self.topic, self.partitions, exist_ok=True)
        self._writer = log.writer(self.topic)
        self._producer = f"{job}/{query}"

    def _records(self, batch: pa.Table) -> list[Record]:
        out = []
        for row in batch.to_pylist():
            key = row.get(self.key_field) if self.key_field else None
            value = json.dumps(row, default=str, separators=(",", ":")).encode()
            out.append(Record(value, None if key is None else str(key).encode()))
        return out

    def write_batch(self, batch: pa.Table, batch_id: int) -> None:
        assert self._writer is not None, "LogSink.write_batch before open"
        self._writer.append(
            self._records(batch), producer_id=self._producer, sequence=batch_id
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def summary(self) -> SinkSummary | None:
        ends = EventLog(self.log_dir).reader(self.topic).end_offsets()
        return SinkSummary(
            f"topic {self.topic}", ["partition", "end offset"], sorted(ends.items())
        )


class DeadLetterSink:
    """Rejected input records, byte for byte, with the reason and origin in headers.

    Headers: ``error`` (why it was rejected), ``source.topic``, ``source.partition``,
    ``source.offset`` and ``job``. The record keeps its source partition when the dead-letter
    topic has as many partitions as the source. Written split by split (see
    :mod:`stateful_runtime.connectors.dead_letters`), each source partition an idempotent producer.
    """

    def __init__(self, log_dir: str, topic: str, *, source_topic: str, job: str) -> None:
        self.log_dir, self.topic, self.source_topic, self.job = log_dir, topic, source_topic, job

    def describe(self) -> str:
        return f"dead-letter topic {self.topic!r} in {self.log_dir}"

    def writer(self) -> TopicWriter:
        """The dead-letter topic's writer (created with the source's partition count)."""
        log = EventLog(self.log_dir)
        log.create_topic(self.topic, log.topic(self.source_topic).partitions, exist_ok=True)
        return log.writer(self.topic)

    def write_split(self, writer: TopicWriter, table: pa.Table, partition: int, start: int
                    ) -> int:
        """Append one split's rejected records; a split already appended appends nothing."""
        records = [
            Record(
                row[RAW] or b"",
                headers={"error": row[ERROR], "source.topic": self.source_topic,
                         "source.partition": str(row[PARTITION]),
                         "source.offset": str(row[OFFSET]), "job": self.job},
                partition=row[PARTITION],
            )
            for row in table.to_pylist()
        ]
        return writer.append(records, producer_id=f"{self.job}/{self.source_topic}/"
                             f"p{partition}", sequence=start)

    def summary(self) -> SinkSummary | None:
        return SinkSummary(f"dead letters: {self.records():,} in topic {self.topic}", [])

    def records(self) -> int:
        """How many dead letters the topic holds."""
        try:  # the cached reader: this runs for every progress line
            return sum(cached_reader(self.log_dir, self.topic).end_offsets().values())
        except TopicNotFoundError:  # no dead letter yet
            return 0
