"""The operator engine's state backend on the worker's own RocksDB
(:class:`~stateful_runtime.operators.keyed_store.KeyedStore`): ``state.backend=rocksdb_local``.

Rows, each key starting with the key group (two bytes):

* ``<group> s <state name> \\0 <key>`` → the pickled value of one state of one key (a map state
  is one row holding its dict: the engine loads a key's map whole, as the window operator
  reads it);
* ``<group> t <timestamp, 8 bytes> <key>`` → nothing: the timer index, in time order within a
  key group, which the task walks for due timers;
* ``<group> s _srt_timers_of \\0 <key>`` → the key's timestamps (``list_timers`` without a scan).

Keys are pickled tuples of the key fields' Python values. A key's rows are read on its first
access in a key's turn, cached for the turn and written back once at its end (Spark's path does
the same against the JVM; here a read is a local RocksDB get, ~1 µs). Processing-time TTL is
stored beside the value (``(value, expires)``) and checked against the batch's processing time,
as the in-memory backend does.
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stateful_runtime.operators.backend import MapCell, StateBackend, ValueCell
from stateful_runtime.operators.keyed_store import MAX_PARALLELISM, KeyedStore, group_prefix

_PICKLE = pickle.HIGHEST_PROTOCOL
_MISSING = object()
_TIMER_SET = "_srt_timers_of"
_TS_OFFSET = 2**63  # timestamps as unsigned big-endian: byte order is time order


def encode_ts(ts: int) -> bytes:
    return (ts + _TS_OFFSET).to_bytes(8, "big")


def harness_group(key_bytes: bytes) -> int:
    """A key group for a key outside Spark (the test harness): Spark's path takes the group
    the JVM computed, and the two never share a store."""
    return zlib.crc32(key_bytes) % MAX_PARALLELISM


class _Cell:
    def __init__(self, backend: LocalBackend, name: str, ttl_ms: int | None) -> None:
        self.b, self.ttl = backend, ttl_ms
        self.tag = b"s" + name.encode() + b"\x00"
        self.cached: Any = _MISSING
        self.dirty = False

    def _row(self) -> bytes:
        return self.b.prefix + self.tag + self.b.key_bytes

    def _stored(self) -> Any:
        if self.cached is _MISSING:
            raw = self.b.store.get(self._row())
            self.cached = None if raw is None else pickle.loads(raw)
        return self.cached

    def _live(self, stored: Any) -> Any:
        if stored is None or self.ttl is None:
            return stored
        value, expires = stored
        return None if expires <= self.b.clock() else value

    def _stamp(self, value: Any) -> Any:
        return value if self.ttl is None else (value, self.b.clock() + self.ttl)

    def reset(self) -> None:
        self.cached, self.dirty = _MISSING, False

    def flush(self) -> None:
        if self.dirty:
            if self.cached is None:
                self.b.store.delete(self._row())
            else:
                self.b.store.put(self._row(), pickle.dumps(self.cached, _PICKLE))
        self.cached, self.dirty = _MISSING, False


class _LocalValue(_Cell, ValueCell):
    def get(self) -> Any:
        return self._live(self._stored())

    def put(self, value: Any) -> None:
        self.cached, self.dirty = self._stamp(value), True

    def clear(self) -> None:
        self.cached, self.dirty = None, True


class _LocalMap(_Cell, MapCell):
    """A key's map as one dict ``entry key → value`` (or ``(value, expires)`` with TTL)."""

    def _map(self) -> dict[Any, Any]:
        stored = self._stored()
        if stored is None:
            stored = self.cached = {}
        return stored

    def get_entry(self, key: Any) -> Any:
        return self._live(self._map().get(key))

    def put_entry(self, key: Any, value: Any) -> None:
        self._map()[key] = self._stamp(value)
        self.dirty = True

    def remove_entry(self, key: Any) -> None:
        if self._map().pop(key, _MISSING) is not _MISSING:
            self.dirty = True

    def entries(self) -> Iterator[tuple[Any, Any]]:
        for k, stored in list(self._map().items()):
            value = self._live(stored)
            if value is not None:
                yield k, value

    def clear(self) -> None:
        self.cached, self.dirty = {}, True

    def flush(self) -> None:
        if self.dirty and not self.cached:
            self.cached = None  # an empty map is no row
        super().flush()


