"""Closed-window reconciliation: a sink table's window counts against its source topic.

The consistent cut is the last micro-batch the sink wrote, B (its ledger row). Spark wrote B's
source end offsets and watermark to ``offsets/B`` before running it, and a window whose end is
at or before that watermark was final before B ran. So, with the ledger read before or with
the table (one snapshot where the warehouse has them; ClickHouse: ledger first, then the
table with FINAL — later batches cannot change a closed window), the table's closed windows
must count exactly the good records of the source up to B's offsets whose event time falls
in them.

This module reads the table side (ledger and window sums, one snapshot) and compares; the
source side comes from ``srt reconcile`` (:meth:`StreamingRuntime.window_counts`), a process
that loads the job file, so the Dagster process never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dagster_defs._specs import WindowReconciliation

if TYPE_CHECKING:
    from stateful_runtime.contract import WindowCounts
    from stateful_runtime.ledger import LedgerEntry

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
    """What the sink table says (see :func:`table_side`): the last batch the sink wrote
    and, per window start (epoch ms), the window's end (epoch ms) and summed count."""

    batch: int | None
    windows: dict[int, tuple[int, int]] = field(default_factory=dict)

    def closed(self, watermark_ms: int) -> dict[int, int]:
        """Counts of the windows that end at or before ``watermark_ms``."""
        return {w: n for w, (end, n) in self.windows.items() if end <= watermark_ms}


def _iso(ms: int | None) -> str | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC).isoformat()


def table_side(frame: Any, last: LedgerEntry | None, rec: WindowReconciliation) -> TableSide:
    """The last batch the sink wrote and the table's window counts, from a read of the table
    (:class:`~dagster_defs.resources.TableRead`): naive timestamps are UTC."""
    import pandas as pd

    if last is None:
        return TableSide(None)
    windows: dict[int, tuple[int, int]] = {}
    if len(frame):
        zero = pd.Timestamp(0, tz="UTC")
        ms = pd.Timedelta(milliseconds=1)
        starts = (pd.to_datetime(frame[rec.window_start_column], utc=True) - zero) // ms
        ends = (pd.to_datetime(frame[rec.window_end_column], utc=True) - zero) // ms
        counts = pd.to_numeric(frame[rec.count_column]).fillna(0)
        for start, end, n in zip(starts, ends, counts, strict=True):
            if pd.isna(start) or pd.isna(end):
                continue  # a row without a window is the not_null check's business
            prev = windows.get(int(start), (int(end), 0))
            windows[int(start)] = (max(prev[0], int(end)), prev[1] + int(n))
    return TableSide(last.batch_id, windows)


def compare(table: TableSide, source: WindowCounts) -> Outcome:
    """Window by window, the table's closed windows (by the watermark of the batch the
    source was counted to) against the source's good records."""
    watermark = source.watermark_ms or 0
    closed = table.closed(watermark)
    windows = sorted(set(closed) | set(source.windows))
    mismatched = [w for w in windows if closed.get(w, 0) != source.windows.get(w, 0)]
    table_total, source_total = sum(closed.values()), sum(source.windows.values())
    metadata: dict[str, Any] = {
        "sink_batch": table.batch,
        "watermark": _iso(source.watermark_ms),
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
                "table": closed.get(w, 0),
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
            f"{len(windows)} closed windows (end <= watermark {_iso(source.watermark_ms)}) "
            f"count all {source_total} good source events up to sink batch {table.batch}; "
            f"{source.dead_letters} dead letters in the same range are accounted apart"
        ),
        metadata,
    )
