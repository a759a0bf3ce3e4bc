"""Per-partition event-time alignment with idleness, shared by the sources.

Spark keeps one watermark per query: the maximum event time seen minus the out-of-orderness
bound. A partition that lags the others in event time (a smaller backlog share, a slow
producer) would see its records fall behind that watermark and be dropped as late. Flink
tracks a watermark per partition and takes the minimum; we get the same effect by alignment in
the source (Flink's watermark alignment):

* every read task records the largest event time of its split in a small stats file
  (:meth:`EventTimeAlignment.record`, next to the dead-letter staging directory);
* when planning the next batch, the driver holds back at its start offset every partition more
  than the bound ahead of the slowest *active* partition (:meth:`EventTimeAlignment.hold_back`),
  before the batch's record cap is shared among the rest;
* a partition with nothing new to read for longer than ``WatermarkStrategy.with_idleness`` is
  idle and holds nobody back; without idleness a silent partition stalls the others (Flink's
  behaviour too).

This *recorded* alignment works at batch granularity: it cannot stop a partition from covering
more than the bound within one batch (the watermark then passes the slow partition's next
records). The frontiers live in the driver (the first batch after a restart is not held back),
and a bounded (``--available-now``) run never waits. Kafka uses it.

A source that can read one record's event time cheaply (the embedded event log: one RocksDB
read) aligns at *plan time* instead, which has no such gap: :func:`bound_by_event_time` cuts
each partition's range where its event time passes the slowest partition's end by more than
the bound.
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import LongType, StructField

from stateful_runtime.checkpoints.layout import QueryLayout, event_time_stats
from stateful_runtime.connectors.base import ERROR

if TYPE_CHECKING:
    from stateful_runtime.watermarks import WatermarkStrategy


def options(watermark: WatermarkStrategy | None) -> dict[str, str]:
    """DataSource options that switch alignment on (the recording side also needs the query's
    dead-letter staging directory)."""
    if watermark is None or not watermark.timestamp_field:
        return {}
    return {
        "event_time_field": watermark.timestamp_field,
        "event_time_unit": watermark.timestamp_unit,
        "max_drift_ms": str(int(watermark.max_out_of_orderness.total_seconds() * 1e3)),
        "idleness_ms": (
            "" if watermark.idleness is None else str(int(watermark.idleness.total_seconds() * 1e3))
        ),
    }


def _max_ms(values: pa.Array, unit: str) -> int | None:
    """Largest event time of a column in ms (``unit``: ms, s or timestamp)."""
    if unit == "timestamp":
        values = pc.cast(values, pa.timestamp("ms")).cast(pa.int64())
    top = pc.max(values).as_py()
    if top is None:
        return None
    return int(top) * 1000 if unit == "s" else int(top)


class EventTimeAlignment:
    """Driver and task sides of alignment for one source reader (None if not configured)."""

    def __init__(self, opts: Mapping[str, str], staging: str) -> None:
        self.field = opts["event_time_field"]
        self.unit = opts.get("event_time_unit", "ms")
        self.drift_ms = int(opts.get("max_drift_ms") or 0)
        idle = opts.get("idleness_ms")
        self.idle_s = int(idle) / 1e3 if idle else None
        self.stats = event_time_stats(staging)
        self.frontier: dict[str, float] = {}
        self._arrival: dict[str, float] = {}
        self._seen_end: dict[str, int] = {}

    @classmethod
    def of(cls, opts: Mapping[str, str]) -> EventTimeAlignment | None:
        staging = opts.get("dead_letter_staging")
        return cls(opts, staging) if staging and opts.get("event_time_field") else None

    # -- task side ---------------------------------------------------------------------------
    def record(self, key: str, start: int, end: int, tables: Sequence[pa.Table]) -> None:
        """Record the largest event time of the good records of split ``key[start:end]``."""
        tops = [
            _max_ms(t.filter(pc.is_null(t.column(ERROR))).column(self.field), self.unit)
            for t in tables
        ]
        known = [t for t in tops if t is not None]
        if not known:
            return
        self.stats.mkdir(parents=True, exist_ok=True)
        final = self.stats / f"{key}-{start}-{end}.json"
        tmp = self.stats / f".{final.name}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps({"max": max(known)}))
        os.replace(tmp, final)

    # -- driver side -------------------------------------------------------------------------
    def _refresh(self) -> None:
        if not self.stats.is_dir():
            return
        for f in self.stats.glob("*.json"):
            key = f.name[:-5].rsplit("-", 2)[0]
            try:
                top = json.loads(f.read_text())["max"]
            except (OSError, ValueError, KeyError):
                continue
            if top > self.frontier.get(key, -math.inf):
                self.frontier[key] = top
            f.unlink(missing_ok=True)

    def hold_back(
        self, start: Mapping[str, int], ends: dict[str, int], *, bounded: bool
    ) -> dict[str, int]:
        """``ends`` with every partition that runs ahead in event time of the slowest active
        one held at its start offset."""
        now = time.monotonic()
        for k, e in ends.items():
            if e > self._seen_end.get(k, -1):
                self._seen_end[k] = e
                self._arrival[k] = now
        self._refresh()

        def idle(k: str) -> bool:
            return (
                self.idle_s is not None
                and ends[k] <= start.get(k, 0)
                and now - self._arrival.get(k, now) >= self.idle_s
            )

        active = [self.frontier.get(k, -math.inf) for k in ends if not idle(k)]
        if not active:
            return ends
        low = min(active)
        out = {
            k: (start.get(k, 0) if self.frontier.get(k, -math.inf) > low + self.drift_ms else v)
            for k, v in ends.items()
        }
        if bounded and all(out[k] <= start.get(k, 0) for k in out):
            return ends  # a bounded (availableNow) run never waits
        return out


# -- plan-time alignment (sources that can read one record's event time cheaply) ----------------


def record_time(value: bytes, field: str, unit: str) -> int | None:
    """Event time (ms) of one raw JSON record, None if it has none."""
    try:  # a hostile record (deep, NaN, 1e400) reads as "no event time", never a failure
        ts = json.loads(value)[field]
    except (ValueError, KeyError, TypeError, RecursionError, IndexError):
        return None
    if isinstance(ts, bool):
        return None
    if isinstance(ts, int | float):
        if isinstance(ts, float) and not math.isfinite(ts):
            return None
        try:
            return int(ts * 1000) if unit == "s" else int(ts)
        except (OverflowError, ValueError):
            return None
    if isinstance(ts, str):
        from datetime import UTC, datetime

        try:
            dt = datetime.fromisoformat(ts)
        except ValueError:
            return None
        return int((dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp() * 1000)
    return None


# How far back from a range's end to look for a record with an event time (bad records).
LOOK_BACK = 32


def bound_by_event_time(
    start: Mapping[str, int],
    ends: dict[str, int],
    time_at: Callable[[str, int], int | None],
    drift_ms: int,
) -> dict[str, int]:
    """Cut every partition's range where its event time passes the slowest partition's end by
    more than ``drift_ms``, so that no record of this batch moves the watermark past records
    the slowest partition has not read yet. ``time_at(partition, offset)`` reads one record's
    event time. Partitions are assumed ordered in event time up to ``drift_ms`` (a bisection
    finds the cut); a partition with nothing to read does not hold the others (it counts as
    idle at once)."""
    last: dict[str, int] = {}
    for k, e in ends.items():
        lo = start.get(k, 0)
        for o in range(e - 1, max(lo, e - LOOK_BACK) - 1, -1):
            t = time_at(k, o)
            if t is not None:
                last[k] = t
                break
    if len(last) < 2:
        return ends
    target = min(last.values()) + drift_ms
    out = dict(ends)
    for k, t in last.items():
        if t <= target:
            continue
        lo, hi = start.get(k, 0), ends[k]  # first offset in [lo, hi) past the target
        while lo < hi:
            mid = (lo + hi) // 2
            tm = time_at(k, mid)
            if tm is not None and tm > target:
                hi = mid
            else:
                lo = mid + 1
        out[k] = lo
    return out


# -- the late-event watermark of a batch (exact accounting of late records) ---------------------

# A column a source adds, on request, to every record: the watermark (ms) Spark's stateful
# operators drop late records by in the record's micro-batch. Spark's own counter
# (``numRowsDroppedByWatermark``) counts rows after the partial aggregation, one per window and
# key, not records; with this column the planner counts late records one by one.
LATE_BEFORE = "_late_before_ms"
LATE_BEFORE_FIELD = StructField(LATE_BEFORE, LongType(), True)
LATE_WATERMARK_OF = "late_watermark_of"  # the option: the query's checkpoint directory


def late_watermark_ms(query_checkpoint: str | Path) -> int:
    """The late-event watermark of the batch Spark is planning in ``query_checkpoint``: the
    watermark of the batch before it (Spark's ``getInputWatermarkForLateEvents`` is batch
    N-1's), read from Spark's offset log. Partitions are planned after Spark logs batch N's
    offsets; 0 before any batch (Spark's watermark starts at the epoch)."""
    query = QueryLayout(query_checkpoint)
    batches = query.planned_batches()
    if len(batches) < 2:
        return 0
    return max(0, int(query.watermark_ms(batches[-2]) or 0))


def late_before_fields(opts: Mapping[str, str]) -> tuple[StructField, ...]:
    """The extra schema field of a source asked for the late-event watermark (else none)."""
    return (LATE_BEFORE_FIELD,) if opts.get(LATE_WATERMARK_OF) else ()


def late_before_ms(opts: Mapping[str, str]) -> int | None:
    """Driver side, when planning a batch's partitions: the value its records carry."""
    where = opts.get(LATE_WATERMARK_OF)
    return late_watermark_ms(where) if where else None


def with_late_before(table: pa.Table, at: int, value: int | None) -> pa.Table:
    """Task side: ``table`` with the column inserted at ``at`` (None: not asked for)."""
    if value is None:
        return table
    return table.add_column(at, LATE_BEFORE, pa.array(np.full(len(table), value, np.int64)))
