"""What the Kafka source, the Kafka sink and the Kafka dead-letter topic share.

* Client settings: ``bootstrap.servers`` plus pass-through librdkafka settings (SASL/SSL...).
  Which settings are secret, and masking them, is :mod:`stateful_runtime.masking`' business:
  ``mask_config`` masks them for ``describe()``, logs and error messages, and every secret
  value read here is remembered, so it is masked wherever it shows up in text later. Spark
  options carry them, but offsets, registry entries and ``explain()`` never do.
* :func:`check_cluster`: reachability and topic checks with a message that says what to do.
* :class:`CommitMarkers`: the last committed batch of each transactional producer, kept in a
  small compacted control topic and written in the *same* transaction as the data, so "data
  committed" and "batch marked committed" are one atomic fact (see ARCHITECTURE.md, Kafka sink).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from stateful_runtime import masking
from stateful_runtime.exceptions import ConfigError

METADATA_TIMEOUT_S = 10.0
# A partition's leadership moving (a broker shut down, a leader elected) answers offset
# requests with these for a moment: a new leader answers OFFSET_NOT_AVAILABLE until its high
# watermark has caught up.
LEADER_MOVING = frozenset(
    {
        5,  # LEADER_NOT_AVAILABLE
        6,  # NOT_LEADER_OR_FOLLOWER
        7,  # REQUEST_TIMED_OUT
        74,  # FENCED_LEADER_EPOCH
        75,  # UNKNOWN_LEADER_EPOCH
        78,  # OFFSET_NOT_AVAILABLE
    }
)
# The cluster out of reach for a moment (a broker restarting, the network): librdkafka's own
# codes for a transport failure, a request that timed out, every broker down and no partition
# leader known (_NOENT, "No leaders found": the admin client's answer while they are down), and
# Kafka's NETWORK_EXCEPTION.
UNREACHABLE = frozenset({-195, -185, -187, -156, 13})
# How long a moving leadership, or a cluster out of reach, is asked again before its error
# stands (Kafka's own clients wait default.api.timeout.ms, 60 s, the same way).
LEADER_WAIT_S = 60.0


def _code(exc: Exception) -> int | None:
    err: Any = exc.args[0] if exc.args else None
    return err.code() if hasattr(err, "code") else None


def leader_moving(exc: Exception) -> bool:
    """Whether ``exc`` (a KafkaException) is a partition's leadership moving."""
    return _code(exc) in LEADER_MOVING


def passing(exc: Exception) -> bool:
    """Whether ``exc`` (a KafkaException) is a state of the cluster that passes: a partition's
    leadership moving, or the cluster out of reach for a moment."""
    code = _code(exc)
    return code in LEADER_MOVING or code in UNREACHABLE


def watermark_offsets(consumer: Any, tp: Any) -> tuple[int, int]:
    """``consumer.get_watermark_offsets(tp)`` (low, high), asked again with backoff for up to
    :data:`LEADER_WAIT_S` while the partition's leadership moves; any other error, or one
    that lasts, stands. Without it a job whose dead letters or sink markers were read at the
    moment a leader moved stopped (found by the cluster trial of tests/faults)."""
    from confluent_kafka import KafkaException

    deadline, pause = time.monotonic() + LEADER_WAIT_S, 0.1
    while True:
        try:
            return consumer.get_watermark_offsets(tp, timeout=METADATA_TIMEOUT_S)
        except KafkaException as exc:
            if not leader_moving(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)  # backoff before asking a moving leadership again
        pause = min(pause * 2, 2.0)


CONTROL_SUFFIX = ".srt-commits"


def client_config(bootstrap_servers: str, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    if not bootstrap_servers:
        raise ConfigError(
            "bootstrap_servers must be set, e.g. '127.0.0.1:9092' "
            "(--set source.bootstrap_servers=HOST:PORT)"
        )
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers}
    for k, v in (extra or {}).items():
        if k in ("bootstrap.servers", "transactional.id", "isolation.level", "group.id"):
            raise ConfigError(f"client setting {k!r} is set by the runtime; remove it")
        conf[str(k)] = v
    return conf


