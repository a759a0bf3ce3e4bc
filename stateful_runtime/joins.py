"""Joins of two keyed streams, in event time: Flink's interval join and window join, and an
event-time temporal join against a versioned table built from a changelog stream of upserts.

Both run on connected streams (``KeyedStream.connect``): each join is a
:class:`~stateful_runtime.functions.KeyedCoProcessFunction` the runtime writes
(:class:`IntervalJoinOperator`, :class:`TemporalJoinOperator`) around the user's join function,
so state, timers, isolation, checkpoints, savepoints, both state backends, the fingerprint and
the test harness are connect's. Each side is buffered in a keyed map state by event time and
cleaned by event-time timers as the watermark (the minimum of both inputs') passes, so the state
stays bounded on an endless stream. A record behind the watermark when it arrives is late: it
goes to the join's late side output if one is set, else it is dropped and counted as late in
the job's accounting (as a window's).

* **Interval join** (``left.interval_join(right).between(lower, upper)``): each left record
  ``l`` meets each right record ``r`` of its key with
  ``l.ts + lower <= r.ts <= l.ts + upper``, whichever arrives first, once:
  ``ProcessJoinFunction.process_element(left, right, ctx)`` is called for every such pair as
  the second of the two arrives. A left record is kept until the watermark passes
  ``l.ts + upper``, a right one until it passes ``r.ts - lower``.
* **Temporal join** (``stream.temporal_join(versions)``): the second input is a changelog of
  upserts (each record the new version of its key's row, valid from its event time); each
  record of the first input is held until the watermark passes its time, then
  ``TemporalJoinFunction.process_element(value, version, ctx)`` gets the version valid at that
  time (the one with the greatest event time not after it; None if there is none). The output
  depends on the inputs only, never on which topic was read first, so a replay gives the same.
  A key keeps its newest version that no future record can be older than, and every newer one.
* **Window join** (``first.join(second).where(...).equal_to(...).window(assigner)
  .apply(JoinFunction)``): each tumbling or sliding window's records of both inputs, per key,
  kept until the watermark passes the window's end; then ``JoinFunction.join(first, second)``
  for every pair, and the window is forgotten.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar

from pyspark.sql.types import StructType

from stateful_runtime.exceptions import ConfigError, UserFunctionError
from stateful_runtime.functions import (
    Context,
    KeyedCoProcessFunction,
    OutputTag,
    RuntimeContext,
    drop_late,
    live_entries,
    reject_record,
    to_datetime,
)
from stateful_runtime.state import MapStateDescriptor, TimeDomain, cell_of, own_copy
from stateful_runtime.windows import SlidingEventTimeWindows, TumblingEventTimeWindows

# The states of the joins (one map per input, by event time in ms): what srt explain and
# srt state inspect name.
LEFT_BUFFER = "left_buffer"
RIGHT_BUFFER = "right_buffer"
PENDING = "pending"
VERSIONS = "versions"
WINDOWS = "windows"
_MS = timedelta(milliseconds=1)


class JoinContext:
    """Given to a join function's ``process_element``: the times of what is joined, the
    key, the watermark and side outputs."""

    def __init__(self, ctx: Context) -> None:
        self._ctx = ctx
        self.left_ms = 0
        self.right_ms: int | None = 0

    def left_timestamp(self) -> datetime:
        """Event time of the left (first input's) record."""
        return to_datetime(self.left_ms)

    def right_timestamp(self) -> datetime | None:
        """Event time of the right record (of a temporal join: of the version; None without
        one)."""
        return None if self.right_ms is None else to_datetime(self.right_ms)

    def timestamp(self) -> datetime:
        """An interval join's output time: the later of the two (Flink's); a temporal
        join's: the left record's."""
        if self.right_ms is None:
            return to_datetime(self.left_ms)
        return to_datetime(max(self.left_ms, self.right_ms))

    def get_current_key(self) -> Any:
        return self._ctx.get_current_key()

    def current_watermark(self) -> datetime:
        return self._ctx.current_watermark()

    def output(self, tag: OutputTag, record: Mapping[str, Any]) -> None:
        """Send ``record`` to side output ``tag`` (one of the function's ``side_outputs``)."""
        self._ctx.output(tag, record)


class ProcessJoinFunction:
    """Flink's ProcessJoinFunction: ``process_element(left, right, ctx)`` is called for every
    pair an interval join matches and yields output records (dicts of ``output_schema``);
    ``ctx`` is a :class:`JoinContext`. ``open()`` / ``close()`` run once per task (clients,
    not state: the join keeps the state)."""

    output_schema: ClassVar[Mapping[str, Any] | StructType] = {}
    side_outputs: ClassVar[tuple[OutputTag, ...]] = ()

    def open(self) -> None:
        """Called once per task before any element."""

    def process_element(
        self, left: dict[str, Any], right: dict[str, Any], ctx: JoinContext
    ) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        """Called when the task ends."""


class TemporalJoinFunction:
    """A temporal join's function: ``process_element(value, version, ctx)`` is called once
    for every record of the first input, when the watermark has passed its time, with
    ``version`` the second input's record (of the same key) valid at that time, or None when
    there was none yet (yield nothing for an inner join). ``ctx`` is a :class:`JoinContext`
    (``right_timestamp()``: the version's time)."""

    output_schema: ClassVar[Mapping[str, Any] | StructType] = {}
    side_outputs: ClassVar[tuple[OutputTag, ...]] = ()

    def open(self) -> None:
        """Called once per task before any element."""

    def process_element(
        self, value: dict[str, Any], version: dict[str, Any] | None, ctx: JoinContext
    ) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def close(self) -> None:
        """Called when the task ends."""


class JoinFunction:
    """Flink's JoinFunction of a window join: ``join(first, second)`` returns the output record
    (a dict of ``output_schema``) of one pair of records of one key in one window, or None for
    none. ``open()`` / ``close()`` run once per task."""

    output_schema: ClassVar[Mapping[str, Any] | StructType] = {}

    def open(self) -> None:
        """Called once per task before any element."""

    def join(self, first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any] | None:
        raise NotImplementedError

    def close(self) -> None:
        """Called when the task ends."""


class JoinOperator(KeyedCoProcessFunction):
    """A join as the co-process function the runtime runs: the user's function
    (:attr:`join_function`), its side outputs and the join's late side outputs."""

    kind: ClassVar[str] = "join"
    calls: ClassVar[tuple[str, str]] = ("left", "right")

    def __init__(
        self,
        fn: ProcessJoinFunction | TemporalJoinFunction | JoinFunction,
        late: tuple[OutputTag | None, ...],
    ) -> None:
        self.join_function = fn
        self.late_tags = tuple(t for t in late if t is not None)
        self.output_schema = fn.output_schema  # type: ignore[misc]
        declared = tuple(getattr(fn, "side_outputs", ()))
        clash = [t.name for t in self.late_tags if t in declared]
        if clash:
            raise ConfigError(
                f"{type(fn).__name__}: side output(s) {clash} are both the function's and the "
                f"join's late side output; give the late data a tag of its own"
            )
        self.side_outputs = declared + tuple(dict.fromkeys(self.late_tags))  # type: ignore[misc]

    def describe(self) -> str:
        raise NotImplementedError

    def close(self) -> None:
        self.join_function.close()


# The joins run only inside the engine's keyed operator (on Spark and in the test harness),
# whose times they read and set in milliseconds: no datetime per element and timer.
def _ts(ctx: Context) -> int:
    """The element's (or the firing timer's) event time."""
    return ctx.operator.current_ms  # type: ignore[attr-defined,no-any-return]


def _watermark(ctx: Context) -> int:
    return ctx.operator.watermark_ms  # type: ignore[attr-defined,no-any-return]


def _late(ctx: Context) -> bool:
    return _ts(ctx) < _watermark(ctx)


def _timer(ctx: Context, ms: int) -> None:
    """An event-time timer of the current key at ``ms``."""
    ctx.operator.register_user_timer(ms, TimeDomain.EVENT_TIME)  # type: ignore[attr-defined]


class IntervalJoinOperator(JoinOperator):
    """``left.ts + lower <= right.ts <= left.ts + upper`` (bounds in ms)."""

    kind = "interval join"
    # It only ever puts new lists of records and removes them, and the user's function gets
    # copies of the other side's records: its reads may be shared with the state (see
    # stateful_runtime.operators.keyed).
    writes_back_reads = True

    def __init__(
        self,
        fn: ProcessJoinFunction,
        lower: timedelta,
        upper: timedelta,
        left_late: OutputTag | None = None,
        right_late: OutputTag | None = None,
    ) -> None:
        super().__init__(fn, (left_late, right_late))
        self.lower, self.upper = lower // _MS, upper // _MS
        self.left_late, self.right_late = left_late, right_late

    def describe(self) -> str:
        def plus(ms: int) -> str:
            return f"{'-' if ms < 0 else '+'} {timedelta(milliseconds=abs(ms))}"

        return (
            f"left.ts {plus(self.lower)} <= right.ts <= left.ts {plus(self.upper)}; each side "
            f"buffered by "
            f"event time ({LEFT_BUFFER}, {RIGHT_BUFFER}) until the watermark passes its "
            f"interval"
        )

    def open(self, ctx: RuntimeContext) -> None:
        self.left = ctx.get_map_state(MapStateDescriptor(LEFT_BUFFER, int, list))
        self.right = ctx.get_map_state(MapStateDescriptor(RIGHT_BUFFER, int, list))
        self.join_function.open()

    def process_element1(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        return iter(self._arrive(value, ctx, left=True))

    def process_element2(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        return iter(self._arrive(value, ctx, left=False))

    def _arrive(self, value: dict[str, Any], ctx: Context, *, left: bool) -> list[dict[str, Any]]:
        if _late(ctx):
            drop_late(ctx, self.left_late if left else self.right_late, value)
            return []
        ts = _ts(ctx)
        own, other = (self.left, self.right) if left else (self.right, self.left)
        own.put(ts, [*(own.get(ts) or []), value])
        # Kept while a record of the other side that is not late (at or after the
        # watermark) can still match it.
        last = ts + self.upper if left else ts - self.lower
        _timer(ctx, last + 1)
        lo, hi = (ts + self.lower, ts + self.upper) if left else (ts - self.upper, ts - self.lower)
        out: list[dict[str, Any]] = []
        join = JoinContext(ctx)
        fn: Any = self.join_function
        shared = ctx.operator.shared_reads  # type: ignore[attr-defined]
        for at in sorted(other.keys()):
            if lo <= at <= hi:
                for stored in other.get(at) or ():
                    record = own_copy(stored) if shared else stored  # the function's own
                    if left:
                        join.left_ms, join.right_ms = ts, at
                        out.extend(fn.process_element(value, record, join) or ())
                    else:
                        join.left_ms, join.right_ms = at, ts
                        out.extend(fn.process_element(record, value, join) or ())
        return out

    def on_timer(self, timestamp: datetime, ctx: Context) -> Iterator[dict[str, Any]]:
        # One timer per (key, time): it is the end of the left records at t - upper - 1 and
        # of the right ones at t + lower - 1.
        t = _ts(ctx)
        self.left.remove(t - self.upper - 1)
        self.right.remove(t + self.lower - 1)
        return iter(())


class TemporalJoinOperator(JoinOperator):
    """The first input's records held (:data:`PENDING`) until the watermark passes them, then
    joined with the second input's version (:data:`VERSIONS`) valid at their time."""

    kind = "temporal join"
    calls = ("stream", "versions")
    # It puts new lists and versions and removes them, and hands its function copies of the
    # versions (a pending record it hands over leaves the state): its reads may be shared with
    # the state (see stateful_runtime.operators.keyed).
    writes_back_reads = True

    def __init__(self, fn: TemporalJoinFunction, late: OutputTag | None = None) -> None:
        super().__init__(fn, (late,))
        self.late = late

    def describe(self) -> str:
        return (
            f"each record of input 1 held ({PENDING}) until the watermark passes its time, "
            f"then joined with input 2's version valid at that time ({VERSIONS}: the versions "
            f"a future record can still need)"
        )

    def open(self, ctx: RuntimeContext) -> None:
        self.pending = ctx.get_map_state(MapStateDescriptor(PENDING, int, list))
        self.versions = ctx.get_map_state(MapStateDescriptor(VERSIONS, int, dict))
        self.join_function.open()

    def process_element1(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        if _late(ctx):
            drop_late(ctx, self.late, value)
            return iter(())
        ts = _ts(ctx)
        # One timer per key, at its earliest pending record (Flink's temporal join): a timer
        # joins every record the watermark has passed. A record before the earliest gets one.
        # With reads shared, the key's pending records are the store's own dict.
        live = live_entries(ctx, self.pending)
        pending: Any = self.pending if live is None else live
        earliest = min(pending.keys(), default=None)
        held = [*(pending.get(ts) or []), value]
        if live is None:
            self.pending.put(ts, held)
        else:
            live[ts] = held
            cell_of(self.pending).replace_entries(live)
        if earliest is None or ts < earliest:
            _timer(ctx, ts + 1)
        return iter(())

    def process_element2(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        if _late(ctx):  # it would change what records already joined saw
            drop_late(ctx, None, value)
            return iter(())
        ts = _ts(ctx)
        self.versions.put(ts, value)  # of one key and time, the last read wins
        # Once the watermark passes it, the versions before it are no longer needed.
        _timer(ctx, ts + 1)
        return iter(())

    def on_timer(self, timestamp: datetime, ctx: Context) -> Iterator[dict[str, Any]]:
        # Every record before the watermark is final (a version still to come is at or after
        # it): joined now, whichever timer fired. Times first (no copy of the records), then
        # only the entries needed.
        t = max(_ts(ctx), _watermark(ctx))
        times = sorted(self.versions.keys())
        out: list[dict[str, Any]] = []
        join = JoinContext(ctx)
        fn: Any = self.join_function
        shared = ctx.operator.shared_reads  # type: ignore[attr-defined]
        read: dict[int, Any] = {}
        for at in sorted(k for k in self.pending.keys() if k < t):
            i = bisect_right(times, at) - 1
            version, join.right_ms = None, None
            if i >= 0:
                join.right_ms = times[i]
                if times[i] not in read:
                    got = self.versions.get(times[i])
                    read[times[i]] = own_copy(got) if shared else got  # the function's own
                version = read[times[i]]
            join.left_ms = at
            # The records themselves (no copy): each is removed from state once joined.
            for record in self.pending.get(at) or []:
                # Each record apart: one that raises is dead-lettered alone, and the key's
                # other records are joined (the timer's call does not fail for it).
                try:
                    out.extend(list(fn.process_element(record, version, join) or ()))
                except (ConfigError, UserFunctionError):
                    raise
                except Exception as exc:
                    reject_record(ctx, record, exc, f"{type(fn).__name__}.process_element")
            self.pending.remove(at)
        # Every record still to come is at t or later (the pending ones and those not late):
        # the newest version at or before t serves them all, the older ones none.
        i = bisect_right(times, t) - 1
        for at in times[: max(i, 0)]:
            self.versions.remove(at)
        rest = min(self.pending.keys(), default=None)
        if rest is not None:  # the key's timer, at its earliest record still pending
            _timer(ctx, rest + 1)
        return iter(out)


class WindowJoinOperator(JoinOperator):
    """Flink's window join: every pair of the two inputs' records of one key in one window
    (tumbling or sliding, event time), when the window ends."""

    kind = "window join"
    calls = ("first", "second")
    # Every window it reads it puts back or removes, and the user's function gets copies of a
    # window's records when it fires: its reads may be shared with the state (no copy of a
    # window's records per element; see stateful_runtime.operators.keyed).
    writes_back_reads = True

    def __init__(
        self, fn: JoinFunction, assigner: TumblingEventTimeWindows | SlidingEventTimeWindows
    ) -> None:
        super().__init__(fn, ())
        self.assigner = assigner
        self.size = assigner.size // _MS
        self.slide = (
            assigner.slide // _MS if isinstance(assigner, SlidingEventTimeWindows) else self.size
        )

    def describe(self) -> str:
        return (
            f"{self.assigner.describe()}: each window's records of both inputs kept "
            f"({WINDOWS}) until the watermark passes its end, then every pair joined"
        )

    def open(self, ctx: RuntimeContext) -> None:
        # window start -> [end, first input's records, second input's records]
        self.windows = ctx.get_map_state(MapStateDescriptor(WINDOWS, int, list))
        self.join_function.open()

    def process_element1(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        return self._add(value, ctx, 1)

    def process_element2(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        return self._add(value, ctx, 2)

    def _add(self, value: dict[str, Any], ctx: Context, side: int) -> Iterator[dict[str, Any]]:
        ts, watermark = _ts(ctx), _watermark(ctx)
        # With reads shared, the key's windows are the store's own dict (see WindowOperator).
        live = live_entries(ctx, self.windows)
        get, put = (
            (self.windows.get, self.windows.put) if live is None else (live.get, live.__setitem__)
        )
        last = ts - ts % self.slide
        placed = False
        for start in range(last, ts - self.size, -self.slide):
            end = start + self.size
            if end - 1 <= watermark:  # the window has fired (a window's lateness rule)
                continue
            stored = get(start)
            if stored is None:  # a new window: its timer (a window stays until it fires)
                stored = [end, [], []]
                _timer(ctx, end - 1)
            stored[side].append(value)
            put(start, stored)
            placed = True
        if not placed:
            drop_late(ctx, None, value)
        elif live is not None:
            cell_of(self.windows).replace_entries(live)
        return iter(())

    def on_timer(self, timestamp: datetime, ctx: Context) -> Iterator[dict[str, Any]]:
        start = _ts(ctx) + 1 - self.size
        stored = self.windows.get(start)
        if stored is None:
            return iter(())
        self.windows.remove(start)
        fn: Any = self.join_function
        out = []
        firsts, seconds = own_copy(stored[1]), own_copy(stored[2])  # the function's own
        for a in firsts:
            for b in seconds:
                # Each pair apart: one that raises is dead-lettered alone (as the pair).
                try:
                    joined = fn.join(a, b)
                except (ConfigError, UserFunctionError):
                    raise
                except Exception as exc:
                    pair = {"first": a, "second": b}
                    reject_record(ctx, pair, exc, f"{type(fn).__name__}.join")
                    continue
                if joined is not None:
                    out.append(joined)
        return iter(out)
