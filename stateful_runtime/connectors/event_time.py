"""A source's event-time policy applied to a batch: which event times its read tasks accept.

The policy (:class:`~stateful_runtime.watermarks.EventTimePolicy`, on the source's
``WatermarkStrategy``) names a floor and ceilings relative to the batch's processing time and
to the watermark. Read tasks must judge a record the same way on every run of its batch (a
replayed batch dead-letters exactly the records its first run did: input = output + dead letters
+ late holds across crashes), so they never read a clock: the driver, planning a batch's
partitions, reads the batch's processing time and watermark from Spark's offset log (written
for batch N, with ``batchTimestampMs`` and ``batchWatermarkMs``, before its partitions are
planned; a re-run reads the same entry) and hands each split the resulting
:class:`~stateful_runtime.connectors.formats.json.TimeBounds`. The decoder turns a record
outside into a dead letter, so it never reaches ``withWatermark``.

An outlier is judged against the stream too (``max_ahead_of_stream``): each read task, once its
split is decoded, refuses a record that lies that far ahead of both the batch's watermark and
the records that follow it in its partition (:func:`refuse_outliers`). What follows a split's
last records is read from the rest of the batch's range (the offsets are logged, so a replay
sees the same); a partition's last records of a batch are judged by those before them, so the
driver ends a partition's range before a short run of records that jumped that far ahead
(:func:`hold_trailing_jump`): a later batch reads them with the records after them, which tell
a stream that moved on from outliers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.alignment import LOOK_BACK, record_time
from stateful_runtime.connectors.formats.json import ERROR_COLUMN, RAW_COLUMN, TimeBounds
from stateful_runtime.instants import iso_ms, span

if TYPE_CHECKING:
    from stateful_runtime.watermarks import WatermarkStrategy

FLOOR = "event_time_floor_ms"
MAX_AHEAD = "event_time_max_ahead_ms"
MAX_AHEAD_OF_WATERMARK = "event_time_max_ahead_of_watermark_ms"
MAX_AHEAD_OF_STREAM = "event_time_max_ahead_of_stream_ms"
BATCH_TIMES_OF = "batch_times_of"  # the query's checkpoint directory


def _ms(value: timedelta | None) -> str:
    return "" if value is None else str(value // timedelta(milliseconds=1))


def options(watermark: WatermarkStrategy | None, query_checkpoint: str | None) -> dict[str, str]:
    """DataSource options carrying the source's policy (none without an event-time field)."""
    if watermark is None or not watermark.timestamp_field:
        return {}
    policy = watermark.event_time_policy
    floor = policy.floor
    out = {
        FLOOR: "" if floor is None else str(math.floor(floor.timestamp() * 1000)),
        MAX_AHEAD: _ms(policy.max_ahead_of_processing_time),
        MAX_AHEAD_OF_WATERMARK: _ms(policy.max_ahead_of_watermark),
        MAX_AHEAD_OF_STREAM: _ms(policy.max_ahead_of_stream),
    }
    if query_checkpoint is not None:
        out[BATCH_TIMES_OF] = query_checkpoint
    return out


def _int(opts: Mapping[str, str], key: str) -> int | None:
    raw = opts.get(key)
    return int(raw) if raw else None


