"""Test harness for user functions: feed elements and watermarks, get outputs, state, timers.

It runs the engine a job runs (:class:`~stateful_runtime.operators.arrow_keyed.KeyedTask`: the
function's state and timers in the worker's RocksDB, in a temporary directory), batch by batch
as Spark's tasks do, without Spark. Each call is one micro-batch of one state partition holding
every key group: at its watermark (and processing time) the due timers fire first, in time
order, then key group, then key; then its elements, key by key in key-group and key order (each
key's in the order given); then the timers they made due; then the batch commits a version of
the state. A key's group is Spark's (``pmod(hash(key fields), 128)``), so the order is a Spark
run's of one state partition::

    h = KeyedProcessHarness(FraudCounter(), key_by="merchant_id", timestamp_field="ts_ms")
    h.process_element({"merchant_id": "M1", "ts_ms": 1_000})
    h.process_watermark(61_000)
    assert h.state("M1", "count") is None

As in a job, the function is a fresh copy for each batch, ``open``-ed and ``close``-d around it:
what it keeps in its own attributes does not outlive the batch; state does.

A function that raises on an element (or a timer) is isolated as on the cluster: the key's
state, timers and outputs stay as before that call, and the element is in
:attr:`KeyedProcessHarness.dead_letters` with the reason; under ``errors=ErrorPolicy("fail")``
(or past the policy's bounds, counted per batch as a task counts them) the harness raises
:class:`~stateful_runtime.exceptions.UserFunctionError` instead, as the job would stop, and the
batch leaves no trace.
"""

from __future__ import annotations

import copy
import os
import tempfile
import weakref
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Self