def admin_client(config: Mapping[str, Any], *, what: str = "source") -> Any:
    """An ``AdminClient`` for ``config``; ConfigError if the settings are invalid."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        # confluent-kafka takes a logger object, which its type stubs do not allow for.
        return AdminClient({**config, "logger": _QUIET})  # type: ignore[dict-item]
    except KafkaException as exc:
        raise ConfigError(
            f"Kafka {what}: invalid client settings ({masking.mask_text(str(exc))}); check the "
            f"security.*/sasl.*/ssl.* settings against your cluster's"
        ) from None


def check_cluster(
    config: Mapping[str, Any],
    topics: list[str] | None = None,
    pattern: str | None = None,
    *,
    what: str = "source",
    admin: Any = None,
    wait_s: float = 0.0,
) -> dict[str, int]:
    """Partition counts of ``topics`` (or of topics matching ``pattern``); ConfigError if the
    cluster cannot be reached, the security settings are wrong or a topic is missing.
    ``admin``: a client to reuse (a new connection per call costs tens of milliseconds).
    ``wait_s``: a running job's wait for a cluster out of reach (a broker restarting), asked
    again by a new client with backoff; at a job's start, none."""
    import re

    from confluent_kafka import KafkaException

    servers = config["bootstrap.servers"]
    if admin is None:
        admin = admin_client(config, what=what)
    deadline, pause = time.monotonic() + wait_s, 0.1
    while True:
        try:
            # list_topics(topic) would auto-create it on some brokers: list everything.
            meta = admin.list_topics(timeout=METADATA_TIMEOUT_S)
            break
        except KafkaException as exc:
            if time.monotonic() + pause > deadline:
                raise ConfigError(
                    f"Kafka {what}: cannot reach the cluster at {servers} within "
                    f"{METADATA_TIMEOUT_S + wait_s:.0f} s ({masking.mask_text(str(exc))}). "
                    + (
                        "The job stops with nothing of the batch committed; once the "
                        "brokers are back, a restart resumes exactly"
                        if wait_s
                        else "Check bootstrap_servers, that the brokers are up, and the "
                        "security.protocol/sasl.* settings; nothing was read or written"
                    )
                ) from None
        time.sleep(pause)
        pause = min(pause * 2, 2.0)
        admin = admin_client(config, what=what)
    found = {
        t: len(m.partitions)
        for t, m in meta.topics.items()
        if m.error is None and not t.startswith("__")
    }
    if pattern is not None:
        rx = re.compile(pattern)
        return {t: n for t, n in found.items() if rx.fullmatch(t)}
    missing = [t for t in topics or [] if t not in found]
    if missing:
        raise ConfigError(
            f"Kafka {what}: topic(s) {missing} do not exist on {servers}; create them (e.g. "
            f"kafka-topics --create --topic {missing[0]} --partitions N) or fix the topic name"
        )
    return {t: found[t] for t in topics or []}


