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

Record size: a record larger than the producer's ``message.max.bytes`` is refused by the client,
one larger than the topic's ``max.message.bytes`` by the broker, and the batch holding it would
fail on every replay. So each record's size is computed before the write as Kafka counts it
(:func:`record_size`: key, value, headers and the record's and its batch's framing, counted at
their largest) against both limits (the topic's read once at ``open``):
:meth:`KafkaSink.unstorable` names the records over a limit (a query whose rows are source
records dead-letters them), and ``write_batch`` stops the job naming the row, its size, the
limit and the setting that raises it (a window's row). The producers' ``batch.size`` is kept
within the topic's limit, so records that each fit are never batched past it.
"""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from stateful_runtime.checkpoints.keyed import key_partition
from stateful_runtime.connectors.base import Sink, SinkSummary
from stateful_runtime.connectors.formats.json import encode_records
from stateful_runtime.connectors.kafka import client as kafka_client
from stateful_runtime.connectors.kafka.client import (
    METADATA_TIMEOUT_S,
    CommitMarkers,
    ensure_topic,
    produce,
    quiet,
    topic_max_message_bytes,
    watermark_offsets,
)
from stateful_runtime.exceptions import ConfigError, SinkError
from stateful_runtime.masking import mask_config

DELIVERY = ("exactly_once", "at_least_once")
# Test hook: after committing a batch's transaction the sink touches
# $SRT_TEST_KAFKA_AFTER_COMMIT/committed-<batch> and blocks, so a test can kill -9 the job
# exactly between the Kafka commit and Spark's batch commit.
AFTER_COMMIT_HOOK = "SRT_TEST_KAFKA_AFTER_COMMIT"
BATCH_HEADER = "srt.batch"


# librdkafka refuses a record locally when RECORD_OVERHEAD + key + value + headers exceeds the
# producer's message.max.bytes (rd_kafka_msg_max_wire_size: the v2 record's length, attributes,
# timestamp and offset deltas, key and value lengths and header count, each varint at its
# largest). A broker checks a record batch against the topic's max.message.bytes, and a batch
# adds its 61-byte header (base offset, length, epoch, magic, CRC, attributes, last offset
# delta, timestamps, producer id and epoch, base sequence, record count).
RECORD_OVERHEAD = 5 + 1 + 10 + 5 + 5 + 5 + 5
BATCH_OVERHEAD = 61
PRODUCER_LIMIT_DEFAULT = 1_000_000  # librdkafka's message.max.bytes
# The batch header's value is the batch id: counted at its longest (an int64's digits).
_LONGEST_BATCH_ID = 2**63 - 1


def _varint_size(n: int) -> int:
    """Bytes of ``n`` as a Kafka (zigzag) varint."""
    z, size = (n << 1) ^ (n >> 63), 1
    while z >= 0x80:
        z >>= 7
        size += 1
    return size


def headers_size(headers: Sequence[tuple[str, bytes]]) -> int:
    """Bytes of ``headers`` in a v2 record (each: name length, name, value length, value)."""
    total = 0
    for name, value in headers:
        n = len(name.encode())
        total += _varint_size(n) + n + _varint_size(len(value)) + len(value)
    return total


def record_size(key: bytes | None, value: bytes, headers: int) -> int:
    """A record's size as librdkafka checks it against ``message.max.bytes``: ``key`` and
    ``value`` with ``headers`` bytes of headers (:func:`headers_size`) and the record's
    framing at its largest. In a record batch on the broker it is :data:`BATCH_OVERHEAD` more."""
    return RECORD_OVERHEAD + len(key or b"") + len(value) + headers


def _partition_for(key: bytes | None, i: int, partitions: int) -> int:
    """librdkafka's "consistent" partitioner (CRC32 of the key); keyless rows round-robin."""
    if key is None:
        return i % partitions
    return zlib.crc32(key) % partitions


_TOO_LARGE_WAY = (
    "raise the producer's message.max.bytes (the job setting kafka.message.max.bytes) and the "
    "topic's max.message.bytes, or make the job's records smaller"
)


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
    if code == KafkaError.MSG_SIZE_TOO_LARGE:
        return SinkError(
            f"Kafka sink producer {tid}: {what}: a record was refused as too large ({exc}). "
            f"The batch was not committed and is replayed when the job runs again: "
            f"{_TOO_LARGE_WAY}"
        )
    return SinkError(
        f"Kafka sink producer {tid}: {what} failed ({exc}); the batch was not committed and "
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
        partition_by: an output column (a string or an integer) whose key group places each
            record: partition ``p`` of ``n`` holds the keys a job keyed by that column keeps
            in its state partition ``p`` of ``n`` (:func:`~stateful_runtime.checkpoints.
            keyed.key_partition`), so a job reading the topic with ``KafkaSource(keyed_by=
            column)`` and ``parallelism=n`` runs without a shuffle. Without ``key``, the
            column's value is also the record's key.
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
        partition_by: str | None = None,
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
        self.partition_by = partition_by or None
        self.transaction_timeout_ms = transaction_timeout_ms
        self._producers: list[Any] = []
        self._ids: list[str] = []
        self._last: dict[str, int] = {}
        self._parts = partitions
        self._markers = CommitMarkers(self.config, topic)
        self._job = ""
        # The limits a record is checked against (the topic's read at ``open``).
        self._producer_limit = int(self.config.get("message.max.bytes", PRODUCER_LIMIT_DEFAULT))
        self._topic_limit: int | None = None
        self._checked: tuple[pa.Table, list[tuple[int, bytes | None, bytes]]] | None = None

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
            partition_by=config.get("sink.partition_by") or None,
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
            self._topic_limit = topic_max_message_bytes(self.config, self.topic)
            if self.delivery == "at_least_once":
                self._producers = [
                    Producer(
                        quiet(
                            {
                                **self._producer_config(),
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
                            **self._producer_config(),
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

    def _producer_config(self) -> dict[str, Any]:
        """The client settings, with ``batch.size`` within the topic's ``max.message.bytes``:
        librdkafka would otherwise put records that each fit into one batch the broker
        refuses (as a whole, on every replay)."""
        config = dict(self.config)
        if self._topic_limit is not None:
            size = int(config.get("batch.size", PRODUCER_LIMIT_DEFAULT))
            config["batch.size"] = max(1, min(size, self._topic_limit))
        return config

    def _headers(self, batch_id: int) -> list[tuple[str, bytes]]:
        return [(BATCH_HEADER, str(batch_id).encode()), ("srt.job", self._job.encode())]

    def _too_large(self, key: bytes | None, value: bytes, headers: int) -> str | None:
        """Why the record cannot be produced to the topic (None: it can): its size, the
        limit and the setting that raises it."""
        size = record_size(key, value, headers)
        parts = f"key {len(key or b'')}, value {len(value)}, headers {headers}"
        if size > self._producer_limit:
            return (
                f"Kafka topic {self.topic!r}: the record is {size} bytes as produced ({parts}, "
                f"framing {RECORD_OVERHEAD}), over the producer's message.max.bytes of "
                f"{self._producer_limit}: raise it with the job setting kafka.message.max.bytes "
                f"(a key of the job file's DEFAULTS, then --set) and the topic's "
                f"max.message.bytes with it"
            )
        if self._topic_limit is not None and size + BATCH_OVERHEAD > self._topic_limit:
            return (
                f"Kafka topic {self.topic!r}: the record is {size + BATCH_OVERHEAD} bytes in "
                f"its record batch ({parts}, framing {RECORD_OVERHEAD + BATCH_OVERHEAD}), over "
                f"the topic's max.message.bytes of {self._topic_limit}: raise it "
                f"(kafka-configs.sh --alter --entity-type topics --entity-name {self.topic} "
                f"--add-config max.message.bytes=N)"
            )
        return None

    def unstorable(self, rows: pa.Table) -> list[tuple[int, str]]:
        """The rows whose record is too large for the producer or the topic (headers counted
        with the longest batch id), each with its size, the limit and the setting."""
        headers = headers_size(self._headers(_LONGEST_BATCH_ID))
        out = []
        records = self._records(rows, 0)
        self._checked = (rows, records)  # for write_batch, when it gets this very table
        for i, (_, key, value) in enumerate(records):
            why = self._too_large(key, value, headers)
            if why is not None:
                out.append((i, why))
        return out

    def _check_sizes(
        self, records: list[tuple[int, bytes | None, bytes]], headers: int, batch_id: int
    ) -> None:
        """A :class:`SinkError` naming the records of batch ``batch_id`` too large to produce
        (a window's row: it stands for many records), before any is written."""
        bad = []
        for i, (_, key, value) in enumerate(records):
            why = self._too_large(key, value, headers)
            if why is not None:
                bad.append((i, key, why))
        if not bad:
            return
        shown = "; ".join(
            f"row {i}" + (f" (key {key.decode(errors='replace')})" if key else "") + f": {why}"
            for i, key, why in bad[:3]
        )
        more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
        raise SinkError(
            f"Kafka sink {self.topic!r}: {len(bad)} record(s) of batch {batch_id} are too large "
            f"to produce: {shown}{more}. None of the batch was written and it was not "
            f"committed: it is replayed when the job runs again (nothing written twice) and "
            f"stops here again until the limit is raised or the job's rows are smaller"
        )

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
        """``batch``'s records: (partition, key, value). Encoded once when ``unstorable`` was
        asked about this very table (it found nothing: the writer passes it on as it is)."""
        checked, self._checked = self._checked, None
        if checked is not None and checked[0] is batch:
            return checked[1]
        values = encode_records(batch)
        keys: Sequence[bytes | None] = [None] * len(values)
        if self.key_columns:
            keys = encode_records(batch.select(list(self.key_columns)))
        if self.partition_by is not None:
            placed = self._placed(batch)
            if not self.key_columns:
                keys = [None if v is None else str(v).encode() for v in placed]
            parts = self._parts
            return [
                (key_partition(v, parts), key, value)
                for v, key, value in zip(placed, keys, values, strict=True)
            ]
        return [
            (_partition_for(key, i, self._parts), key, value)
            for i, (key, value) in enumerate(zip(keys, values, strict=True))
        ]

    def _placed(self, batch: pa.Table) -> list[Any]:
        """The values of ``partition_by`` that place ``batch``'s records."""
        column = self.partition_by
        if column not in batch.column_names:
            raise ConfigError(
                f"Kafka sink {self.topic!r}: partition_by={column!r} is not an output column "
                f"(the output has {batch.column_names}); name one of them"
            )
        values = batch.column(column)
        if not (pa.types.is_string(values.type) or pa.types.is_integer(values.type)):
            raise ConfigError(
                f"Kafka sink {self.topic!r}: partition_by={column!r} is a {values.type} "
                f"column; records are placed by the key group of a string or an integer"
            )
        return values.to_pylist()

    def write_batch(self, batch: pa.Table, batch_id: int) -> None:
        from confluent_kafka import KafkaException

        assert self._producers, "KafkaSink.write_batch before open"
        records = self._records(batch, batch_id)
        headers = self._headers(batch_id)
        self._check_sizes(records, headers_size(headers), batch_id)
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
        from confluent_kafka import KafkaError, KafkaException

        producer = self._producers[0]
        errors: list[Any] = []

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)

        try:
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
        except KafkaException as exc:
            producer.flush(METADATA_TIMEOUT_S)
            raise _fail("produce", exc, self._job, "(at-least-once)") from None
        left = producer.flush(METADATA_TIMEOUT_S * 6)
        if left or errors:
            large = any(e.code() == KafkaError.MSG_SIZE_TOO_LARGE for e in errors)
            raise SinkError(
                f"Kafka sink {self.topic!r}: {left + len(errors)} records undelivered, errors "
                f"{[str(e) for e in errors[:3]]}; the batch will be re-executed on restart"
                + (f": {_TOO_LARGE_WAY}" if large else "")
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
            p: watermark_offsets(c, TopicPartition(topic, p))[1] for p in sorted(meta.partitions)
        }
    finally:
        c.close()


def _after_commit_hook(batch_id: int) -> None:
    where = os.environ.get(AFTER_COMMIT_HOOK)
    if where:
        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"committed-{batch_id}").touch()
        threading.Event().wait(600)  # the test kills the job here
