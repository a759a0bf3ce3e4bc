"""The full-semantics window operator, as a keyed process function over the runtime's state.

Used when a window needs more than Spark's native ``groupBy(window)``: sliding or session
windows, the global window with a count trigger, allowed lateness (late firings update the
result), a late side output, or early firings. It runs on the same keyed operator as user
functions, so it has the same checkpointing, restart and harness behaviour.

Per key, one map state ``windows``: window start → [end, accumulator, elements since last
firing, processing time of last firing]. Timers: ``end - 1`` fires the window (Flink's window
max timestamp); ``end - 1 + allowed lateness`` purges it. An element whose window was purged
already (``end - 1 + lateness <= watermark``) is late: it goes to the late side output if there
is one, else it is counted in the map state ``late_dropped``.

A window function that raises when its window fires (a timer) cannot be helped by a replay:
the same contents raise again. The window's contents are dead-lettered (one record: the key,
the window's bounds, and its elements or accumulator) with the step and the exception, and
its state is cleared, so nothing is lost and the state stays bounded; under
``errors.policy=fail`` the job stops instead, the window's state as it was.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from pyspark.sql.types import StructType

from stateful_runtime.aggregates import Aggregate
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import (
    KeyedProcessFunction,
    OutputTag,
    ProcessWindowFunction,
    TimeWindow,
    drop_late,
    live_entries,
    to_datetime,
)
from stateful_runtime.job import FAIL
from stateful_runtime.operators.isolation import describe
from stateful_runtime.operators.keyed import OperatorContext
from stateful_runtime.state import (
    AggregateFunction,
    MapStateDescriptor,
    ValueStateDescriptor,
    cell_of,
    own_copy,
)
from stateful_runtime.windows import (
    CountTrigger,
    EarlyFiring,
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    Trigger,
    TumblingEventTimeWindows,
    WindowAssigner,
)

GLOBAL_START = -(2**62)
_MS = timedelta(milliseconds=1)


def _ms(td: timedelta) -> int:
    return int(td / _MS)


def _naive_utc(ms: int) -> datetime | None:
    if ms <= GLOBAL_START or ms >= 2**62:
        return None
    return to_datetime(ms).astimezone(UTC).replace(tzinfo=None)


def _append(record: dict[str, Any], elements: list) -> list:
    elements.append(record)
    return elements


class WindowOperator(KeyedProcessFunction):
    """Window assignment, triggers, lateness and aggregation for one keyed window stream."""

    # Every window it reads it puts back or removes, so its reads may be shared with the
    # state (no copy per element and window: see stateful_runtime.operators.keyed); what it
    # hands a user's function when a window fires is a copy (:meth:`_emit`).
    writes_back_reads = True

    def __init__(
        self,
        assigner: WindowAssigner,
        keys: Sequence[str],
        aggregates: Mapping[str, Aggregate] | AggregateFunction | ProcessWindowFunction,
        output_schema: StructType,
        *,
        allowed_lateness: timedelta = timedelta(0),
        late_tag: OutputTag | None = None,
        trigger: Trigger | None = None,
    ) -> None:
        self.assigner = assigner
        self.keys = list(keys)
        self.window_function = aggregates if isinstance(aggregates, ProcessWindowFunction) else None
        self.aggregate_function = aggregates if isinstance(aggregates, AggregateFunction) else None
        self.aggregates = (
            {} if self.window_function or self.aggregate_function else dict(aggregates)  # type: ignore[arg-type]
        )
        self.output_schema = output_schema  # type: ignore[misc]
        self.side_outputs = (late_tag,) if late_tag else ()  # type: ignore[misc]
        self.lateness = _ms(allowed_lateness)
        self.late_tag = late_tag
        self.trigger = trigger
        # The assigner in milliseconds, once: _assign runs for every element.
        a = assigner
        self._size = (
            _ms(a.size) if isinstance(a, TumblingEventTimeWindows | SlidingEventTimeWindows) else 0
        )
        self._slide = _ms(a.slide) if isinstance(a, SlidingEventTimeWindows) else 0
        self._sessions = isinstance(a, EventTimeSessionWindows)
        self._gap = _ms(a.gap) if isinstance(a, EventTimeSessionWindows) else 0
        self._slid: tuple[int | None, list[tuple[int, int]]] = (None, [])
        self._slides: dict[int, list[tuple[int, int]]] = {}
        # The trigger and the contents' add, decided once: they run per element and window.
        self._count = trigger.count if isinstance(trigger, CountTrigger) else 0
        self._early_firing = trigger if isinstance(trigger, EarlyFiring) else None
        self._add: Any = (
            _append
            if self.window_function is not None
            else self.aggregate_function.add
            if self.aggregate_function is not None
            else self._add_aggregates
        )

    def open(self, ctx: Any) -> None:
        self.windows = ctx.get_map_state(MapStateDescriptor("windows", int, list))
        self.late_dropped = ctx.get_state(ValueStateDescriptor("late_dropped", int))

    def describe(self) -> str:
        fn = self.window_function or self.aggregate_function
        aggs = (
            type(fn).__name__
            if fn is not None
            else ", ".join(f"{k}={a.describe()}" for k, a in self.aggregates.items())
        )
        extra = (
            [f"allowed lateness {timedelta(milliseconds=self.lateness)}"] if self.lateness else []
        )
        if self.late_tag:
            extra.append(f"late data → side output {self.late_tag.name}")
        if self.trigger:
            extra.append(self.trigger.describe())
        return f"{self.assigner.describe()} by {', '.join(self.keys)} → {aggs}" + (
            f" ({'; '.join(extra)})" if extra else ""
        )

    def needs(self) -> str:
        why = []
        if not isinstance(self.assigner, TumblingEventTimeWindows):
            why.append(self.assigner.describe())
        fn = self.window_function or self.aggregate_function
        if fn is not None:
            why.append(f"a Python {getattr(fn, 'kind', type(fn).__name__)}")
        if self.lateness:
            why.append("allowed lateness")
        if self.late_tag:
            why.append("a late side output")
        if self.trigger:
            why.append(self.trigger.describe())
        return ", ".join(why)

    # ------------------------------------------------------------------ assignment

    def _assign(self, ts: int) -> list[tuple[int, int]]:
        size, slide = self._size, self._slide
        if slide:
            last = ts - ts % slide
            # Elements of one slide share their windows (the size is a multiple of the slide):
            # the list is made once per slide, not per element, and kept for a few slides
            # (elements out of order by a slide or two alternate between them).
            if last != self._slid[0]:
                windows = self._slides.get(last)
                if windows is None:
                    if len(self._slides) >= 64:  # disorder spans a few slides: keep a few
                        self._slides.clear()
                    windows = self._slides[last] = [
                        (s, s + size) for s in range(last, last - size, -slide)
                    ]
                self._slid = (last, windows)
            return self._slid[1]
        if size:
            start = ts - ts % size
            return [(start, start + size)]
        if self._gap:
            return [(ts, ts + self._gap)]
        return [(GLOBAL_START, 2**62)]

    # The window's contents: built-in aggregates (a dict of accumulators), a user
    # AggregateFunction (its accumulator), or a ProcessWindowFunction (the elements).

    def _empty(self) -> Any:
        if self.window_function is not None:
            return []
        if self.aggregate_function is not None:
            return self.aggregate_function.create_accumulator()
        return {name: agg.create() for name, agg in self.aggregates.items()}

    def _add_aggregates(self, record: dict[str, Any], acc: Any) -> Any:
        return {name: agg.add(acc[name], record) for name, agg in self.aggregates.items()}

    def _merge(self, a: Any, b: Any) -> Any:
        if self.window_function is not None:
            return a + b
        if self.aggregate_function is not None:
            return self.aggregate_function.merge(a, b)
        return {name: agg.merge(a[name], b[name]) for name, agg in self.aggregates.items()}

    def _emit(
        self, ctx: OperatorContext, start: int, end: int, acc: Any
    ) -> Iterator[dict[str, Any]]:
        key = ctx.operator.current_key
        if ctx.operator.shared_reads:
            # The function's own contents: an output may hold a list or dict of them, which
            # the window's later elements would change before the output is written.
            acc = own_copy(acc)
        if self.window_function is not None:
            window = TimeWindow(_naive_utc(start), _naive_utc(end))
            yield from self.window_function.process(
                key[0] if len(key) == 1 else key, window, list(acc)
            )
            return
        row = dict(zip(self.keys, key, strict=True))
        row["window_start"] = _naive_utc(start)
        row["window_end"] = _naive_utc(end)
        if self.aggregate_function is not None:
            row.update(self.aggregate_function.get_result(acc))
        else:
            for name, agg in self.aggregates.items():
                row[name] = agg.result(acc[name])
        yield row

    # ------------------------------------------------------------------ timers

    def _timers_for(self, ctx: OperatorContext, end: int, register: bool) -> None:
        if end >= 2**62:
            return
        service = ctx.timer_service()
        op = service.register_event_time_timer if register else service.delete_event_time_timer
        op(to_datetime(end - 1))
        if self.lateness:
            op(to_datetime(end - 1 + self.lateness))

    # ------------------------------------------------------------------ elements

    def process_element(
        self,
        value: dict[str, Any],
        ctx: OperatorContext,  # type: ignore[override]
    ) -> Iterator[dict[str, Any]]:
        op = ctx.operator
        ts, watermark = op.current_ms, op.watermark_ms
        windows = [self._merge_session(ts, ctx)] if self._sessions else self._assign(ts)
        # With reads shared, the key's windows are the store's own dict: changed in place and
        # handed back once per element, not read and written once per window.
        live = live_entries(ctx, self.windows)
        get = self.windows.get if live is None else live.get
        add, lateness, count = self._add, self.lateness, self._count
        for start, end in windows:
            if end - 1 + lateness <= watermark and end < 2**62:
                self._late(value, ctx)
                continue
            stored = get(start)
            if stored is None:
                stored = [end, self._empty(), 0, 0.0]
                self._timers_for(ctx, end, register=True)
                if live is not None:
                    live[start] = stored
            stored[1] = add(value, stored[1])
            stored[2] += 1
            if count and stored[2] >= count:
                yield from self._emit(ctx, start, end, stored[1])
                if live is None:
                    self.windows.remove(start)  # fire and purge
                else:
                    del live[start]
                continue
            # A late firing (the window had fired already), or an early one.
            if end - 1 <= watermark or (self._early_firing is not None and self._early(stored)):
                stored[2], stored[3] = 0, time.time()
                yield from self._emit(ctx, start, end, stored[1])
            if live is None:  # a copy: written back (a live window is changed in place)
                self.windows.put(start, stored)
        if live is not None:
            cell_of(self.windows).replace_entries(live)

    def _early(self, stored: list) -> bool:
        t = self._early_firing
        assert t is not None
        if t.count and stored[2] >= t.count:
            return True
        return bool(t.interval and time.time() - stored[3] >= t.interval.total_seconds())

    def _merge_session(self, ts: int, ctx: OperatorContext) -> tuple[int, int]:
        start, end = ts, ts + self._gap
        merged_acc: dict[str, Any] | None = None
        count = 0
        for s, stored in list(self.windows.items()):
            e = stored[0]
            if s < end and start < e:  # overlapping sessions merge
                start, end = min(start, s), max(end, e)
                merged_acc = stored[1] if merged_acc is None else self._merge(merged_acc, stored[1])
                count += stored[2]
                self._timers_for(ctx, e, register=False)
                self.windows.remove(s)
        if merged_acc is not None:
            self.windows.put(start, [end, merged_acc, count, 0.0])
            self._timers_for(ctx, end, register=True)
        return start, end

    def _late(self, value: dict[str, Any], ctx: OperatorContext) -> None:
        if self.late_tag is None:
            self.late_dropped.update((self.late_dropped.value() or 0) + 1)
        drop_late(ctx, self.late_tag, value)  # the job's accounting counts it as late

    # ------------------------------------------------------------------ timers fire

    # The window operator runs only inside the runtime's keyed operator, whose context it reads.
    def on_timer(  # type: ignore[override]
        self, timestamp: datetime, ctx: OperatorContext
    ) -> Iterator[dict[str, Any]]:
        t = ctx.operator.current_ms
        for start, stored in list(self.windows.items()):
            end = stored[0]
            if end - 1 == t:
                stored[2] = 0
                try:
                    rows = list(self._emit(ctx, start, end, stored[1]))
                except ConfigError:
                    raise  # the function's definition is wrong, not this window
                except Exception as exc:
                    if ctx.operator.guard.errors.policy == FAIL:
                        raise  # the engine stops the job, the window's state as it was
                    self._reject_window(ctx, start, end, stored[1], exc)
                    self.windows.remove(start)
                    continue
                yield from rows
                if not self.lateness:
                    self.windows.remove(start)
                else:
                    self.windows.put(start, stored)
            elif self.lateness and end - 1 + self.lateness <= t:
                self.windows.remove(start)

    def _reject_window(
        self, ctx: OperatorContext, start: int, end: int, contents: Any, exc: Exception
    ) -> None:
        """The window function raised firing window [start, end) of the current key: its
        contents (the elements of a process window function; the accumulator of an aggregate)
        are dead-lettered as one record with the window's key and bounds, and its state is
        cleared by the caller. Kept, a window that cannot fire would never be emitted nor
        released (Flink's operator would fail the job on every restart instead)."""
        op = ctx.operator
        key = op.current_key[0] if len(op.current_key) == 1 else op.current_key
        bounds = [_naive_utc(start), _naive_utc(end)]  # None: the global window's
        record: dict[str, Any] = {
            "key": key,
            "window_start": bounds[0].isoformat() if bounds[0] else None,
            "window_end": bounds[1].isoformat() if bounds[1] else None,
        }
        if self.window_function is not None:
            record["elements"] = list(contents)
        else:
            record["accumulator"] = contents
        op.guard.reject(
            op.guard.seen,
            record,
            f"on_timer: the window function raised {describe(exc)} firing the window "
            f"[{record['window_start']}, {record['window_end']}) of key {key!r}; the window's "
            f"contents are this record and its state was cleared",
            cause=exc,
        )
