"""A query's progress: where its records went, its health, and what its checkpoint says.

* :func:`checkpoint_facts` — a query's checkpoint now (last committed batch, its age, the batch
  in flight): the one reader of those facts, for the job process, its control endpoint and
  ``srt status``.
* :class:`Records` — the records a query read, counted per batch (its sources' read tasks'
  reports and Spark's progress reports).
* :func:`batch_health` / :func:`new_progress` — Spark's progress reports read into
  :class:`~stateful_runtime.contract.BatchHealth`.

Nothing here imports Spark (``srt status`` reads checkpoint facts from this module).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.contract import (
    SAMPLE_CHARS,
    BatchHealth,
    CheckpointFacts,
    DeadLetterSample,
    DeadLetterView,
    RecentBatch,
    RecordCounts,
    recent_rates,
)

if TYPE_CHECKING:
    from pyspark.sql.streaming import StreamingQuery

    from stateful_runtime.connectors.accounting import BatchCounts


def now_iso() -> str:
    """Now, as the registry and health reports write times (ISO 8601, UTC, seconds)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def checkpoint_facts(query_dir: str | Path, now: float | None = None) -> CheckpointFacts:
    """What one query's checkpoint says at ``now`` (default: now): last committed batch, when it
    committed, how long the batch after it has been planned (in flight), and its state
    partitions. Read from files, so it does not go stale when the job process hangs, as its
    own health report does. A file written after ``now`` (a batch that committed or was
    planned while the facts were read) is 0 s old, never less."""
    now = time.time() if now is None else now
    query = QueryLayout(query_dir)
    last = query.last_committed()
    commit_time = query.last_commit_time()
    planned = query.offsets(0 if last is None else last + 1)
    try:
        inflight_age: float | None = _age(now, planned.stat().st_mtime)
    except OSError:
        inflight_age = None
    try:
        partitions = None if last is None else query.state_partitions(last)
    except (OSError, ValueError):
        partitions = None
    return CheckpointFacts(
        last_committed_batch=last,
        last_commit_time=commit_time,
        checkpoint_age_s=None if commit_time is None else _age(now, commit_time),
        inflight_batch_age_s=inflight_age,
        state_partitions=partitions,
    )


def _age(now: float, written: float) -> float:
    return max(0.0, round(now - written, 3))


@dataclass
class Records:
    """Where the records a query read from its source went, this run: ``input`` (read) =
    ``output`` (into the job's operators or sinks) + ``dead_letters`` (rejected, to the
    dead-letter topic) + ``late`` (behind the watermark: dropped and counted, or to a late side
    output). ``input`` and ``dead_letters`` are counted where the source's frame is read,
    ``late`` where the window drops them (Spark's native window, or the window operator).

    A union's query counts each input apart too (``by_source``, from its read tasks' reports
    and the stateful operator's ``late:<source>``); the totals hold them all, and the records
    its steps rejected."""

    input: int = 0
    dead_letters: int = 0
    late: int = 0
    by_source: dict[str, Records] = field(default_factory=dict)

    @property
    def output(self) -> int:
        return self.input - self.dead_letters - self.late

    def add(
        self,
        progress: Mapping[str, Any],
        counted: Mapping[str, BatchCounts],
        sources: Sequence[str] = (),
    ) -> int:
        """Count one batch in: its sources' ``counted`` records (by source name: what its read
        tasks reported) and its progress report's late records (``sources``: a union's inputs,
        by name); returns the batch's late records."""
        # Named where the query's DataFrame observes them; imported here, as that module
        # imports Spark and ``srt status`` reads checkpoint facts from this one without it.
        from stateful_runtime.runtime.dataframes import LATE_METRICS

        observed = progress.get("observedMetrics") or {}
        lates = _metrics(observed.get(LATE_METRICS))
        for name in sources if len(sources) > 1 else ():
            one = self.by_source.setdefault(name, Records())
            one.late += int(lates.get(f"late:{name}") or 0)
        for name, batch in counted.items():
            self.input += batch.records
            self.dead_letters += batch.dead_letters
            if len(sources) > 1:
                one = self.by_source.setdefault(name, Records())
                one.input += batch.records
                one.dead_letters += batch.dead_letters
        late = int(lates.get("late") or 0)
        self.late += late
        return late

    def counts(self, source: str | Sequence[str]) -> RecordCounts:
        """The counts so far, as health reports them (a union's: each input's too)."""
        names = [source] if isinstance(source, str) else list(source)
        by_source = tuple(
            self.by_source.get(n, Records()).counts(n) for n in names if len(names) > 1
        )
        return RecordCounts(
            "+".join(names), self.input, self.output, self.dead_letters, self.late, by_source
        )


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


