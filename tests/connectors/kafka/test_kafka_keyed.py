"""Kafka topics placed by a job's key (``KafkaSource(keyed_by=...)``, ``KafkaSink(partition_by=
...)``): read, decoded and processed in one task per partition without a shuffle, on Apache
Kafka; what the job cannot see of its producers checked at start, per record and per batch."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest
from pyspark.sql.streaming.datasource import ReadAllAvailable

from stateful_runtime.checkpoints.keyed import key_partition
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.kafka.sink import KafkaSink
from stateful_runtime.connectors.kafka.source import KafkaSource, KafkaStreamReader
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.planner import plan
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import EXAMPLES
from tests.operators.payments import T0, H, assert_deduplicated, dedup_lines, payment

pytestmark = pytest.mark.slow

SCHEMA = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def _rows(lines: list[bytes]) -> pa.Table:
    return pa.Table.from_pylist([json.loads(line) for line in lines])


def _settings(kafka, tmp_path, topic: str) -> dict[str, str]:
    return {
        "source.kind": "kafka",
        "source.bootstrap_servers": kafka.bootstrap,
        "source.topic": topic,
        "source.keyed_by": "txn_id",
        "source.log_dir": str(tmp_path / "log"),  # the deduplicated payments' topic
        "checkpoint.dir": str(tmp_path / "ck"),
        "parallelism": "2",
        # Several batches a run: the partitions must stay aligned in event time within each
        # (plan-time alignment), or a TTL cleanup driven by the faster partition removes a
        # txn's state before the slower one's duplicate comes, and it is emitted again.
        "source.max_records_per_batch": "500",
    }


def _run(settings: dict[str, str]) -> tuple[int, str, str, str]:
    """The deduplicator's bounded run: exit code, Spark's last plan, what it said, and why
    its plan reads as it does."""
    out = io.StringIO()
    loaded = load_job_file(EXAMPLES / "deduplicate_payments.py", settings)
    reason = plan(loaded.job).queries[0].reason
    runner = JobRunner(loaded, available_now=True, out=out)
    code = runner.run()
    execution = runner.runs[0].query._jsq.streamingQuery().lastExecution()
    spark_plan = execution.executedPlan().toString() if execution is not None else ""
    return code, spark_plan, out.getvalue(), reason


def test_a_topic_placed_by_the_sink_is_read_without_a_shuffle_and_checked(
    spark, kafka, tmp_path, capsys
):
    """The sink places each payment by the key group of its txn_id; the deduplicator keyed by
    txn_id with as many state partitions reads each partition in one Python task (no exchange,
    no mapInArrow in Spark's plan) across a restart, and its output equals the oracle's. A
    record placed otherwise, older than what the start looks at, stops the batch in its task,
    committing nothing. Given a third partition, the job reads the topic with a shuffle (the
    plan says why) and its state is the same: the output still equals the oracle."""
    topic = "pay-by-txn"
    lines = dedup_lines()
    sink = KafkaSink(kafka.bootstrap, topic, partitions=2, partition_by="txn_id")
    sink.open("producer", "q")
    settings = _settings(kafka, tmp_path, topic)
    for batch, part in enumerate((lines[:1_500], lines[1_500:2_500])):
        sink.write_batch(_rows(part), batch)
        code, spark_plan, out, reason = _run(settings)
        assert code == 0, out
        assert "without a shuffle" in reason, reason
        # the operator inside the source's read: no exchange, no second Python worker
        assert "MapInArrow" not in spark_plan and "Exchange" not in spark_plan, spark_plan
        assert "the operator in the read's own Python worker" in reason, reason
    sink.close()
    placed = {m.partition(): m for m in kafka.read(topic)}
    assert placed.keys() == {0, 1}
    for m in kafka.read(topic):
        assert m.partition() == key_partition(json.loads(m.value())["txn_id"], 2)
        assert m.key() == json.loads(m.value())["txn_id"].encode()
    assert_deduplicated(tmp_path / "log", lines[:2_500])

    # A payment of t1 in the partition that does not own t1's key group, then enough placed
    # records after it that the start's look at the newest ones does not see it.
    wrong = 1 - key_partition("t1", 2)
    stray = payment(99_999, "M1", T0 + 60 * H, txn="t1")
    filler = [
        payment(100_000 + i, "M1", T0 + 60 * H + i, txn=f"x{i}")
        for i in range(2_000)
        if key_partition(f"x{i}", 2) == wrong
    ]
    assert len(filler) > 200
    kafka.produce(topic, [(b"t1", stray, wrong)] + [(None, f, wrong) for f in filler])
    query = QueryLayout(tmp_path / "ck" / "deduplicator")
    last = query.last_committed()
    code, _, out, _ = _run(settings)
    said = capsys.readouterr().err
    assert code != 0 and "not placed by the job's key" in said, out + said
    assert query.last_committed() == last


def test_a_topic_given_more_partitions_is_read_with_a_shuffle_and_the_state_carries_on(
    spark, kafka, tmp_path
):
    """A keyed topic whose partition count grows under a job: the running job's next batch is
    refused by name (its producers now place keys elsewhere); restarted, the job reads the
    topic with a shuffle (its state partitions no longer match) and its output equals the
    oracle's: the state is the same whichever path read it."""
    from confluent_kafka.admin import NewPartitions

    topic = "pay-grows"
    lines = dedup_lines()
    sink = KafkaSink(kafka.bootstrap, topic, partitions=2, partition_by="txn_id")
    sink.open("producer", "q")
    sink.write_batch(_rows(lines[:1_500]), 0)
    sink.close()
    settings = _settings(kafka, tmp_path, topic)
    code, _, out, reason = _run(settings)
    assert code == 0 and "without a shuffle" in reason, out
    reader = KafkaStreamReader(
        {
            **KafkaSource(kafka.bootstrap, topic, SCHEMA, keyed_by="txn_id").options(),
            "by_partition": "2",
        }
    )
    start = reader.initialOffset()
    reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))  # as planned

    admin = kafka.admin()  # kept alive until the future resolves
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(30)
    with pytest.raises(ConfigError, match="has 3 partitions, the job started reading it with 2"):
        reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    grown = KafkaSink(kafka.bootstrap, topic, partition_by="txn_id")
    grown.open("producer", "q")  # (the same transactional ids: it fences the first)
    grown.write_batch(_rows(lines[1_500:]), 1)
    grown.close()
    assert {m.partition() for m in kafka.read(topic)} == {0, 1, 2}
    code, spark_plan, out, reason = _run(settings)
    assert code == 0, out
    assert "into 3 partitions, the job has 2 state partitions" in reason, reason
    assert "Exchange" in spark_plan
    assert_deduplicated(tmp_path / "log", lines)