class LocalBackend(StateBackend):
    """State and timers of one task's partition in its :class:`KeyedStore`.

    Args:
        store: the partition's store, opened at the batch's version.
        clock: the processing time (ms) processing-time TTL measures against.
        key_timers: keep each key's timestamps in a row of its own, so that a key's timers
            are listed without a scan (the test harness lists them; a task fires due timers
            from the index and never lists a key's, so it skips the row's read and write).
    """

    def __init__(
        self, store: KeyedStore, clock: Callable[[], int], *, key_timers: bool = True
    ) -> None:
        self.store = store
        self.clock = clock
        self.key_timers = key_timers
        self.cells: list[_Cell] = []
        self.group: int | None = None  # set by the driver from the JVM's key group column
        self.prefix = b""
        self.key: tuple = ()
        self.key_bytes = b""
        self._timer_set: set[int] | None = None
        self._timers_dirty = False
        self._added: set[int] = set()
        self._deleted: set[int] = set()

    # -- cells ------------------------------------------------------------------------------
    def value_cell(self, name: str, processing_ttl_ms: int | None) -> ValueCell:
        cell = _LocalValue(self, name, processing_ttl_ms)
        self.cells.append(cell)
        return cell

    def map_cell(self, name: str, processing_ttl_ms: int | None) -> MapCell:
        cell = _LocalMap(self, name, processing_ttl_ms)
        self.cells.append(cell)
        return cell

    # -- a key's turn -----------------------------------------------------------------------
    def begin_key(self, key: tuple) -> None:
        self.key = key
        self.key_bytes = pickle.dumps(key, _PICKLE)
        group = self.group if self.group is not None else harness_group(self.key_bytes)
        self.prefix = group_prefix(group)
        for cell in self.cells:
            cell.reset()
        self._timer_set = None

    def end_key(self) -> None:
        for cell in self.cells:
            cell.flush()
        if self._timers_dirty:
            store, base = self.store, self.prefix + b"t"
            for ts in self._deleted:
                store.delete(base + encode_ts(ts) + self.key_bytes)
            for ts in self._added:
                store.put(base + encode_ts(ts) + self.key_bytes, b"")
            row = self.prefix + b"s" + _TIMER_SET.encode() + b"\x00" + self.key_bytes
            if not self.key_timers:
                pass
            elif self._timer_set:
                store.put(row, pickle.dumps(sorted(self._timer_set), _PICKLE))
            else:
                store.delete(row)
            self._added.clear()
            self._deleted.clear()
            self._timers_dirty = False
        self._timer_set = None

    # -- timers -----------------------------------------------------------------------------
    def _timers(self) -> set[int]:
        if self._timer_set is None:
            raw = self.store.get(
                self.prefix + b"s" + _TIMER_SET.encode() + b"\x00" + self.key_bytes
            )
            self._timer_set = set(pickle.loads(raw)) if raw else set()
        return self._timer_set

    def register_timer(self, ts: int) -> None:
        if not self.key_timers:  # the index row is written (again) at the key's end
            self._added.add(ts)
            self._deleted.discard(ts)
            self._timers_dirty = True
            return
        timers = self._timers()
        if ts not in timers:
            timers.add(ts)
            if ts in self._deleted:
                self._deleted.discard(ts)
            else:
                self._added.add(ts)
            self._timers_dirty = True

    def delete_timer(self, ts: int) -> None:
        if not self.key_timers:  # whether it exists or not, its index row goes
            self._deleted.add(ts)
            self._added.discard(ts)
            self._timers_dirty = True
            return
        timers = self._timers()
        if ts in timers:
            timers.discard(ts)
            if ts in self._added:
                self._added.discard(ts)
            else:
                self._deleted.add(ts)
            self._timers_dirty = True

    def list_timers(self) -> Iterable[int]:
        if not self.key_timers:  # a scan of the key's group (no task lists a key's timers)
            base = self.prefix + b"t"
            stored = {
                int.from_bytes(row[3:11], "big") - _TS_OFFSET
                for row, _ in self.store.scan(base, base + b"\xff" * 9)
                if row[11:] == self.key_bytes
            }
            return sorted((stored - self._deleted) | self._added)
        return sorted(self._timers())

    def due(self, upto: int, groups: Iterable[int]) -> list[tuple[int, int, tuple]]:
        """Timers at or before ``upto`` in ``groups``, in time order (then group, then key):
        ``(ts, group, key)``, not yet removed (:meth:`take` removes one as it fires)."""
        out = []
        stop = encode_ts(upto + 1) if upto < _TS_OFFSET - 1 else b"\xff" * 9
        for g in groups:
            base = group_prefix(g) + b"t"
            for row, _ in self.store.scan(base, base + stop):
                ts = int.from_bytes(row[3:11], "big") - _TS_OFFSET
                out.append((ts, g, row[11:]))
        out.sort()
        return [(ts, g, pickle.loads(kb)) for ts, g, kb in out]

    def take(self, key: tuple, ts: int) -> None:
        """Remove ``key``'s timer ``ts`` (before it fires, as Spark does; the driver has set
        :attr:`group`)."""
        self.begin_key(key)
        self.delete_timer(ts)
        self.end_key()

    def timers_of(self, key: tuple) -> list[int]:
        """Every timer of ``key`` (user and TTL cleanup; the harness shows them)."""
        self.begin_key(key)
        try:
            return sorted(self._timers())
        finally:
            self._timer_set = None


def stored_states(store: KeyedStore) -> set[tuple[str, tuple]]:
    """(state name, key) of every state row in ``store`` (the timer index and the keys' timer
    sets aside: the test harness asks what a cleanup removed)."""
    out = set()
    for row, _ in store.scan(b"", b"\xff\xff"):
        if row[2:3] != b"s":
            continue
        name, _, key = row[3:].partition(b"\x00")
        if name.decode() != _TIMER_SET:
            out.add((name.decode(), pickle.loads(key)))
    return out
