"""Sink into the embedded event log: results as JSON records, exactly once."""

from __future__ import annotations

import pyarrow as pa

from stateful_runtime.connectors.base import Sink, SinkSummary
from stateful_runtime.connectors.eventlog.store import EventLog, TopicWriter
from stateful_runtime.connectors.formats.json import encode_records
from stateful_runtime.exceptions import ConfigError


class LogSink(Sink):
    """Appends each output row as a JSON record to a topic of the embedded log.

    Exactly-once: every batch is one atomic append carrying the producer id ``job/query`` and the
    batch id as its sequence, so a re-executed batch appends nothing.

    Args:
        log_dir: the event log directory.
        topic: the output topic; created with ``partitions`` partitions if missing.
        key_field: output column whose value keys the record (partitioning), or None; a
            topic keyed by a field (``srt log append --key-field``) takes only that field, and
            places each record by its key group.
        partitions: partition count used when the topic has to be created.
    """

    def __init__(
        self, log_dir: str, topic: str, *, key_field: str | None = None, partitions: int = 1
    ) -> None:
        self.log_dir, self.topic, self.key_field, self.partitions = (
            log_dir,
            topic,
            key_field,
            partitions,
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
        writer = log.writer(self.topic)
        placed_by = writer.info.key
        if placed_by is not None and self.key_field != placed_by.field:
            writer.close()
            raise ConfigError(
                f"topic {self.topic!r} in {self.log_dir} is keyed by field {placed_by.field!r} "
                f"(each record in the partition owning its key group), and this sink keys "
                f"its records by {self.key_field or 'nothing'}: give "
                f"LogSink(..., key_field={placed_by.field!r}), or write to another topic"
            )
        self._writer = writer
        self._producer = f"{job}/{query}"

    def check_schema(self, schema: pa.Schema) -> None:
        if self.key_field is not None and self.key_field not in schema.names:
            raise ConfigError(
                f"LogSink of topic {self.topic!r}: key_field {self.key_field!r} is not a column "
                f"of the stream's output ({', '.join(schema.names)}); name one of them, or "
                f"key_field=None"
            )

    def _keys(self, batch: pa.Table) -> list[bytes | None]:
        names = batch.column_names
        if not self.key_field:
            return [None] * batch.num_rows
        column = batch.column(len(names) - 1 - names[::-1].index(self.key_field))
        return [None if key is None else str(key).encode() for key in column.to_pylist()]

    def write_batch(self, batch: pa.Table, batch_id: int) -> None:
        assert self._writer is not None, "LogSink.write_batch before open"
        self._writer.append_values(
            encode_records(batch), self._keys(batch), producer_id=self._producer, sequence=batch_id
        )

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def summary(self) -> SinkSummary | None:
        ends = EventLog(self.log_dir).reader(self.topic).end_offsets()
        return SinkSummary(f"topic {self.topic}", ["partition", "end offset"], sorted(ends.items()))