class _Quiet:
    """A logger for librdkafka that drops its connection chatter (errors surface as
    exceptions with our own message)."""

    def log(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        return self.log


_QUIET = _Quiet()


def quiet(config: Mapping[str, Any]) -> dict[str, Any]:
    return {**config, "logger": _QUIET}


def ensure_topic(
    config: Mapping[str, Any],
    topic: str,
    partitions: int,
    topic_config: Mapping[str, str] | None = None,
) -> int:
    """Create ``topic`` if it does not exist; returns its partition count."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(quiet(config))
    meta = admin.list_topics(timeout=METADATA_TIMEOUT_S)
    if topic in meta.topics and meta.topics[topic].error is None:
        return len(meta.topics[topic].partitions)
    fut = admin.create_topics([NewTopic(topic, partitions, -1, config=dict(topic_config or {}))])[
        topic
    ]
    try:
        fut.result(METADATA_TIMEOUT_S)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
    _await_leaders(admin, topic)
    return partitions


def _await_leaders(admin: Any, topic: str) -> None:
    """Wait until the brokers' metadata gives every partition of a topic just created a
    leader: the controller answers CreateTopics before then, and a client asking a partition's
    offsets in between is told "Unknown partition"."""
    import time

    deadline = time.monotonic() + METADATA_TIMEOUT_S
    while True:
        meta = admin.list_topics(topic, timeout=METADATA_TIMEOUT_S).topics.get(topic)
        if (
            meta is not None
            and meta.error is None
            and meta.partitions
            and all(p.leader >= 0 and p.error is None for p in meta.partitions.values())
        ):
            return
        if time.monotonic() > deadline:
            return  # what the caller asks next says what is wrong, by name
        time.sleep(0.05)


def topic_max_message_bytes(config: Mapping[str, Any], topic: str) -> int | None:
    """The topic's ``max.message.bytes`` (the largest record batch the broker appends to it),
    read with DescribeConfigs; None when the broker does not answer it (then only the
    producer's ``message.max.bytes`` is checked before a record is produced)."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType

    admin = AdminClient(quiet(config))
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = admin.describe_configs([resource])[resource].result(METADATA_TIMEOUT_S)
        value = entries["max.message.bytes"].value
        return int(value) if value not in (None, "") else None
    except (KafkaException, KeyError, ValueError, TimeoutError):
        return None


class CommitMarkers:
    """Last committed batch per transactional producer, from the control topic.

    The control topic ``<topic>.srt-commits`` (compacted, one partition) holds records keyed by
    transactional id whose value is ``{"batch": N, ...}``. Each is written inside the producer's
    transaction with the data of batch N, so a read_committed reader sees the marker iff it
    sees the data.
    """

    def __init__(self, config: Mapping[str, Any], topic: str) -> None:
        self.config = dict(config)
        self.topic = topic + CONTROL_SUFFIX

    def ensure(self) -> None:
        ensure_topic(
            self.config,
            self.topic,
            1,
            {"cleanup.policy": "compact", "min.compaction.lag.ms": "3600000"},
        )

    def read(self) -> dict[str, dict[str, Any]]:
        """``{transactional id: last committed marker}``. Call after ``init_transactions``
        of the reading producer: that aborts what a zombie left open, so the read ends."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        consumer = Consumer(
            quiet(
                {
                    **self.config,
                    "group.id": "srt-commit-markers",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                    "allow.auto.create.topics": False,
                }
            )
        )
        try:
            tp = TopicPartition(self.topic, 0)
            low, high = watermark_offsets(consumer, tp)
            out: dict[str, dict[str, Any]] = {}
            if high <= low:
                return out
            consumer.assign([TopicPartition(self.topic, 0, low)])
            while True:
                msg = consumer.poll(METADATA_TIMEOUT_S)
                if msg is None:
                    raise TimeoutError(f"reading {self.topic} timed out")
                if error := msg.error():
                    if error.code() == KafkaError._PARTITION_EOF:
                        return out
                    raise RuntimeError(str(error))
                key, value = msg.key(), msg.value()
                if key is not None and value is not None:
                    out[key.decode()] = json.loads(value)
                if (msg.offset() or 0) >= high - 1:
                    return out
        finally:
            consumer.close()

    def record(self, producer_id: str, marker: Mapping[str, Any]) -> tuple[bytes, bytes]:
        return producer_id.encode(), json.dumps(dict(marker), separators=(",", ":")).encode()


# Job-file keys holding librdkafka settings: ``kafka.<setting>``; a value ``env:NAME`` is read
# from the environment when the job starts, so the secret is not in the job's config.
CLIENT_PREFIX = "kafka."


def client_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """librdkafka settings from job-file keys ``kafka.*`` (``env:NAME`` values resolved)."""
    out = {}
    for k, v in config.items():
        if not k.startswith(CLIENT_PREFIX) or v in (None, ""):
            continue
        out[k[len(CLIENT_PREFIX) :]] = masking.resolve(k, v)
    return out


def produce(producer: Any, topic: str, **kwargs: Any) -> None:
    """Produce one record, waiting for room when the local queue is full."""
    while True:
        try:
            producer.produce(topic, **kwargs)
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(0.05)
