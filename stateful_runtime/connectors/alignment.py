"""Per-partition event-time alignment with idleness, shared by the sources.

Spark keeps one watermark per query: the maximum event time seen minus the out-of-orderness
bound. A partition that lags the others in event time (a smaller backlog share, a slow
producer) would see its records fall behind that watermark and be dropped as late. Flink
tracks a watermark per partition and takes the minimum; we get the same effect by alignment in
the source (Flink's watermark alignment), at *plan time*: both sources read one record's event
time cheaply (the event log one RocksDB read, Kafka one fetch by the driver's consumer, each
read once), so :func:`bound_by_event_time` cuts each partition's range where its event time
passes the slowest partition's end by more than the bound, before and after the batch's
record cap is shared: no record of a batch moves the watermark past records another
partition has not read yet.

A partition with nothing new to read is silent. On Kafka it holds the others (Flink without
idleness) until it has been silent for longer than ``WatermarkStrategy.with_idleness``
(:class:`Idleness`, :func:`hold_for_silent`): they are cut where they pass its last record's
event time by more than the bound; a bounded (``--available-now``) run never waits. The event
log's silent partitions hold nobody (idle at once).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from pyspark.sql.types import LongType, StructField

from stateful_runtime.checkpoints.layout import QueryLayout

if TYPE_CHECKING:
    from stateful_runtime.watermarks import WatermarkStrategy


def options(watermark: WatermarkStrategy | None) -> dict[str, str]:
    """DataSource options that switch alignment on."""
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


class Idleness:
    """Driver side: when each partition's listed end last grew, which tells a silent partition
    that still holds the others from an idle one (``idleness_ms``; none: never idle)."""

    def __init__(self, opts: Mapping[str, str]) -> None:
        idle = opts.get("idleness_ms")
        self.idle_s = int(idle) / 1e3 if idle else None
        self._arrival: dict[str, float] = {}
        self._seen_end: dict[str, int] = {}

    def holding(self, start: Mapping[str, int], listed: Mapping[str, int]) -> list[str]:
        """The partitions with nothing new to read in ``listed`` that are not idle yet."""
        now = time.monotonic()
        for k, e in listed.items():
            if e > self._seen_end.get(k, -1):
                self._seen_end[k] = e
                self._arrival[k] = now
        return [
            k
            for k, e in listed.items()
            if e <= start.get(k, 0)
            and (self.idle_s is None or now - self._arrival.get(k, now) < self.idle_s)
        ]


def hold_for_silent(
    start: Mapping[str, int],
    ends: dict[str, int],
    silent: list[str],
    time_at: Callable[[str, int], int | None],
    drift_ms: int,
    *,
    bounded: bool,
) -> dict[str, int]:
    """Cut every partition's range where its event time passes the last record read of the
    slowest of the ``silent`` partitions by more than ``drift_ms`` (a silent partition that
    holds no record holds nobody). A ``bounded`` run is never held whole."""
    lasts = [t for k in silent if (t := _last_time(k, 0, start.get(k, 0), time_at)) is not None]
    if not lasts:
        return ends
    out = _cut(start, ends, time_at, min(lasts) + drift_ms, _last_times(start, ends, time_at))
    if bounded and all(out[k] <= start.get(k, 0) for k in out):
        return ends
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


def _last_time(
    key: str, lo: int, end: int, time_at: Callable[[str, int], int | None]
) -> int | None:
    """The event time of the last record before ``end`` that has one (looking back at most
    :data:`LOOK_BACK` records, not before ``lo``)."""
    for o in range(end - 1, max(lo, end - LOOK_BACK) - 1, -1):
        t = time_at(key, o)
        if t is not None:
            return t
    return None


def _last_times(
    start: Mapping[str, int], ends: Mapping[str, int], time_at: Callable[[str, int], int | None]
) -> dict[str, int]:
    """The event time of the last record of each partition's range that has one."""
    return {
        k: t
        for k, e in ends.items()
        if (t := _last_time(k, start.get(k, 0), e, time_at)) is not None
    }


def _cut(
    start: Mapping[str, int],
    ends: dict[str, int],
    time_at: Callable[[str, int], int | None],
    target: int,
    last: Mapping[str, int],
) -> dict[str, int]:
    """``ends`` with every partition's range (whose last event time is ``last``'s) ending
    before its first record past ``target`` (a bisection: partitions are ordered in event
    time up to the bound)."""
    out = dict(ends)
    for k, t in last.items():
        if t <= target:
            continue
        lo, hi = start.get(k, 0), ends[k]
        while lo < hi:  # first offset in [lo, hi) past the target
            mid = (lo + hi) // 2
            tm = time_at(k, mid)
            if tm is not None and tm > target:
                hi = mid
            else:
                lo = mid + 1
        out[k] = lo
    return out


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
    finds the cut); a partition with nothing to read does not hold the others here
    (:func:`hold_for_silent` does)."""
    last = _last_times(start, ends, time_at)
    if len(last) < 2:
        return ends
    return _cut(start, ends, time_at, min(last.values()) + drift_ms, last)


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
