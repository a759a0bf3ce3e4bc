"""Kafka source on a real broker and a real Spark: offsets, errors, secrets, idleness, lag."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest

from stateful_runtime import StreamJob, WatermarkStrategy
from stateful_runtime.connectors.base import read_stream
from stateful_runtime.connectors.kafka.source import KafkaSource, KafkaStreamReader
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.job import CheckpointConfig
from stateful_runtime.masking import mask_config
from stateful_runtime.planner import plan
from stateful_runtime.runtime.explain import explain
from stateful_runtime.runtime.progress import batch_health

SCHEMA = {"id": int, "ts_ms": int}
BASE = 1_767_225_600_000
SECRET = "hunter2-very-secret"


def _rec(i: int, ts: int) -> bytes:
    return json.dumps({"id": i, "ts_ms": ts}).encode()


def test_starting_offsets_discovery_and_errors(kafka, monkeypatch):
    kafka.create_topic("so", 2)
    kafka.produce("so", [(None, _rec(i, BASE + i), i % 2, BASE + i) for i in range(10)])

    def initial(starting):
        src = KafkaSource(kafka.bootstrap, "so", SCHEMA, starting_offsets=starting)
        return KafkaStreamReader(src.options()).initialOffset()

    assert initial("earliest") == {"so:0": 0, "so:1": 0}
    assert initial("latest") == {"so:0": 5, "so:1": 5}
    assert initial(f"timestamp:{BASE + 4}") == {"so:0": 2, "so:1": 2}
    assert initial('{"so": {"1": 3}}') == {"so:0": 0, "so:1": 3}
    with pytest.raises(ConfigError, match="outside the partition's range"):
        initial({"so": {"0": 99}})
    with pytest.raises(ConfigError, match="not understood"):
        KafkaSource(kafka.bootstrap, "so", SCHEMA, starting_offsets="yesterday")
    with pytest.raises(ConfigError, match="do not exist"):
        KafkaSource(kafka.bootstrap, "nope", SCHEMA).check()
    # An unreachable cluster is waited for METADATA_TIMEOUT_S (10 s); 1 s shows the same.
    monkeypatch.setattr("stateful_runtime.connectors.kafka.client.METADATA_TIMEOUT_S", 1.0)
    with pytest.raises(ConfigError, match="cannot reach the cluster at 127.0.0.1:1 within 1 s"):
        KafkaSource("127.0.0.1:1", "so", SCHEMA).check()
    # What a bounded run reads at most (its JIT's size): the topics' records, or None.
    assert KafkaSource(kafka.bootstrap, "so", SCHEMA).records_held() == 10
    assert KafkaSource("127.0.0.1:1", "so", SCHEMA).records_held() is None
    # A running job's reader waits for a cluster out of reach (a broker restarting), asking
    # again with a new client, before it stops the job saying a restart resumes exactly.
    monkeypatch.setattr("stateful_runtime.connectors.kafka.source.LEADER_WAIT_S", 1.5)
    away = KafkaStreamReader(KafkaSource("127.0.0.1:1", "so", SCHEMA).options())
    with pytest.raises(ConfigError, match="within 2 s .*a restart resumes exactly"):
        away._partitions()
    # Pattern subscription sees a topic (and partitions) created later.
    reader = KafkaStreamReader(
        KafkaSource(kafka.bootstrap, pattern="so.*", schema=SCHEMA).options()
    )
    start = reader.initialOffset()
    kafka.create_topic("so-later", 1)
    kafka.produce("so-later", [(None, _rec(0, BASE), 0)])
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    assert reader.latestOffset(start, ReadAllAvailable())["so-later:0"] == 1


def test_secrets_never_in_describe_offsets_explain_or_registry(kafka, tmp_path, monkeypatch):
    kafka.create_topic("sec", 1)
    src = KafkaSource(
        kafka.bootstrap,
        "sec",
        SCHEMA,
        client_config={"sasl.password": SECRET, "ssl.key.password": SECRET},
    )
    job = StreamJob("sec-job", CheckpointConfig(str(tmp_path / "ck")))
    job.from_source(
        src, WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts_ms"), name="s"
    ).sink_to(__import__("stateful_runtime").LogSink(str(tmp_path / "log"), "o"))
    shown = explain(plan(job))
    assert SECRET not in shown and SECRET not in src.describe()
    # The planner says which reader reads the topic, and why not Spark's connector.
    assert "read by the runtime's reader" in shown and "not Spark's Kafka connector" in shown
    assert SECRET not in json.dumps(KafkaStreamReader(src.options()).initialOffset())
    assert SECRET not in json.dumps(mask_config({"kafka.sasl.password": SECRET}))
    assert mask_config({"kafka.sasl.password": "env:PW"}) == {"kafka.sasl.password": "env:PW"}
    # Every registry write masks the config, whoever writes it (runner or launcher).
    from stateful_runtime.runtime import registry

    monkeypatch.setenv("SRT_HOME", str(tmp_path / "home"))
    registry.write("sec-job", {"job": "sec-job", "config": {"kafka.sasl.password": SECRET}})
    assert SECRET not in (tmp_path / "home" / "jobs" / "sec-job.json").read_text()


@pytest.mark.parametrize("idleness", [timedelta(seconds=1), None], ids=["idleness", "none"])
def test_idle_partition_does_not_stall_windows(spark, kafka, tmp_path, idleness):
    """Partition 1 has 2 s of events, then silence; partition 0 has 5 minutes. With per-partition
    alignment, partition 0 waits for partition 1 (its records would else become late); with
    idleness partition 1 stops holding it back after 1 s, without it the windows stall."""
    from pyspark.sql import functions as F

    topic = f"idle-{'on' if idleness else 'off'}"
    kafka.create_topic(topic, 2)
    kafka.produce(
        topic,
        [(None, _rec(i, BASE + i * 100), 1) for i in range(20)]
        + [(None, _rec(i, BASE + i * 1000), 0) for i in range(300)],
    )
    src = KafkaSource(kafka.bootstrap, topic, SCHEMA, max_records_per_batch=40)
    wm = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
        "ts_ms"
    )
    if idleness:
        wm = wm.with_idleness(idleness)
    df = (
        read_stream(spark, *src.data_source(str(tmp_path / "stage"), watermark=wm))
        .filter(F.col("_error").isNull())
        .withColumn("et", F.timestamp_millis("ts_ms"))
        .withWatermark("et", "5 seconds")
        .groupBy(F.window("et", "1 minute"))
        .count()
    )
    closed: list = []
    q = (
        df.writeStream.outputMode("append")
        .foreachBatch(lambda d, _: closed.extend(r[0].start for r in d.collect()))
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(processingTime="0.2 seconds")
        .start()
    )
    try:
        deadline = time.monotonic() + 90
        while len(closed) < 4 and time.monotonic() < deadline:
            time.sleep(0.2)
            assert q.isActive, f"the query failed: {q.exception()}"
            if not idleness and any(
                json.loads(p["sources"][0]["endOffset"] or "{}").get(f"{topic}:1") == 20
                for p in q.recentProgress
            ):
                # Partition 1 fully read, partition 0 held back: give it 8 s (8x the
                # idleness of the other case) to show it does not move.
                deadline = min(deadline, time.monotonic() + 8)
        progress = [p for p in q.recentProgress if p["numInputRows"]][-1]
    finally:
        q.stop()
    health = batch_health(progress)
    if idleness:
        assert len(closed) == 4  # minutes 0-3 closed; minute 4 waits for the watermark
    else:
        assert closed == []  # stalled behind the silent partition, as Flink without idleness
        assert health.lag_by_partition is not None
        assert health.lag_by_partition[f"{topic}:0"] > 200
        assert health.lag_records == sum(health.lag_by_partition.values())


def test_splits_read_exactly_their_committed_records_around_transaction_markers(kafka):
    """Transactions put control records (markers) between data records, and aborted records
    are skipped by read_committed: a split reads every committed record in its offset range,
    no more, stops at its end even when the range ends on a marker, and a reused consumer
    reads the next split from where it is told (the source's bulk read path)."""
    from confluent_kafka import Producer
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    kafka.create_topic("txn", 1)
    p = Producer({"bootstrap.servers": kafka.bootstrap, "transactional.id": "t-src"})
    p.init_transactions(10)
    committed, i = [], 0
    for t in range(12):
        p.begin_transaction()
        rows = [_rec(i + k, BASE + i + k) for k in range(1 + t % 4)]
        for r in rows:
            p.produce("txn", r, partition=0)
        i += len(rows)
        if t % 3 == 2:
            p.abort_transaction(10)
        else:
            p.commit_transaction(10)
            committed += [json.loads(r)["id"] for r in rows]

    reader = KafkaStreamReader(KafkaSource(kafka.bootstrap, "txn", SCHEMA).options())
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    assert end["txn:0"] > len(committed)  # markers and aborted records take offsets
    # Every cut of the range into two splits reads each committed record exactly once.
    for cut in range(0, end["txn:0"] + 1, 3):
        ids = []
        for lo, hi in ((0, cut), (cut, end["txn:0"])):
            (split,) = reader.partitions({"txn:0": lo}, {"txn:0": hi}) or [None]
            if split is None:
                continue
            for batch in reader.read(split):
                assert all(lo <= o < hi for o in batch.column("_offset").to_pylist())
                ids += batch.column("id").to_pylist()
        assert ids == committed, cut


def test_records_deleted_before_the_job_read_them_are_refused_by_name(kafka, capfd):
    """Records the job had not read, deleted from the topic (its retention while the job was
    stopped; here DeleteRecords) refuse the batch, naming the partition and the offsets lost,
    when it is planned and when a read meets the gap (deleted after the plan); with
    ``fail_on_data_loss=False`` the job goes on from the oldest record left and says what it
    skipped. Never silently."""
    from confluent_kafka import TopicPartition
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    from stateful_runtime.exceptions import SourceDataLostError

    kafka.create_topic("retained", 2)
    kafka.produce("retained", [(None, _rec(i, BASE + i), i % 2, BASE + i) for i in range(20)])
    reader = KafkaStreamReader(KafkaSource(kafka.bootstrap, "retained", SCHEMA).options())
    start = reader.initialOffset()
    end = reader.latestOffset(start, ReadAllAvailable())
    [planned] = [s for s in reader.partitions(start, end) if s.partition == 1]
    admin = kafka.admin()
    gone = admin.delete_records([TopicPartition("retained", 1, 4)])
    [f.result(10) for f in gone.values()]
    assert KafkaSource(kafka.bootstrap, "retained", SCHEMA).records_held() == 16  # 4 deleted

    with pytest.raises(SourceDataLostError, match=r"retained:1 offsets 0\.\.3 \(4 records\)"):
        reader.partitions(start, end)
    with pytest.raises(SourceDataLostError, match=r"retained:1 offsets 0\.\.3"):
        list(reader.read(planned))  # deleted after the batch was planned

    lenient = KafkaStreamReader(
        KafkaSource(kafka.bootstrap, "retained", SCHEMA, fail_on_data_loss=False).options()
    )
    splits = {s.partition: s for s in lenient.partitions(start, end)}
    assert (splits[0].start, splits[1].start) == (0, 4)
    ids = [i for s in splits.values() for b in lenient.read(s) for i in b.column("id").to_pylist()]
    assert sorted(ids) == [i for i in range(20) if i % 2 == 0 or i >= 8]
    assert "retained:1 offsets 0..3 were deleted before the job read them" in capfd.readouterr().err


def test_implausible_event_times_are_dead_letters_of_the_kafka_source(spark, kafka, tmp_path):
    """Issue 23 on Kafka: a year-2100 and a pre-1970 event time are refused by the read tasks
    with the bound in the reason (judged by the batch's logged processing time), the good
    records pass, and the refused ones are staged for the dead-letter topic."""
    import pyarrow.ipc as ipc

    from stateful_runtime.connectors.dead_letters import staged

    topic = "implausible"
    kafka.create_topic(topic, 2)
    future, negative = _rec(100, 4_102_444_800_000), _rec(101, -1000)
    kafka.produce(
        topic,
        [(None, _rec(i, BASE + i * 1000), i % 2) for i in range(40)]
        + [(None, future, 0), (None, negative, 1)],
    )
    wm = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
        "ts_ms"
    )
    ck, stage = tmp_path / "ck", tmp_path / "stage"
    rows: list = []
    source = KafkaSource(kafka.bootstrap, topic, SCHEMA)
    q = (
        read_stream(spark, *source.data_source(str(stage), watermark=wm, query_checkpoint=str(ck)))
        .writeStream.foreachBatch(
            lambda d, _: rows.extend(d.select("id", "_error", "_raw").collect())
        )
        .option("checkpointLocation", str(ck))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination(120)
    assert q.exception() is None
    errors = {bytes(r["_raw"]): r["_error"] for r in rows if r["_error"] is not None}
    assert sorted(errors) == sorted([future, negative])
    assert "2100-01-01T00:00:00Z (4102444800000 ms) is 73." in errors[future]
    assert "ahead of the batch's processing time" in errors[future]
    assert errors[negative] == (
        "event time 'ts_ms' 1969-12-31T23:59:59Z (-1000 ms) is before the floor "
        "1970-01-01T00:00:00Z"
    )
    assert sorted(r["id"] for r in rows if r["_error"] is None) == list(range(40))
    dead = []
    for *_, path in staged(str(stage)):
        with ipc.open_file(str(path)) as f:
            dead += f.read_all().column("_raw").to_pylist()
    assert sorted(dead) == sorted([future, negative])


def test_a_record_without_a_value_is_read_as_a_bad_record_at_its_offset(kafka):
    """A tombstone (a record whose value is null: a compacted topic's delete) among records
    reads as an empty record that fails the decode, at its own offset, and the records around
    it read as they are (the bulk read takes values out of a fetch whole)."""
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    kafka.create_topic("tomb", 1)
    kafka.produce("tomb", [(b"k", None if i == 3 else _rec(i, BASE + i)) for i in range(6)])
    reader = KafkaStreamReader(KafkaSource(kafka.bootstrap, "tomb", SCHEMA).options())
    start = reader.initialOffset()
    [split] = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))
    rows = [r for b in reader.read(split) for r in b.to_pylist()]
    assert [r["_offset"] for r in rows] == list(range(6))
    assert [r["id"] for r in rows] == [0, 1, 2, None, 4, 5]
    assert (rows[3]["_error"], rows[3]["_raw"]) == ("empty record", b"")
    assert [r["_error"] for r in rows[:3] + rows[4:]] == [None] * 5
