"""A query's checkpoint facts and its health, from files and progress reports (no Spark)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from stateful_runtime.contract import CheckpointFacts, QueryHealth
from stateful_runtime.runtime.progress import Records, batch_health, checkpoint_facts

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
        "observedMetrics": {
            "srt_source": {"input": 100, "dead_letters": 3},
            "srt_late": {"late": 2},
        },
    }
    records = Records()
    late = records.add(progress)
    assert (late, records.input, records.output) == (2, 100, 95)
    health = batch_health(progress, late_rows=late, late_rows_this_run=records.late)
    assert (health.last_batch, health.state_rows, health.state_bytes) == (7, 4, 1000)
    assert health.lag_by_partition == {"0": 10, "1": 0} and health.lag_records == 10
    report = QueryHealth(batch=health, records=records.counts("payments"))
    assert QueryHealth.from_json(report.to_json()) == report
