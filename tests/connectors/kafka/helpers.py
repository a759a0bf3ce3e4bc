"""Apache Kafka for the Kafka tests: one KRaft node on 127.0.0.1 (``platform/kafka-broker.sh``,
the pinned jars of ``platform/jvm-artifacts.sh``), with its data in the test's directory.

A :class:`Broker` can be stopped (SIGTERM), killed (SIGKILL: a crash) and started again on the
same data directory and port: a restart as clients see it, with its records, its transactions
and its producers' epochs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "platform" / "kafka-broker.sh"
JARS = Path(sys.prefix) / "share" / "stateful-runtime" / "jars" / "kafka"


class Client:
    """What a test does with Kafka, through ``bootstrap`` (a node or a cluster); topics get
    ``replicas`` replicas."""

    bootstrap: str
    replicas: int = 1

    def admin(self):
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def create_topic(self, name: str, partitions: int, **config: str) -> None:
        """Topics keep their records for ever unless told: the tests produce records stamped
        with historical event times, which the broker's time retention (7 days, swept every
        few seconds) would delete in the middle of a test."""
        from confluent_kafka.admin import NewTopic

        config.setdefault("retention.ms", "-1")
        admin = self.admin()  # kept alive until the future resolves
        new = NewTopic(name, partitions, self.replicas, config=config)
        admin.create_topics([new])[name].result(30)

    def produce(self, topic: str, records, *, partition_of=None) -> None:
        """records: iterable of (key, value), (key, value, partition) or
        (key, value, partition, timestamp_ms)."""
        from confluent_kafka import Producer

        p = Producer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 5, "enable.idempotence": True}
        )
        for rec in records:
            key, value, *more = rec
            kw = dict(zip(("partition", "timestamp"), more, strict=False))
            while True:
                try:
                    p.produce(topic, key=key, value=value, **kw)
                    break
                except BufferError:
                    p.poll(0.05)
        assert p.flush(30) == 0

    def read(self, topic: str, *, committed: bool = True, timeout: float = 10.0) -> list:
        """Every record of ``topic`` (read_committed unless told), in partition/offset order."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        c = Consumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": "test-reader",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "isolation.level": "read_committed" if committed else "read_uncommitted",
            }
        )
        try:
            meta = c.list_topics(timeout=10).topics[topic]
            parts = sorted(meta.partitions)
            c.assign([TopicPartition(topic, p, 0) for p in parts])
            out, eof = [], set()
            deadline = time.monotonic() + timeout
            while len(eof) < len(parts):
                m = c.poll(1.0)
                if time.monotonic() > deadline:
                    raise AssertionError(f"reading {topic}: no EOF on {set(parts) - eof}")
                if m is None:
                    continue
                if m.error():
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        eof.add(m.partition())
                        continue
                    raise AssertionError(str(m.error()))
                eof.discard(m.partition())
                out.append(m)
            return sorted(out, key=lambda m: (m.partition(), m.offset()))
        finally:
            c.close()


@dataclass
class Broker(Client):
    """One Kafka node (broker and controller) and its process."""

    bootstrap: str
    process: subprocess.Popen
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)  # its SRT_KAFKA_* settings
    replicas: int = 1

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop the broker (SIGTERM: a clean shutdown; SIGKILL: a crash) and wait for it."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)

    def start(self) -> None:
        """Start it again on its data directory (its port, records and transactions)."""
        assert self.process.poll() is not None, "the broker is running"
        self.process = _launch(self.data_dir, self.port, self.env)
        _wait_ready(self)

    @property
    def port(self) -> int:
        return int(self.bootstrap.rsplit(":", 1)[1])


@dataclass
class Cluster(Client):
    """Kafka nodes of one cluster, each broker and controller; topics replicated to all."""

    nodes: list[Broker]

    @property
    def bootstrap(self) -> str:  # type: ignore[override]
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def replicas(self) -> int:  # type: ignore[override]
        return len(self.nodes)

    def node(self, node_id: int) -> Broker:
        return self.nodes[node_id - 1]

    def leader(self, topic: str, partition: int) -> int:
        """The node id leading ``topic``'s ``partition`` now."""
        meta = self.admin().list_topics(topic, timeout=10)
        return meta.topics[topic].partitions[partition].leader

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


def _launch(data_dir: Path, port: int, env: dict[str, str] | None = None) -> subprocess.Popen:
    data_dir.mkdir(parents=True, exist_ok=True)
    log = (data_dir.parent / "kafka.log").open("a")
    return subprocess.Popen(
        ["bash", str(SCRIPT), str(port), str(data_dir)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env={**os.environ, **(env or {})},
    )


def _wait_ready(broker: Broker, timeout: float = 180, brokers: int = 1) -> None:
    """Until the broker answers a metadata request naming ``brokers`` brokers (it may take a
    minute on a loaded machine: two JVM starts, the format's and the broker's)."""
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + timeout
    while True:
        if broker.process.poll() is not None:
            log = broker.data_dir.parent / "kafka.log"
            raise RuntimeError(
                f"Kafka exited with {broker.process.returncode}: {log.read_text()[-3000:]}"
            )
        try:
            meta = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=1)
            if len(meta.brokers) >= brokers:
                return
        except Exception:  # noqa: BLE001 - not listening yet
            pass
        if time.monotonic() > deadline:
            broker.stop(signal.SIGKILL)
            raise RuntimeError(f"Kafka did not answer within {timeout:.0f} s")
        time.sleep(0.1)


def _require_jars() -> None:
    from tests.helpers import require

    require(
        any(JARS.glob("org.apache.kafka.kafka_2.13-*.jar")),
        "Apache Kafka's jars",
        "run platform/bootstrap.sh dev (platform/jvm-artifacts.sh kafka)",
    )


def start_broker(data_dir: Path) -> Broker:
    """Apache Kafka on a free port with its data in ``data_dir``, ready."""
    from tests.helpers import free_port

    _require_jars()
    port = free_port()
    broker = Broker(f"127.0.0.1:{port}", _launch(data_dir, port), data_dir)
    _wait_ready(broker)
    return broker


def start_cluster(root: Path, nodes: int = 3) -> Cluster:
    """A cluster of ``nodes`` Kafka nodes (each broker and controller: a quorum of
    ``nodes`` voters) under ``root/node-<id>``, every internal topic and new topic
    replicated to all of them with min.insync.replicas 2; ready when every node answers
    naming them all."""
    import base64
    import uuid

    from tests.helpers import free_port

    _require_jars()
    ports = [(free_port(), free_port()) for _ in range(nodes)]
    voters = ",".join(f"{i + 1}@127.0.0.1:{c}" for i, (_, c) in enumerate(ports))
    cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
    members = []
    for i, (port, controller) in enumerate(ports):
        env = {
            "SRT_KAFKA_NODE_ID": str(i + 1),
            "SRT_KAFKA_CONTROLLER_PORT": str(controller),
            "SRT_KAFKA_VOTERS": voters,
            "SRT_KAFKA_CLUSTER_ID": cluster_id,
            "SRT_KAFKA_REPLICAS": str(nodes),
        }
        data = root / f"node-{i + 1}" / "data"
        members.append(Broker(f"127.0.0.1:{port}", _launch(data, port, env), data, env, nodes))
    cluster = Cluster(members)
    try:
        for member in members:
            _wait_ready(member, brokers=nodes)
    except BaseException:
        cluster.stop()
        raise
    return cluster
