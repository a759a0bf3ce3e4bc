"""Kafka sink on Apache Kafka: transactions bound to batch ids, fencing, replay."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from stateful_runtime.connectors.kafka.sink import (
    BATCH_HEADER,
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    KafkaSink,
    headers_size,
    record_size,
)
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


# Record size (issue 23: no record blocks the stream): the size the sink computes against what
# confluent-kafka and the broker actually accept or refuse, at the boundary.
# Header names as C strings (confluent-kafka ends a name at a NUL), any other UTF-8.
_NAMES = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=12)
_HEADERS = st.lists(st.tuples(_NAMES, st.binary(max_size=200)), max_size=3)


_RECORDS = st.lists(
    st.tuples(st.one_of(st.none(), st.binary(max_size=300)), _HEADERS, st.integers(-4, 40)),
    min_size=1,
    max_size=12,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limit=st.integers(1_000, 5_000), records=_RECORDS)
def test_record_size_is_exactly_what_the_producer_refuses_past_message_max_bytes(
    kafka, limit, records
):
    """librdkafka refuses a record locally (MSG_SIZE_TOO_LARGE) iff its size as
    ``record_size`` counts it exceeds ``message.max.bytes``: exact, both sides of the line."""
    from confluent_kafka import KafkaError, KafkaException, Producer

    producer = Producer({"bootstrap.servers": kafka.bootstrap, "message.max.bytes": limit})
    for key, headers, slack in records:
        hsize = headers_size(headers)
        value = b"v" * max(0, limit - record_size(key, b"", hsize) + slack // 8)
        try:
            producer.produce("size-local", key=key, value=value, headers=headers or None)
            refused = False
        except KafkaException as exc:
            assert exc.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
            refused = True
        assert refused == (record_size(key, value, hsize) > limit), (key, headers, len(value))
    producer.purge()


# Headers as the runtime writes them (ASCII names).
_ASCII_HEADERS = st.lists(
    st.tuples(
        st.text("abcdefghijklmnopqrstuvwxyz._", min_size=1, max_size=12),
        st.binary(max_size=200),
    ),
    max_size=3,
)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
)
@given(
    records=st.lists(
        st.tuples(
            st.one_of(st.none(), st.binary(max_size=300)), _ASCII_HEADERS, st.integers(-4, 40)
        ),
        min_size=1,
        max_size=12,
    )
)
def test_a_record_within_the_topics_limit_as_counted_is_accepted_by_the_broker(kafka, records):
    """The broker checks a record batch against the topic's max.message.bytes: a record whose
    ``record_size`` plus the batch header fits is appended; one it refuses was counted over,
    and one counted over but appended is within the varints' slack of the limit. (Whether
    the broker appended it is read from the topic's end offset: under pytest, a delivery
    report with an error left a TypeError pending inside confluent-kafka.)"""
    from confluent_kafka import Consumer, Producer, TopicPartition

    if "size-topic" not in kafka.admin().list_topics(timeout=10).topics:
        kafka.create_topic("size-topic", 1, **{"max.message.bytes": "2000"})
    # One record a batch, as the sink's check counts a record alone.
    producer = Producer({"bootstrap.servers": kafka.bootstrap, "batch.size": 1})
    ends = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": "size-topic"})
    tp = TopicPartition("size-topic", 0)
    try:
        for key, headers, slack in records:
            hsize = headers_size(headers)
            value = b"v" * max(0, 2000 - BATCH_OVERHEAD - record_size(key, b"", hsize) + slack)
            size = record_size(key, value, hsize) + BATCH_OVERHEAD
            before = ends.get_watermark_offsets(tp, timeout=10)[1]
            producer.produce("size-topic", key=key, value=value, headers=headers or None)
            assert producer.flush(10) == 0
            appended = ends.get_watermark_offsets(tp, timeout=10)[1] - before
            if size <= 2000:
                assert appended == 1, size
            elif appended:
                assert size - 2000 <= RECORD_OVERHEAD - 7, size  # the varints at their largest
    finally:
        ends.close()


def test_a_record_too_large_for_the_topic_is_named_and_a_batch_of_fitting_ones_goes_through(
    kafka,
):
    """``unstorable`` names the record past the topic's max.message.bytes (size, limit, the
    setting); ``write_batch`` of a window's rows with it stops naming the key and writes
    nothing; many records that each fit are not batched past the topic's limit."""
    topic = "size-sink"
    kafka.create_topic(topic, 1, **{"max.message.bytes": "2000"})
    sink = KafkaSink(kafka.bootstrap, topic, key=("k",))
    sink.open("sizes", "q")
    small = pa.table({"k": [f"k{i}" for i in range(30)], "v": ["x" * 500] * 30})
    assert sink.unstorable(small) == []
    sink.write_batch(small, 0)  # 30 x ~530 bytes: one batch of them would be refused
    assert len(_values(kafka, topic)) == 30
    big = pa.table({"k": ["k0", "huge", "k2"], "v": ["x", "y" * 1950, "z"]})
    [(row, why)] = sink.unstorable(big)
    assert row == 1
    assert "max.message.bytes of 2000" in why and "--add-config max.message.bytes" in why
    size = int(why.split("the record is ")[1].split(" bytes")[0])
    assert size > 2000
    with pytest.raises(SinkError, match=r'key \{"k":"huge"\}.*max.message.bytes of 2000'):
        sink.write_batch(big, 1)
    assert len(_values(kafka, topic)) == 30  # nothing of batch 1
    sink.write_batch(big.take([0, 2]), 1)
    assert len(_values(kafka, topic)) == 32
    sink.close()


def test_a_record_past_the_producers_message_max_bytes_is_named_with_the_setting(kafka):
    sink = KafkaSink(kafka.bootstrap, "size-producer", client_config={"message.max.bytes": 1_500})
    sink.open("sizes2", "q")
    [(row, why)] = sink.unstorable(pa.table({"v": ["a", "b" * 1500]}))
    assert row == 1 and "message.max.bytes of 1500" in why
    assert "the job setting kafka.message.max.bytes" in why
    sink.close()


@pytest.mark.parametrize("delivery", ["exactly_once", "at_least_once"])
def test_a_record_the_check_did_not_foresee_refused_is_a_named_error(kafka, delivery):
    """The topic's limit lowered after the sink read it: the broker refuses the record, and
    the write ends in a SinkError naming the cause and the settings, nothing committed."""
    from confluent_kafka.admin import ConfigResource, ResourceType

    topic = f"size-lowered-{delivery}"
    kafka.create_topic(topic, 1, **{"max.message.bytes": "100000"})
    sink = KafkaSink(kafka.bootstrap, topic, delivery=delivery)
    sink.open(f"sizes-{delivery}", "q")
    lowered = ConfigResource(
        ResourceType.TOPIC, topic, set_config={"max.message.bytes": "2000", "retention.ms": "-1"}
    )
    admin = kafka.admin()  # kept alive until the future resolves
    [future] = admin.alter_configs([lowered]).values()
    future.result(10)
    rows = pa.table({"v": ["x" * 5000]})
    assert sink.unstorable(rows) == []  # the limit as read at open
    with pytest.raises(SinkError, match="too large|Message size too large") as refused:
        sink.write_batch(rows, 0)
    assert "the topic's max.message.bytes" in str(refused.value)
    assert _values(kafka, topic) == []
    sink.close()
