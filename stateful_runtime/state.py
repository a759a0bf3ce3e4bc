"""Keyed state: descriptors declare it, handles read and write it.

A descriptor has a stable name (savepoints and checkpoints are keyed by it: renaming a state
orphans it) and a declared type. Handles are obtained in ``open()`` from the runtime context::

    self.count = ctx.get_state(ValueStateDescriptor("count", int))

State is scoped to the current key: every handle reads and writes the value of the key whose
element (or timer) is being processed.

TTL (:class:`StateTtlConfig`) is set on the descriptor. In the processing-time domain it is
Spark's own TTL (the function must run in processing time); in the event-time domain it is the
runtime's: a value expires ``ttl`` after it was last written (or read, with
``UpdateType.ON_READ_AND_WRITE``) as measured by element timestamps, and is removed by a timer
when the watermark passes its expiry. Expired values are never returned.
"""

from __future__ import annotations

import enum
import pickle
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

from stateful_runtime.exceptions import ConfigError

T = TypeVar("T")
K = TypeVar("K")
ACC = TypeVar("ACC")
OUT = TypeVar("OUT")


class UpdateType(enum.Enum):
    """When a value's TTL clock restarts."""

    ON_CREATE_AND_WRITE = "on_create_and_write"
    ON_READ_AND_WRITE = "on_read_and_write"


class TimeDomain(enum.Enum):
    EVENT_TIME = "event_time"
    PROCESSING_TIME = "processing_time"


@dataclass(frozen=True)
class StateTtlConfig:
    """Time-to-live of a state's values; expired values are never returned."""

    ttl: timedelta
    update_type: UpdateType = UpdateType.ON_CREATE_AND_WRITE
    time_domain: TimeDomain = TimeDomain.PROCESSING_TIME

    def __post_init__(self) -> None:
        if not isinstance(self.ttl, timedelta) or self.ttl <= timedelta(0):
            raise ConfigError(f"state TTL must be a positive timedelta, got {self.ttl!r}")

    @property
    def ttl_ms(self) -> int:
        return int(self.ttl / timedelta(milliseconds=1))


@dataclass(frozen=True)
class StateDescriptor:
    """Base of all descriptors: a stable name and an optional TTL."""

    name: str

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str) or self.name.startswith("_srt"):
            raise ConfigError(
                f"state name must be a non-empty string not starting with '_srt', got {self.name!r}"
            )

    @property
    def kind(self) -> str:
        return type(self).__name__.removesuffix("StateDescriptor").lower()


@dataclass(frozen=True)
class ValueStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key."""

    type: Any = object
    ttl: StateTtlConfig | None = None


@dataclass(frozen=True)
class ListStateDescriptor(StateDescriptor, Generic[T]):
    """A list of values per key."""

    type: Any = object
    ttl: StateTtlConfig | None = None


@dataclass(frozen=True)
class MapStateDescriptor(StateDescriptor, Generic[K, T]):
    """A map per key; each map entry has its own TTL clock."""

    key_type: Any = object
    value_type: Any = object
    ttl: StateTtlConfig | None = None


@dataclass(frozen=True)
class ReducingStateDescriptor(StateDescriptor, Generic[T]):
    """One value per key, folded with ``reduce_function(old, new)`` on every ``add``."""

    reduce_function: Callable[[Any, Any], Any] = None  # type: ignore[assignment]
    type: Any = object
    ttl: StateTtlConfig | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not callable(self.reduce_function):
            raise ConfigError(f"ReducingStateDescriptor {self.name!r} needs a reduce_function")


class AggregateFunction(Generic[T, ACC, OUT]):
    """Flink's AggregateFunction: incremental aggregation through an accumulator.

    ``create_accumulator()`` makes an empty accumulator; ``add(value, acc)`` returns the updated
    accumulator; ``merge(a, b)`` combines two (session windows merge); ``get_result(acc)`` is the
    output. Accumulators are stored in state, so they must be picklable.
    """

    def create_accumulator(self) -> ACC:
        raise NotImplementedError

    def add(self, value: T, accumulator: ACC) -> ACC:
        raise NotImplementedError

    def get_result(self, accumulator: ACC) -> OUT:
        raise NotImplementedError

    def merge(self, a: ACC, b: ACC) -> ACC:
        raise NotImplementedError(f"{type(self).__name__} does not support merge")


@dataclass(frozen=True)
class AggregatingStateDescriptor(StateDescriptor, Generic[T, ACC, OUT]):
    """One accumulator per key; ``add`` folds values in, ``get`` returns the result."""

    aggregate_function: AggregateFunction = None  # type: ignore[assignment]
    ttl: StateTtlConfig | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not isinstance(self.aggregate_function, AggregateFunction):
            raise ConfigError(
                f"AggregatingStateDescriptor {self.name!r} needs an AggregateFunction"
            )


# ---------------------------------------------------------------------------------------------
# Handles. Each wraps a backend "cell" (see stateful_runtime/operators/backend.py) that stores
# one raw Python value per key (value/reducing/aggregating), a list, or a map.


class ValueState(Generic[T]):
    def __init__(self, cell: Any) -> None:
        self._cell = cell

    def value(self) -> T | None:
        """The current key's value, or None if unset or expired."""
        return self._cell.get()

    def update(self, value: T) -> None:
        if value is None:
            raise ValueError("ValueState.update(None): use clear() to remove the value")
        self._cell.put(value)

    def clear(self) -> None:
        self._cell.clear()


