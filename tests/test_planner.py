"""The planner: which path each query takes and why, and what `explain` says."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

from stateful_runtime import (
    CheckpointConfig,
    LogSource,
    StreamJob,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from stateful_runtime.job import RocksDBMemory
from stateful_runtime.planner import plan
from stateful_runtime.runtime.explain import explain, steps
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.state import TimeDomain
from tests.helpers import EXAMPLES, windowed_job


def test_plan_chooses_native_path_and_explains_why(tmp_path):
    p = plan(windowed_job(tmp_path))
    assert [q.name for q in p.queries] == ["out"]
    assert p.queries[0].dead_letters.sink.topic == "in-dlq"
    main = p.queries[0]
    assert main.path == "native" and main.output_mode == "update"
    assert main.stateful_operators == ["agg"]
    assert main.spark_state  # (its window's state is in Spark's store)
    text = explain(p)
    assert "path: native" in text and "groupBy(window)" in text
    assert "filter v > 0" in text and "bounded out-of-orderness 0:00:02" in text


def test_append_only_sink_gets_window_close_emission(tmp_path):
    q = plan(windowed_job(tmp_path, sink_upsert=False)).queries[0]
    assert q.output_mode == "append"
    assert "when the watermark passes its end" in "\n".join(steps(q))


def test_reduce_runs_on_the_window_operator_with_the_source_fields(tmp_path):
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.testing import window_harness

    EventLog(tmp_path / "log").create_topic("in", 1)
    job = StreamJob("r", CheckpointConfig(str(tmp_path / "ck")))
    stream = job.from_source(
        LogSource(str(tmp_path / "log"), "in", {"k": str, "v": int, "ts": int}),
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts"),
        name="src",
    )
    out = (
        stream.key_by("k")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
        .reduce(lambda a, b: {**a, "v": a["v"] + b["v"]}, name="sum-v")
    )
    out.sink_to(LogSink(str(tmp_path / "log"), "out"))
    q = plan(job).queries[0]
    assert q.path == "window" and "reduce" in q.reason
    assert not q.spark_state  # (the window operator's state is in the worker's RocksDB)
    assert "in the Python worker" in q.reason  # the why names where the state lives
    node = out.node
    h = window_harness(node.assigner, node.parent.keys, node.contents, timestamp_field="ts")
    for ts in (1, 2, 3, 11_000):
        h.process_element({"k": "a", "v": 10, "ts": ts})
    h.process_watermark(20_000)
    assert [(r["v"], r["window_start"].second) for r in h.output] == [(30, 0), (10, 10)]


def test_explain_without_the_topic(spark, tmp_path: Path):
    """`srt explain` plans a job whose source topic does not exist yet; Spark's own plan says
    what is missing instead of failing the command."""
    job = load_job_file(
        EXAMPLES / "upi_per_minute.py",
        {"source.log_dir": str(tmp_path / "no-log"), "checkpoint.dir": str(tmp_path / "ckpt")},
    ).job
    text = explain(plan(job), spark)
    assert "window per-merchant-minute" in text
    assert "Spark plan: not available until the source's topic exists" in text
    assert "srt log create upi-payments" in text
    assert not (tmp_path / "no-log").exists()  # explaining creates nothing


def test_explain_names_where_keyed_state_lives_and_its_memory_settings(tmp_path):
    job = windowed_job(tmp_path)
    job.rocksdb = RocksDBMemory(block_cache_mb=32, write_buffer_mb=8, write_buffers=3)
    text = explain(plan(job))
    assert (
        "state: keyed state in a RocksDB in each Python worker ("
        "state.rocksdb.block_cache_mb=32, state.rocksdb.write_buffer_mb=8, "
        "state.rocksdb.write_buffers=3: at most 56 MiB per worker)"
    ) in text


def test_the_joins_run_on_the_runtimes_operators_and_say_why_not_sparks_join(tmp_path):
    job = load_job_file(EXAMPLES / "merchant_tiers.py", {"source.log_dir": str(tmp_path)}).job
    joins = {q.name: q for q in plan(job).queries if "join on connected streams" in q.reason}
    assert len(joins) == 3  # the temporal, interval and window joins
    for q in joins.values():
        assert q.path == "process"
        assert "not Spark's own stream-stream join" in q.reason and "late side output" in q.reason


def test_only_functions_with_timers_read_event_time_ticks(tmp_path):
    """A query of keyed state in event time reads its timer ticks (a source whose offset
    moves when a timer is behind the watermark, so Spark runs a batch without input) only
    when its function has timers: an ``on_timer`` of the user's own, the window operator's,
    the joins', or TTL's cleanups. None carries the watermark's branch (it re-read each
    batch's shuffle) unless its checkpoint was written with it; one written without ticks
    reads none."""
    expected = {
        "deduplicate_payments.py": {"deduplicator": TimeDomain.EVENT_TIME},  # TTL's cleanups
        "fraud_rules.py": {"fraud-rules": None},  # broadcast state, no timers
        "fraud_rate_limit.py": {"fraud-counter": TimeDomain.EVENT_TIME},
        "payment_refunds.py": {"match-refunds": TimeDomain.EVENT_TIME},  # a co-process on_timer
        "merchant_tiers.py": {
            "tier-as-of": TimeDomain.EVENT_TIME,
            "refunds-within-30m": TimeDomain.EVENT_TIME,
            "refunds-same-hour": TimeDomain.EVENT_TIME,
        },
        "session_summary.py": {"sessions": TimeDomain.EVENT_TIME},
    }
    for example, ticks in expected.items():
        settings = {"source.log_dir": str(tmp_path)}
        queries = {q.name: q for q in plan(load_job_file(EXAMPLES / example, settings).job).queries}
        assert {q: queries[q].ticks for q in ticks} == ticks, example
        assert not any(q.watermark_carrier for q in queries.values()), example
        kept = replace(queries[next(iter(ticks))], watermark_carrier_kept=True)
        assert kept.ticks is None and kept.watermark_carrier == (kept.process is not None)
        unticked = replace(queries[next(iter(ticks))], event_ticks_written=False)
        assert unticked.ticks is None and not unticked.watermark_carrier
    window = windowed_job(tmp_path)  # a native window: Spark's own operator asks for batches
    assert plan(window).queries[0].ticks is None


def test_a_keyed_function_reads_a_topic_placed_by_its_key_without_a_shuffle(tmp_path):
    """A source placed by the key groups of the job's key into as many partitions as the job's
    state partitions is read, decoded and processed in one task per partition; anything else
    is shuffled, and the plan says why."""
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.store import TopicKey

    log = tmp_path / "log"
    EventLog(log).create_topic("by-txn", 2, key=TopicKey("txn_id", "str"))
    EventLog(log).create_topic("by-merchant", 2, key=TopicKey("merchant_id", "str"))

    def query(example: str, topic: str, **settings: object):
        values = {"source.log_dir": str(log), "source.topic": topic, "parallelism": 2}
        return plan(load_job_file(EXAMPLES / example, {**values, **settings}).job).queries[0]

    keyed = query("deduplicate_payments.py", "by-txn")  # keyed by txn_id, TTL only
    assert keyed.by_partition and "without a shuffle" in keyed.reason
    # nothing of Spark's between the read and the operator: the operator in the read's worker
    assert keyed.keyed_read and "in the read's own Python worker" in keyed.reason
    assert keyed.copartitioned is not None and keyed.copartitioned.partitions == 2
    wider = query("deduplicate_payments.py", "by-txn", parallelism=4)
    assert not wider.by_partition and "parallelism=2" in wider.reason
    other_key = query("deduplicate_payments.py", "by-merchant")
    assert not other_key.by_partition and "not of the job's key" in other_key.reason
    timers = query("fraud_rate_limit.py", "by-merchant")  # an on_timer: ticks, unshuffled
    assert timers.by_partition and timers.ticks is TimeDomain.EVENT_TIME
    carried = replace(timers, watermark_carrier_kept=True)  # the branch reads the shuffle
    assert not carried.by_partition
    EventLog(log).create_topic("plain", 2)
    plain = query("deduplicate_payments.py", "plain")
    assert not plain.by_partition and "placed by" not in plain.reason


def test_the_operator_runs_inside_the_read_only_where_spark_does_nothing_between(tmp_path):
    """A filter before ``key_by`` is Spark's, and so is the event time of a string field: the
    read and the operator then stay two Python workers in one task (``by_partition``, not
    ``keyed_read``), and the plan says why; an event time in seconds or a timestamp is read
    in Python as Spark reads it."""
    from stateful_runtime import KeyedProcessFunction, LogSink
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.store import TopicKey

    log = tmp_path / "log"
    EventLog(log).create_topic("by-m", 2, key=TopicKey("m", "str"))

    class Count(KeyedProcessFunction):
        output_schema = {"m": str}

        def process_element(self, value, ctx):
            return ()

    def query(time_type: type, unit: str, *, filtered: bool = False):
        job = StreamJob("j", parallelism=2, checkpoint=CheckpointConfig(str(tmp_path / "ck")))
        wm = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("t", unit)
        stream = job.from_source(LogSource(str(log), "by-m", {"m": str, "t": time_type}), wm, "s")
        if filtered:
            stream = stream.filter("m != 'x'")
        stream.key_by("m").process(Count(), name="c").sink_to(LogSink(str(log), "out"), name="o")
        return plan(job).queries[0]

    assert query(int, "ms").keyed_read and query(int, "s").keyed_read
    assert query(datetime, "timestamp").keyed_read
    text = query(str, "timestamp")
    assert text.by_partition and not text.keyed_read and "is read by Spark" in text.reason
    filtered = query(int, "ms", filtered=True)
    assert filtered.by_partition and not filtered.keyed_read
    assert "the filter before the key runs in Spark" in filtered.reason
