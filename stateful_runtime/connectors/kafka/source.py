"""Kafka source on confluent-kafka, as a Spark Python streaming DataSource (``srt_kafka``).

Offsets in Spark's offset log are ``{"<topic>:<partition>": <next offset>}``: committed with
the batch's state, and the same shape as the event log's, so lag, dead letters and range
planning are shared (:mod:`..ranges`, :mod:`..dead_letters`). Each Spark task reads one offset
range of one partition with ``isolation.level=read_committed`` (no consumer group; offsets live
in the checkpoint only) and yields Arrow batches decoded by :mod:`..formats.json`.

Partitions are aligned in event time (Flink's per-split watermarks, with idleness) as for
every source: :mod:`..alignment`.

A topic whose producers place records by the key groups of a field (``KafkaSink(partition_by=
...)``, or ``partition=key_partition(value, n)`` when producing) is declared so by the job
(``keyed_by``): a job keyed by that field reads it without a shuffle (the planner's choice,
``Source.key_placement``). The job cannot see the producers, so it checks: at start, the
newest records of every partition (:data:`PLACEMENT_SAMPLE` each) must be where their key
group belongs; in the tasks, every record (the keyed operator refuses one of a key group its
partition does not own); and each batch, the topic's partition count against the one the job
started with (a topic given more partitions moves keys between them).
"""

from __future__ import annotations

import bisect
import json
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from stateful_runtime._process import freeze_worker_heap
from stateful_runtime.checkpoints.keyed import key_group, key_groups, owner_of
from stateful_runtime.connectors import accounting, alignment, event_time
from stateful_runtime.connectors.base import (
    OFFSET,
    PARTITION,
    KeyPlacement,
    Source,
    stream_schema,
)
from stateful_runtime.connectors.dead_letters import stage
from stateful_runtime.connectors.formats.json import TimeBounds, decode_json, to_struct
from stateful_runtime.connectors.kafka import client as kafka_client
from stateful_runtime.connectors.kafka.client import (
    LEADER_WAIT_S,
    METADATA_TIMEOUT_S,
    admin_client,
    check_cluster,
    passing,
    quiet,
    watermark_offsets,
)
from stateful_runtime.connectors.kafka.dead_letters import KafkaDeadLetterSink
from stateful_runtime.connectors.ranges import BatchCap, split_ranges
from stateful_runtime.exceptions import ConfigError, SourceDataLostError, StatefulRuntimeError
from stateful_runtime.masking import mask_config

if TYPE_CHECKING:
    from stateful_runtime.watermarks import WatermarkStrategy

FORMAT = "srt_kafka"
MAX_SPLIT_RECORDS = 250_000
ARROW_BATCH_ROWS = 65_536
# Which reader reads a topic, and why (``srt explain``). Spark's own connector must match
# Spark's version exactly; NOTES ("Spark's own Kafka connector against the Python source").
READER = (
    "read by the runtime's reader (confluent-kafka in the Python workers, JSON decoded in "
    "Arrow), not Spark's Kafka connector: Maven Central serves none for Spark 4.3, and Spark "
    "4.2's with from_json read about half as fast as this reader on the same cores"
)
# How long a task waits for offsets it was told exist (an open transaction holds them back).
READ_TIMEOUT_S = 120.0
# The newest records of each partition a job reading a topic ``keyed_by`` a field checks at
# start for their placement.
PLACEMENT_SAMPLE = 200
# The option of a read whose Spark partition p is the topic's partition p, whole, and the
# partition count the job planned it with (Source.read_stream's by_partition).
BY_PARTITION = "by_partition"
# The job setting that lets a job go on over records deleted before it read them.
DATA_LOSS_SETTING = "source.fail_on_data_loss"
META = ("kafka_topic", "kafka_key", "kafka_timestamp_ms", "kafka_headers")
HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


def _parse_starting(value: Any) -> Any:
    """``earliest``, ``latest``, ``timestamp:<epoch ms>``, or JSON ``{"topic:p": offset}`` /
    ``{"topic": {"p": offset}}``."""
    if isinstance(value, str):
        v = value.strip()
        if v in ("earliest", "latest"):
            return v
        if v.startswith("timestamp:"):
            try:
                return {"timestamp": int(v.split(":", 1)[1])}
            except ValueError:
                pass
        elif v.startswith("{"):
            try:
                value = json.loads(v)
            except ValueError:
                pass
    if isinstance(value, Mapping):
        if set(value) == {"timestamp"} and isinstance(value["timestamp"], int):
            return {"timestamp": value["timestamp"]}
        flat: dict[str, int] = {}
        for k, v in value.items():
            if isinstance(v, Mapping):
                flat.update({f"{k}:{p}": int(o) for p, o in v.items()})
            elif ":" in str(k) and isinstance(v, int):
                flat[str(k)] = v
            else:
                break
        else:
            if flat:
                return flat
    raise ConfigError(
        f"starting_offsets {value!r} not understood; use 'earliest', 'latest', "
        f"'timestamp:<epoch ms>' or JSON like '{{\"topic\": {{\"0\": 42}}}}'"
    )


