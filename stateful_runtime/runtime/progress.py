"""A query's progress: where its records went, its health, and what its checkpoint says.

* :func:`checkpoint_facts` — a query's checkpoint now (last committed batch, its age, the batch
  in flight): the one reader of those facts, for the job process, its control endpoint and
  ``srt status``.
* :class:`Records` — the records a query read, counted per batch from Spark's progress reports.
* :func:`batch_health` / :func:`new_progress` — Spark's progress reports read into
  :class:`~stateful_runtime.contract.BatchHealth`.

Nothing here imports Spark (``srt status`` reads checkpoint facts from this module).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.contract import BatchHealth, CheckpointFacts, RecordCounts

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery


def now_iso() -> str:
    """Now, as the registry and health reports write times (ISO 8601, UTC, seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def checkpoint_facts(query_dir: str | Path, now: float | None = None) -> CheckpointFacts:
    """What one query's checkpoint says at ``now`` (default: now): last committed batch, when it
    committed, how long the batch after it has been planned (in flight), and its state
    partitions. Read from files, so it does not go stale when the job process hangs, as its
    own health report does."""
    now = time.time() if now is None else now
    query = QueryLayout(query_dir)
    last = query.last_committed()
    commit_time = query.last_commit_time()
    planned = query.offsets(0 if last is None else last + 1)
    try:
        inflight_age: float | None = round(now - planned.stat().st_mtime, 3)
    except OSError:
        inflight_age = None
    try:
        partitions = None if last is None else query.state_partitions(last)
    except (OSError, ValueError):
        partitions = None
    return CheckpointFacts(
        last_committed_batch=last,
        last_commit_time=commit_time,
        checkpoint_age_s=None if commit_time is None else round(now - commit_time, 3),
        inflight_batch_age_s=inflight_age,
        state_partitions=partitions,
    )


@dataclass
class Records:
    """Where the records a query read from its source went, this run: ``input`` (read) =
    ``output`` (into the job's operators or sinks) + ``dead_letters`` (rejected, to the
    dead-letter topic) + ``late`` (behind the watermark: dropped and counted, or to a late side
    output). ``input`` and ``dead_letters`` are counted where the source's frame is read,
    ``late`` where the window drops them (Spark's native window, or the window operator)."""

    input: int = 0
    dead_letters: int = 0
    late: int = 0

    @property
    def output(self) -> int:
        return self.input - self.dead_letters - self.late

    def add(self, progress: Mapping[str, Any]) -> int:
        """Count one batch's progress report in; returns the batch's late records."""
        # Named where the query's DataFrame observes them; imported here, as that module
        # imports Spark and ``srt status`` reads checkpoint facts from this one without it.
        from stateful_runtime.runtime.dataframes import LATE_METRICS, SOURCE_METRICS

        observed = progress.get("observedMetrics") or {}
        source = _metrics(observed.get(SOURCE_METRICS))
        self.input += int(source.get("input") or 0)
        self.dead_letters += int(source.get("dead_letters") or 0)
        late = int(_metrics(observed.get(LATE_METRICS)).get("late") or 0)
        self.late += late
        return late

    def counts(self, source: str) -> RecordCounts:
        """The counts so far, as health reports them."""
        return RecordCounts(source, self.input, self.output, self.dead_letters, self.late)


def _metrics(row: Any) -> Mapping[str, Any]:
    """One observed metric of a progress report: a Row (PySpark's progress object) or a dict
    (its JSON)."""
    if row is None:
        return {}
    return row.asDict() if hasattr(row, "asDict") else row


def _offsets(value: Any) -> Any:
    """A source's offsets from a progress report (a dict, or its JSON text)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def batch_health(
    progress: Mapping[str, Any], *, late_rows: int = 0, late_rows_this_run: int = 0
) -> BatchHealth:
    """One query's last batch from its Spark progress report (``late_rows``: the batch's
    records behind the watermark, counted by :class:`Records`)."""
    ops = progress.get("stateOperators") or []
    src = (progress.get("sources") or [{}])[0]
    lag, lag_by_partition = None, None
    end, latest = (_offsets(src.get("endOffset")), _offsets(src.get("latestOffset")))
    if isinstance(end, dict) and isinstance(latest, dict):
        # Offsets are {"<partition>": next} (event log) or {"<topic>:<partition>": next} (Kafka).
        lag_by_partition = {p: max(0, int(latest[p]) - int(end.get(p, 0))) for p in latest}
        lag = sum(lag_by_partition.values())
    return BatchHealth(
        last_batch=progress.get("batchId"),
        input_rows=progress.get("numInputRows"),
        input_rows_per_s=progress.get("inputRowsPerSecond"),
        processed_rows_per_s=progress.get("processedRowsPerSecond"),
        batch_duration_ms=(progress.get("durationMs") or {}).get("triggerExecution"),
        watermark=(progress.get("eventTime") or {}).get("watermark"),
        state_rows=sum(o.get("numRowsTotal", 0) for o in ops),
        state_bytes=sum(o.get("memoryUsedBytes", 0) for o in ops),
        lag_records=lag,
        lag_by_partition=lag_by_partition,
        updated_at=now_iso(),
        late_rows_dropped=late_rows,
        late_rows_dropped_this_run=late_rows_this_run,
    )


def new_progress(query: StreamingQuery, printed: int) -> list[dict[str, Any]]:
    """Progress reports of batches after ``printed``, oldest first. ``lastProgress`` answers
    the usual poll (nothing new, or one batch) in one small call; the whole ``recentProgress``
    (up to 100 reports, each a JSON document through py4j) only when batches were missed."""
    last = query.lastProgress
    if last is None or last["batchId"] <= printed:
        return []
    if last["batchId"] == printed + 1:
        return [last]
    return [p for p in query.recentProgress if p["batchId"] > printed]
