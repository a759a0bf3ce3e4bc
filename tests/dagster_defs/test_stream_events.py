"""The sink table's runless materialisations (the health sensor's ``commit_events``) over a
real DuckDB sink ledger: each committed batch is reported once, and a batch the sink committed
before the job reported its progress waits for the next tick (else it would carry the previous
batch's watermark, and the watermark of a stream that then goes quiet would never be shown)."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

from dagster_defs import StreamingJobTranslator
from dagster_defs._stream_events import commit_events
from dagster_defs.resources import DuckDBWarehouse
from dbt_sink.duckdb import DuckDBUpsertSink
from stateful_runtime.contract import JobStatus
from tests.dagster_defs.helpers import UPI_JOB


def _status(live: bool, last_batch: int, watermark: str) -> JobStatus:
    table = UPI_JOB.sink_tables[0]
    return JobStatus.from_json(
        {
            "job": UPI_JOB.name,
            "state": "RUNNING" if live else "FINISHED",
            "alive": live,
            "live": live,
            "queries": {table.query: {"checkpoint_dir": "/nonexistent"}},
            "health": {table.query: {"last_batch": last_batch, "watermark": watermark}},
        }
    )


def _warehouse(tmp_path, batches: int) -> DuckDBWarehouse:
    """A real DuckDB sink that committed ``batches`` batches of the UPI job's table."""
    table = UPI_JOB.sink_tables[0]
    database = tmp_path / "w.duckdb"
    sink = DuckDBUpsertSink(str(database), table.table, table.key)
    sink.open(UPI_JOB.name, table.query)
    for batch in range(batches):
        sink.write_batch(
            pa.table(
                {
                    "merchant_id": ["m1"],
                    "window_start": [datetime(2026, 1, 1, 0, batch)],
                    "window_end": [datetime(2026, 1, 1, 0, batch + 1)],
                    "payments": [1],
                    "amount_paise": [100],
                }
            ),
            batch,
        )
    return DuckDBWarehouse(path=str(database))


def test_a_batch_is_reported_once_its_progress_is(tmp_path):
    warehouse, reported = _warehouse(tmp_path, 2), {}
    translator = StreamingJobTranslator()

    def tick(status: JobStatus) -> list:
        return commit_events(warehouse, UPI_JOB, status, translator, reported)

    # The sink has batches 0 and 1; the job has reported batch 0's progress only.
    [first] = tick(_status(True, 0, "1970-01-01T00:00:00.000Z"))
    assert first.metadata["last batch"].value == 0 and "watermark" not in first.metadata
    assert tick(_status(True, 0, "1970-01-01T00:00:00.000Z")) == []  # nothing new yet
    [second] = tick(_status(True, 1, "2026-01-01T00:01:55.000Z"))
    assert second.metadata["last batch"].value == 1
    assert second.metadata["watermark"].value == "2026-01-01T00:01:55.000Z"
    assert tick(_status(True, 1, "2026-01-01T00:01:55.000Z")) == []


def test_a_stopped_job_reports_every_committed_batch(tmp_path):
    # A job that died after its sink committed batch 2 never reports it: reported anyway.
    [event] = commit_events(
        _warehouse(tmp_path, 3),
        UPI_JOB,
        _status(False, 0, "2026-01-01T00:00:30.000Z"),
        StreamingJobTranslator(),
        {},
    )
    assert (event.metadata["first batch"].value, event.metadata["last batch"].value) == (0, 2)


def test_a_map_async_steps_calls_are_plotted_from_the_jobs_health():
    """The health's ``calls`` (a map_async step's calls this run, as the job process reports
    them) become numbers the asset page plots: calls, retries, failures, p50 and p99."""
    from dagster_defs._stream_events import plot_metadata
    from stateful_runtime.contract import CALL_BUCKETS_MS

    buckets = [0] * (len(CALL_BUCKETS_MS) + 1)
    buckets[CALL_BUCKETS_MS.index(20)] = 98  # 98 calls of 10-20 ms, 2 of 200-500 ms
    buckets[CALL_BUCKETS_MS.index(500)] = 2
    status = _running_with(
        {
            "calls": {
                "score": {
                    "calls": 100,
                    "retries": 7,
                    "failed": 1,
                    "buckets": buckets,
                    "rate_per_s": 12.5,
                }
            }
        }
    )
    plotted = {k: v.value for k, v in plot_metadata(status).items()}
    assert plotted["score: calls (this run)"] == 100
    assert plotted["score: retried calls (this run)"] == 7
    assert plotted["score: records failed after retries (this run)"] == 1
    assert plotted["score: call latency p50 (ms)"] == 20.0
    assert plotted["score: call latency p99 (ms)"] == 500.0
    assert plotted["score: call rate (calls/s, last batch)"] == 12.5


def test_each_partitions_event_time_lag_is_plotted_from_the_jobs_health():
    """A partition far behind its source's newest holds the watermark: the asset page plots
    each partition's event-time lag."""
    from dagster_defs._stream_events import plot_metadata

    status = _running_with(
        {
            "event_time_lag_by_partition": {"upi:0": 0, "upi:1": 600_000},
            "watermark_held_by": "upi:1",
        }
    )
    plotted = {k: v.value for k, v in plot_metadata(status).items()}
    assert plotted["event-time lag of upi:1 (ms)"] == 600_000
    assert plotted["event-time lag of upi:0 (ms)"] == 0


def _running_with(health: dict) -> JobStatus:
    """The UPI job running, its query's last batch (3) reported with ``health``."""
    table = UPI_JOB.sink_tables[0]
    return JobStatus.from_json(
        {
            "job": UPI_JOB.name,
            "state": "RUNNING",
            "alive": True,
            "live": True,
            "queries": {table.query: {"checkpoint_dir": "/nonexistent"}},
            "health": {table.query: {"last_batch": 3, **health}},
        }
    )
