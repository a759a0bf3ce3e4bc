"""Kafka sinks on confluent-kafka: job output (transactional or at-least-once) and dead letters.

Exactly-once (the default) is Flink's two-phase commit bound to Spark's batch commit:

* ``open``: one transactional producer per output shard, ``transactional.id =
  "<job>.<sink>.<n>"`` (stable across restarts). ``init_transactions`` fences any older
  instance with the same id (a zombie driver) and aborts the transaction it left open. Then the
  sink reads the control topic ``<topic>.srt-commits`` (read_committed) for the last batch each
  producer committed.
* ``write_batch(rows, N)``: per producer, if N ≤ its last committed batch, nothing is written
  (a batch re-executed after a crash between the Kafka commit and Spark's ``commits/N``).
  Else: begin, produce the rows, produce the marker ``{txn id: {"batch": N}}`` to the control
  topic, commit. Data and marker are one transaction: both visible to read_committed, or neither.
* Spark writes ``commits/N`` only after ``write_batch`` returned.

At-least-once (``delivery="at_least_once"``): an idempotent producer, flushed per batch; a batch
replayed after a crash is written again.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from stateful_runtime.connectors.base import Sink, SinkSummary
from stateful_runtime.connectors.formats.json import encode_records
from stateful_runtime.connectors.kafka import client as kafka_client
from stateful_runtime.connectors.kafka.client import (
    METADATA_TIMEOUT_S,
    CommitMarkers,
    ensure_topic,
    produce,
    quiet,
)
from stateful_runtime.exceptions import ConfigError, SinkError
from stateful_runtime.masking import mask_config

DELIVERY = ("exactly_once", "at_least_once")
# Test hook: after committing a batch's transaction the sink touches
# $SRT_TEST_KAFKA_AFTER_COMMIT/committed-<batch> and blocks, so a test can kill -9 the job
# exactly between the Kafka commit and Spark's batch commit.
AFTER_COMMIT_HOOK = "SRT_TEST_KAFKA_AFTER_COMMIT"
BATCH_HEADER = "srt.batch"


def _partition_for(key: bytes | None, i: int, partitions: int) -> int:
    """librdkafka's "consistent" partitioner (CRC32 of the key); keyless rows round-robin."""
    if key is None:
        return i % partitions
    return zlib.crc32(key) % partitions


def _fail(what: str, exc: BaseException, job: str, tid: str) -> SinkError:
    err = exc.args[0] if exc.args else None
    code = getattr(err, "code", lambda: None)()
    from confluent_kafka import KafkaError

    if code in (KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH):
        return SinkError(
            f"Kafka sink producer {tid} was fenced: another instance of job {job!r} started "
            f"with the same transactional id. Keep one `srt run` per job (`srt status {job}`); "
            f"this instance stops without committing, nothing is lost"
        )
    return SinkError(
        f"Kafka sink: {what} failed ({exc}); the batch was not committed and "
        f"will be re-executed on restart"
    )