def test_a_topic_placed_by_kafkas_partitioner_is_refused_at_start_by_name(kafka, tmp_path):
    """Producers that key records by txn_id but leave the partition to Kafka's partitioner
    place keys elsewhere than their key groups: a job declaring the topic keyed_by txn_id is
    refused before it reads anything, saying how to produce it or to drop the declaration."""
    topic = "pay-by-kafka"
    kafka.create_topic(topic, 2)
    lines = dedup_lines()[:300]
    kafka.produce(topic, [(json.loads(line)["txn_id"].encode(), line) for line in lines])
    source = KafkaSource(kafka.bootstrap, topic, SCHEMA, keyed_by="txn_id")
    with pytest.raises(ConfigError, match="its producers place records otherwise") as refused:
        source.check_placement(2)
    assert "KafkaSink(partition_by='txn_id')" in str(refused.value)
    assert "source.keyed_by" in str(refused.value)
    for bad, why in [
        ({"topics": ["a", "b"]}, "reads one topic"),
        ({"topics": None, "pattern": "pay-.*"}, "reads one topic"),
        ({"keyed_by": "amount"}, "not a field"),
        ({"keyed_by": "amount_paise", "schema": {**SCHEMA, "amount_paise": float}}, "a double"),
    ]:
        args = {"topics": topic, "schema": SCHEMA, "keyed_by": "txn_id", **bad}
        with pytest.raises(ConfigError, match=why):
            KafkaSource(kafka.bootstrap, **args)