class KafkaSource(Source):
    """Read Kafka topics; records are JSON objects decoded into ``schema``.

    Args:
        bootstrap_servers: ``host:port[,host:port]``.
        topics: a topic or list of topics (or give ``pattern``, a regex over topic names;
            topics and partitions that appear later are read from their start).
        schema: record schema (``{field: type}`` or a StructType), as for :class:`LogSource`.
        starting_offsets: ``"earliest"``, ``"latest"``, ``{"timestamp": epoch_ms}`` (first
            record at or after it), or ``{"topic": {"partition": offset}}``; used by a query's
            first run only, a restarted query resumes from its checkpoint.
        max_records_per_batch: cap per micro-batch (None: all available).
        dead_letter_topic: where undecodable records go (default ``<first topic>-dlq``).
        client_config: extra librdkafka settings (``security.protocol``, ``sasl.*``, ``ssl.*``).
        metadata_columns: add ``kafka_topic``, ``kafka_key``, ``kafka_timestamp_ms`` and
            ``kafka_headers`` columns.
        name: source name (default: the topics joined, or ``kafka``).
        fail_on_data_loss: records the job had not read deleted before it read them (the
            topic's retention while the job was stopped) refuse the batch, naming them
            (:class:`~stateful_runtime.exceptions.SourceDataLostError`); False: the job goes
            on from the oldest record left, saying each range it skipped (Spark's
            ``failOnDataLoss``).
        keyed_by: the field (a string or an integer of ``schema``) whose key groups the
            topic's producers place records by (see the module doc): a job keyed by it, with
            as many state partitions as the topic has, reads each partition in the task that
            keeps its state, without a shuffle. One topic only.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        topics: str | Sequence[str] | None = None,
        schema: StructType | Mapping[str, Any] | None = None,
        *,
        pattern: str | None = None,
        starting_offsets: Any = "earliest",
        max_records_per_batch: int | None = None,
        dead_letter_topic: str | None = None,
        client_config: Mapping[str, Any] | None = None,
        metadata_columns: bool = False,
        name: str | None = None,
        fail_on_data_loss: bool = True,
        keyed_by: str | None = None,
    ) -> None:
        if isinstance(topics, str):
            topics = [topics]
        if bool(topics) == bool(pattern):
            raise ConfigError("KafkaSource takes topics=[...] or pattern='regex', not both")
        if schema is None:
            raise ConfigError("KafkaSource needs a record schema")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"topic pattern {pattern!r} is not a regex: {exc}") from None
        if max_records_per_batch is not None and max_records_per_batch < 1:
            raise ConfigError(f"max_records_per_batch must be >= 1, got {max_records_per_batch}")
        self.config = kafka_client.client_config(bootstrap_servers, client_config)
        self.topics = list(topics or [])
        self.pattern = pattern
        self.schema = to_struct(schema)
        self.starting_offsets = _parse_starting(starting_offsets)
        self.max_records_per_batch = max_records_per_batch
        self.metadata_columns = metadata_columns
        self.fail_on_data_loss = fail_on_data_loss
        base = self.topics[0] if self.topics else "kafka"
        self.name = name or ("-".join(self.topics) if self.topics else "kafka")
        self.dead_letter_topic = dead_letter_topic or f"{base}-dlq"
        clash = [f for f in self.schema.fieldNames() if f in META] if metadata_columns else []
        if clash:
            raise ConfigError(f"schema field(s) {clash} clash with the Kafka metadata columns")
        self.keyed_by = keyed_by or None
        if self.keyed_by is not None:
            _check_keyed_by(self.keyed_by, self.topics, self.schema)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], schema: StructType | Mapping[str, Any]
    ) -> KafkaSource:
        """From job-file keys ``source.bootstrap_servers``, ``source.topic`` (comma-separated)
        or ``source.topic_pattern``, ``source.starting_offsets``,
        ``source.max_records_per_batch``, ``source.fail_on_data_loss`` and ``kafka.*`` client
        settings."""
        pattern = config.get("source.topic_pattern") or None
        topics = None if pattern else [t for t in str(config["source.topic"]).split(",") if t]
        return cls(
            config.get("source.bootstrap_servers", ""),
            topics,
            schema,
            pattern=pattern,
            starting_offsets=config.get("source.starting_offsets", "earliest"),
            max_records_per_batch=config.get("source.max_records_per_batch"),
            client_config=kafka_client.client_settings(config),
            fail_on_data_loss=str(config.get(DATA_LOSS_SETTING, True)).lower()
            not in ("false", "0", "no"),
            keyed_by=config.get("source.keyed_by") or None,
        )

    def describe(self) -> str:
        what = f"topics {self.topics}" if self.topics else f"topics matching {self.pattern!r}"
        limit = self.max_records_per_batch or "unlimited"
        settings = mask_config({k: v for k, v in self.config.items() if k != "bootstrap.servers"})
        return (
            f"Kafka {what} on {self.config['bootstrap.servers']} (from "
            f"{self.starting_offsets}, max {limit} records/batch, read_committed, "
            f"per-partition event-time alignment, JSON → {self.schema.simpleString()}"
            + (f", placed by the key groups of {self.keyed_by!r}" if self.keyed_by else "")
            + (f", client settings {settings}" if settings else "")
            + f"); {READER}"
        )

    def check(self) -> None:
        found = check_cluster(self.config, self.topics or None, self.pattern)
        if self.pattern and not found:
            raise ConfigError(
                f"Kafka source: no topic matches {self.pattern!r} on "
                f"{self.config['bootstrap.servers']}; create one or fix the pattern"
            )

    def records_held(self) -> int | None:
        from confluent_kafka import Consumer, KafkaException, TopicPartition

        try:
            counts = check_cluster(self.config, self.topics or None, self.pattern)
            c = Consumer(quiet({**self.config, "group.id": "srt-size"}))
        except (ConfigError, KafkaException):
            return None
        try:
            return sum(
                hi - lo
                for topic, n in counts.items()
                for p in range(n)
                for lo, hi in [watermark_offsets(c, TopicPartition(topic, p))]
            )
        except KafkaException:
            return None
        finally:
            c.close()

    def key_placement(self) -> KeyPlacement | None:
        """The placement ``keyed_by`` declares, into the topic's partitions as they are now."""
        if self.keyed_by is None:
            return None
        [topic] = self.topics
        partitions = check_cluster(self.config, self.topics)[topic]
        kind = self.schema[self.keyed_by].dataType.simpleString()
        return KeyPlacement(self.keyed_by, kind, partitions, f"Kafka topic {topic!r}")

    def check_placement(self, partitions: int) -> None:
        """Refuse, before the job reads anything, a topic whose newest records
        (:data:`PLACEMENT_SAMPLE` a partition) are not where the key groups of ``keyed_by``
        place them among ``partitions`` (the producers use Kafka's own partitioner, or
        another field)."""
        from confluent_kafka import Consumer, TopicPartition

        [topic] = self.topics
        c = Consumer(
            quiet({**self.config, "group.id": "srt-placement", "enable.partition.eof": True})
        )
        try:
            for p in range(partitions):
                lo, hi = watermark_offsets(c, TopicPartition(topic, p))
                start = max(lo, hi - PLACEMENT_SAMPLE)
                if start >= hi:
                    continue
                c.assign([TopicPartition(topic, p, start)])
                for offset, value in _sample(c, hi):
                    misplaced = self._misplaced(value, p, partitions)
                    if misplaced is not None:
                        raise ConfigError(
                            f"Kafka source {self.name}: the job declares topic {topic!r} "
                            f"placed by the key groups of {self.keyed_by!r} (keyed_by), but "
                            f"{topic}:{p} offset {offset} holds {self.keyed_by}="
                            f"{misplaced!r}, whose key group {key_group([misplaced])} belongs "
                            f"to partition {owner_of(key_group([misplaced]), partitions)} of "
                            f"{partitions}: its producers place records otherwise (Kafka's own "
                            f"partitioner?). Produce with KafkaSink(partition_by="
                            f"{self.keyed_by!r}) or partition=key_partition(value, "
                            f"{partitions}) (stateful_runtime.checkpoints.keyed), or drop "
                            f"keyed_by (source.keyed_by) to read it with a shuffle; nothing "
                            f"was read"
                        )
        finally:
            c.close()

    def _misplaced(self, value: bytes | None, partition: int, partitions: int) -> Any:
        """The ``keyed_by`` value of a record that is not in the partition owning its key
        group (None: it is, or the record does not decode: the job dead-letters it)."""
        try:
            record = json.loads(value or b"")
        except ValueError:
            return None
        found = record.get(self.keyed_by) if isinstance(record, dict) else None
        if not isinstance(found, str | int) or isinstance(found, bool):
            return None
        if key_group([found]) in key_groups(partition, partitions):
            return None
        return found

    def decode(
        self,
        values: list[bytes],
        *,
        event_time: tuple[str, str] | None = None,
        bounds: TimeBounds | None = None,
    ) -> pa.Table:
        """Decode raw records exactly as the job does: declared fields + ``_error``/``_raw``
        (with ``event_time`` and a batch's ``bounds``, as its read tasks judge event time)."""
        return decode_json(values, self.schema, event_time=event_time, bounds=bounds)

    def data_source(
        self,
        dead_letter_staging: str | None = None,
        watermark: WatermarkStrategy | None = None,
        late_watermark_of: str | None = None,
        query_checkpoint: str | None = None,
        *,
        by_partition: bool = False,
        accounting: Mapping[str, str] | None = None,
    ) -> tuple[type[DataSource], dict[str, str]]:
        self.check()
        options = self.options(dead_letter_staging, watermark, late_watermark_of, query_checkpoint)
        if by_partition:
            placement = self.key_placement()
            assert placement is not None, "by_partition needs keyed_by"
            self.check_placement(placement.partitions)
            options[BY_PARTITION] = str(placement.partitions)
        options.update(accounting or {})
        return KafkaDataSource, options

    def options(
        self,
        dead_letter_staging: str | None = None,
        watermark: WatermarkStrategy | None = None,
        late_watermark_of: str | None = None,
        query_checkpoint: str | None = None,
    ) -> dict[str, str]:
        """The ``srt_kafka`` DataSource options (they carry the client settings: Spark redacts
        option values whose names match ``spark.redaction.regex`` in plans; ours never print)."""
        opts = {
            "config": json.dumps(self.config),
            "topics": json.dumps(self.topics),
            "pattern": self.pattern or "",
            "schema": self.schema.json(),
            "starting": json.dumps(self.starting_offsets),
            "metadata_columns": "1" if self.metadata_columns else "",
            "max_records_per_batch": str(self.max_records_per_batch or ""),
            "name": self.name,
            "fail_on_data_loss": "true" if self.fail_on_data_loss else "false",
        }
        if dead_letter_staging is not None:
            opts["dead_letter_staging"] = dead_letter_staging
        opts.update(alignment.options(watermark))
        opts.update(event_time.options(watermark, query_checkpoint))
        if late_watermark_of is not None:
            opts[alignment.LATE_WATERMARK_OF] = late_watermark_of
        return opts

    def dead_letter_sink(self, job: str) -> KafkaDeadLetterSink:
        return KafkaDeadLetterSink(
            self.config,
            self.dead_letter_topic,
            source=self.name,
            job=job,
            source_topics=self.topics,
            source_pattern=self.pattern,
        )


