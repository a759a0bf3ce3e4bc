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

Each call of a user function (``process_element``, ``on_timer``; the window operator's
functions run inside these) is atomic: its state writes, timer changes and outputs are held
aside (:class:`_Txn`, over the backend's cells: no backend knows of it) and applied when it
returns (a plain value cell's writes are held by the cell until the key's turn ends, so a
key's run of elements costs the backend one read and one write, not one per element). When
it raises, none of them happened, and the element (or timer) is isolated by the
task's :class:`~stateful_runtime.operators.isolation.StepGuard`: dead-lettered with the step and
the reason, or the job stopped where the job's error policy says so. A value a function reads
from state is its own copy (a mutable one is copied on read), so changing it in place and then
raising leaves the state as it was; as with Flink's RocksDB backend, a value changed in place
must be written back (``update``/``put``) to be kept.

The copy on read is per element and grows with the value: a window operator whose accumulator is a
dict of thousands of entries paid a pickle round trip of it for every element and window (Nexmark
q5: 87% of a worker's time). A function that writes back every value it changes (the runtime's own
window operator: its ``writes_back_reads``) may run with reads *shared* with the state
(:meth:`KeyedOperator.share_reads`): no copies and no writes held aside, so a call that raised may
have changed state that no rollback can undo. Such a call raises :class:`ReadsShared` instead of
being isolated, and the driver runs the task again from its batch's version with copies on read,
where the call is isolated as usual (Flink's answer to a failure, a replay from the last consistent
state, at the scale of one task).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from stateful_runtime.exceptions import ConfigError, UserFunctionError
from stateful_runtime.functions import (
    BROADCAST_KEY,
    Context,
    KeyedProcessFunction,
    OutputTag,
    RuntimeContext,
    TimerService,
    function_name,
    has_on_timer,
    to_datetime,
    to_ms,
)
from stateful_runtime.job import ErrorPolicy
from stateful_runtime.operators.backend import MapCell, StateBackend, ValueCell
from stateful_runtime.operators.isolation import StepGuard, describe
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
    own_copy,
)

TIMERS_STATE = "_srt_timers"
# An element's source partition, offset and union input (each None where unknown).
Origin = tuple[int | None, int | None, int | None]


class ReadsShared(Exception):  # noqa: N818 (control flow between the engine and its driver)
    """A call raised while its reads were shared with the state (see the module doc): the
    task must run again from its batch's version with :meth:`KeyedOperator.share_reads` off."""


_USER = 1
_TTL = 2
_BOTH = _USER | _TTL


class KeyedOperator:
    """One task's instance of a keyed process function.

    Args:
        fn: the function.
        guard: how the task isolates an element or timer the function raises on (default: a
            guard that keeps its rejects in memory, under the default error policy).
    """

    def __init__(self, fn: KeyedProcessFunction, guard: StepGuard | None = None) -> None:
        self.fn = fn
        self.guard = (
            guard if guard is not None else StepGuard(type(fn).__name__, "?", ErrorPolicy(), None)
        )
        # The source partition and offset of the element being processed and its union input
        # (the Spark adapter sets it as it hands each element over; None in the harness), or
        # a lookup of an element's, asked only when one is isolated or late (the Arrow path:
        # nothing per element).
        self.origin: Origin = (None, None, None)
        self.origin_of: Callable[[dict[str, Any]], Origin] | None = None
        self._txn = _Txn(self)
        self.shared_reads = False
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
        # The handles ``open`` got, by state name (``apply_to_keyed_state`` passes them on).
        self.handles: dict[str, Any] = {}
        # apply_to_keyed_state calls of the running call, run once it has returned.
        self.deferred: list[tuple[StateDescriptor, Any]] = []
        self._ctx = OperatorContext(self)

    # ----------------------------------------------------------------------- lifecycle

    def open(self, backend: StateBackend) -> None:
        self.backend = backend
        # Declared whatever the function: checkpoints of every keyed operator hold it.
        self._timers = backend.map_cell(TIMERS_STATE, None)
        self.fn.open(_OperatorRuntimeContext(self))
        user = has_on_timer(self.fn)
        # Which kinds of timer fire here; only with both does a timestamp need its record.
        self._kinds = (_USER if user else 0) | (_TTL if self.ttl_cells else 0)
        only = self.cells[0][1] if len(self.cells) == 1 else None
        if self._kinds == _TTL and isinstance(only, EventTtlValueCell):
            only.sole = backend.sole_expiry = True
        # Only a user's on_timer acts visibly on a due timer ahead of a key's elements: TTL
        # expiry only drops values that reads already treat as gone. Skipping it saves listing
        # the key's timers (a round trip to Spark's state store per key and batch).
        self._fire_first = user

    def close(self) -> None:
        self.fn.close()

    def share_reads(self) -> None:
        """Hand the function stored values without a copy and write its changes straight
        through (see the module doc): only for a function that writes back what it changes,
        driven by a caller that runs the task again on :class:`ReadsShared`."""
        self.shared_reads = True

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
        # Only a plain cell holds its writes until the key's turn ends: a TTL cell stamps
        # each write with the element's time, and two handles of one state must see each
        # other's writes at once.
        wrapped = self._txn.wrap(cell, hold=ttl is None and known is None)
        if known is not None:
            for other in self._txn.cells.get(desc.name, ()):
                other.holds = False
        self._txn.cells.setdefault(desc.name, []).append(wrapped)
        return wrapped

    def keep_handle(self, desc: StateDescriptor, handle: Any) -> Any:
        self.handles[desc.name] = handle
        return handle

    def apply_to_keyed_state(self, desc: StateDescriptor, function: Any) -> None:
        """Call ``function(key, handle)`` for every key holding state ``desc`` once the running
        call has returned (a broadcast element's: Flink's ``applyToKeyedState``)."""
        if self.descriptors.get(desc.name) != desc:
            raise ConfigError(
                f"apply_to_keyed_state: {type(self.fn).__name__} declares no keyed state "
                f"{desc!r} in open()"
            )
        self.deferred.append((desc, function))

    def _run_deferred(self) -> None:
        """The apply_to_keyed_state calls of the call that just returned, each key's call
        atomic and isolated as an element's; the current key is restored after."""
        backend = self.backend
        assert backend is not None
        deferred, self.deferred = self.deferred, []
        key, group = self.current_key, getattr(backend, "group", None)
        fn = self.fn
        self._txn.flush()
        backend.end_key()
        try:
            for desc, function in deferred:
                handle = self.handles[desc.name]
                fn.applying = desc.name  # type: ignore[attr-defined]
                for at, each in backend.keys_with(desc.name):
                    if at is not None:
                        backend.group = at  # type: ignore[attr-defined]
                    self.current_key = each
                    backend.begin_key(each)
                    shown = each[0] if len(each) == 1 else each
                    self._call(
                        lambda _arg, _ctx, f=function, k=shown, h=handle: f(k, h),
                        None,
                        {"key": shown, "state": desc.name},
                        None,
                    )
                    self._txn.flush()
                    backend.end_key()
        finally:
            fn.applying = None  # type: ignore[attr-defined]
            if hasattr(backend, "group"):
                backend.group = group  # type: ignore[attr-defined]
            self.current_key = key
            backend.begin_key(key)

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
        self._txn.timer(ts, True)

    def delete_user_timer(self, ts: int, domain: TimeDomain) -> None:
        self._check_domain(domain)
        self._txn.timer(ts, False)

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
            self._call(self.fn.on_timer, to_datetime(ts), None, ts)

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
        fn = self.fn
        try:
            if self._fire_first:
                self._fire_due()
            for ts, value in elements:
                self.current_ms = ts
                self._call(fn.process_element, value, value, None)
        finally:
            self._txn.flush()
            backend.end_key()

    def _call(self, method: Any, arg: Any, element: dict[str, Any] | None, ts: int | None) -> None:
        """One user call, atomic: ``method(arg, ctx)`` (``process_element`` of ``element``, or
        ``on_timer`` of timer ``ts``); its state writes, timers and outputs apply when it
        returns, and none of them when it raises (the element or timer is isolated)."""
        txn, main = self._txn, self.main
        # _Txn.begin, inlined: this runs per element. With reads shared, state is read and
        # written as outside a call (no copies, no writes held aside): a raise redoes the task.
        txn.active, txn.side_at = not self.shared_reads, len(self.side)
        self.guard.seen += 1  # also the call's position in the task (rejects in a row)
        emitted = len(main)
        try:
            out = method(arg, self._ctx)
            if out is not None:
                main.extend(out)  # a generator runs here
        except (ConfigError, UserFunctionError):
            del main[emitted:]
            txn.rollback()
            self.deferred.clear()
            raise  # the function's definition is wrong (or a step's error bound tripped)
        except Exception as exc:
            del main[emitted:]
            txn.rollback()
            self.deferred.clear()
            if self.shared_reads:
                raise ReadsShared(describe(exc)) from exc
            self._isolate(exc, element, ts)
            return
        txn.active = False
        if txn.touched or txn.timers:
            if self.current_key == BROADCAST_KEY:
                txn.rollback()
                raise ConfigError(
                    f"{function_name(self.fn)}.process_broadcast_element wrote keyed state or "
                    f"a timer; a broadcast element has no key: change every key's state with "
                    f"ctx.apply_to_keyed_state(descriptor, function)"
                )
            txn.commit()
        if self.deferred:
            self._run_deferred()

    def _isolate(self, exc: Exception, element: dict[str, Any] | None, ts: int | None) -> None:
        key = self.current_key[0] if len(self.current_key) == 1 else self.current_key
        if element is not None:
            partition, offset, _ = (
                self.origin if self.origin_of is None else self.origin_of(element)
            )
            what = getattr(self.fn, "element_call", "process_element")
            record: object = element
        else:
            partition = offset = None
            what = "on_timer"
            record = {"key": key, "timer": to_datetime(ts or 0).isoformat()}
        self.guard.reject(
            self.guard.seen,
            record,
            f"{what} raised {describe(exc)} (key {key!r}; the key's state is as before it)",
            partition,
            offset,
            exc,
        )

    def origin_input(self, element: dict[str, Any]) -> int | None:
        """The input of a union ``element`` came from (None outside a union)."""
        return (self.origin if self.origin_of is None else self.origin_of(element))[2]

    def reject_record(self, record: dict[str, Any], exc: Exception, call: str) -> None:
        """Isolate one record a runtime operator handed to a user function inside its own
        call (a temporal join's timer joins each held record apart): dead-lettered with the
        reason, or the job stopped, as an element's call."""
        key = self.current_key[0] if len(self.current_key) == 1 else self.current_key
        self.guard.reject(
            self.guard.seen,
            record,
            f"{call} raised {describe(exc)} (key {key!r}; the record is dropped from state)",
            None,
            None,
            exc,
        )

    @property
    def cleanups_only(self) -> dict[str, bool] | None:
        """When every timer of the function is an event-time TTL cleanup (no ``on_timer``):
        its TTL states (name → whether a map), which a cleanup cuts to what outlives it
        (``LocalBackend.expire``, no user code, no key turn); else None."""
        if self._kinds != _TTL:
            return None
        return {
            name: isinstance(cell, EventTtlMapCell)
            for name, cell in self.cells
            if isinstance(cell, EventTtlValueCell | EventTtlMapCell)
        }

    def visit(self, key: tuple, call: Callable[[], Any]) -> Any:
        """``call()`` in ``key``'s turn, outside a user call: what it reads is the key's state
        (a lookup's ``needs_lookup``, before the batch's elements)."""
        backend = self.backend
        assert backend is not None
        self.current_key = key
        backend.begin_key(key)
        try:
            return call()
        finally:
            self._txn.flush()
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
            self._txn.flush()
            backend.end_key()


_UNSET = object()
_CLEARED = object()


class _Txn:
    """One user call's state writes, timer changes and outputs, held aside until it returns.

    Outside a call (``open``, the runtime's own bookkeeping) the wrapped cells write through.
    A committed write of a plain value cell stays in the cell (``held``) until :meth:`flush`,
    which the operator calls before it leaves the key's turn (``end_key``).
    """

    def __init__(self, operator: KeyedOperator) -> None:
        self.op = operator
        self.active = False
        self.touched: list[_TxnValue | _TxnMap] = []
        self.timers: list[tuple[int, bool]] = []
        self.side_at = 0
        self.held: list[_TxnValue] = []
        self.cells: dict[str, list[Any]] = {}  # the wrapped cells by state name

    def wrap(self, cell: Any, hold: bool = False) -> Any:
        return (
            _TxnMap(cell, self)
            if isinstance(cell, MapCell) or hasattr(cell, "entries")
            else _TxnValue(cell, self, hold)
        )

    def flush(self) -> None:
        """Write the values committed calls of the current key left held into the backend."""
        if self.held:
            for cell in self.held:
                cell.write_back()
            self.held.clear()

    def begin(self) -> None:
        self.active = True
        self.side_at = len(self.op.side)

    def timer(self, ts: int, register: bool) -> None:
        if self.active:
            self.timers.append((ts, register))
        elif register:
            self.op._mark(ts, _USER)
        else:
            self.op._unmark(ts, _USER)

    def commit(self) -> None:
        self.active = False
        for cell in self.touched:
            cell.apply()
        self.touched.clear()
        if self.timers:
            for ts, register in self.timers:
                if register:
                    self.op._mark(ts, _USER)
                else:
                    self.op._unmark(ts, _USER)
            self.timers.clear()

    def rollback(self) -> None:
        self.active = False
        for cell in self.touched:
            cell.discard()
        self.touched.clear()
        self.timers.clear()
        del self.op.side[self.side_at :]


class _TxnValue(ValueCell):
    """A value cell as one user call sees it: reads its own writes, writes on commit. With
    ``holds``, a commit keeps the value here (``held``: what the backend gets at the key's
    turn's end, :meth:`_Txn.flush`) and later calls read it from here."""

    __slots__ = ("held", "holds", "inner", "pending", "txn")

    def __init__(self, inner: ValueCell, txn: _Txn, holds: bool = False) -> None:
        self.inner, self.txn, self.pending = inner, txn, _UNSET
        self.held: Any = _UNSET
        self.holds = holds

    def get(self) -> Any:
        pending = self.pending
        if pending is _UNSET:
            held = self.held
            value = self.inner.get() if held is _UNSET else None if held is _CLEARED else held
            return own_copy(value) if self.txn.active else value
        return None if pending is _CLEARED else pending

    def put(self, value: Any) -> None:
        if not self.txn.active:
            self.held = _UNSET
            self.inner.put(value)
            return
        if self.pending is _UNSET:
            self.txn.touched.append(self)
        self.pending = value

    def clear(self) -> None:
        if not self.txn.active:
            self.held = _UNSET
            self.inner.clear()
            return
        if self.pending is _UNSET:
            self.txn.touched.append(self)
        self.pending = _CLEARED

    def apply(self) -> None:
        pending, self.pending = self.pending, _UNSET
        if pending is _UNSET:
            return
        if self.holds:
            if self.held is _UNSET:
                self.txn.held.append(self)
            self.held = pending
        elif pending is _CLEARED:
            self.inner.clear()
        else:
            self.inner.put(pending)

    def write_back(self) -> None:
        held, self.held = self.held, _UNSET
        if held is _CLEARED:
            self.inner.clear()
        elif held is not _UNSET:
            self.inner.put(held)

    def discard(self) -> None:
        self.pending = _UNSET


class _TxnMap(MapCell):
    """A map cell as one user call sees it: reads its own writes, writes on commit. A read
    entry is the function's own copy and is not written back unless the function puts it."""

    def __init__(self, inner: MapCell, txn: _Txn) -> None:
        self.inner, self.txn = inner, txn
        self.pending: dict[Any, Any] = {}
        self.cleared = False
        self.listed = False

    def _touch(self) -> None:
        if not self.listed:
            self.listed = True
            self.txn.touched.append(self)

    def get_entry(self, key: Any) -> Any:
        if not self.txn.active:
            return self.inner.get_entry(key)
        if key in self.pending:
            value = self.pending[key]
            return None if value is _CLEARED else value
        return None if self.cleared else own_copy(self.inner.get_entry(key))

    def put_entry(self, key: Any, value: Any) -> None:
        if not self.txn.active:
            self.inner.put_entry(key, value)
            return
        self._touch()
        self.pending[key] = value

    def remove_entry(self, key: Any) -> None:
        if not self.txn.active:
            self.inner.remove_entry(key)
            return
        self._touch()
        self.pending[key] = _CLEARED

    def entries(self) -> Iterator[tuple[Any, Any]]:
        if not self.txn.active:
            return self.inner.entries()
        merged = {} if self.cleared else dict(self.inner.entries())
        for key, value in self.pending.items():
            if value is _CLEARED:
                merged.pop(key, None)
            else:
                merged[key] = value
        pending = self.pending
        return iter([(k, v if k in pending else own_copy(v)) for k, v in merged.items()])

    def entry_keys(self) -> Iterator[Any]:
        # Keys only: no copy of the values (a join lists a buffer's times on every call).
        if not self.txn.active:
            return self.inner.entry_keys()
        keys = {} if self.cleared else dict.fromkeys(self.inner.entry_keys())
        for key, value in self.pending.items():
            if value is _CLEARED:
                keys.pop(key, None)
            else:
                keys[key] = None
        return iter(list(keys))

    def clear(self) -> None:
        if not self.txn.active:
            self.inner.clear()
            return
        self._touch()
        self.pending.clear()
        self.cleared = True

    def live_entries(self) -> dict[Any, Any] | None:
        return None if self.txn.active else self.inner.live_entries()

    def replace_entries(self, entries: dict[Any, Any]) -> None:
        assert not self.txn.active
        self.inner.replace_entries(entries)

    def apply(self) -> None:
        if self.cleared:
            self.inner.clear()
        for key, value in self.pending.items():
            if value is _CLEARED:
                self.inner.remove_entry(key)
            else:
                self.inner.put_entry(key, value)
        self.discard()

    def discard(self) -> None:
        self.pending, self.cleared, self.listed = {}, False, False


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
        return self._op.keep_handle(descriptor, ValueState(self._op.cell(descriptor)))

    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        return self._op.keep_handle(descriptor, ListState(self._op.cell(descriptor)))

    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        return self._op.keep_handle(descriptor, MapState(self._op.cell(descriptor)))

    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState:
        return self._op.keep_handle(
            descriptor, ReducingState(self._op.cell(descriptor), descriptor.reduce_function)
        )

    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState:
        return self._op.keep_handle(
            descriptor, AggregatingState(self._op.cell(descriptor), descriptor.aggregate_function)
        )


class OperatorContext(Context):
    """The engine's :class:`~stateful_runtime.functions.Context`; ``operator`` is the
    :class:`KeyedOperator` running the function (the window operator reads it directly)."""

    def __init__(self, operator: KeyedOperator) -> None:
        self.operator = operator
        self._timers = _OperatorTimers(operator)
        self._ms: int | None = None
        self._at = to_datetime(0)

    def timestamp(self) -> datetime:
        ms = self.operator.current_ms
        if ms != self._ms:  # a function often asks more than once per element
            self._ms, self._at = ms, to_datetime(ms)
        return self._at

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

    def apply_to_keyed_state(self, descriptor: StateDescriptor, function: Any) -> None:
        self.operator.apply_to_keyed_state(descriptor, function)


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


def has_ttl(fn: KeyedProcessFunction) -> bool:
    """Whether a state of ``fn`` has a TTL (in the function's time domain: in event time its
    cleanups are timers)."""
    return any(getattr(d, "ttl", None) is not None for d in describe_states(fn))