from stateful_runtime.checkpoints.keyed import MAX_PARALLELISM, key_group
from stateful_runtime.functions import (
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
from stateful_runtime.operators.arrow_keyed import KeyedTask, load_broadcast
from stateful_runtime.operators.isolation import StepGuard
from stateful_runtime.operators.keyed import KeyedOperator, _RefreshOnRead
from stateful_runtime.operators.keyed_store import KeyedStore
from stateful_runtime.operators.local_state import LocalBackend, stored_states
from stateful_runtime.operators.ttl import EventTtlValueCell

# Every key group in the harness's one state partition.
_GROUPS = range(MAX_PARALLELISM)


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


def _close(store: KeyedStore) -> None:
    store.wait_snapshots()
    store.close()


def _order(key: tuple) -> tuple:
    """A key in the order Arrow sorts a batch's keys (nulls last)."""
    return tuple((v is None, v) for v in key)


class KeyedProcessHarness:
    """Drive a :class:`KeyedProcessFunction` by hand, batch by batch, on the engine.

    Args:
        fn: the function (copied for each batch, as Spark ships it to each task).
        key_by: key field(s) of the records.
        timestamp_field: field holding epoch milliseconds (or pass ``timestamp=`` per element).
        errors: what the function's failures do (the job's ``errors.*``; default: isolated).
        name: the step's name in dead letters and errors.
    """

    def __init__(
        self,
        fn: KeyedProcessFunction,
        key_by: str | Sequence[str],
        timestamp_field: str | None = None,
        *,
        errors: ErrorPolicy | None = None,
        name: str | None = None,
    ) -> None:
        self.keys = (key_by,) if isinstance(key_by, str) else tuple(key_by)
        self.timestamp_field = timestamp_field
        self.fn = copy.deepcopy(fn)
        self.guard = StepGuard(name or type(fn).__name__, "harness", errors or ErrorPolicy(), None)
        # In memory where the machine has it (/dev/shm): a batch's commit syncs its files, which
        # on a disk takes most of a harness batch's time and buys a test nothing.
        shm = Path("/dev/shm")
        where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        self._dir = tempfile.TemporaryDirectory(prefix="srt-harness-", dir=where)
        root = Path(self._dir.name)
        self.store = KeyedStore(root / "checkpoint" / "keyed" / "harness" / "0", root / "local")
        self.store.open(0)
        # A RocksDB dropped without its close takes about a second of the dropping thread
        # (for each harness a test made, at the garbage collector's next pass): closed when
        # the harness is, or when it goes, its snapshot writers waited for first.
        weakref.finalize(self, _close, self.store)
        self.version = 0
        self.watermark_ms = 0
        self.processing_ms = 0
        self.output: list[dict[str, Any]] = []
        self.side: dict[str, list[dict[str, Any]]] = {}
        self.rejects: list[tuple[bytes, str, int | None, int | None]] = []
        self._view: KeyedOperator | None = None
        self._viewer()  # what open() declares is checked now, as a job's plan checks it

    def close(self) -> None:
        """Close the state's RocksDB (also ``with KeyedProcessHarness(...) as h:``)."""
        _close(self.store)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- batches ----------------------------------------------------------------------------
    def _key(self, record: dict[str, Any]) -> tuple:
        return tuple(record[k] for k in self.keys)

    def _time(self, record: dict[str, Any], timestamp: datetime | int | None) -> int:
        if timestamp is None:
            if self.timestamp_field is None:
                raise ValueError("give timestamp= or construct the harness with timestamp_field")
            timestamp = record[self.timestamp_field]
        return _ms(timestamp)

    def _batch(
        self,
        elements: Sequence[tuple[tuple, int, dict[str, Any]]] = (),
        broadcast: Sequence[tuple[int, dict[str, Any]]] = (),
    ) -> list[dict[str, Any]]:
        """One micro-batch: ``elements`` (key, event time, record), ``broadcast`` elements
        (event time, record); the main outputs it emitted, in order."""
        if self.store.db is None:  # a batch that failed left the store closed
            self.store.open(self.version)
        self._view = None
        task = KeyedTask(
            self.fn, self.guard, self.store, _GROUPS, self.watermark_ms, self.processing_ms
        )
        op = task.op
        main: list[dict[str, Any]] = []
        side: list[tuple[str, dict[str, Any]]] = []

        def collect() -> None:
            m, s = op.drain()
            main.extend(m)
            side.extend(s)

        try:
            for _ in task.fire_due():
                collect()
            if broadcast:
                task.process_broadcast(sorted(broadcast, key=lambda e: e[0]), first=True)
                collect()
            runs: dict[tuple, list[tuple[int, dict[str, Any]]]] = {}
            for key, ts, record in elements:
                runs.setdefault(key, []).append((ts, record))
            turns = sorted((key_group(k), _order(k), k) for k in runs)
            for group, _, key in turns:
                task.process(group, key, runs[key])
                collect()
            for _ in task.fire_due():
                collect()
            op.close()
            collect()
            self.version = task.commit()
            self.store.publish()
        except BaseException:
            self.store.close()  # the batch leaves nothing: the next opens the last version
            raise
        self.rejects.extend(op.guard.rejects.rows)
        self.output.extend(main)
        for tag, record in side:
            self.side.setdefault(tag, []).append(record)
        return main

    def process_element(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """A batch of one element; returns the main outputs it produced."""
        return self._batch([(self._key(record), self._time(record, timestamp), dict(record))])

    def process_elements(
        self,
        records: Iterable[dict[str, Any]],
        *,
        watermark: datetime | int | None = None,
        processing_time: datetime | int | None = None,
    ) -> list[dict[str, Any]]:
        """One batch of ``records`` (their event time in ``timestamp_field``), at
        ``watermark`` and ``processing_time`` when given (the timers they make due fire
        first); returns the main outputs it produced."""
        self._advance(watermark, processing_time)
        return self._batch([(self._key(r), self._time(r, None), dict(r)) for r in records])

    def _advance(self, watermark: datetime | int | None, now: datetime | int | None) -> None:
        if watermark is not None:
            self.watermark_ms = max(self.watermark_ms, _ms(watermark))
        if now is not None:
            self.processing_ms = _ms(now)

    def process_watermark(self, watermark: datetime | int) -> list[dict[str, Any]]:
        """A batch without elements at ``watermark``: fires the due event-time timers.
        Returns their outputs."""
        self._advance(watermark, None)
        return self._batch()

    def set_processing_time(self, now: datetime | int) -> list[dict[str, Any]]:
        """A batch without elements at processing time ``now``: fires the due
        processing-time timers. Returns their outputs."""
        self._advance(None, now)
        return self._batch()

    # -- what it left -----------------------------------------------------------------------
    @property
    def dead_letters(self) -> list[tuple[dict[str, Any], str]]:
        """The elements (and timers, as ``{"key", "timer"}``) the function raised on, with
        the reason, in order: what the job dead-letters."""
        import json

        return [(json.loads(raw), reason) for raw, reason, _, _ in self.rejects]

    def side_output(self, tag: OutputTag | str) -> list[dict[str, Any]]:
        return list(self.side.get(tag if isinstance(tag, str) else tag.name, []))

    @property
    def late_dropped(self) -> int:
        """How many late records a window or join dropped (what the job counts as late)."""
        return len(self.side.get(LATE_MARK, []))

    def _viewer(self) -> KeyedOperator:
        """The function opened on the state as the last batch committed it (for reading)."""
        if self.store.db is None:
            self.store.open(self.version)
        if self._view is None:
            op = KeyedOperator(copy.deepcopy(self.fn), copy.deepcopy(self.guard))
            backend = LocalBackend(self.store, clock=lambda: op.processing_ms, key_timers=False)
            backend.groups = _GROUPS
            op.set_time(self.watermark_ms, self.processing_ms)
            op.open(backend)
            if isinstance(op.fn, BroadcastProcess):
                load_broadcast(self.store, _GROUPS, op.fn)
            self._view = op
        return self._view

    def _begin(self, key: Any) -> tuple[KeyedOperator, LocalBackend, tuple]:
        key_t = key if isinstance(key, tuple) else (key,)
        op = self._viewer()
        backend = op.backend
        assert isinstance(backend, LocalBackend)
        backend.group = key_group(key_t)
        return op, backend, key_t

    def state(self, key: Any, name: str) -> Any:
        """The live value of state ``name`` for ``key`` (None if unset or expired), at the
        watermark and processing time of the last batch."""
        op, backend, key_t = self._begin(key)
        desc = op.descriptors[name]
        cell = next(c for n, c in op.cells if n == name)
        backend.begin_key(key_t)
        op.current_ms = op.watermark_ms
        value = _peek(cell)
        if desc.kind == "aggregating" and value is not None:
            return desc.aggregate_function.get_result(value)  # type: ignore[attr-defined]
        return value

    def stored_states(self) -> set[tuple[str, tuple]]:
        """(state name, key) of every state row the store holds, expired or not (what a
        cleanup really removed, not only hid)."""
        op = self._viewer()
        assert isinstance(op.backend, LocalBackend)
        return stored_states(op.backend)

    def timers(self, key: Any) -> list[int]:
        """Pending user and cleanup timers of ``key`` (epoch ms)."""
        _, backend, key_t = self._begin(key)
        backend.begin_key(key_t)
        return sorted(backend.list_timers())

    def user_timers(self, key: Any) -> list[int]:
        op, _, key_t = self._begin(key)
        return op.user_timers(key_t)


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
        errors, name: as :class:`KeyedProcessHarness`'s.
    """

    def __init__(
        self,
        fn: KeyedCoProcessFunction,
        key_by: str | Sequence[str],
        timestamp_field: str | None = None,
        *,
        key_by2: str | Sequence[str] | None = None,
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
        """A batch of one element of the first input; returns the main outputs it produced."""
        return self._batch(
            [(self._key(record), self._time(record, timestamp), {**record, CO_INPUT: 1})]
        )

    def process_element2(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """A batch of one element of the second input; returns the main outputs it produced."""
        key = tuple(record[k] for k in self.keys2)
        return self._batch([(key, self._time(record, timestamp), {**record, CO_INPUT: 2})])

    def process_elements(  # type: ignore[override]
        self,
        first: Iterable[dict[str, Any]] = (),
        second: Iterable[dict[str, Any]] = (),
        *,
        watermark: datetime | int | None = None,
        processing_time: datetime | int | None = None,
    ) -> list[dict[str, Any]]:
        """One batch of records of the first input and of the second (their event time in
        ``timestamp_field``), at ``watermark`` and ``processing_time`` when given; returns the
        main outputs it produced."""
        self._advance(watermark, processing_time)
        elements = [(self._key(r), self._time(r, None), {**r, CO_INPUT: 1}) for r in first]
        elements += [
            (tuple(r[k] for k in self.keys2), self._time(r, None), {**r, CO_INPUT: 2})
            for r in second
        ]
        return self._batch(elements)


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
        key_by, timestamp_field, errors, name: as :class:`KeyedProcessHarness`'s.
    """

    def __init__(
        self,
        fn: KeyedBroadcastProcessFunction,
        descriptors: Any,
        key_by: str | Sequence[str],
        timestamp_field: str | None = None,
        *,
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
            errors=errors,
            name=name or type(fn).__name__,
        )

    def process_element(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """A batch of one keyed element; returns the main outputs it produced."""
        return self._batch(
            [(self._key(record), self._time(record, timestamp), {**record, CO_INPUT: 1})]
        )

    def process_broadcast_element(
        self, record: dict[str, Any], timestamp: datetime | int | None = None
    ) -> list[dict[str, Any]]:
        """A batch of one broadcast element; returns the main outputs it produced."""
        return self._batch(broadcast=[(self._time(record, timestamp), {**record, CO_INPUT: 2})])

    def broadcast_state(self, name: str) -> dict[Any, Any]:
        """Broadcast state ``name``'s entries, as the last batch committed them."""
        fn = self._viewer().fn
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
    errors: ErrorPolicy | None = None,
) -> KeyedCoProcessHarness:
    """A harness around an interval join (what ``left.interval_join(right).between(lower,
    upper).process(fn)`` runs): left records with ``process_element1``, right ones with
    ``process_element2``; ``state(key, "left_buffer")`` / ``"right_buffer"`` show the
    buffers, :attr:`~KeyedProcessHarness.late_dropped` the late records dropped."""
    join = IntervalJoinOperator(fn, lower, upper, left_late, right_late)
    return KeyedCoProcessHarness(join, key_by, timestamp_field, key_by2=key_by2, errors=errors)


def temporal_join_harness(
    fn: TemporalJoinFunction,
    key_by: str | Sequence[str],
    timestamp_field: str | None = None,
    *,
    key_by2: str | Sequence[str] | None = None,
    late: OutputTag | None = None,
    errors: ErrorPolicy | None = None,
) -> KeyedCoProcessHarness:
    """A harness around a temporal join (what ``stream.temporal_join(versions).process(fn)``
    runs): the stream's records with ``process_element1``, versions with
    ``process_element2``; ``state(key, "pending")`` / ``"versions"`` show its state."""
    join = TemporalJoinOperator(fn, late)
    return KeyedCoProcessHarness(join, key_by, timestamp_field, key_by2=key_by2, errors=errors)


def window_join_harness(
    fn: JoinFunction,
    assigner: Any,
    key_by: str | Sequence[str],
    timestamp_field: str | None = None,
    *,
    key_by2: str | Sequence[str] | None = None,
    errors: ErrorPolicy | None = None,
) -> KeyedCoProcessHarness:
    """A harness around a window join (what ``first.join(second).where(key_by)
    .equal_to(key_by2).window(assigner).apply(fn)`` runs): the first stream's records with
    ``process_element1``, the second's with ``process_element2``; ``state(key, "windows")``
    shows the open windows."""
    join = WindowJoinOperator(fn, assigner)
    return KeyedCoProcessHarness(join, key_by, timestamp_field, key_by2=key_by2, errors=errors)


def window_harness(
    assigner: Any,
    key_by: str | Sequence[str],
    contents: Any,
    *,
    timestamp_field: str,
    allowed_lateness: Any = None,
    late_tag: OutputTag | None = None,
    trigger: Any = None,
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
    return KeyedProcessHarness(operator, keys, timestamp_field, errors=errors)
