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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.formats.json import TimeBounds
from stateful_runtime.instants import iso_ms

if TYPE_CHECKING:
    from stateful_runtime.watermarks import WatermarkStrategy

FLOOR = "event_time_floor_ms"
MAX_AHEAD = "event_time_max_ahead_ms"
MAX_AHEAD_OF_WATERMARK = "event_time_max_ahead_of_watermark_ms"
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
    if floor is None and not ceilings:
        return None
    ceiling = min(ceilings) if ceilings else (None, 0, "", "")
    return TimeBounds(
        floor_ms=floor,
        floor_why="" if floor is None else f"the floor {iso_ms(floor)}",
        ceiling_ms=ceiling[0],
        ceiling_from_ms=ceiling[1],
        ceiling_from=ceiling[2],
        ceiling_setting=ceiling[3],
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
