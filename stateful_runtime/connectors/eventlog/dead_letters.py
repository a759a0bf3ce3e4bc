"""Event-log dead letters: rejected records appended to a topic, once, after their batch commits.

Staging and the publish protocol are :mod:`stateful_runtime.connectors.dead_letters`; this is
the event log's side of its :class:`~stateful_runtime.connectors.base.DeadLetterSink` contract.
"""

from __future__ import annotations

import pyarrow as pa

from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW, SinkSummary
from stateful_runtime.connectors.dead_letters import STEP
from stateful_runtime.connectors.eventlog.store import (
    EventLog,
    Record,
    TopicWriter,
    cached_reader,
)
from stateful_runtime.exceptions import TopicNotFoundError


def _headers(row: dict, topic: str, job: str) -> dict[str, str]:
    """A dead letter's headers; a step's reject (:data:`STEP`) also names its step, and its
    source partition and offset are empty where no single record was to blame."""
    headers = {
        "error": row[ERROR],
        "source.topic": topic,
        "source.partition": "" if row[PARTITION] is None else str(row[PARTITION]),
        "source.offset": "" if row[OFFSET] is None else str(row[OFFSET]),
        "job": job,
    }
    if row.get(STEP) is not None:
        headers["step"] = row[STEP]
    return headers


class EventLogDeadLetterSink:
    """Rejected input records, byte for byte, with the reason and origin in headers.

    Headers: ``error`` (why it was rejected), ``source.topic``, ``source.partition``,
    ``source.offset`` and ``job``; a record a step rejected also ``step``. The record keeps
    its source partition when the dead-letter topic has as many partitions as the source.
    Written split by split (see :mod:`stateful_runtime.connectors.dead_letters`), each source
    partition an idempotent producer.
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

    def _producer(self, partition: int | str) -> str:
        return f"{self.job}/{self.source_topic}/p{partition}"

    def published(self, writer: TopicWriter, partition: int | str) -> int:
        """The producer's sequence is the end of the last split it appended."""
        return writer.producer_sequence(self._producer(partition)) or 0

    def write_split(
        self, writer: TopicWriter, table: pa.Table, partition: int | str, end: int
    ) -> int:
        """Append rejected records and move the partition's mark to ``end`` in one write (a
        step's rejects: ``partition`` is ``<partition>@<step>``, and ``step`` a header)."""
        records = [
            Record(
                row[RAW] or b"",
                headers=_headers(row, self.source_topic, self.job),
                partition=-1 if row[PARTITION] is None else row[PARTITION],
            )
            for row in table.to_pylist()
        ]
        return writer.append(records, producer_id=self._producer(partition), sequence=end)

    def published_offsets(self, partition: int | str, start: int, end: int) -> set[int]:
        """Read from the topic's headers (every partition: the topic may have fewer)."""
        log = EventLog(self.log_dir)
        if self.topic not in {t.name for t in log.topics()}:
            return set()
        reader = log.reader(self.topic)
        try:
            out = set()
            for p, stop in reader.end_offsets().items():
                for r in reader.read(p, 0, stop):
                    h = r.headers
                    if (
                        h.get("job") == self.job
                        and h.get("source.topic") == self.source_topic
                        and h.get("source.partition") == str(partition)
                        and start <= int(h.get("source.offset", -1)) < end
                    ):
                        out.add(int(h["source.offset"]))
            return out
        finally:
            reader.close()

    def summary(self) -> SinkSummary | None:
        return SinkSummary(f"dead letters: {self.records():,} in topic {self.topic}", [])

    def records(self) -> int:
        """How many dead letters the topic holds."""
        try:  # the cached reader: this runs for every progress line
            return sum(cached_reader(self.log_dir, self.topic).end_offsets().values())
        except TopicNotFoundError:  # no dead letter yet
            return 0