# The optional Kafka record columns (``metadata_columns=True``).
METADATA_FIELDS = (
    StructField("kafka_topic", StringType()),
    StructField("kafka_key", BinaryType()),
    StructField("kafka_timestamp_ms", LongType()),
    StructField("kafka_headers", HEADERS_TYPE),
)


class KafkaDataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        extra = METADATA_FIELDS if self.options.get("metadata_columns") else ()
        out = stream_schema(
            StructType.fromJson(json.loads(self.options["schema"])),
            extra + alignment.late_before_fields(self.options),
        )
        return out

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(self.options)


@dataclass
class KafkaSplit(InputPartition):
    topic: str
    partition: int
    start: int
    end: int
    late_before: int | None = None  # the batch's late-event watermark, when asked for
    bounds: TimeBounds | None = None  # the event times the batch accepts
    through: int | None = None  # where the partition's range in the batch ends
    ends_run: bool = False  # the split reads its partition to the end of a bounded run


_CONSUMERS: dict[tuple[str, str], Any] = {}
_UNREAD = object()
_TIMES_KEPT = 100_000  # event times of single records a reader keeps for its next plans


def _topic_partition(key: str) -> tuple[str, int]:
    """``"topic:partition"`` (an offsets key) as (topic, partition)."""
    topic, partition = key.rsplit(":", 1)
    return topic, int(partition)


