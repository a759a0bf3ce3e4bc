"""A query's checkpoint facts and its health, from files and progress reports; which reports
are of committed batches, against a real streaming query."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from stateful_runtime.connectors.accounting import BatchCounts
from stateful_runtime.contract import (
    CheckpointFacts,
    QueryHealth,
    RecentBatch,
    RecordCounts,
    recent_rates,
)
from stateful_runtime.runtime.progress import (
    Records,
    batch_health,
    checkpoint_facts,
    counted_input,
    idle_health,
    new_progress,
    recent_batch,
)

NOW = 1_700_000_000.0


def _batch(query: Path, batch: int, *, planned_at: float, committed_at: float | None) -> None:
    meta = {"batchWatermarkMs": 0, "conf": {"spark.sql.shuffle.partitions": "3"}}
    offsets = query / "offsets" / str(batch)
    offsets.parent.mkdir(parents=True, exist_ok=True)
    offsets.write_text(f'v1\n{json.dumps(meta)}\n{{"0": {batch * 10}}}\n')
    os.utime(offsets, (planned_at, planned_at))
    if committed_at is not None:
        commit = query / "commits" / str(batch)
        commit.parent.mkdir(parents=True, exist_ok=True)
        commit.write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        os.utime(commit, (committed_at, committed_at))


def test_an_empty_checkpoint_has_no_facts(tmp_path: Path):
    assert checkpoint_facts(tmp_path / "q", NOW) == CheckpointFacts()


def test_last_commit_its_age_and_the_batch_in_flight(tmp_path: Path):
    q = tmp_path / "q"
    (q / "state").mkdir(parents=True)
    _batch(q, 0, planned_at=NOW - 60, committed_at=NOW - 50)
    _batch(q, 1, planned_at=NOW - 40, committed_at=NOW - 30.5)
    _batch(q, 2, planned_at=NOW - 12.25, committed_at=None)
    facts = checkpoint_facts(q, NOW)
    assert facts == CheckpointFacts(
        last_committed_batch=1,
        last_commit_time=NOW - 30.5,
        checkpoint_age_s=30.5,
        inflight_batch_age_s=12.25,
        state_partitions=3,
    )
    # What a health report carries of it.
    assert facts.committed() == CheckpointFacts(1, checkpoint_age_s=30.5)


def test_a_stateless_query_has_no_state_partitions_and_nothing_in_flight(tmp_path: Path):
    q = tmp_path / "q"
    _batch(q, 0, planned_at=NOW - 5, committed_at=NOW - 4)
    facts = checkpoint_facts(q, NOW)
    assert (facts.last_committed_batch, facts.inflight_batch_age_s) == (0, None)
    assert facts.state_partitions is None


def test_a_batch_committed_while_the_facts_are_read_is_no_age_not_a_negative_one(tmp_path: Path):
    """A status takes its time first and reads the checkpoint after: a batch that commits (or
    is planned) in between is 0 s old at that time, not a negative age."""
    q = tmp_path / "q"
    _batch(q, 0, planned_at=NOW - 1, committed_at=NOW + 0.067)
    _batch(q, 1, planned_at=NOW + 0.07, committed_at=None)
    facts = checkpoint_facts(q, NOW)
    assert (facts.checkpoint_age_s, facts.inflight_batch_age_s) == (0.0, 0.0)
    assert facts.last_commit_time == NOW + 0.067


_batches = st.lists(
    st.tuples(
        st.integers(0, 100_000),  # rows
        st.integers(0, 60_000),  # idle time before the trigger (ms)
        st.integers(1, 60_000),  # duration (ms)
    ),
    min_size=1,
    max_size=10,
)


@given(_batches)
def test_rates_over_time_are_records_over_wall_time_and_over_time_run(shape):
    """Input rate: records ÷ (first trigger → last commit); processing rate: records ÷ the
    time the batches ran. Idle time lowers the first, never the second."""
    recent, t = [], 1_700_000_000_000
    for i, (rows, idle, duration) in enumerate(shape):
        t += idle
        progress = {
            "batchId": i,
            "numInputRows": rows,
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t / 1000))
            + f".{t % 1000:03d}Z",
            "durationMs": {"triggerExecution": duration, "addBatch": duration},
        }
        batch = recent_batch(progress)
        assert batch == RecentBatch(i, rows, t, duration)
        recent.append(batch)
        t += duration
    read = sum(r for r, _, _ in shape)
    ran = sum(d for _, _, d in shape)
    wall = t - recent[0].started_ms
    input_rate, processed = recent_rates(recent)
    assert input_rate == round(read * 1000 / wall, 3)
    assert processed == round(read * 1000 / ran, 3)
    assert input_rate <= processed + 0.001  # waiting between batches is not processing
    health = batch_health(progress, recent=tuple(recent))
    assert (health.recent_input_rows_per_s, health.recent_processed_rows_per_s) == (
        input_rate,
        processed,
    )
    assert QueryHealth.from_json(QueryHealth(batch=health).to_json()).batch == health


def test_records_and_batch_health_from_a_progress_report():
    progress = {
        "batchId": 7,
        "numInputRows": 100,
        "inputRowsPerSecond": 50.0,
        "processedRowsPerSecond": 200.0,
        "durationMs": {"triggerExecution": 500},
        "eventTime": {"watermark": "2024-01-01T00:00:00.000Z"},
        "stateOperators": [{"numRowsTotal": 4, "memoryUsedBytes": 1000}],
        "sources": [{"endOffset": '{"0": 90, "1": 10}', "latestOffset": {"0": 100, "1": 10}}],
        "observedMetrics": {"srt_late": {"late": 2}},
    }
    records = Records()
    late = records.add(progress, {"payments": BatchCounts(100, 3)})
    assert (late, records.input, records.output) == (2, 100, 95)
    health = batch_health(progress, late_rows=late, late_rows_this_run=records.late)
    assert (health.last_batch, health.state_rows, health.state_bytes) == (7, 4, 1000)
    assert health.lag_by_partition == {"0": 10, "1": 0} and health.lag_records == 10
    report = QueryHealth(batch=health, records=records.counts("payments"))
    assert QueryHealth.from_json(report.to_json()) == report

    # An idle trigger's report later: the source caught up, and no batch ran to say so.
    idle = {
        "batchId": 8,
        "sources": [{"endOffset": {"0": 100, "1": 10}, "latestOffset": {"0": 100, "1": 10}}],
    }
    now = idle_health(health, idle)
    assert (now.last_batch, now.input_rows, now.lag_records) == (7, 100, 0)
    first = idle_health(None, idle)  # before the run's first batch
    assert (first.last_batch, first.lag_records) == (None, 0)
    assert QueryHealth.from_json(QueryHealth(batch=first).to_json()).batch == first


def test_a_unions_records_are_counted_per_input_and_its_lag_over_every_input():
    progress = {
        "batchId": 3,
        "sources": [
            {"endOffset": {"0": 5}, "latestOffset": {"0": 9}},
            {"endOffset": {"bank:0": 7}, "latestOffset": {"bank:0": 8}},
        ],
        "observedMetrics": {"srt_late": {"late": 4, "late:app": 0, "late:bank": 4}},
    }
    counted = {"app": BatchCounts(50, 1), "bank": BatchCounts(20, 2)}
    records = Records()
    assert records.add(progress, counted, ["app", "bank"]) == 4
    records.add(progress, counted, ["app", "bank"])
    counts = records.counts(["app", "bank"])
    assert (counts.source, counts.input, counts.dead_letters, counts.late) == (
        "app+bank",
        140,
        6,
        8,
    )
    app, bank = counts.by_source
    assert (app.source, app.input, app.output, app.dead_letters, app.late) == ("app", 100, 98, 2, 0)
    assert (bank.input, bank.output, bank.dead_letters, bank.late) == (40, 28, 4, 8)
    assert RecordCounts.from_json(counts.to_json()) == counts
    health = batch_health(progress)
    assert health.lag_by_partition == {"1/0": 4, "2/bank:0": 1} and health.lag_records == 5


def test_idle_triggers_reports_are_not_batches_and_hide_none(spark, tmp_path: Path):
    """Spark reports an idle trigger with the id of the batch that has not run yet. The
    monitor's reading of reports (polled as the runner polls) must yield each committed batch
    once, with its rows, and nothing else: it printed "rows 0" for every batch after the first
    and lost the real batches' rows when idle reports were taken for commits."""
    inbox, checkpoint = tmp_path / "in", tmp_path / "cp"
    inbox.mkdir()
    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "50ms")
    query = (
        spark.readStream.schema("n INT")
        .json(str(inbox))
        .writeStream.format("noop")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime="0.1 seconds")
        .start()
    )
    seen: list[dict] = []
    printed = -1

    def poll_until(rows: int) -> None:
        nonlocal printed
        deadline = time.monotonic() + 60
        while sum(p["numInputRows"] for p in seen) < rows:
            assert query.isActive, query.exception()
            assert time.monotonic() < deadline, f"reports so far: {seen}"
            for p in new_progress(query, printed).batches:
                printed = p["batchId"]
                seen.append(p)
            time.sleep(0.02)

    try:
        written = 0
        for i, rows in enumerate((5, 7, 11)):
            (inbox / f"{i}.json").write_text("".join(f'{{"n": {n}}}\n' for n in range(rows)))
            written += rows
            poll_until(written)
            idle_since = query.lastProgress["timestamp"]
            # Idle triggers report (every 50 ms) before the next file comes.
            deadline = time.monotonic() + 30
            while query.lastProgress["timestamp"] == idle_since or query.lastProgress.get(
                "numInputRows"
            ):
                assert time.monotonic() < deadline, "no idle report"
                time.sleep(0.02)
            idle = new_progress(query, printed)
            assert idle.batches == [] and idle.idle is not None  # what the source holds now
    finally:
        query.stop()
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    committed = sorted(int(f.name) for f in (checkpoint / "commits").iterdir() if f.name.isdigit())
    assert [p["batchId"] for p in seen] == committed
    assert [p["numInputRows"] for p in seen] == [5, 7, 11]