def bounds(
    opts: Mapping[str, str], processing_ms: int | None, watermark_ms: int | None
) -> TimeBounds | None:
    """The bounds of a batch planned at ``processing_ms`` with watermark ``watermark_ms``
    (None, or 0 before the first watermark: not bounded by it)."""
    if not opts.get("event_time_field"):
        return None
    floor = _int(opts, FLOOR)
    ceilings = []
    ahead = _int(opts, MAX_AHEAD)
    if ahead is not None and processing_ms is not None:
        ceilings.append(
            (
                processing_ms + ahead,
                processing_ms,
                "the batch's processing time",
                f"max_ahead_of_processing_time {timedelta(milliseconds=ahead)}",
            )
        )
    ahead_wm = _int(opts, MAX_AHEAD_OF_WATERMARK)
    if ahead_wm is not None and watermark_ms:
        ceilings.append(
            (
                watermark_ms + ahead_wm,
                watermark_ms,
                "the watermark",
                f"max_ahead_of_watermark {timedelta(milliseconds=ahead_wm)}",
            )
        )
    stream = _int(opts, MAX_AHEAD_OF_STREAM)
    if floor is None and not ceilings and stream is None:
        return None
    ceiling = min(ceilings) if ceilings else (None, 0, "", "")
    return TimeBounds(
        floor_ms=floor,
        floor_why="" if floor is None else f"the floor {iso_ms(floor)}",
        ceiling_ms=ceiling[0],
        ceiling_from_ms=ceiling[1],
        ceiling_from=ceiling[2],
        ceiling_setting=ceiling[3],
        stream_ms=stream,
        watermark_ms=max(0, int(watermark_ms or 0)),
    )


def batch_bounds(opts: Mapping[str, str]) -> TimeBounds | None:
    """Driver side, when planning a batch's partitions: the bounds its read tasks apply, from
    the processing time and watermark Spark logged for it. Without the query's checkpoint (a
    source read outside a job) the driver's clock stands in for the batch's processing time."""
    if not opts.get("event_time_field"):
        return None
    where = opts.get(BATCH_TIMES_OF)
    processing, watermark = None, None
    if where:
        query = QueryLayout(where)
        batch = query.last_planned()
        if batch is not None:
            processing, watermark = query.batch_times(batch)
    if processing is None:
        processing = int(time.time() * 1000)
    return bounds(opts, processing, watermark)


def plan_filter(opts: Mapping[str, str]) -> Callable[[int | None], int | None]:
    """For plan-time alignment: an event time read from one record, or None if the policy
    refuses it (judged against the driver's clock: only which offsets a batch covers depends
    on it, and those are logged before the batch runs)."""
    limits = bounds(opts, int(time.time() * 1000), None)
    if limits is None:
        return lambda t: t

    def keep(t: int | None) -> int | None:
        if t is None or limits.reason("", t, "") is not None:
            return None
        return t

    return keep


# -- outliers relative to the stream -------------------------------------------------------------

# How many records around a record it is judged against (the median of the next ones).
STREAM_CONTEXT = 8


