"""Test harness for user functions: feed elements and watermarks, get outputs, state, timers.

It runs the same operator code as the Spark path (:class:`KeyedOperator`), over an in-memory
backend, with Spark's ordering: elements see the current watermark; advancing the watermark
(or processing time) fires every due timer, in time order::

    h = KeyedProcessHarness(FraudCounter(), key_by="merchant_id", timestamp_field="ts_ms")
    h.process_element({"merchant_id": "M1", "ts_ms": 1_000})
    h.process_watermark(61_000)
    assert h.state("M1", "count") is None

A function that raises on an element (or a timer) is isolated as on the cluster: the key's
state, timers and outputs stay as before that call, and the element is in
:attr:`KeyedProcessHarness.dead_letters` with the reason; under ``errors=ErrorPolicy("fail")``
(or past the policy's bound) the harness raises
:class:`~stateful_runtime.exceptions.UserFunctionError` instead, as the job would stop.
"""

from __future__ import annotations

import copy
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Self

from stateful_runtime.functions import (
    BROADCAST_KEY,
    CO_INPUT,
    LATE_MARK,
    BroadcastProcess,
    CoInput,
    CoProcess,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    to_ms,
)
from stateful_runtime.job import ErrorPolicy
from stateful_runtime.joins import (
    IntervalJoinOperator,
    JoinFunction,
    JoinOperator,
    ProcessJoinFunction,
    TemporalJoinFunction,
    TemporalJoinOperator,
    WindowJoinOperator,
)
from stateful_runtime.operators.backend import MemoryBackend
from stateful_runtime.operators.isolation import StepGuard
from stateful_runtime.operators.keyed import KeyedOperator, _RefreshOnRead
from stateful_runtime.operators.ttl import EventTtlValueCell
from stateful_runtime.state import TimeDomain

# The state backend a harness runs on unless given one: "memory" (dicts) or "rocksdb_local"
# (the worker's RocksDB of ``state.backend=rocksdb_local``, in a temporary directory).
BACKENDS = ("memory", "rocksdb_local")
DEFAULT_BACKEND = "memory"


def _ms(value: datetime | int) -> int:
    return to_ms(value)


def _peek(cell: Any) -> Any:
    """A cell's live value without the side effects of a read (TTL refresh on read)."""
    if isinstance(cell, _RefreshOnRead):
        return _peek(cell.inner)
    if isinstance(cell, EventTtlValueCell):
        stored = cell.inner.get()
        return stored[0] if stored is not None and cell.live(stored[1]) else None
    if hasattr(cell, "entries"):
        return dict(cell.entries()) or None
    return cell.get()


