"""The keyed process operator: runs a KeyedProcessFunction against any StateBackend.

The Spark adapter (:mod:`stateful_runtime.operators.spark`) and the test harness
(:mod:`stateful_runtime.testing`) both drive this class, so a function behaves the same in a
unit test and on a cluster.

Timers: the backend keeps one timer per (key, timestamp). A function with both user timers
(it overrides ``on_timer``) and event-time TTL state records what each timestamp is for in an
internal map state ``_srt_timers`` (user timer, TTL cleanup or both), so that a user timer and a
cleanup timer at the same instant fire once and each does its part. A function with one kind
only needs no record: every timer is of that kind, and the map is never read or written (on
Spark each state access is a round trip to the JVM, per key).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import (
    Context,
    KeyedProcessFunction,
    OutputTag,
    RuntimeContext,
    TimerService,
    to_datetime,
    to_ms,
)
from stateful_runtime.operators.backend import MapCell, StateBackend, ValueCell
from stateful_runtime.operators.ttl import EventTtlMapCell, EventTtlValueCell
from stateful_runtime.state import (
    AggregatingState,
    AggregatingStateDescriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    StateDescriptor,
    TimeDomain,
    UpdateType,
    ValueState,
    ValueStateDescriptor,
)

TIMERS_STATE = "_srt_timers"
_USER = 1
_TTL = 2
_BOTH = _USER | _TTL


class KeyedOperator:
    """One task's instance of a keyed process function."""

    def __init__(self, fn: KeyedProcessFunction) -> None:
        self.fn = fn
        self.domain: TimeDomain = fn.time_domain
        self.side_tags = {t.name for t in fn.side_outputs}
        self.backend: StateBackend | None = None
        self.descriptors: dict[str, StateDescriptor] = {}
        self.ttl_cells: list[EventTtlValueCell | EventTtlMapCell] = []
        self.cells: list[tuple[str, ValueCell | MapCell]] = []
        self.current_key: tuple = ()
        self.current_ms = 0
        self.watermark_ms = 0
        self.processing_ms = 0
        self.timer_domain = self.domain
        self.main: list[dict[str, Any]] = []
        self.side: list[tuple[str, dict[str, Any]]] = []
        self._ctx = OperatorContext(self)

    # ----------------------------------------------------------------------- lifecycle

    def open(self, backend: StateBackend) -> None:
        self.backend = backend
        # Declared whatever the function: checkpoints of every keyed operator hold it.
        self._timers = backend.map_cell(TIMERS_STATE, None)
        self.fn.open(_OperatorRuntimeContext(self))
        user = type(self.fn).on_timer is not KeyedProcessFunction.on_timer
        # Which kinds of timer fire here; only with both does a timestamp need its record.
        self._kinds = (_USER if user else 0) | (_TTL if self.ttl_cells else 0)
        # Only a user's on_timer acts visibly on a due timer ahead of a key's elements: TTL
        # expiry only drops values that reads already treat as gone. Skipping it saves listing
        # the key's timers (a round trip to Spark's state store per key and batch).
        self._fire_first = user

    def close(self) -> None:
        self.fn.close()

    def set_time(self, watermark_ms: int, processing_ms: int) -> None:
        self.watermark_ms, self.processing_ms = watermark_ms, processing_ms

    # ----------------------------------------------------------------------- state

    def cell(self, desc: StateDescriptor) -> ValueCell | MapCell:
        """Backend cell for a descriptor (called from ``open`` via RuntimeContext)."""
        assert self.backend is not None, "state can only be declared in open()"
        known = self.descriptors.get(desc.name)
        if known is not None and known != desc:
            raise ConfigError(f"state {desc.name!r} is declared twice with different descriptors")
        self.descriptors[desc.name] = desc
        ttl = getattr(desc, "ttl", None)
        processing_ttl = None
        if ttl is not None:
            if ttl.time_domain is not self.domain:
                raise ConfigError(
                    f"state {desc.name!r} has a {ttl.time_domain.value} TTL but "
                    f"{type(self.fn).__name__} runs in {self.domain.value} (Spark runs a "
                    f"stateful operator in one time mode): set the function's time_domain or "
                    f"the TTL's time_domain to match"
                )
            if ttl.time_domain is TimeDomain.PROCESSING_TIME:
                processing_ttl = ttl.ttl_ms
        if isinstance(desc, MapStateDescriptor):
            cell: Any = self.backend.map_cell(desc.name, processing_ttl)
            if ttl is not None and processing_ttl is None:
                cell = EventTtlMapCell(cell, self, ttl.ttl_ms, ttl.update_type)
        else:
            cell = self.backend.value_cell(desc.name, processing_ttl)
            if ttl is not None and processing_ttl is None:
                cell = EventTtlValueCell(cell, self, ttl.ttl_ms, ttl.update_type)
        if (
            ttl is not None
            and processing_ttl is not None
            and ttl.update_type is UpdateType.ON_READ_AND_WRITE
        ):
            if isinstance(desc, MapStateDescriptor):
                raise ConfigError(
                    f"map state {desc.name!r}: ON_READ_AND_WRITE is supported for event-time "
                    f"TTL only (Spark's processing-time TTL restarts on write)"
                )
            cell = _RefreshOnRead(cell)
        if isinstance(cell, EventTtlValueCell | EventTtlMapCell):
            self.ttl_cells.append(cell)
        self.cells.append((desc.name, cell))
        return cell

    # ----------------------------------------------------------------------- timers

    def _mark(self, ts: int, flag: int) -> None:
        if self._kinds != _BOTH:
            self.backend.register_timer(ts)  # type: ignore[union-attr]
            return
        flags = self._timers.get_entry(ts) or 0
        if not flags & flag:
            self._timers.put_entry(ts, flags | flag)
            if not flags:
                self.backend.register_timer(ts)  # type: ignore[union-attr]

    def _unmark(self, ts: int, flag: int) -> None:
        if self._kinds != _BOTH:
            if self._kinds != _TTL:  # with TTL only, ts may be a cleanup timer: it stays
                self.backend.delete_timer(ts)  # type: ignore[union-attr]
            return
        flags = self._timers.get_entry(ts) or 0
        if flags & flag:
            rest = flags & ~flag
            if rest:
                self._timers.put_entry(ts, rest)
            else:
                self._timers.remove_entry(ts)
                self.backend.delete_timer(ts)  # type: ignore[union-attr]

    def _check_domain(self, domain: TimeDomain) -> None:
        if domain is not self.domain:
            raise ConfigError(
                f"{type(self.fn).__name__} runs in {self.domain.value} and cannot use "
                f"{domain.value} timers; set time_domain = TimeDomain.{domain.name} on the class"
            )

    def register_user_timer(self, ts: int, domain: TimeDomain) -> None:
        self._check_domain(domain)
        self._mark(ts, _USER)

    def delete_user_timer(self, ts: int, domain: TimeDomain) -> None:
        self._check_domain(domain)
        self._unmark(ts, _USER)

    def register_ttl_timer(self, ts: int) -> None:
        self._mark(ts, _TTL)

    def user_timers(self, key: tuple) -> list[int]:
        """``key``'s registered user timers (the test harness shows them)."""
        backend = self.backend
        assert backend is not None
        backend.begin_key(key)
        try:
            if self._kinds == _BOTH:
                return sorted(ts for ts, flags in self._timers.entries() if flags & _USER)
            return sorted(backend.list_timers()) if (self._kinds or _USER) & _USER else []
        finally:
            backend.end_key()

    # ----------------------------------------------------------------------- output

    def emit_side(self, tag: OutputTag, record: Mapping[str, Any]) -> None:
        if tag.name not in self.side_tags:
            raise ConfigError(
                f"{type(self.fn).__name__} wrote to side output {tag.name!r}, which is not in "
                f"its side_outputs; declare it: side_outputs = (OutputTag({tag.name!r}, ...),)"
            )
        self.side.append((tag.name, dict(record)))

    def drain(self) -> tuple[list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
        main, side = self.main, self.side
        self.main, self.side = [], []
        return main, side

    # ----------------------------------------------------------------------- driving

    def _now(self) -> int:
        return self.watermark_ms if self.domain is TimeDomain.EVENT_TIME else self.processing_ms

    def _fire_current(self, ts: int) -> None:
        """Run timer ``ts`` of the current key (already removed from the backend)."""
        if self._kinds == _BOTH:
            flags = self._timers.get_entry(ts) or 0
            self._timers.remove_entry(ts)
        else:
            flags = self._kinds or _USER
        self.current_ms = ts
        if flags & _TTL:
            for cell in self.ttl_cells:
                cell.expire(ts)
        if flags & _USER:
            self.timer_domain = self.domain
            out = self.fn.on_timer(to_datetime(ts), self._ctx)
            if out is not None:
                self.main.extend(out)

    def _fire_due(self) -> None:
        """Fire the current key's timers that are due before its new elements are processed.

        Spark fires a micro-batch's timers *after* its elements; Flink fires a timer as soon as
        the watermark passes it, before later elements. Firing due timers first gives Flink's
        order: elements of batch N see the effects of every timer due by batch N's watermark.
        """
        now = self._now()
        known = (
            (ts for ts, _ in self._timers.entries())
            if self._kinds == _BOTH
            else self.backend.list_timers()  # type: ignore[union-attr]
        )
        due = sorted(ts for ts in known if ts <= now)
        for ts in due:
            self.backend.delete_timer(ts)  # type: ignore[union-attr]
            self._fire_current(ts)

    def process(self, key: tuple, elements: Iterable[tuple[int, dict[str, Any]]]) -> None:
        """Run ``process_element`` for one key's elements, given as (event time ms, record)."""
        backend = self.backend
        assert backend is not None
        self.current_key = key
        backend.begin_key(key)
        fn, ctx, main = self.fn, self._ctx, self.main
        try:
            if self._fire_first:
                self._fire_due()
            for ts, value in elements:
                self.current_ms = ts
                out = fn.process_element(value, ctx)
                if out is not None:
                    main.extend(out)
        finally:
            backend.end_key()

    def fire(self, key: tuple, ts: int) -> None:
        """A timer of ``key`` at ``ts`` fired (the backend has already removed it)."""
        backend = self.backend
        assert backend is not None
        self.current_key = key
        backend.begin_key(key)
        try:
            self._fire_current(ts)
        finally:
            backend.end_key()


class _OperatorTimers(TimerService):
    def __init__(self, operator: KeyedOperator) -> None:
        self._op = operator

    def current_watermark(self) -> datetime:
        return to_datetime(self._op.watermark_ms)

    def current_processing_time(self) -> datetime:
        return to_datetime(self._op.processing_ms)

    def register_event_time_timer(self, when: datetime) -> None:
        self._op.register_user_timer(to_ms(when), TimeDomain.EVENT_TIME)

    def delete_event_time_timer(self, when: datetime) -> None:
        self._op.delete_user_timer(to_ms(when), TimeDomain.EVENT_TIME)

    def register_processing_time_timer(self, when: datetime) -> None:
        self._op.register_user_timer(to_ms(when), TimeDomain.PROCESSING_TIME)

    def delete_processing_time_timer(self, when: datetime) -> None:
        self._op.delete_user_timer(to_ms(when), TimeDomain.PROCESSING_TIME)


class _OperatorRuntimeContext(RuntimeContext):
    def __init__(self, operator: KeyedOperator) -> None:
        self._op = operator

    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        return ValueState(self._op.cell(descriptor))

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        return ListState(self._op.cell(descriptor))

    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        return MapState(self._op.cell(descriptor))

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState:
        return ReducingState(self._op.cell(descriptor), descriptor.reduce_function)

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState:
        return AggregatingState(self._op.cell(descriptor), descriptor.aggregate_function)


class OperatorContext(Context):
    """The engine's :class:`~stateful_runtime.functions.Context`; ``operator`` is the
    :class:`KeyedOperator` running the function (the window operator reads it directly)."""

    def __init__(self, operator: KeyedOperator) -> None:
        self.operator = operator
        self._timers = _OperatorTimers(operator)

    def timestamp(self) -> datetime:
        return to_datetime(self.operator.current_ms)

    def get_current_key(self) -> Any:
        key = self.operator.current_key
        return key[0] if len(key) == 1 else key

    def timer_service(self) -> TimerService:
        return self._timers

    def current_watermark(self) -> datetime:
        return to_datetime(self.operator.watermark_ms)

    def output(self, tag: OutputTag, record: Mapping[str, Any]) -> None:
        self.operator.emit_side(tag, record)

    def time_domain(self) -> TimeDomain:
        return self.operator.timer_domain


class _RefreshOnRead(ValueCell):
    """Processing-time TTL with ON_READ_AND_WRITE: a read rewrites the value (Spark's TTL
    clock restarts on write only)."""

    def __init__(self, inner: ValueCell) -> None:
        self.inner = inner

    def get(self) -> Any:
        value = self.inner.get()
        if value is not None:
            self.inner.put(value)
        return value

    def put(self, value: Any) -> None:
        self.inner.put(value)

    def clear(self) -> None:
        self.inner.clear()


class _Recorder(StateBackend):
    """A backend that only records which states a function declares."""

    def value_cell(self, name: str, processing_ttl_ms: int | None) -> ValueCell:
        return None  # type: ignore[return-value]

    def map_cell(self, name: str, processing_ttl_ms: int | None) -> MapCell:
        return None  # type: ignore[return-value]

    def register_timer(self, ts: int) -> None:
        pass

    def delete_timer(self, ts: int) -> None:
        pass

    def list_timers(self) -> list[int]:
        return []


def describe_states(fn: KeyedProcessFunction) -> list[StateDescriptor]:
    import copy

    op = KeyedOperator(copy.deepcopy(fn))
    op.open(_Recorder())
    return list(op.descriptors.values())