def stream_outliers(
    ms: np.ndarray, after: np.ndarray, bounds: TimeBounds
) -> tuple[np.ndarray, np.ndarray]:
    """The outliers of a split: for each record, the event time it was judged against (the
    median of the :data:`STREAM_CONTEXT` good records after it; for the partition's last record
    of the batch, of those before it; a record alone is never one) where it lies more than
    ``bounds.stream_ms`` ahead of both that and the batch's watermark, else NaN; and whether
    that was the records before it. ``ms``: the split's event times in offset order, NaN for a
    record refused already; ``after``: those of the good records following the split in its
    batch."""
    out = np.full(len(ms), np.nan)
    by_before = np.zeros(len(ms), bool)
    if bounds.stream_ms is None:
        return out, by_before
    good = np.flatnonzero(~np.isnan(ms))
    times = ms[good]
    candidates = np.flatnonzero(times > bounds.watermark_ms + bounds.stream_ms)
    if not len(candidates):
        return out, by_before
    k = STREAM_CONTEXT
    following = np.concatenate([times[1:], np.asarray(after, np.float64), np.full(k, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(following, k)[candidates]
    ref = np.full(len(candidates), np.nan)
    seen = ~np.isnan(windows).all(axis=1)
    # A median below t - bound needs a successor below it: the cheap test first.
    low = np.zeros(len(candidates), bool)
    with np.errstate(all="ignore"):
        low[seen] = np.nanmin(windows[seen], axis=1) < times[candidates[seen]] - bounds.stream_ms
    if low.any():
        ref[low] = np.nanmedian(windows[low], axis=1)
    for i in np.flatnonzero(~seen):  # the partition's last record of the batch
        j = candidates[i]
        if j:
            ref[i] = np.median(times[max(0, j - k) : j])
    flagged = times[candidates] > ref + bounds.stream_ms  # NaN: never
    out[good[candidates[flagged]]] = ref[flagged]
    by_before[good[candidates[flagged & ~seen]]] = True
    return out, by_before


def _event_ms(table: pa.Table, field: str, unit: str) -> np.ndarray:
    """The event time (ms) of each record of a decoded table, NaN for a refused one."""
    col = table.column(field).combine_chunks()
    bad = table.column(ERROR_COLUMN).combine_chunks().is_valid()
    if pa.types.is_timestamp(col.type):
        ms = pc.divide(pc.cast(pc.cast(col, pa.timestamp("us")), pa.int64()), 1000.0)
        values = ms.to_numpy(zero_copy_only=False)
    elif pa.types.is_integer(col.type) or pa.types.is_floating(col.type):
        values = pc.cast(col, pa.float64()).to_numpy(zero_copy_only=False)
        values = values * (1 if unit == "ms" else 1000)
    elif pa.types.is_string(col.type):
        values = np.array([_iso_ms(v) for v in col.to_pylist()], np.float64)
    else:
        return np.full(len(table), np.nan)
    values = np.where(bad.to_numpy(zero_copy_only=False), np.nan, values.astype(np.float64))
    return values


def _iso_ms(text: str | None) -> float:
    if text is None:
        return math.nan
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return math.nan
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000


def refuse_outliers(
    tables: Sequence[pa.Table],
    field: str,
    unit: str,
    bounds: TimeBounds | None,
    raw: Callable[[int], pa.Array],
    after: Callable[[], Sequence[int]],
) -> list[pa.Table]:
    """A split's decoded tables (in offset order) with its outliers (:func:`stream_outliers`)
    refused: the reason in the error column, their bytes (``raw(i)``: table ``i``'s) kept.
    ``after()``: the event times of the good records after the split in its batch (at most
    :data:`STREAM_CONTEXT`; asked only when a record near the split's end is in doubt)."""
    out = list(tables)
    if bounds is None or bounds.stream_ms is None or not out or field not in out[0].column_names:
        return out
    ms = np.concatenate([_event_ms(t, field, unit) for t in out])
    with np.errstate(invalid="ignore"):
        doubt = ms > bounds.watermark_ms + bounds.stream_ms
    if not doubt.any():
        return out
    near_end = np.flatnonzero(~np.isnan(ms))[-STREAM_CONTEXT:]
    later = np.asarray(after() if doubt[near_end].any() else (), np.float64)
    ref, by_before = stream_outliers(ms, later, bounds)
    at = 0
    for i, table in enumerate(out):
        part = ref[at : at + table.num_rows]
        at += table.num_rows
        hit = ~np.isnan(part)
        if not hit.any():
            continue
        times = ms[at - table.num_rows : at]
        before = by_before[at - table.num_rows : at]
        why = pa.array(
            [
                _outlier_reason(field, times[j], part[j], before[j], bounds) if hit[j] else None
                for j in range(len(part))
            ],
            pa.string(),
        )
        mask = pa.array(hit)
        e = table.schema.get_field_index(ERROR_COLUMN)
        r = table.schema.get_field_index(RAW_COLUMN)
        table = table.set_column(e, ERROR_COLUMN, pc.if_else(mask, why, table.column(e)))
        kept = table.column(r).combine_chunks()
        out[i] = table.set_column(r, RAW_COLUMN, pc.if_else(mask, pc.cast(raw(i), kept.type), kept))
    return out


def _outlier_reason(field: str, t: float, ref: float, before: bool, bounds: TimeBounds) -> str:
    assert bounds.stream_ms is not None
    wm = bounds.watermark_ms
    which = f"the {STREAM_CONTEXT} before it" if before else f"the next {STREAM_CONTEXT}"
    return (
        f"event time {field!r} {iso_ms(t)} is an outlier: {span(t - ref)} ahead of its "
        f"partition's records around it in the batch (median {iso_ms(ref)}, {which}) and "
        + (f"{span(t - wm)} ahead of the watermark {iso_ms(wm)}" if wm else "no watermark yet")
        + f"; max_ahead_of_stream {timedelta(milliseconds=bounds.stream_ms)}"
    )


# A stream that moved on shows it within this many records (the last of them then has more
# than half of the records before it it is judged by on its side): a shorter run of records
# ahead at the end of a partition's range is moved out of the batch (:func:`hold_trailing_jump`).
MOVED_ON = STREAM_CONTEXT // 2 + 2


def _run_ahead(
    key: str, end: int, time_at: Callable[[str, int], int | None], stream_ms: int
) -> int | None:
    """Where the records before ``end`` that all lie more than ``stream_ms`` past the median
    of the :data:`STREAM_CONTEXT` before them begin, when they are fewer than
    :data:`MOVED_ON` (else, or if there are none, None)."""
    found: list[tuple[int, int]] = []  # (offset, event time), newest first
    o = end - 1
    while o >= max(0, end - 4 * LOOK_BACK) and len(found) < MOVED_ON + STREAM_CONTEXT:
        if (t := time_at(key, o)) is not None:
            found.append((o, t))
        o -= 1
    run = 0
    for n in range(1, MOVED_ON + 1):
        base = [t for _, t in found[n : n + STREAM_CONTEXT]]
        if not base:
            break
        floor = float(np.median(base)) + stream_ms
        if all(t > floor for _, t in found[:n]):
            run = n
    return found[run - 1][0] if 0 < run < MOVED_ON else None


def hold_trailing_jump(
    start: Mapping[str, int],
    ends: dict[str, int],
    listed: Mapping[str, int],
    time_at: Callable[[str, int], int | None],
    stream_ms: int | None,
    *,
    bounded: bool,
) -> dict[str, int]:
    """Driver side: ``ends`` with no partition's range ending in a run of fewer than
    :data:`MOVED_ON` records that jumped more than ``stream_ms`` ahead of the records before
    them. In the batch they would be judged by the records before them only, which cannot tell
    a stream that moved on (resumed after a pause) from outliers. The range ends before them,
    so a later batch reads them with the records after them (a live stream at its end waits
    for those); a range that would be left empty while records after them exist reaches over
    them instead. A bounded run's last batch reads them as they are. Records without an event
    time (bad ones, a transaction's markers) are skipped."""
    if stream_ms is None:
        return ends
    out = dict(ends)
    for k, end in ends.items():
        lo, last = start.get(k, 0), listed.get(k, end)
        if end <= lo or (bounded and end >= last):
            continue
        run = _run_ahead(k, end, time_at, stream_ms)
        if run is None:
            continue
        if run > lo or end >= last:
            out[k] = max(lo, run)
        else:  # the run is the whole range and more follows: read the run with what follows
            out[k] = min(last, end + STREAM_CONTEXT + MOVED_ON)
    return out


def good_times(values: Sequence[bytes], field: str, unit: str, bounds: TimeBounds) -> list[int]:
    """Event times of the raw records ``values`` that have one the batch accepts, at most
    :data:`STREAM_CONTEXT` (what follows a split, for :func:`refuse_outliers`)."""
    out = []
    for v in values:
        t = record_time(v, field, unit)
        if t is not None and bounds.reason(field, t, "") is None:
            out.append(t)
            if len(out) == STREAM_CONTEXT:
                break
    return out


def stream_ms(opts: Mapping[str, str]) -> int | None:
    """The source's ``max_ahead_of_stream`` (ms), None if off or without event time."""
    return _int(opts, MAX_AHEAD_OF_STREAM) if opts.get("event_time_field") else None