class KeyedProcessHarness:
    """Drive a :class:`KeyedProcessFunction` by hand.

    Args:
        fn: the function (deep-copied, as Spark does when it ships it to a worker).
        key_by: key field(s) of the records.
        timestamp_field: field holding epoch milliseconds (or pass ``timestamp=`` per element).
        backend: ``"memory"`` or ``"rocksdb_local"`` (default :data:`DEFAULT_BACKEND`).
        errors: what the function's failures do (the job's ``errors.*``; default: isolated).
        name: the step's name in dead letters and errors.
    """

    def __init__(
        self,
        fn: KeyedProcessFunction,
        key_by: str | Sequence[str],
        timestamp_field: str | None = None,
        *,
        backend: str | None = None,
        errors: ErrorPolicy | None = None,
        name: str | None = None,
    ) -> None:
        self.keys = (key_by,) if isinstance(key_by, str) else tuple(key_by)
        self.timestamp_field = timestamp_field
        guard = StepGuard(name or type(fn).__name__, "harness", errors or ErrorPolicy(), None)
        self.operator = KeyedOperator(copy.deepcopy(fn), guard)
        kind = backend or DEFAULT_BACKEND
        if kind not in BACKENDS:
            raise ValueError(f"backend={kind!r}: use one of {BACKENDS}")
        self.backend: Any
        if kind == "memory":
            self.backend = MemoryBackend(clock=lambda: self.operator.processing_ms)
        else:
            from stateful_runtime.operators.keyed_store import KeyedStore
            from stateful_runtime.operators.local_state import LocalBackend

            self._dir = tempfile.TemporaryDirectory(prefix="srt-harness-")
            store = KeyedStore(Path(self._dir.name) / "checkpoint", Path(self._dir.name) / "local")
            store.open(0)
            self.store = store
            # A RocksDB dropped without its close takes about a second of the dropping thread
            # (for each harness a test made, at the garbage collector's next pass): closed
            # when the harness is, or when it goes.
            weakref.finalize(self, store.close)
            self.backend = LocalBackend(store, clock=lambda: self.operator.processing_ms)
        self.operator.set_time(0, 0)
        self.operator.open(self.backend)
        self.output: list[dict[str, Any]] = []
        self.side: dict[str, list[dict[str, Any]]] = {}

    def close(self) -> None:
        """Close the backend's RocksDB (``backend="rocksdb_local"``; nothing to do on the
        in-memory backend). Also ``with KeyedProcessHarness(...) as h:``."""
        store = getattr(self, "store", None)
        if store is not None:
            store.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collect(self) -> list[dict[str, Any]]:
        main, side = self.operator.drain()
        self.output.extend(main)
        for tag, record in side:
            self.side.setdefault(tag, []).append(record)
        return main

    def _key(self, record: dict[str, Any]) -> tuple:
        return tuple(record[k] for k in self.keys)

    def process_element(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """Process one element; returns the main outputs it produced."""
        return self._element(self._key(record), record, timestamp)

    def _element(
        self, key: tuple, value: dict[str, Any], timestamp: datetime | int | None
    ) -> list[dict[str, Any]]:
        if timestamp is None:
            if self.timestamp_field is None:
                raise ValueError("give timestamp= or construct the harness with timestamp_field")
            timestamp = value[self.timestamp_field]
        self.operator.process(key, [(_ms(timestamp), dict(value))])
        return self._collect()

    def process_elements(self, records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for record in records:
            out += self.process_element(record)
        return out

    def _fire(self, upto: int) -> list[dict[str, Any]]:
        out = []
        if isinstance(self.backend, MemoryBackend):
            for ts, key in self.backend.due(upto):
                self.operator.fire(key, ts)
                out += self._collect()
            return out
        from stateful_runtime.operators.keyed_store import MAX_PARALLELISM

        for ts, _, key in self.backend.due(upto, range(MAX_PARALLELISM)):
            self.backend.take(key, ts)
            self.operator.fire(key, ts)
            out += self._collect()
        return out

    def process_watermark(self, watermark: datetime | int) -> list[dict[str, Any]]:
        """Advance the watermark; fires due event-time timers. Returns their outputs."""
        wm = _ms(watermark)
        self.operator.set_time(max(wm, self.operator.watermark_ms), self.operator.processing_ms)
        if self.operator.domain is TimeDomain.EVENT_TIME:
            return self._fire(self.operator.watermark_ms)
        return []

    def set_processing_time(self, now: datetime | int) -> list[dict[str, Any]]:
        """Advance processing time; fires due processing-time timers."""
        self.operator.set_time(self.operator.watermark_ms, _ms(now))
        if self.operator.domain is TimeDomain.PROCESSING_TIME:
            return self._fire(self.operator.processing_ms)
        return []

    @property
    def dead_letters(self) -> list[tuple[dict[str, Any], str]]:
        """The elements (and timers, as ``{"key", "timer"}``) the function raised on, with
        the reason, in order: what the job dead-letters."""
        import json

        return [(json.loads(raw), reason) for raw, reason, _, _ in self.operator.guard.rejects.rows]

    def side_output(self, tag: OutputTag | str) -> list[dict[str, Any]]:
        return list(self.side.get(tag if isinstance(tag, str) else tag.name, []))

    @property
    def late_dropped(self) -> int:
        """How many late records a window or join dropped (what the job counts as late)."""
        return len(self.side.get(LATE_MARK, []))

    def state(self, key: Any, name: str) -> Any:
        """The live value of state ``name`` for ``key`` (None if unset or expired)."""
        key_t = key if isinstance(key, tuple) else (key,)
        desc = self.operator.descriptors[name]
        cell = next(c for c in self._cells() if c[0] == name)[1]
        self.backend.begin_key(key_t)
        saved_ms = self.operator.current_ms
        self.operator.current_ms = max(self.operator.watermark_ms, saved_ms)
        try:
            value = _peek(cell)
            if desc.kind == "aggregating" and value is not None:
                return desc.aggregate_function.get_result(value)  # type: ignore[attr-defined]
            return value
        finally:
            self.operator.current_ms = saved_ms

    def stored_states(self) -> set[tuple[str, tuple]]:
        """(state name, key) of every state row the backend holds, expired or not (what a
        cleanup really removed, not only hid)."""
        if isinstance(self.backend, MemoryBackend):
            return set(self.backend.data)
        from stateful_runtime.operators.local_state import stored_states

        return stored_states(self.backend)

    def _cells(self) -> list[tuple[str, Any]]:
        return self.operator.cells  # populated by KeyedOperator.cell

    def timers(self, key: Any) -> list[int]:
        """Pending user and cleanup timers of ``key`` (epoch ms)."""
        key_t = key if isinstance(key, tuple) else (key,)
        if isinstance(self.backend, MemoryBackend):
            return sorted(self.backend.timers.get(key_t, ()))
        return self.backend.timers_of(key_t)

    def user_timers(self, key: Any) -> list[int]:
        return self.operator.user_timers(key if isinstance(key, tuple) else (key,))


class KeyedCoProcessHarness(KeyedProcessHarness):
    """Drive a :class:`~stateful_runtime.functions.KeyedCoProcessFunction` by hand: its two
    inputs' elements with :meth:`process_element1` and :meth:`process_element2`, the rest
    (watermark, processing time, state, timers, outputs, dead letters) as
    :class:`KeyedProcessHarness`'s::

        h = KeyedCoProcessHarness(MatchRefunds(), key_by="txn_id", timestamp_field="ts_ms")
        h.process_element1({"txn_id": "t1", "amount_paise": 500, "ts_ms": 1_000})
        h.process_element2({"txn_id": "t1", "refund_paise": 500, "ts_ms": 2_000})

    Args:
        fn: the function.
        key_by: the first input's key field(s).
        key_by2: the second input's (default: ``key_by``).
        timestamp_field: field holding epoch milliseconds, in the records of both inputs (or
            pass ``timestamp=`` per element).
        backend, errors, name: as :class:`KeyedProcessHarness`'s.
    """

    def __init__(
        self,
        fn: KeyedCoProcessFunction,
        key_by: str | Sequence[str],
        timestamp_field: str | None = None,
        *,
        key_by2: str | Sequence[str] | None = None,
        backend: str | None = None,
        errors: ErrorPolicy | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(fn, KeyedCoProcessFunction):
            raise TypeError(f"KeyedCoProcessHarness takes a KeyedCoProcessFunction, got {fn!r}")
        if isinstance(fn, JoinOperator) and name is None:
            name = type(fn.join_function).__name__
        inputs = (CoInput("", None), CoInput("", None))
        super().__init__(
            CoProcess(fn, inputs),
            key_by,
            timestamp_field,
            backend=backend,
            errors=errors,
            name=name or type(fn).__name__,
        )
        keys2 = key_by if key_by2 is None else key_by2
        self.keys2 = (keys2,) if isinstance(keys2, str) else tuple(keys2)
        if len(self.keys2) != len(self.keys):
            raise ValueError(f"key_by {self.keys} and key_by2 {self.keys2} differ in length")

    def process_element(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        raise TypeError("a co-process function takes process_element1 or process_element2")

    def process_element1(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """Process one element of the first input; returns the main outputs it produced."""
        return self._element(self._key(record), {**record, CO_INPUT: 1}, timestamp)

    def process_element2(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """Process one element of the second input; returns the main outputs it produced."""
        key = tuple(record[k] for k in self.keys2)
        return self._element(key, {**record, CO_INPUT: 2}, timestamp)


class KeyedBroadcastProcessHarness(KeyedProcessHarness):
    """Drive a :class:`~stateful_runtime.functions.KeyedBroadcastProcessFunction` by hand:
    keyed elements with :meth:`process_element`, broadcast elements with
    :meth:`process_broadcast_element` (one parallel instance: the cluster gives each the
    same), the broadcast state with :meth:`broadcast_state`; the rest as
    :class:`KeyedProcessHarness`'s::

        h = KeyedBroadcastProcessHarness(RuleAlerts(), RULES, key_by="merchant_id",
                                         timestamp_field="ts_ms")
        h.process_broadcast_element({"rule_id": "big", "min_paise": 5_000_000, "ts_ms": 0})
        h.process_element({"merchant_id": "M1", "amount_paise": 6_000_000, "ts_ms": 1_000})

    Args:
        fn: the function.
        descriptors: the broadcast states (what ``DataStream.broadcast`` takes).
        key_by, timestamp_field, backend, errors, name: as :class:`KeyedProcessHarness`'s.
    """

    def __init__(
        self,
        fn: KeyedBroadcastProcessFunction,
        descriptors: Any,
        key_by: str | Sequence[str],
        timestamp_field: str | None = None,
        *,
        backend: str | None = None,
        errors: ErrorPolicy | None = None,
        name: str | None = None,
    ) -> None:
        if not isinstance(fn, KeyedBroadcastProcessFunction):
            raise TypeError(
                f"KeyedBroadcastProcessHarness takes a KeyedBroadcastProcessFunction, got {fn!r}"
            )
        states = tuple(descriptors) if isinstance(descriptors, list | tuple) else (descriptors,)
        inputs = (CoInput("", None), CoInput("", None))
        super().__init__(
            BroadcastProcess(fn, inputs, states),
            key_by,
            timestamp_field,
            backend=backend,
            errors=errors,
            name=name or type(fn).__name__,
        )

    def process_element(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """Process one keyed element; returns the main outputs it produced."""
        return self._element(self._key(record), {**record, CO_INPUT: 1}, timestamp)

    def process_broadcast_element(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """Process one broadcast element; returns the main outputs it produced."""
        return self._element(BROADCAST_KEY, {**record, CO_INPUT: 2}, timestamp)

    def broadcast_state(self, name: str) -> dict[Any, Any]:
        """Broadcast state ``name``'s entries."""
        fn = self.operator.fn
        assert isinstance(fn, BroadcastProcess)
        return dict(fn.broadcast[name])


def interval_join_harness(
    fn: ProcessJoinFunction,
    lower: timedelta,
    upper: timedelta,
    key_by: str | Sequence[str],
    timestamp_field: str | None = None,
    *,
    key_by2: str | Sequence[str] | None = None,
    left_late: OutputTag | None = None,
    right_late: OutputTag | None = None,
    backend: str | None = None,
    errors: ErrorPolicy | None = None,
) -> KeyedCoProcessHarness:
    """A harness around an interval join (what ``left.interval_join(right).between(lower,
    upper).process(fn)`` runs): left records with ``process_element1``, right ones with
    ``process_element2``; ``state(key, "left_buffer")`` / ``"right_buffer"`` show the
    buffers, :attr:`~KeyedProcessHarness.late_dropped` the late records dropped."""
    join = IntervalJoinOperator(fn, lower, upper, left_late, right_late)
    return KeyedCoProcessHarness(
        join, key_by, timestamp_field, key_by2=key_by2, backend=backend, errors=errors
    )


def temporal_join_harness(
    fn: TemporalJoinFunction,
    key_by: str | Sequence[str],
    timestamp_field: str | None = None,
    *,
    key_by2: str | Sequence[str] | None = None,
    late: OutputTag | None = None,
    backend: str | None = None,
    errors: ErrorPolicy | None = None,
) -> KeyedCoProcessHarness:
    """A harness around a temporal join (what ``stream.temporal_join(versions).process(fn)``
    runs): the stream's records with ``process_element1``, versions with
    ``process_element2``; ``state(key, "pending")`` / ``"versions"`` show its state."""
    join = TemporalJoinOperator(fn, late)
    return KeyedCoProcessHarness(
        join, key_by, timestamp_field, key_by2=key_by2, backend=backend, errors=errors
    )


def window_join_harness(
    fn: JoinFunction,
    assigner: Any,
    key_by: str | Sequence[str],
    timestamp_field: str | None = None,
    *,
    key_by2: str | Sequence[str] | None = None,
    backend: str | None = None,
    errors: ErrorPolicy | None = None,
) -> KeyedCoProcessHarness:
    """A harness around a window join (what ``first.join(second).where(key_by)
    .equal_to(key_by2).window(assigner).apply(fn)`` runs): the first stream's records with
    ``process_element1``, the second's with ``process_element2``; ``state(key, "windows")``
    shows the open windows."""
    join = WindowJoinOperator(fn, assigner)
    return KeyedCoProcessHarness(
        join, key_by, timestamp_field, key_by2=key_by2, backend=backend, errors=errors
    )


def window_harness(
    assigner: Any,
    key_by: str | Sequence[str],
    contents: Any,
    *,
    timestamp_field: str,
    allowed_lateness: Any = None,
    late_tag: OutputTag | None = None,
    trigger: Any = None,
    backend: str | None = None,
    errors: ErrorPolicy | None = None,
) -> KeyedProcessHarness:
    """A harness around the window operator: ``contents`` is what ``aggregate``/``process``
    take (``{column: Aggregate}``, an AggregateFunction or a ProcessWindowFunction)."""
    from pyspark.sql.types import StructType

    from stateful_runtime.operators.window import WindowOperator

    keys = (key_by,) if isinstance(key_by, str) else tuple(key_by)
    operator = WindowOperator(
        assigner,
        keys,
        contents,
        StructType(),
        allowed_lateness=allowed_lateness or timedelta(0),
        late_tag=late_tag,
        trigger=trigger,
    )
    return KeyedProcessHarness(operator, keys, timestamp_field, backend=backend, errors=errors)
