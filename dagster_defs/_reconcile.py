"""Closed-window reconciliation: a sink table's window counts against its source topic.

The consistent cut is the last micro-batch the sink wrote, B (its ledger row). Spark wrote B's
source end offsets and watermark to ``offsets/B`` before running it, and a window whose end is
at or before that watermark was final before B ran. So, read in one DuckDB snapshot, the
table's closed windows must count exactly the good records of the source up to B's offsets
whose event time falls in them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dagster_defs._specs import SinkTableSpec, StreamingJobSpec, WindowReconciliation

if TYPE_CHECKING:
    import duckdb

    from dagster_defs.resources import StreamingRuntime

# Records decoded per read: bounds memory while the check walks a large topic.
READ_CHUNK = 65_536
# Mismatched windows listed in the check's metadata; the totals cover all of them.
SHOWN_MISMATCHES = 20


@dataclass
class Outcome:
    """A reconciliation result, ready to become an AssetCheckResult."""

    passed: bool
    description: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass
class TableSide:
    """What the sink table says, read in one DuckDB snapshot."""

    batch: int | None
    watermark_ms: int | None = None
    source_ends: dict[str, int] = field(default_factory=dict)
    windows: dict[int, int] = field(default_factory=dict)


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def read_table_side(
    con: duckdb.DuckDBPyConnection,
    job: StreamingJobSpec,
    table: SinkTableSpec,
    rec: WindowReconciliation,
    entry: Mapping[str, Any] | None,
) -> TableSide:
    """The last sink batch, its offsets and watermark, and the table's closed-window counts."""
    from dbt_sink import LEDGER_TABLE
    from stateful_runtime.checkpoints import layout

    row = con.execute(
        f"SELECT max(batch_id) FROM {LEDGER_TABLE} WHERE job = ? AND sink = ?",
        [job.name, table.query],
    ).fetchone()
    batch = None if row is None else row[0]
    if batch is None:
        return TableSide(None)
    queries = (entry or {}).get("queries") or {}
    if table.query not in queries:
        raise LookupError(
            f"job {job.name!r} has no query {table.query!r} in its registry entry "
            f"(queries: {sorted(queries)}); SinkTableSpec.query must name it"
        )
    offsets = layout.committed_offsets(queries[table.query]["checkpoint_dir"], int(batch))
    assert offsets is not None
    if len(offsets["sources"]) != 1 or not isinstance(offsets["sources"][0], dict):
        raise LookupError(
            f"query {table.query!r} reads {len(offsets['sources'])} sources; "
            f"reconciliation handles one"
        )
    watermark = int(offsets["watermark_ms"] or 0)
    sums = con.execute(
        f"SELECT epoch_ms({_q(rec.window_start_column)}), sum({_q(rec.count_column)}) "
        f"FROM {_q(table.table)} WHERE epoch_ms({_q(rec.window_end_column)}) <= ? GROUP BY 1",
        [watermark],
    ).fetchall()
    ends = {str(k): int(v) for k, v in offsets["sources"][0].items()}
    return TableSide(int(batch), watermark, ends, {int(w): int(n) for w, n in sums})


@dataclass
class SourceSide:
    windows: Counter[int] = field(default_factory=Counter)
    records: int = 0
    good: int = 0
    dead_letters: int = 0
    dead_letter_topic: str = ""
    dead_letter_topic_records: int | None = None