def _consumer(config_json: str, reset: str) -> Any:
    """One consumer per Python worker process, client config and offset reset (workers are
    reused). ``reset``: what a read of an offset the broker no longer holds does: ``error``
    (the job refuses data loss) or ``earliest``."""
    from confluent_kafka import Consumer

    c = _CONSUMERS.get((config_json, reset))
    if c is None:
        c = Consumer(
            quiet(
                {
                    **json.loads(config_json),
                    "group.id": "srt-source",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "allow.auto.create.topics": False,
                    "fetch.max.bytes": 64 << 20,
                    "auto.offset.reset": reset,
                    # A split stops reading with records still queued; librdkafka then holds the
                    # next fetch of that partition back for this long (1 s by default), which
                    # every later split of a reused consumer waited out.
                    "fetch.queue.backoff.ms": 10,
                    # A split that ends at the partition's end leaves a fetch waiting on the broker
                    # for new records (500 ms by default); the next split's fetch queues behind it.
                    "fetch.wait.max.ms": 10,
                }
            )
        )
        _CONSUMERS[(config_json, reset)] = c
    return c


def _probe_consumer(config: Mapping[str, Any]) -> Any:
    """The driver's consumer of single records (plan-time alignment): each fetch asks for as
    little as the broker can send (one record batch) and nothing is fetched ahead."""
    from confluent_kafka import Consumer

    return Consumer(
        quiet(
            {
                **config,
                "group.id": "srt-alignment",
                "enable.auto.commit": False,
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
                "allow.auto.create.topics": False,
                "auto.offset.reset": "error",
                "max.partition.fetch.bytes": 1,
                "queued.min.messages": 1,
                "fetch.wait.max.ms": 1,
                "fetch.queue.backoff.ms": 1,
            }
        )
    )


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.config_json = options["config"]
        self.config = json.loads(self.config_json)
        self.topics: list[str] = json.loads(options["topics"])
        self.pattern = options.get("pattern") or None
        self.record_schema = StructType.fromJson(json.loads(options["schema"]))
        self.starting = json.loads(options["starting"])
        self.metadata = bool(options.get("metadata_columns"))
        max_rows = options.get("max_records_per_batch")
        self.max_rows = int(max_rows) if max_rows else None
        self.staging = options.get("dead_letter_staging")
        self.idleness = alignment.Idleness(options)
        time_field = options.get("event_time_field")
        self.event_time = (time_field, options.get("event_time_unit", "ms")) if time_field else None
        self.drift_ms = int(options.get("max_drift_ms") or 0)
        # (partition, offset) → its record's event time (None: no record, or no time there),
        # or the record's value until it is asked for
        self._times: dict[tuple[str, int], int | bytes | None] = {}
        self._timer: Any = None  # the driver's consumer for plan-time alignment
        self._plausible = event_time.plan_filter(options)  # (renewed by each plan)
        self.target: dict[str, int] | None = None
        self._admin: Any = None
        self._latest: dict[str, int] | None = None
        self.options = dict(options)
        self.cap = BatchCap()
        self.fail_on_data_loss = options.get("fail_on_data_loss", "true") != "false"

    # -- driver side: offsets ------------------------------------------------------------
    def _admin_client(self) -> Any:
        """One admin connection for the reader's life (partition discovery and offsets)."""
        if self._admin is None:
            self._admin = admin_client(self.config)
        return self._admin

    def _partitions(self) -> list[tuple[str, int]]:
        """The topics' partitions; the job is running, so a cluster out of reach (a broker
        restarting) is waited for up to :data:`LEADER_WAIT_S`."""
        counts = check_cluster(
            self.config,
            self.topics or None,
            self.pattern,
            admin=self._admin_client(),
            wait_s=LEADER_WAIT_S,
        )
        return [(t, p) for t, n in sorted(counts.items()) for p in range(n)]

    def _list(self, spec: Any, parts: list[tuple[str, int]]) -> dict[str, int]:
        """The offsets ``spec`` names for ``parts``. A partition whose leadership is moving
        (a broker shut down, a leader elected) answers with a leader error for a moment, and
        a broker restarting leaves the cluster out of reach for a while: asked again, with
        backoff and a new client, for up to :data:`LEADER_WAIT_S`; then the error stands (the
        job stops naming it, and its restart resumes exactly)."""
        from confluent_kafka import IsolationLevel, KafkaException, TopicPartition

        deadline, pause = time.monotonic() + LEADER_WAIT_S, 0.1
        while True:
            futures = self._admin_client().list_offsets(
                {TopicPartition(t, p): spec for t, p in parts},
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=METADATA_TIMEOUT_S,
            )
            try:
                found = {
                    f"{tp.topic}:{tp.partition}": f.result().offset for tp, f in futures.items()
                }
            except KafkaException as exc:
                if not passing(exc) or time.monotonic() + pause > deadline:
                    raise
                # A client that knew the leader before a broker restarted keeps asking with
                # its leader epoch and is answered FENCED_LEADER_EPOCH as long as it lives: a
                # new client learns the cluster afresh.
                self._admin = None
            else:
                # After a partition's leader moved, librdkafka's admin client keeps asking the
                # old leader it knew and answers -1001 (OFFSET_INVALID) without an error, for
                # as long as the client lives (the broker's answer is never negative): a new
                # client asks the cluster afresh. Taken as an offset, it moved the batch's end
                # back and the next batch refused its start as records deleted.
                unknown = sorted(k for k, offset in found.items() if offset < 0)
                if not unknown:
                    return found
                self._admin = None
                if time.monotonic() + pause > deadline:
                    raise StatefulRuntimeError(
                        f"Kafka source: the cluster at {self.config.get('bootstrap.servers')} "
                        f"gave no offset for {', '.join(unknown)} within {LEADER_WAIT_S:.0f} s "
                        f"(their leadership moving?); the job stops with nothing of the batch "
                        f"committed, and a restart resumes exactly"
                    )
            time.sleep(pause)  # backoff before asking a moving leadership again
            pause = min(pause * 2, 2.0)

    def _ends(self) -> dict[str, int]:
        from confluent_kafka.admin import OffsetSpec

        return self._list(OffsetSpec.latest(), self._partitions())

    def _earliest(self, parts: list[tuple[str, int]]) -> dict[str, int]:
        from confluent_kafka.admin import OffsetSpec

        return self._list(OffsetSpec.earliest(), parts) if parts else {}

    def initialOffset(self) -> dict:
        parts = self._partitions()
        ends = self._ends()
        if self.starting == "latest":
            return ends
        earliest = self._earliest(parts)
        if self.starting == "earliest":
            return earliest
        if "timestamp" in self.starting:
            from confluent_kafka import Consumer, TopicPartition

            c = Consumer(quiet({**self.config, "group.id": "srt-source-init"}))
            try:
                found = c.offsets_for_times(
                    [TopicPartition(t, p, self.starting["timestamp"]) for t, p in parts],
                    timeout=METADATA_TIMEOUT_S,
                )
            finally:
                c.close()
            # No record at or after the timestamp: start at the end.
            return {
                f"{tp.topic}:{tp.partition}": tp.offset
                if tp.offset >= 0
                else ends[f"{tp.topic}:{tp.partition}"]
                for tp in found
            }
        unknown = sorted(set(self.starting) - set(ends))
        if unknown:
            raise ConfigError(
                f"starting_offsets name partitions that do not exist: {unknown}; "
                f"existing: {sorted(ends)}"
            )
        out = dict(earliest)
        for k, off in self.starting.items():
            if not earliest[k] <= off <= ends[k]:
                raise ConfigError(
                    f"starting offset {off} for {k} is outside the partition's "
                    f"range [{earliest[k]}, {ends[k]}]"
                )
            out[k] = off
        return out

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.max_rows) if self.max_rows else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._ends()

    def _with_new_partitions(self, start: dict, ends: dict) -> dict:
        new = [k for k in ends if k not in start]
        if not new:
            return start
        return {**self._earliest([_topic_partition(k) for k in new]), **start}

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        ends = listed = self._ends() if self.target is None else self.target
        self._latest = ends if self.target is None else None
        start = self._with_new_partitions(start, ends)
        # Event-time alignment (alignment's module doc): the partitions a silent one holds
        # first, so the cap goes to the others; the cut at the slowest end; the cap; and the
        # cut again (the cap ends partitions at different event times), as the event log plans.
        if self.event_time is not None:
            # A record the policy refuses has no event time here, as in the batch.
            self._plausible = event_time.plan_filter(self.options)
            silent = self.idleness.holding(start, ends)
            ends = alignment.hold_for_silent(
                start, ends, silent, self._time_at, self.drift_ms, bounded=self.target is not None
            )
            ends = alignment.bound_by_event_time(start, ends, self._time_at, self.drift_ms)
        capped = self.cap.limit(
            start, ends, limit.max_rows if isinstance(limit, ReadMaxRows) else None
        )
        if capped != ends and self.event_time is not None:
            capped = alignment.bound_by_event_time(start, capped, self._time_at, self.drift_ms)
        if self.event_time is not None and event_time.stream_ms(self.options) is not None:
            for k, e in capped.items():  # one fetch brings the records the check reads
                if int(start.get(k, 0)) < e < int(listed.get(k, e)):
                    self._time_at(k, max(0, e - 2))
            capped = event_time.reach_past_jump(
                start,
                capped,
                listed,
                self._time_at,
                event_time.stream_ms(self.options),
            )
        return capped

    def _time_at(self, key: str, offset: int) -> int | None:
        """The event time of the record at ``offset`` of partition ``key`` (None: none there,
        a transaction's marker or a record without a plausible event time), read once by the
        driver's own consumer (records never change). A fetch brings the record's batch from
        there on: the times of all of it are kept (the next probes of a bisection are near)."""
        found = self._times.get((key, offset), _UNREAD)
        if type(found) is bytes:  # fetched, parsed when asked for
            assert self.event_time is not None
            found = self._times[(key, offset)] = alignment.record_time(found, *self.event_time)
        if found is not _UNREAD:
            return self._plausible(found)  # type: ignore[arg-type]
        from confluent_kafka import TopicPartition

        if self._timer is None:
            self._timer = _probe_consumer(self.config)
        topic, partition = _topic_partition(key)
        self._timer.assign([TopicPartition(topic, partition, offset)])
        msgs: list[Any] = []
        deadline = time.monotonic() + METADATA_TIMEOUT_S
        while not msgs and time.monotonic() < deadline:
            msgs = self._timer.consume(1, 0.05)
        msgs += self._timer.consume(1_000, 0)  # the rest of what the fetch brought
        if len(self._times) >= _TIMES_KEPT:
            self._times.clear()
        at = offset
        for m in msgs:  # an error (the partition's end) ends the run
            if m.error() is not None or m.offset() < at:
                break
            for gap in range(at, m.offset()):  # markers, aborted records
                self._times[(key, gap)] = None
            self._times[(key, m.offset())] = m.value() or b""
            at = m.offset() + 1
        if (key, offset) not in self._times:
            self._times[(key, offset)] = None
        return self._time_at(key, offset)

    def reportLatestOffset(self) -> dict:
        # Spark asks right after latestOffset, for the lag in the batch's progress: the ends
        # just listed (as Spark's own Kafka source answers), not a second round trip.
        return self._latest if self._latest is not None else self._ends()

    def _unread_deleted(self, start: dict, end: dict) -> dict[str, tuple[int, int]]:
        """The batch's partitions whose first records to read are gone from the broker:
        ``{partition: (the batch's start, the first offset left)}``."""
        keys = [k for k, hi in end.items() if int(start.get(k, 0)) < int(hi)]
        if not keys:
            return {}
        earliest = self._earliest([_topic_partition(k) for k in keys])
        return {
            k: (int(start.get(k, 0)), earliest[k])
            for k in keys
            if int(start.get(k, 0)) < earliest[k]
        }

    def partitions(self, start: dict, end: dict) -> list[KafkaSplit]:
        lost = self._unread_deleted(start, end)
        if lost and self.fail_on_data_loss:
            raise SourceDataLostError(self.options.get("name", "kafka"), lost)
        if lost:
            for k, (lo, hi) in lost.items():
                print(
                    f"source {self.options.get('name', 'kafka')}: {k} offsets {lo}..{hi - 1} "
                    f"were deleted before the job read them; skipped "
                    "(fail_on_data_loss off)",
                    file=sys.stderr,
                )
            start = {**start, **{k: min(hi, int(end[k])) for k, (_, hi) in lost.items()}}
        out = []
        late = alignment.late_before_ms(self.options)
        bounds = event_time.batch_bounds(self.options)
        placed = self.options.get(BY_PARTITION)
        if placed:  # Spark's partition p is the topic's, whole, empty ones included
            return self._placed_splits(int(placed), start, end, late, bounds)
        for key, lo, hi in split_ranges(start, end, MAX_SPLIT_RECORDS):
            topic, p = key.rsplit(":", 1)
            out.append(
                KafkaSplit(
                    topic, int(p), lo, hi, late, bounds, int(end[key]), self._ends_run(key, hi)
                )
            )
        return out

    def _ends_run(self, key: str, hi: int) -> bool:
        """Whether a split ending at ``hi`` reads partition ``key`` to the end of this
        bounded run (its partition counts as idle after the batch: input_watermarks)."""
        return self.target is not None and key in self.target and hi >= int(self.target[key])

    def _placed_splits(
        self, planned: int, start: dict, end: dict, late: int | None, bounds: TimeBounds | None
    ) -> list[KafkaSplit]:
        [topic] = self.topics
        now = sorted(int(k.rsplit(":", 1)[1]) for k in end)
        if now != list(range(planned)):
            raise ConfigError(
                f"Kafka source {self.options.get('name', 'kafka')}: topic {topic!r} has "
                f"{len(now)} partitions, the job started reading it with {planned}, each in "
                f"the task of its state partition (keyed_by): with more partitions its "
                f"producers place a key elsewhere. Nothing of the batch was committed; restart "
                f"the job: it reads the topic with a shuffle while its parallelism differs "
                f"from the partition count (srt explain says which)"
            )
        return [
            KafkaSplit(
                topic,
                p,
                int(start.get(f"{topic}:{p}", 0)),
                int(end[f"{topic}:{p}"]),
                late,
                bounds,
                int(end[f"{topic}:{p}"]),
                self._ends_run(f"{topic}:{p}", int(end[f"{topic}:{p}"])),
            )
            for p in now
        ]

    # -- executor side ----------------------------------------------------------------------
    def _fetch(self, split: KafkaSplit) -> tuple[list[bytes], list[Any], list[int]]:
        """The split's record values (with their offsets and, if asked, metadata), read in
        bulk: the per-message work is ``map`` over the messages' C methods, not a Python
        loop."""
        from confluent_kafka import KafkaError, Message, TopicPartition

        c = _consumer(self.config_json, "error" if self.fail_on_data_loss else "earliest")
        c.assign([TopicPartition(split.topic, split.partition, split.start)])
        values: list[bytes] = []
        offsets: list[int] = []
        metas: list[Any] = []
        nxt = split.start
        deadline = time.monotonic() + READ_TIMEOUT_S
        try:
            while nxt < split.end:
                # consume() waits for the full count or the timeout: ask for what the split
                # still needs (control records make it fewer) and wait briefly.
                msgs = c.consume(max(1, min(10_000, split.end - nxt)), 0.05)
                eof = False
                # map over the C methods: a third of a Python comprehension's time a record
                if any(map(Message.error, msgs)):  # (an error is truthy)
                    for m in msgs:
                        err = m.error()
                        if err is None:
                            continue
                        if err.code() == KafkaError._AUTO_OFFSET_RESET:  # deleted since planned
                            earliest = self._earliest([(split.topic, split.partition)])
                            raise SourceDataLostError(
                                self.options.get("name", "kafka"),
                                {
                                    f"{split.topic}:{split.partition}": (
                                        nxt,
                                        next(iter(earliest.values())),
                                    )
                                },
                            )
                        if err.code() in kafka_client.UNREACHABLE:
                            continue  # the client reconnects; the deadline bounds the wait
                        if err.code() != KafkaError._PARTITION_EOF:
                            raise RuntimeError(f"Kafka read {split}: {err}")
                        eof = eof or m.offset() >= split.end
                    msgs = [m for m in msgs if m.error() is None]
                # (a message without an error has its offset)
                offs = cast(list[int], list(map(Message.offset, msgs)))
                cut = bisect.bisect_left(offs, split.end)
                past_end = cut < len(offs)
                if past_end:
                    msgs, offs = msgs[:cut], offs[:cut]
                if msgs:
                    got = list(map(Message.value, msgs))
                    if None in got:  # a tombstone: no value
                        got = [v or b"" for v in got]
                    values += cast(list[bytes], got)
                    offsets += offs
                    if self.metadata:
                        metas += [(m.key(), m.timestamp()[1], m.headers()) for m in msgs]
                    nxt = offs[-1] + 1
                if past_end or eof:
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"Kafka read {split}: offsets up to {split.end} not readable within "
                        f"{READ_TIMEOUT_S:.0f} s (last read {offsets[-1] if offsets else None})"
                    )
        finally:
            c.unassign()
        return values, metas, offsets

    def read(self, split: KafkaSplit) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        freeze_worker_heap()
        values, metas, offsets = self._fetch(split)
        tables = []
        for lo in range(0, len(values), ARROW_BATCH_ROWS):
            hi = min(len(values), lo + ARROW_BATCH_ROWS)
            table = decode_json(
                values[lo:hi], self.record_schema, event_time=self.event_time, bounds=split.bounds
            )
            cols = {}
            if self.metadata:
                chunk = metas[lo:hi]
                cols = {
                    "kafka_topic": pa.array([split.topic] * (hi - lo), pa.string()),
                    "kafka_key": pa.array([m[0] for m in chunk], pa.binary()),
                    "kafka_timestamp_ms": pa.array([m[1] for m in chunk], pa.int64()),
                    "kafka_headers": pa.array(
                        [[{"key": k, "value": v} for k, v in (m[2] or [])] for m in chunk],
                        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
                    ),
                }
            n = len(self.record_schema.fields)
            for i, (name, col) in enumerate(cols.items()):
                table = table.add_column(n + i, name, col)
            table = alignment.with_late_before(table, n + len(cols), split.late_before)
            tables.append(
                table.append_column(
                    PARTITION, pa.array(np.full(hi - lo, split.partition, np.int32))
                ).append_column(OFFSET, pa.array(np.asarray(offsets[lo:hi], np.int64)))
            )
        newest = None
        if self.event_time is not None:
            field, unit = self.event_time
            tables, newest = event_time.judge_split(
                tables,
                field,
                unit,
                split.bounds,
                raw=lambda i: pa.array(
                    values[i * ARROW_BATCH_ROWS : (i + 1) * ARROW_BATCH_ROWS], pa.binary()
                ),
                after=lambda: event_time.times_after(
                    lambda lo, hi: self._fetch(replace(split, start=lo, end=hi))[0],
                    split.end,
                    split.through,
                    field,
                    unit,
                    split.bounds,
                ),
            )
        key = f"{split.topic}:{split.partition}"
        if self.staging is not None and tables:
            stage(self.staging, key, split.start, split.end, pa.concat_tables(tables))
        accounting.report(
            self.options, key, split.start, split.partition, tables, newest, ends_run=split.ends_run
        )
        for table in tables:
            yield from table.to_batches()


