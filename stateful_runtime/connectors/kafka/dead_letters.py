"""Kafka dead letters: rejected records published to a topic, once, after their batch commits.

Staging and the publish protocol are :mod:`stateful_runtime.connectors.dead_letters`; this is
the Kafka side of its :class:`~stateful_runtime.connectors.base.DeadLetterSink` contract.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW, SinkSummary
from stateful_runtime.connectors.dead_letters import NO_ORIGIN, STEP
from stateful_runtime.connectors.kafka.client import (
    LEADER_WAIT_S,
    METADATA_TIMEOUT_S,
    CommitMarkers,
    check_cluster,
    ensure_topic,
    produce,
    quiet,
    watermark_offsets,
)


class KafkaDeadLetterSink:
    """Rejected input records, byte for byte, on a Kafka topic, with the reason in headers.

    Headers: ``error``, ``source.topic``, ``source.partition``, ``source.offset``, ``job``;
    a record a step rejected also ``step``.
    Record ``p`` of a source partition goes to dead-letter partition ``p % partitions`` (the
    topic is created with the source's partition count). One publish (every staged split of the
    committed batches) is one transaction with producer id ``<job>.<source>.dlq`` that also
    records, per source partition, how far it has published (the end of the last split), so
    crashes between publishing and removing the staged files, and batches planned again with
    other boundaries, duplicate nothing.
    """

    def __init__(
        self,
        config: Mapping[str, Any],
        topic: str,
        *,
        source: str,
        job: str,
        source_topics: Sequence[str] = (),
        source_pattern: str | None = None,
    ) -> None:
        self.config = dict(config)
        self.topic = topic
        self.source_topic = source
        self.job = job
        self.source_topics = list(source_topics)
        self.source_pattern = source_pattern
        self.producer_id = f"{job}.{source}.dlq"
        self._markers = CommitMarkers(self.config, topic)
        self._count: int | None = None

    def describe(self) -> str:
        return f"Kafka dead-letter topic {self.topic!r} on {self.config['bootstrap.servers']}"

    def writer(self) -> _DeadLetterTxn:
        return _DeadLetterTxn(self)

    def published(self, writer: _DeadLetterTxn, key: str | int) -> int:
        return writer.published.get(str(key), 0)

    def write_split(self, writer: _DeadLetterTxn, table: pa.Table, key: str | int, end: int) -> int:
        return writer.write_split(table, str(key), end)

    def published_offsets(self, partition: int | str, start: int, end: int) -> set[int]:
        """Read from the topic's headers, committed records only, every partition."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        topic, p = str(partition).rsplit(":", 1)
        consumer = Consumer(
            quiet(
                {
                    **self.config,
                    "group.id": "srt-dead-letter-replay",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                }
            )
        )
        try:
            meta = consumer.list_topics(self.topic, timeout=METADATA_TIMEOUT_S)
            parts = list(meta.topics[self.topic].partitions) if self.topic in meta.topics else []
            todo = set()
            for dp in parts:
                low, high = watermark_offsets(consumer, TopicPartition(self.topic, dp))
                if high > low:
                    todo.add(dp)
            consumer.assign([TopicPartition(self.topic, dp, 0) for dp in todo])
            out: set[int] = set()
            # consume(n, timeout) returns only once it holds n messages or the timeout passed,
            # so it is asked briefly and often: the loop ends at each partition's end, not at a
            # timeout's (a rewind waited 10 s per call on a topic of a few records).
            stalled = time.monotonic() + METADATA_TIMEOUT_S
            while todo:
                got = consumer.consume(1000, 0.1)
                if got:
                    stalled = time.monotonic() + METADATA_TIMEOUT_S
                elif time.monotonic() > stalled:
                    raise RuntimeError(
                        f"reading dead-letter topic {self.topic}: partitions {sorted(todo)} "
                        f"gave nothing for {METADATA_TIMEOUT_S:.0f} s; check that the "
                        f"cluster is up, then run the rewind again (nothing was rewound)"
                    )
                for m in got:
                    err = m.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            todo.discard(m.partition())
                            continue
                        raise RuntimeError(f"reading dead-letter topic {self.topic}: {err}")
                    h = {
                        str(kv[0]): kv[1].decode() if isinstance(kv[1], bytes) else str(kv[1])
                        for kv in list(m.headers() or [])
                    }
                    if (
                        h.get("job") == self.job
                        and h.get("source.topic") == topic
                        and h.get("source.partition") == p
                        and start <= int(h.get("source.offset") or -1) < end
                    ):
                        out.add(int(h["source.offset"]))
            return out
        finally:
            consumer.close()

    def records(self) -> int:
        """Dead letters published so far (from the control topic's marker, then counted)."""
        if self._count is None:
            try:
                marker = self._markers.read().get(self.producer_id, {})
            except Exception:  # noqa: BLE001 - no topic yet, or broker away: show 0
                return 0
            self._count = int(marker.get("count", 0))
        return self._count

    def summary(self) -> SinkSummary | None:
        return SinkSummary(f"dead letters: {self.records():,} in topic {self.topic}", [])


class _DeadLetterTxn:
    def __init__(self, sink: KafkaDeadLetterSink) -> None:
        from confluent_kafka import Producer

        self.sink = sink
        # (the job is running: a cluster out of reach, a broker restarting, is waited for)
        counts = check_cluster(
            sink.config, sink.source_topics or None, sink.source_pattern, wait_s=LEADER_WAIT_S
        )
        self._parts = ensure_topic(sink.config, sink.topic, max(counts.values(), default=1))
        sink._markers.ensure()
        self.producer = Producer(
            quiet({**sink.config, "transactional.id": sink.producer_id, "linger.ms": 20})
        )
        self.producer.init_transactions(METADATA_TIMEOUT_S * 3)
        marker = sink._markers.read().get(sink.producer_id, {})
        self.published: dict[str, int] = dict(marker.get("published", {}))
        self.count = int(marker.get("count", 0))
        self.producer.begin_transaction()

    def write_split(self, table: pa.Table, key: str, end: int) -> int:
        # A step's reject: ``<topic>:<partition>@<step>`` ("-@<step>": no single origin).
        topic = key.split("@", 1)[0].rsplit(":", 1)[0]
        topic = self.sink.source_topic if topic == NO_ORIGIN else topic
        n = 0
        for row in table.to_pylist():
            part, offset = row[PARTITION], row[OFFSET]
            headers = [
                ("error", (row[ERROR] or "").encode()),
                ("source.topic", topic.encode()),
                ("source.partition", ("" if part is None else str(part)).encode()),
                ("source.offset", ("" if offset is None else str(offset)).encode()),
                ("job", self.sink.job.encode()),
            ]
            if row.get(STEP) is not None:
                headers.append(("step", row[STEP].encode()))
            produce(
                self.producer,
                self.sink.topic,
                value=row[RAW] or b"",
                partition=(part or 0) % self._parts,
                headers=headers,
            )
            n += 1
        self.published[key] = max(end, self.published.get(key, 0))
        self.count += n
        return n

    def __enter__(self) -> _DeadLetterTxn:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None:
            self.producer.abort_transaction(METADATA_TIMEOUT_S)
            return
        mkey, mvalue = self.sink._markers.record(
            self.sink.producer_id, {"published": self.published, "count": self.count}
        )
        produce(self.producer, self.sink._markers.topic, key=mkey, value=mvalue, partition=0)
        self.producer.commit_transaction(METADATA_TIMEOUT_S * 6)
        self.sink._count = self.count
