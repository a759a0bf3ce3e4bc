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
sees the same). A partition's last record of a batch has nothing after it and is not judged,
so a range the planner cuts (the record cap, the alignment) reaches a few records past a
record that jumped ahead (:func:`reach_past_jump`).
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

# How many records after a record it is judged against (their median).
STREAM_CONTEXT = 8


def stream_outliers(ms: np.ndarray, after: np.ndarray, bounds: TimeBounds) -> np.ndarray:
    """The outliers of a split: for each record, the median event time of the
    :data:`STREAM_CONTEXT` good records after it in its batch where it lies more than
    ``bounds.stream_ms`` ahead of both that and the batch's watermark, else NaN. A record with
    none after it in the batch is not judged: one record cannot tell a stream that moved on
    (a sparse topic's next record hours later) from an outlier. ``ms``: the split's event times
    in offset order, NaN for a record refused already; ``after``: those of the good records
    following the split in its batch."""
    out = np.full(len(ms), np.nan)
    if bounds.stream_ms is None:
        return out
    good = np.flatnonzero(~np.isnan(ms))
    times = ms[good]
    candidates = np.flatnonzero(times > bounds.watermark_ms + bounds.stream_ms)
    if not len(candidates):
        return out
    k = STREAM_CONTEXT
    following = np.concatenate([times[1:], np.asarray(after, np.float64), np.full(k, np.nan)])
    windows = np.lib.stride_tricks.sliding_window_view(following, k)[candidates]
    seen = ~np.isnan(windows).all(axis=1)
    # A median below t - bound needs a successor below it: the cheap test first.
    low = np.zeros(len(candidates), bool)
    with np.errstate(all="ignore"):
        low[seen] = np.nanmin(windows[seen], axis=1) < times[candidates[seen]] - bounds.stream_ms
    if not low.any():
        return out
    ref = np.full(len(candidates), np.nan)
    ref[low] = np.nanmedian(windows[low], axis=1)
    flagged = times[candidates] > ref + bounds.stream_ms  # NaN: never
    out[good[candidates[flagged]]] = ref[flagged]
    return out


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
    return np.where(bad.to_numpy(zero_copy_only=False), np.nan, values.astype(np.float64))


def _iso_ms(text: str | None) -> float:
    if text is None:
        return math.nan
    try:
        t = datetime.fromisoformat(text)
    except ValueError:
        return math.nan
    return (t if t.tzinfo else t.replace(tzinfo=UTC)).timestamp() * 1000


def event_ms(tables: Sequence[pa.Table], field: str, unit: str) -> np.ndarray:
    """The event time (ms) of each record of a split's decoded tables, NaN for a refused one."""
    if not tables or field not in tables[0].column_names:
        return np.full(sum(t.num_rows for t in tables), np.nan)
    return np.concatenate([_event_ms(t, field, unit) for t in tables])


def judge_split(
    tables: Sequence[pa.Table],
    field: str,
    unit: str,
    bounds: TimeBounds | None,
    raw: Callable[[int], pa.Array],
    after: Callable[[], Sequence[int]],
) -> tuple[list[pa.Table], int | None]:
    """What a read task does to its split's decoded tables once: its outliers refused
    (:func:`refuse_outliers`), and the newest event time of its good records
    (:func:`newest_ms`), the event times read once for both."""
    ms = event_ms(tables, field, unit)
    return refuse_outliers(tables, ms, field, bounds, raw, after), newest_ms(ms)