def _lag(progress: Mapping[str, Any]) -> tuple[int | None, dict[str, int] | None]:
    """Records in the source not yet read, in all and per partition (None: it does not say)."""
    sources = progress.get("sources") or [{}]
    by_partition: dict[str, int] = {}
    for i, src in enumerate(sources):
        end, latest = (_offsets(src.get("endOffset")), _offsets(src.get("latestOffset")))
        if not (isinstance(end, dict) and isinstance(latest, dict)):
            return None, None
        # Offsets are {"<partition>": next} (event log) or {"<topic>:<partition>": next}
        # (Kafka); a union's inputs are told apart by their place: "<input>/<partition>". The
        # runtime's own sources (timer ticks, a run's first batch) have no partitions.
        lead = f"{i + 1}/" if len(sources) > 1 else ""
        for p in latest:
            if p.rpartition(":")[2].isdigit():
                by_partition[lead + p] = max(0, int(latest[p]) - int(end.get(p, 0)))
    return sum(by_partition.values()), by_partition


def counted_input(progress: Mapping[str, Any], records: int) -> Mapping[str, Any]:
    """A progress report with Spark's input rows (and the rates of them) replaced by
    ``records``, what the batch's read tasks counted (``connectors/accounting.py``): where the
    keyed operator runs inside its source's read (``operators/keyed_read.py``), the rows Spark
    sees are the operator's output, not the records read."""
    seen = int(progress.get("numInputRows") or 0)
    if seen == records:
        return progress
    out = {**progress, "numInputRows": records}
    for rate in ("inputRowsPerSecond", "processedRowsPerSecond"):
        if progress.get(rate) is not None:
            out[rate] = float(progress[rate]) * records / seen if seen else 0.0
    return out


def recent_batch(progress: Mapping[str, Any]) -> RecentBatch | None:
    """A batch that ran, as the rates over time count it (None: its report lacks the time)."""
    try:
        started = datetime.fromisoformat(str(progress["timestamp"]).replace("Z", "+00:00"))
        return RecentBatch(
            int(progress["batchId"]),
            int(progress.get("numInputRows") or 0),
            round(started.timestamp() * 1000),
            int((progress.get("durationMs") or {})["triggerExecution"]),
        )
    except (KeyError, TypeError, ValueError):
        return None


def batch_health(
    progress: Mapping[str, Any],
    *,
    late_rows: int = 0,
    late_rows_this_run: int = 0,
    recent: tuple[RecentBatch, ...] = (),
) -> BatchHealth:
    """One query's last batch from its Spark progress report (``late_rows``: the batch's
    records behind the watermark, counted by :class:`Records`; ``recent``: the run's last
    batches, this one included, for the rates over time)."""
    ops = progress.get("stateOperators") or []
    lag, lag_by_partition = _lag(progress)
    input_rate, processed_rate = recent_rates(recent)
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
        recent=recent,
        recent_input_rows_per_s=input_rate,
        recent_processed_rows_per_s=processed_rate,
    )


def ran(progress: Mapping[str, Any]) -> bool:
    """True if the report is of a micro-batch that ran (and so committed).

    Spark also reports an idle trigger, one that found no new input, every
    ``spark.sql.streaming.noDataProgressEventInterval`` (10 s): that report carries the id of
    the batch that has *not* run yet, no rows and no ``addBatch`` time. Taken for a commit, it
    printed "rows 0" for that id and hid the real batch of the same id when it came (its rows,
    dead letters and late records never counted, its rates never shown)."""
    return "addBatch" in (progress.get("durationMs") or {})


@dataclass(frozen=True)
class NewProgress:
    """What a query reported since the last poll: the batches that ran after the last one
    read (oldest first), and the idle trigger's report if the newest report is one (what the
    source holds now: lag with no batch to show it)."""

    batches: list[dict[str, Any]]
    idle: Mapping[str, Any] | None = None