class ListState(Generic[T]):
    def __init__(self, cell: Any) -> None:
        self._cell = cell

    def get(self) -> list[T]:
        return list(self._cell.get() or [])

    def add(self, value: T) -> None:
        items = self._cell.get() or []
        self._cell.put([*items, value])

    def add_all(self, values: Iterable[T]) -> None:
        items = self._cell.get() or []
        self._cell.put([*items, *values])

    def update(self, values: Iterable[T]) -> None:
        values = list(values)
        if values:
            self._cell.put(values)
        else:
            self._cell.clear()

    def clear(self) -> None:
        self._cell.clear()


def cell_of(state: ValueState | ListState | MapState) -> Any:
    """The backend cell behind a state handle (the runtime's own operators reach it; a user's
    function never needs to)."""
    return state._cell


class MapState(Generic[K, T]):
    def __init__(self, cell: Any) -> None:
        self._cell = cell

    def get(self, key: K) -> T | None:
        return self._cell.get_entry(key)

    def put(self, key: K, value: T) -> None:
        self._cell.put_entry(key, value)

    def contains(self, key: K) -> bool:
        return self._cell.get_entry(key) is not None

    def remove(self, key: K) -> None:
        self._cell.remove_entry(key)

    def items(self) -> Iterator[tuple[K, T]]:
        return iter(list(self._cell.entries()))

    def keys(self) -> Iterator[K]:
        return iter(list(self._cell.entry_keys()))

    def values(self) -> Iterator[T]:
        return (v for _, v in self.items())

    def is_empty(self) -> bool:
        return not any(True for _ in self._cell.entry_keys())

    def clear(self) -> None:
        self._cell.clear()


class ReducingState(Generic[T]):
    def __init__(self, cell: Any, reduce_function: Callable[[T, T], T]) -> None:
        self._cell = cell
        self._reduce = reduce_function

    def get(self) -> T | None:
        return self._cell.get()

    def add(self, value: T) -> None:
        current = self._cell.get()
        self._cell.put(value if current is None else self._reduce(current, value))

    def clear(self) -> None:
        self._cell.clear()


class AggregatingState(Generic[T, OUT]):
    def __init__(self, cell: Any, function: AggregateFunction) -> None:
        self._cell = cell
        self._fn = function

    def get(self) -> OUT | None:
        acc = self._cell.get()
        return None if acc is None else self._fn.get_result(acc)

    def add(self, value: T) -> None:
        acc = self._cell.get()
        if acc is None:
            acc = self._fn.create_accumulator()
        self._cell.put(self._fn.add(value, acc))

    def clear(self) -> None:
        self._cell.clear()


class ReadOnlyBroadcastState(Generic[K, T]):
    """A broadcast state as ``process_element`` and ``on_timer`` of a
    KeyedBroadcastProcessFunction see it: the same map on every parallel instance, read-only
    (Flink's ReadOnlyBroadcastState). Do not change a value in place."""

    def __init__(self, entries: dict[K, T]) -> None:
        self._entries = entries

    def get(self, key: K) -> T | None:
        return self._entries.get(key)

    def contains(self, key: K) -> bool:
        return key in self._entries

    def items(self) -> Iterator[tuple[K, T]]:
        return iter(list(self._entries.items()))

    def keys(self) -> Iterator[K]:
        return iter(list(self._entries))

    def values(self) -> Iterator[T]:
        return iter(list(self._entries.values()))

    def is_empty(self) -> bool:
        return not self._entries


class BroadcastState(ReadOnlyBroadcastState[K, T]):
    """A broadcast state as ``process_broadcast_element`` sees it: what it writes, every
    parallel instance writes (each gets every broadcast element)."""

    def put(self, key: K, value: T) -> None:
        self._entries[key] = value

    def remove(self, key: K) -> None:
        self._entries.pop(key, None)

    def clear(self) -> None:
        self._entries.clear()


# Values a function cannot change in place: read without a copy (the common, cheap case).
_IMMUTABLE = frozenset({int, float, str, bytes, bool, type(None), datetime})


def own_copy(value: Any) -> Any:
    """``value`` as a function's own copy (immutables as they are): what a read from state
    hands a function, so that changing it in place changes no state."""
    if type(value) in _IMMUTABLE:
        return value
    return pickle.loads(pickle.dumps(value, pickle.HIGHEST_PROTOCOL))