def _check_keyed_by(field: str, topics: list[str], schema: StructType) -> None:
    if len(topics) != 1:
        raise ConfigError(
            f"KafkaSource(keyed_by={field!r}) reads one topic (its partitions hold the key "
            f"groups of a job's state partitions), not {topics or 'a pattern'}"
        )
    if field not in schema.fieldNames():
        raise ConfigError(
            f"KafkaSource(keyed_by={field!r}): not a field of the schema {schema.fieldNames()}"
        )
    kind = schema[field].dataType.simpleString()
    if kind not in ("string", "bigint"):
        raise ConfigError(
            f"KafkaSource(keyed_by={field!r}) is a {kind} field; records are placed by the "
            f"key group of a string or an integer field"
        )


def _sample(consumer: Any, end: int) -> Iterator[tuple[int, bytes | None]]:
    """(offset, value) of the assigned partition's records up to ``end`` (committed ones)."""
    from confluent_kafka import KafkaError

    deadline = time.monotonic() + READ_TIMEOUT_S
    while time.monotonic() < deadline:
        for m in consumer.consume(PLACEMENT_SAMPLE, 0.1):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    return
                raise ConfigError(f"Kafka read for the placement check: {err}")
            if m.offset() >= end:
                return
            yield m.offset(), m.value()
            if m.offset() == end - 1:
                return
    raise ConfigError(f"Kafka read for the placement check: offsets up to {end} not read")