def new_progress(query: StreamingQuery, printed: int) -> NewProgress:
    """Progress reports of batches after ``printed`` that ran, oldest first (idle triggers'
    reports apart: :func:`ran`). ``lastProgress`` answers the usual poll (nothing new, or
    one batch) in one small call; the whole ``recentProgress`` (up to 100 reports, each a JSON
    document through py4j) only when batches may have been missed."""
    last = query.lastProgress
    if last is None:
        return NewProgress([])
    idle = None if ran(last) else last
    if last["batchId"] <= printed:
        return NewProgress([], idle)
    if last["batchId"] == printed + 1:
        # An idle report of the next batch means that batch has not run yet.
        return NewProgress([] if idle else [last], idle)
    return NewProgress([p for p in query.recentProgress if p["batchId"] > printed and ran(p)], idle)


def idle_health(batch: BatchHealth | None, idle: Mapping[str, Any]) -> BatchHealth:
    """The last batch's health with the source's lag as an idle trigger's report says it now
    (a job with nothing to read says lag 0 without running a batch; before its first batch of
    a run, the batch is unknown)."""
    lag, by_partition = _lag(idle)
    if batch is None:
        return BatchHealth(
            None, lag_records=lag, lag_by_partition=by_partition, updated_at=now_iso()
        )
    return replace(batch, lag_records=lag, lag_by_partition=by_partition, updated_at=now_iso())


# Dead letters a health report shows, newest last.
DEAD_LETTER_SAMPLES = 20


def reason_kind(reason: str) -> str:
    """A rejection's reason without its particulars (a position, a value): the text up to its
    first ``": "`` (a step's: up to its second), so that reasons count together
    (``malformed JSON``, ``step enrich: ValueError``)."""
    parts = reason.split(": ", 2)
    kind = ": ".join(parts[:2]) if reason.startswith("step ") and len(parts) > 1 else parts[0]
    return kind[:120]


class SampledDeadLetters:
    """A query's dead-letter sink, remembering what this run published through it: the count
    per kind of reason and the newest records (what Dagster shows; ``srt log read`` has all).

    Every other method is the sink's own (it stays the one publisher's sink)."""

    def __init__(self, sink: Any, topic: str) -> None:
        from collections import Counter, deque

        self.sink, self.topic = sink, topic
        self.by_reason: Counter[str] = Counter()
        self.samples: deque[DeadLetterSample] = deque(maxlen=DEAD_LETTER_SAMPLES)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sink, name)

    def write_split(self, writer: Any, table: Any, partition: int | str, end: int) -> int:
        from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW
        from stateful_runtime.connectors.dead_letters import STEP
        from stateful_runtime.masking import mask_text

        done = int(self.sink.write_split(writer, table, partition, end))
        for row in table.to_pylist():
            reason = str(row.get(ERROR) or "")
            if row.get(STEP):  # a step's reject (a user function raised on it)
                reason = f"step {row[STEP]}: {reason}"
            self.by_reason[reason_kind(reason)] += 1
            raw = row.get(RAW) or b""
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            offset = row.get(OFFSET)
            self.samples.append(
                DeadLetterSample(
                    reason,
                    str(row.get(PARTITION)),
                    -1 if offset is None else int(offset),
                    mask_text(text[:SAMPLE_CHARS]),
                )
            )
        return done

    def view(self) -> DeadLetterView:
        """What a health report carries of them."""
        try:
            in_topic = int(self.sink.records())
        except Exception:  # noqa: BLE001 - a count for a report; the topic's system may be away
            in_topic = 0
        return DeadLetterView(self.topic, in_topic, dict(self.by_reason), tuple(self.samples))


def merge_views(views: list[DeadLetterView]) -> DeadLetterView:
    """Dead letters of one topic published through several sinks (a source's, its steps')."""
    by_reason: dict[str, int] = {}
    for v in views:
        for reason, n in v.by_reason.items():
            by_reason[reason] = by_reason.get(reason, 0) + n
    samples = tuple(x for v in views for x in v.samples)[-DEAD_LETTER_SAMPLES:]
    return DeadLetterView(views[0].topic, max(v.in_topic for v in views), by_reason, samples)
