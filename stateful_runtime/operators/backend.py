"""The state backend interface an operator runs against, and its in-memory implementation.

A backend stores, per key, raw Python values in *cells*: a value cell (one value), a list cell
and a map cell. ``begin_key``/``end_key`` bracket all access for one key (Spark scopes state to
the grouping key; a backend may cache between the two and write back at ``end_key``).
Processing-time TTL is the backend's (Spark implements it natively); event-time TTL is layered
on top by the operator (:mod:`stateful_runtime.operators.ttl`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import Any


class ValueCell(ABC):
    @abstractmethod
    def get(self) -> Any: ...

    @abstractmethod
    def put(self, value: Any) -> None: ...

    @abstractmethod
    def clear(self) -> None: ...


class MapCell(ABC):
    @abstractmethod
    def get_entry(self, key: Any) -> Any: ...

    @abstractmethod
    def put_entry(self, key: Any, value: Any) -> None: ...

    @abstractmethod
    def remove_entry(self, key: Any) -> None: ...

    @abstractmethod
    def entries(self) -> Iterator[tuple[Any, Any]]: ...

    def entry_keys(self) -> Iterator[Any]:
        """The keys of the live entries (a cell that copies values on read skips the copy)."""
        return (k for k, _ in self.entries())

    def live_entries(self) -> dict[Any, Any] | None:
        """The current key's entries as the backend's own dict, for an operator running with
        reads shared (``KeyedOperator.share_reads``): it changes the dict in place and hands
        it back with :meth:`replace_entries`, one call per element instead of one per entry.
        None where entries are not kept so (TTL stamps, a transaction's copies)."""
        return None

    def replace_entries(self, entries: dict[Any, Any]) -> None:
        """The key's entries are ``entries`` (from :meth:`live_entries`, changed)."""
        raise NotImplementedError(f"{type(self).__name__} has no live entries")

    @abstractmethod
    def clear(self) -> None: ...


class StateBackend(ABC):
    # Set by the operator when every timer it registers is its key's only one, at the
    # expiry of the key's only state (an event-time TTL value, ``operators/ttl.py``): a
    # backend may then clear a key's state at such a timer unread (``LocalBackend.expire``).
    sole_expiry = False

    @abstractmethod
    def value_cell(self, name: str, processing_ttl_ms: int | None) -> ValueCell:
        """A cell holding one value (lists are values too); TTL in processing time."""

    @abstractmethod
    def map_cell(self, name: str, processing_ttl_ms: int | None) -> MapCell: ...

    @abstractmethod
    def register_timer(self, ts: int) -> None: ...

    @abstractmethod
    def delete_timer(self, ts: int) -> None: ...

    @abstractmethod
    def list_timers(self) -> Iterable[int]:
        """The current key's timers."""

    def begin_key(self, key: tuple) -> None:
        """All following cell and timer calls are for ``key``."""

    def end_key(self) -> None:
        """Done with the current key (write back anything cached)."""

    def keys_with(self, name: str) -> list[tuple[int | None, tuple]]:
        """(key group or None, key) of every key holding state ``name`` (``apply_to_keyed_
        state``, on the backends that can list their keys)."""
        raise NotImplementedError(f"{type(self).__name__} cannot list the keys of a state")


# --------------------------------------------------------------------------- in memory


class _MemoryValue(ValueCell):
    def __init__(self, backend: MemoryBackend, name: str, ttl_ms: int | None) -> None:
        self.b, self.name, self.ttl = backend, name, ttl_ms

    def _slot(self) -> tuple[str, tuple]:
        return (self.name, self.b.key)

    def get(self) -> Any:
        stored = self.b.data.get(self._slot())
        if stored is None:
            return None
        value, expires = stored
        if expires is not None and expires <= self.b.clock():
            return None
        return value

    def put(self, value: Any) -> None:
        expires = None if self.ttl is None else self.b.clock() + self.ttl
        self.b.data[self._slot()] = (value, expires)

    def clear(self) -> None:
        self.b.data.pop(self._slot(), None)


class _MemoryMap(MapCell):
    def __init__(self, backend: MemoryBackend, name: str, ttl_ms: int | None) -> None:
        self.b, self.name, self.ttl = backend, name, ttl_ms

    def _map(self, create: bool = False) -> dict[Any, tuple[Any, int | None]]:
        slot = (self.name, self.b.key)
        if create:
            return self.b.data.setdefault(slot, {})
        return self.b.data.get(slot, {})

    def _live(self, stored: tuple[Any, int | None] | None) -> Any:
        if stored is None:
            return None
        value, expires = stored
        return None if expires is not None and expires <= self.b.clock() else value

    def get_entry(self, key: Any) -> Any:
        return self._live(self._map().get(key))

    def put_entry(self, key: Any, value: Any) -> None:
        expires = None if self.ttl is None else self.b.clock() + self.ttl
        self._map(create=True)[key] = (value, expires)

    def remove_entry(self, key: Any) -> None:
        entries = self._map()
        entries.pop(key, None)
        if not entries:  # an empty map holds no row (as in the stores)
            self.b.data.pop((self.name, self.b.key), None)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        for k, stored in list(self._map().items()):
            value = self._live(stored)
            if value is not None:
                yield k, value

    def clear(self) -> None:
        self.b.data.pop((self.name, self.b.key), None)


class MemoryBackend(StateBackend):
    """Dict-backed state and timers for the test harness (processing-time TTL emulated)."""

    def __init__(self, clock: Callable[[], int]) -> None:
        self.clock = clock
        self.data: dict[tuple[str, tuple], Any] = {}
        self.timers: dict[tuple, set[int]] = {}
        self.key: tuple = ()

    def value_cell(self, name: str, processing_ttl_ms: int | None) -> ValueCell:
        return _MemoryValue(self, name, processing_ttl_ms)

    def map_cell(self, name: str, processing_ttl_ms: int | None) -> MapCell:
        return _MemoryMap(self, name, processing_ttl_ms)

    def begin_key(self, key: tuple) -> None:
        self.key = key

    def keys_with(self, name: str) -> list[tuple[int | None, tuple]]:
        return [(None, key) for n, key in sorted(self.data, key=repr) if n == name]

    def register_timer(self, ts: int) -> None:
        self.timers.setdefault(self.key, set()).add(ts)

    def delete_timer(self, ts: int) -> None:
        timers = self.timers.get(self.key)
        if timers:
            timers.discard(ts)
            if not timers:
                del self.timers[self.key]

    def list_timers(self) -> Iterable[int]:
        return sorted(self.timers.get(self.key, ()))

    def due(self, upto: int) -> list[tuple[int, tuple]]:
        """Timers at or before ``upto``, in time order (removed, as Spark does on firing)."""
        out = sorted((ts, key) for key, tss in self.timers.items() for ts in tss if ts <= upto)
        for ts, key in out:
            self.key = key
            self.delete_timer(ts)
        return out