def refuse_outliers(
    tables: Sequence[pa.Table],
    ms: np.ndarray,
    field: str,
    bounds: TimeBounds | None,
    raw: Callable[[int], pa.Array],
    after: Callable[[], Sequence[int]],
) -> list[pa.Table]:
    """A split's decoded tables (in offset order, event times ``ms``: :func:`event_ms`) with its
    outliers (:func:`stream_outliers`) refused: the reason in the error column, their bytes
    (``raw(i)``: table ``i``'s) kept, their event times in ``ms`` set to NaN. ``after()``: the
    event times of the good records after the split in its batch (at most
    :data:`STREAM_CONTEXT`; asked only when a record near the split's end is in doubt)."""
    out = list(tables)
    if bounds is None or bounds.stream_ms is None or not out:
        return out
    with np.errstate(invalid="ignore"):
        doubt = ms > bounds.watermark_ms + bounds.stream_ms
    if not doubt.any():
        return out
    near_end = np.flatnonzero(~np.isnan(ms))[-STREAM_CONTEXT:]
    later = np.asarray(after() if doubt[near_end].any() else (), np.float64)
    ref = stream_outliers(ms, later, bounds)
    judged = ms.copy()
    ms[~np.isnan(ref)] = np.nan
    at = 0
    for i, table in enumerate(out):
        part, times = ref[at : at + table.num_rows], judged[at : at + table.num_rows]
        at += table.num_rows
        hit = ~np.isnan(part)
        if not hit.any():
            continue
        why = pa.array(
            [
                _outlier_reason(field, times[j], part[j], bounds) if hit[j] else None
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


def _outlier_reason(field: str, t: float, ref: float, bounds: TimeBounds) -> str:
    assert bounds.stream_ms is not None
    wm = bounds.watermark_ms
    return (
        f"event time {field!r} {iso_ms(t)} is an outlier: {span(t - ref)} ahead of the records "
        f"after it in its partition (median of the next {STREAM_CONTEXT} {iso_ms(ref)}) and "
        + (f"{span(t - wm)} ahead of the watermark {iso_ms(wm)}" if wm else "no watermark yet")
        + f"; max_ahead_of_stream {timedelta(milliseconds=bounds.stream_ms)}"
    )


def reach_past_jump(
    start: Mapping[str, int],
    ends: dict[str, int],
    listed: Mapping[str, int],
    time_at: Callable[[str, int], int | None],
    stream_ms: int | None,
) -> dict[str, int]:
    """Driver side: ``ends`` with every partition's range that a cap or the alignment cut
    right after a record that jumped more than ``stream_ms`` past the one before it (while
    more records exist) reaching :data:`STREAM_CONTEXT` records further, so that the batch
    judges it by the records after it (a range's last record is not judged). Records without
    an event time (bad ones, a transaction's markers) are skipped."""
    if stream_ms is None:
        return ends
    out = dict(ends)
    for k, end in ends.items():
        lo, last = start.get(k, 0), listed.get(k, end)
        if end <= lo or end >= last:
            continue
        found: list[int] = []
        for o in range(end - 1, max(lo, end - LOOK_BACK) - 1, -1):
            if (t := time_at(k, o)) is not None:
                found.append(t)
                if len(found) == 2:
                    break
        if len(found) == 2 and found[0] > found[1] + stream_ms:
            out[k] = min(last, end + STREAM_CONTEXT)
    return out


def times_after(
    read: Callable[[int, int], Sequence[bytes]],
    end: int,
    through: int | None,
    field: str,
    unit: str,
    bounds: TimeBounds | None,
) -> list[int]:
    """What follows a split ending at ``end`` in its batch (whose range in the partition ends
    at ``through``), for :func:`refuse_outliers`: the event times of the first
    :data:`STREAM_CONTEXT` records the batch accepts among the next few, ``read(lo, hi)``
    giving raw records."""
    stop = min(through if through is not None else end, end + 4 * STREAM_CONTEXT)
    if stop <= end:
        return []
    out = []
    for v in read(end, stop):
        t = record_time(v, field, unit)
        if t is not None and (bounds is None or bounds.reason(field, t, "") is None):
            out.append(t)
            if len(out) == STREAM_CONTEXT:
                break
    return out


def stream_ms(opts: Mapping[str, str]) -> int | None:
    """The source's ``max_ahead_of_stream`` (ms), None if off or without event time."""
    return _int(opts, MAX_AHEAD_OF_STREAM) if opts.get("event_time_field") else None


# -- what a split reports of its event times (one watermark per partition) ----------------------

_MS_LIMIT = 1 << 42  # event times a split reports: 1970..2109 (ms)


def newest_ms(ms: np.ndarray) -> int | None:
    """The newest of a split's event times of good records (``ms``, NaN for refused ones),
    as its read task reports it (``connectors.accounting``); None outside 1970..2109 (the
    policy's floor refuses the first) or without any."""
    if not len(ms) or np.isnan(ms).all():
        return None
    top = int(np.nanmax(ms))
    return top if 0 <= top < _MS_LIMIT else None