def test_dead_letters_published_are_counted_by_reason_and_sampled(tmp_path: Path):
    """What the job publishes to its dead-letter topic, as its health shows it: counts per
    kind of reason (particulars cut), the newest records (secrets masked), the topic's total."""
    import pyarrow as pa

    from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.dead_letters import EventLogDeadLetterSink
    from stateful_runtime.contract import DeadLetterView
    from stateful_runtime.runtime.progress import DEAD_LETTER_SAMPLES, SampledDeadLetters

    EventLog(tmp_path).create_topic("pay", 2)
    sink = SampledDeadLetters(
        EventLogDeadLetterSink(str(tmp_path), "pay-dlq", source_topic="pay", job="j"), "pay-dlq"
    )
    reasons = [f"malformed JSON: Expecting value: line 1 column {i}" for i in range(30)]
    rows = {
        ERROR: [*reasons, "missing field 'amount'"],
        RAW: [b"{no"] * 30 + [b'{"dsn": "postgresql://u:hunter2@h/db"}'],
        PARTITION: [0] * 31,
        OFFSET: list(range(31)),
    }
    with sink.writer() as writer:
        assert sink.write_split(writer, pa.table(rows), 0, 31) == 31
    view = sink.view()
    assert view.by_reason == {"malformed JSON": 30, "missing field 'amount'": 1}
    assert view.in_topic == 31 and view.topic == "pay-dlq"
    assert len(view.samples) == DEAD_LETTER_SAMPLES and view.samples[-1].source_offset == 30
    assert "hunter2" not in view.samples[-1].value
    health = QueryHealth(dead_letters=view)
    assert QueryHealth.from_json(health.to_json()).dead_letters == view
    assert isinstance(view, DeadLetterView)