class KafkaSink(Sink):
    """Each output row as a JSON record on a Kafka topic.

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        topic: output topic; created with ``partitions`` partitions if missing.
        key: output columns that key each record (their JSON object is the record key). With a
            key the sink is an upsert sink (a window's row is re-emitted on every update, a
            compacted topic keeps the latest); without, an append-only sink.
        delivery: ``"exactly_once"`` (transactions bound to Spark's batch commit; consumers
            must use ``isolation.level=read_committed``) or ``"at_least_once"``.
        producers: transactional producers (one transaction each per batch); output partition
            ``p`` goes through producer ``p % producers``.
        partitions: partition count if the sink creates the topic.
        client_config: extra librdkafka settings (``security.protocol``, ``sasl.*``, ``ssl.*``,
            ``compression.type``...); secrets never appear in logs or ``explain()``.
        transaction_timeout_ms: broker aborts a transaction left open this long (zombie).
    """

    kind = "kafka"
    config_keys = ("sink.kafka_topic", "sink.bootstrap_servers", "sink.delivery")
    location_key = "sink.kafka_topic"

    def __init__(
        self,
        bootstrap_servers: str,
        topic: str,
        *,
        key: Sequence[str] = (),
        delivery: str = "exactly_once",
        producers: int = 1,
        partitions: int = 1,
        client_config: Mapping[str, Any] | None = None,
        transaction_timeout_ms: int = 60_000,
    ) -> None:
        if delivery not in DELIVERY:
            raise ConfigError(f"delivery must be one of {DELIVERY}, got {delivery!r}")
        if producers < 1 or partitions < 1:
            raise ConfigError("producers and partitions must be >= 1")
        self.config = kafka_client.client_config(bootstrap_servers, client_config)
        self.topic = topic
        self.key_columns = tuple(key)
        self.upsert = bool(self.key_columns)
        self.delivery = delivery
        self.producers = producers
        self.partitions = partitions
        self.transaction_timeout_ms = transaction_timeout_ms
        self._producers: list[Any] = []
        self._ids: list[str] = []
        self._last: dict[str, int] = {}
        self._parts = partitions
        self._markers = CommitMarkers(self.config, topic)
        self._job = ""

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, key: Sequence[str] = (), summary_sql: str | None = None
    ) -> KafkaSink:
        """A sink from the job-file keys ``sink.kafka_topic``, ``sink.bootstrap_servers``
        (default: ``source.bootstrap_servers``), ``sink.delivery`` and the ``kafka.*`` client
        settings (see :func:`stateful_runtime.connectors.kafka.client.client_settings`).
        ``summary_sql`` is a warehouse's: a topic's summary is its end offsets."""
        servers = config.get("sink.bootstrap_servers") or config.get("source.bootstrap_servers")
        return cls(
            servers or "",
            config["sink.kafka_topic"],
            key=key,
            delivery=config.get("sink.delivery", "exactly_once"),
            client_config=kafka_client.client_settings(config),
        )

    def default_name(self) -> str:
        return f"kafka-{self.topic}"

    def describe(self) -> str:
        mode = (
            "exactly-once: transactions per batch, read with isolation.level=read_committed"
            if self.delivery == "exactly_once"
            else "at-least-once"
        )
        servers = mask_config(self.config)["bootstrap.servers"]
        return f"Kafka topic {self.topic!r} on {servers} ({mode})"

    def open(self, job: str, query: str) -> None:
        from confluent_kafka import KafkaException, Producer

        self._job = job
        try:
            self._parts = ensure_topic(self.config, self.topic, self.partitions)
            if self.delivery == "at_least_once":
                self._producers = [
                    Producer(
                        quiet(
                            {
                                **self.config,
                                "enable.idempotence": True,
                                "acks": "all",
                                "linger.ms": 20,
                            }
                        )
                    )
                ]
                return
            self._markers.ensure()
            self._ids = [f"{job}.{query}.{n}" for n in range(self.producers)]
            self._producers = []
            for tid in self._ids:
                p = Producer(
                    quiet(
                        {
                            **self.config,
                            "transactional.id": tid,
                            "linger.ms": 20,
                            "transaction.timeout.ms": self.transaction_timeout_ms,
                        }
                    )
                )
                # Fences older instances with this id and aborts their open transaction.
                p.init_transactions(METADATA_TIMEOUT_S * 3)
                self._producers.append(p)
            markers = self._markers.read()
        except KafkaException as exc:
            raise SinkError(
                f"Kafka sink {self.topic!r}: cannot open on {self.config['bootstrap.servers']} "
                f"({exc}); check the brokers and security settings"
            ) from None
        self._last = {tid: int(markers[tid]["batch"]) for tid in self._ids if tid in markers}

    def rewind(self, batch_id: int) -> None:
        """A restore from a savepoint at ``batch_id``: batches after it run again and are
        written again (as Flink's sink does after restoring an older savepoint); skipping them
        would lose whatever differs in the re-execution. One marker transaction per id."""
        from confluent_kafka import KafkaException

        if self.delivery == "at_least_once":
            return  # no markers: every execution is written anyway
        for tid, producer in zip(self._ids, self._producers, strict=True):
            if self._last.get(tid, -1) <= batch_id:
                continue
            try:
                producer.begin_transaction()
                mkey, mvalue = self._markers.record(tid, {"batch": batch_id})
                produce(producer, self._markers.topic, key=mkey, value=mvalue, partition=0)
                producer.commit_transaction(METADATA_TIMEOUT_S * 6)
            except KafkaException as exc:
                raise _fail(f"rewind to batch {batch_id}", exc, self._job, tid) from None
            self._last[tid] = batch_id

    def last_committed(self) -> dict[str, int]:
        """Last batch committed per transactional id (read at ``open``)."""
        return dict(self._last)

    def _records(self, batch: pa.Table, batch_id: int) -> list[tuple[int, bytes | None, bytes]]:
        values = encode_records(batch)
        keys: Sequence[bytes | None] = [None] * len(values)
        if self.key_columns:
            keys = encode_records(batch.select(list(self.key_columns)))
        return [
            (_partition_for(key, i, self._parts), key, value)
            for i, (key, value) in enumerate(zip(keys, values, strict=True))
        ]

    def write_batch(self, batch: pa.Table, batch_id: int) -> None:
        from confluent_kafka import KafkaException

        assert self._producers, "KafkaSink.write_batch before open"
        records = self._records(batch, batch_id)
        headers = [(BATCH_HEADER, str(batch_id).encode()), ("srt.job", self._job.encode())]
        if self.delivery == "at_least_once":
            self._write_at_least_once(records, headers)
            return
        for n, (tid, producer) in enumerate(zip(self._ids, self._producers, strict=True)):
            if self._last.get(tid, -1) >= batch_id:
                continue  # committed before a crash: Spark re-executes, we write nothing
            try:
                producer.begin_transaction()
                for part, key, value in records:
                    if part % self.producers == n:
                        produce(
                            producer,
                            self.topic,
                            key=key,
                            value=value,
                            partition=part,
                            headers=headers,
                        )
                mkey, mvalue = self._markers.record(tid, {"batch": batch_id})
                produce(producer, self._markers.topic, key=mkey, value=mvalue, partition=0)
                producer.commit_transaction(METADATA_TIMEOUT_S * 6)
            except KafkaException as exc:
                err = exc.args[0]
                if not err.fatal():
                    try:
                        producer.abort_transaction(METADATA_TIMEOUT_S)
                    except KafkaException:
                        pass
                raise _fail(f"batch {batch_id}", exc, self._job, tid) from None
            self._last[tid] = batch_id
            _after_commit_hook(batch_id)

    def _write_at_least_once(self, records: list, headers: list) -> None:
        producer = self._producers[0]
        errors: list[str] = []

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for part, key, value in records:
            produce(
                producer,
                self.topic,
                key=key,
                value=value,
                partition=part,
                headers=headers,
                on_delivery=done,
            )
        left = producer.flush(METADATA_TIMEOUT_S * 6)
        if left or errors:
            raise SinkError(
                f"Kafka sink {self.topic!r}: {left} records undelivered, errors "
                f"{errors[:3]}; the batch will be re-executed on restart"
            )

    def close(self) -> None:
        for p in self._producers:
            p.flush(METADATA_TIMEOUT_S)
        self._producers = []

    def summary(self) -> SinkSummary | None:
        return SinkSummary(
            f"Kafka topic {self.topic} ({self.delivery})",
            ["partition", "end offset"],
            sorted(end_offsets(self.config, self.topic).items()),
        )


def end_offsets(config: Mapping[str, Any], topic: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(quiet({**config, "group.id": "srt-summary", "enable.auto.commit": False}))
    try:
        meta = c.list_topics(timeout=METADATA_TIMEOUT_S).topics.get(topic)
        if meta is None:
            return {}
        return {
            p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=METADATA_TIMEOUT_S)[1]
            for p in sorted(meta.partitions)
        }
    finally:
        c.close()


def _after_commit_hook(batch_id: int) -> None:
    where = os.environ.get(AFTER_COMMIT_HOOK)
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"committed-{batch_id}").touch()
        threading.Event().wait(600)  # the test kills the job here
