"""Kafka sink on a real broker (noida-db): transactions bound to batch ids, fencing, replay."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from stateful_runtime.connectors.kafka.sink import BATCH_HEADER, KafkaSink
from stateful_runtime.exceptions import SinkError


def _rows(batch: int, n: int = 5) -> pa.Table:
    return pa.table({"k": [f"k{i}" for i in range(n)], "v": [batch * 100 + i for i in range(n)]})


def _values(kafka, topic, committed=True):
    return [
        (json.loads(m.value()), dict(m.headers())[BATCH_HEADER].decode())
        for m in kafka.read(topic, committed=committed)
    ]


def test_transactional_sink_replayed_batch_writes_nothing_and_zombie_is_fenced(kafka):
    topic = "eos-out"
    a = KafkaSink(kafka.bootstrap, topic, key=("k",), partitions=2)
    a.open("job", "q")
    a.write_batch(_rows(0), 0)
    a.write_batch(_rows(1), 1)
    # A restarted driver: same transactional id, last committed batch read from the marker.
    b = KafkaSink(kafka.bootstrap, topic, key=("k",), partitions=2)
    b.open("job", "q")
    assert b.last_committed() == {"job.q.0": 1}
    b.write_batch(_rows(1), 1)  # Spark re-executes batch 1: nothing is written
    # The old instance is a zombie now: fenced, its batch never becomes visible.
    with pytest.raises(SinkError, match="fenced"):
        a.write_batch(_rows(2), 2)
    b.write_batch(_rows(2), 2)
    got = _values(kafka, topic)
    assert sorted(b for _, b in got) == ["0"] * 5 + ["1"] * 5 + ["2"] * 5
    assert sorted(v["v"] for v, b in got if b == "2") == [200, 201, 202, 203, 204]


def test_rewind_after_a_restore_writes_later_batches_again(kafka):
    topic = "eos-rewind"
    a = KafkaSink(kafka.bootstrap, topic)
    a.open("job3", "q")
    for b in range(3):
        a.write_batch(_rows(b), b)
    restored = KafkaSink(kafka.bootstrap, topic)  # restored from a savepoint at batch 0
    restored.open("job3", "q")
    restored.rewind(0)
    assert restored.last_committed() == {"job3.q.0": 0}
    restored.write_batch(_rows(1, n=2), 1)  # re-executed with other boundaries: written
    again = KafkaSink(kafka.bootstrap, topic)
    again.open("job3", "q")
    assert again.last_committed() == {"job3.q.0": 1}
    assert sorted(b for _, b in _values(kafka, topic)) == ["0"] * 5 + ["1"] * 7 + ["2"] * 5


def test_open_transaction_of_a_crashed_driver_is_aborted_on_restart(kafka):
    from confluent_kafka import Producer

    topic = "eos-crash"
    sink = KafkaSink(kafka.bootstrap, topic)
    sink.open("job2", "q")
    sink.write_batch(_rows(0), 0)
    # What a driver killed mid-transaction leaves: records of batch 1 in an open transaction.
    crashed = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "job2.q.0"})
    crashed.init_transactions(10)
    crashed.begin_transaction()
    crashed.produce(topic, value=b'{"half":1}', headers=[(BATCH_HEADER, b"1")], partition=0)
    crashed.flush(10)
    restarted = KafkaSink(kafka.bootstrap, topic)
    restarted.open("job2", "q")  # fences `crashed` and aborts its transaction
    restarted.write_batch(_rows(1), 1)
    assert sorted(b for _, b in _values(kafka, topic)) == ["0"] * 5 + ["1"] * 5
    assert any(v == {"half": 1} for v, _ in _values(kafka, topic, committed=False))


def test_at_least_once_sink_writes_every_execution(kafka):
    sink = KafkaSink(kafka.bootstrap, "alo-out", delivery="at_least_once")
    sink.open("job3", "q")
    sink.write_batch(_rows(0), 0)
    sink.write_batch(_rows(0), 0)  # a replay is written again: at least once
    sink.close()
    assert len(_values(kafka, "alo-out")) == 10