def test_a_steps_rejects_count_under_the_step_and_merge_with_the_sources(tmp_path: Path):
    import pyarrow as pa

    from stateful_runtime.connectors.dead_letters import STEP_SCHEMA
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.dead_letters import EventLogDeadLetterSink
    from stateful_runtime.contract import DeadLetterView
    from stateful_runtime.runtime.progress import SampledDeadLetters, merge_views

    EventLog(tmp_path).create_topic("pay", 2)
    sink = EventLogDeadLetterSink(str(tmp_path), "pay-dlq", source_topic="pay", job="j")
    steps = SampledDeadLetters(sink, "pay-dlq")
    rows = [
        {
            "_raw": b"{}",
            "_error": "ValueError: bad amount",
            "_partition": 1,
            "_offset": 7,
            "_step": "enrich",
        },
        {
            "_raw": b"{}",
            "_error": "KeyError: 'x'",
            "_partition": None,
            "_offset": None,
            "_step": "enrich",
        },
    ]
    with steps.writer() as writer:
        steps.write_split(writer, pa.Table.from_pylist(rows[:1], schema=STEP_SCHEMA), 1, 8)
    with steps.writer() as writer:  # a reject with no source origin (NO_ORIGIN's mark)
        steps.write_split(writer, pa.Table.from_pylist(rows[1:], schema=STEP_SCHEMA), 0, 1)
    view = steps.view()
    assert view.by_reason == {"step enrich: ValueError": 1, "step enrich: KeyError": 1}
    assert [s.source_offset for s in view.samples] == [7, -1]
    assert view.in_topic == 2
    source = DeadLetterView("pay-dlq", 3, {"malformed JSON": 1, "step enrich: KeyError": 1})
    merged = merge_views([source, view])
    assert merged.by_reason == {
        "malformed JSON": 1,
        "step enrich: KeyError": 2,
        "step enrich: ValueError": 1,
    }
    assert merged.in_topic == 3 and len(merged.samples) == 2


def test_a_batchs_input_rows_are_the_records_its_read_tasks_counted():
    """Where the keyed operator runs inside its source's read, Spark's input rows are the
    operator's output: the report takes the records read instead, its rates scaled alike."""
    progress = {"numInputRows": 40, "inputRowsPerSecond": 20.0, "processedRowsPerSecond": 80.0}
    counted = counted_input(progress, 1_000)
    assert counted == {
        "numInputRows": 1_000,
        "inputRowsPerSecond": 500.0,
        "processedRowsPerSecond": 2_000.0,
    }
    assert counted_input(progress, 40) is progress
    assert counted_input({**progress, "numInputRows": 0}, 0)["numInputRows"] == 0