def count_source(
    runtime: StreamingRuntime,
    entry: Mapping[str, Any],
    rec: WindowReconciliation,
    ends: Mapping[str, int],
    watermark_ms: int,
) -> SourceSide:
    """Good records per closed window in the job's source topic up to ``ends``."""
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.source import LogSource
    from stateful_runtime.runtime.loader import load_job_file

    # The job exactly as the live process runs it: its file and its full config.
    job = load_job_file(
        entry["job_file"], {k: str(v) for k, v in (entry.get("config") or {}).items()}
    ).job
    nodes = [n for n in job.sources if rec.source in (None, n.name)]
    if len(nodes) != 1:
        raise LookupError(
            f"job {job.name!r} has sources {[n.name for n in job.sources]}; set "
            f"WindowReconciliation(source=...) to one of them"
        )
    node = nodes[0]
    source = node.source
    if not isinstance(source, LogSource):
        raise LookupError(
            f"source {node.name!r} is a {type(source).__name__}; reconciliation "
            f"reads the embedded event log (LogSource)"
        )
    if source.starting_offsets != "earliest":
        raise LookupError(
            f"source {node.name!r} starts at {source.starting_offsets!r} offsets; "
            f"reconciliation needs a source read from the earliest offset"
        )
    ts_field, unit = node.watermark.timestamp_field, node.watermark.timestamp_unit
    if ts_field is None:
        raise LookupError(f"source {node.name!r} has no timestamp field")
    if unit not in ("ms", "s"):
        raise LookupError(f"event time unit {unit!r} of source {node.name!r} is not ms or s")
    scale = 1000 if unit == "s" else 1
    size = int(rec.window.total_seconds() * 1000)

    log = EventLog(runtime.resolve(source.log_dir))
    reader = log.reader(source.topic)
    reader.catch_up()
    out = SourceSide(dead_letter_topic=source.dead_letter_topic)
    try:
        _count(reader, source, ts_field, ends, scale, size, watermark_ms, out)
    finally:
        reader.close()
    if source.dead_letter_topic in {t.name for t in log.topics()}:
        dlq = log.reader(source.dead_letter_topic)
        try:
            out.dead_letter_topic_records = sum(dlq.end_offsets().values())
        finally:
            dlq.close()
    return out


def _count(
    reader: Any,
    source: Any,
    ts_field: str,
    ends: Mapping[str, int],
    scale: int,
    size: int,
    watermark_ms: int,
    out: SourceSide,
) -> None:
    import numpy as np
    import pyarrow.compute as pc

    from stateful_runtime.connectors.base import ERROR

    for p, end in sorted(ends.items(), key=lambda kv: int(kv[0])):
        for lo in range(0, end, READ_CHUNK):
            values = reader.read_values(int(p), lo, min(end, lo + READ_CHUNK))
            decoded = source.decode(values)
            good = pc.is_null(decoded.column(ERROR))
            ts = decoded.column(ts_field).filter(good).drop_null()
            out.records += len(values)
            out.good += len(ts)
            out.dead_letters += len(values) - pc.sum(good.cast("int64")).as_py()
            if not len(ts):
                continue
            starts = ts.to_numpy().astype(np.int64) * scale // size * size
            closed = starts[starts + size <= watermark_ms]
            wins, counts = np.unique(closed, return_counts=True)
            out.windows.update(dict(zip(wins.tolist(), counts.tolist(), strict=True)))


def compare(table: TableSide, source: SourceSide) -> Outcome:
    """Window by window, the table's counts against the source's good records."""
    windows = sorted(set(table.windows) | set(source.windows))
    mismatched = [w for w in windows if table.windows.get(w, 0) != source.windows.get(w, 0)]
    table_total, source_total = sum(table.windows.values()), sum(source.windows.values())
    metadata: dict[str, Any] = {
        "sink_batch": table.batch,
        "watermark": _iso(table.watermark_ms),
        "closed_windows": len(windows),
        "table_events_in_closed_windows": table_total,
        "source_good_events_in_closed_windows": source_total,
        "difference": table_total - source_total,
        "mismatched_windows": len(mismatched),
        "source_records_read": source.records,
        "source_good_records_read": source.good,
        "dead_letters_in_range": source.dead_letters,
        "dead_letter_topic": source.dead_letter_topic,
        "dead_letter_topic_records": source.dead_letter_topic_records,
    }
    if mismatched:
        metadata["mismatches"] = [
            {
                "window_start": _iso(w),
                "table": table.windows.get(w, 0),
                "source": source.windows.get(w, 0),
            }
            for w in mismatched[:SHOWN_MISMATCHES]
        ]
        return Outcome(
            False,
            (
                f"{len(mismatched)} of {len(windows)} closed windows disagree with the source: the "
                f"table counts {table_total} events, the source has {source_total} good ones. More "
                f"in the table means duplicates; fewer means lost or late-dropped events."
            ),
            metadata,
        )
    return Outcome(
        True,
        (
            f"{len(windows)} closed windows (end <= watermark {_iso(table.watermark_ms)}) "
            f"count all {source_total} good source events up to sink batch {table.batch}; "
            f"{source.dead_letters} dead letters in the same range are accounted apart"
        ),
        metadata,
    )
