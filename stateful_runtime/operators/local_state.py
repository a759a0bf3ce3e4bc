"""The operator engine's state backend on the worker's own RocksDB
(:class:`~stateful_runtime.operators.keyed_store.KeyedStore`).

Rows (their format is :mod:`stateful_runtime.checkpoints.keyed`'s), each key starting with the
key group (two bytes):

* ``<group> k <key>`` → every state of the key, a pickled dict ``state name → value`` (a map
  state's value is its dict: the engine loads a key's map whole, as the window operator reads
  it); the harness keeps a key's timestamps in it too (``_srt_timers_of``: ``list_timers``
  without a scan), a task does not;
* ``<group> t <timestamp, 8 bytes> <key>`` → nothing: the timer index, in time order within a
  key group, which the task walks for due timers; or :data:`SOLE_EXPIRY`: the key's only
  timer, at the expiry of its only state (``StateBackend.sole_expiry``), where a TTL cleanup
  deletes the key's row without reading it.

Keys are pickled tuples of the key fields' Python values. A key's row is read from the store at
most once a task (decoded into :attr:`LocalBackend.values`; a worker's next task of the same
partition starts from them when the store is at the version this worker committed) and what the
task changed is written in one write batch with its commit, not per key: a key a batch touches
is one read and one write, whatever its number of states. The task's own timer changes are
looked up beside the store's index when it looks for due timers, so nothing is written before
the commit. Processing-time TTL is stored beside the value (``(value, expires)``) and checked
against the batch's processing time, as the in-memory backend does. Expired state also leaves
storage: a map's expired entries go whenever its key writes the map, and each commit sweeps
on through :data:`SWEEP_ROWS` more rows of the partition (a cursor per worker, Flink's
incremental cleanup), removing the expired values and entries of keys nobody writes again.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import operator
import pickle
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from stateful_runtime.checkpoints.keyed import (
    GROUP_BYTES,
    STATE_ROW,
    TIMER_ROW,
    decode_states,
    decode_ts,
    encode_ts,
    key_group,
    parse_row,
    timers_fired,
)
from stateful_runtime.operators.backend import MapCell, StateBackend, ValueCell
from stateful_runtime.operators.keyed_store import MAX_PARALLELISM, KeyedStore, group_prefix

_PICKLE = pickle.HIGHEST_PROTOCOL
_dumps, _loads = pickle.dumps, pickle.loads
_MISSING = object()
_TIMER_SET = "_srt_timers_of"
# Stored values a function cannot change in place (kept decoded between key turns).
_IMMUTABLE = frozenset({int, float, str, bytes, bool, type(None)})
_TS_END = GROUP_BYTES + 1 + 8  # a timer row: group, tag, timestamp, then the key
# A timer row's value when the timer is its key's only one, at its only state's expiry. A
# row written without it (by a function of another shape, or before the mark existed) is
# fired by reading the key's row: a key could hold other cleanup timers, of older expiries.
SOLE_EXPIRY = b"1"
# Rows a commit looks at for expired processing-time TTL state: ~1-3 ms of a task's commit,
# a partition of 1M keys swept every 1,000 batches (a key a batch touches is purged anyway).
SWEEP_ROWS = 1_000
# Where each partition's sweep goes on from in this worker (store checkpoint → next row; a
# worker that starts anew sweeps from the start: the cursor decides nothing but the order).
_sweep_from: dict[str, bytes] = {}


class _Encoded:
    """A stored value kept as its pickle (see :meth:`LocalBackend.end_key`); pickled inside
    its key's row as the value itself."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def __reduce__(self) -> tuple[Any, tuple[bytes]]:
        return _loads, (self.raw,)


_PREFIXES = [group_prefix(g) for g in range(MAX_PARALLELISM)]


class _Cell:
    """A state of the current key: an entry of the key's states (:meth:`LocalBackend.load`)."""

    __slots__ = ("b", "ttl", "name", "is_map")

    def __init__(self, backend: LocalBackend, name: str, ttl_ms: int | None) -> None:
        self.b, self.ttl, self.name = backend, ttl_ms, name
        self.is_map = False

    def _stored(self) -> Any:
        b = self.b
        states = b.states if b.loaded == b.turn else b.load()
        if states is None:
            return None
        value = states.get(self.name)
        if type(value) is _Encoded:
            value = states[self.name] = _loads(value.raw)
        return value

    def _set(self, stored: Any) -> None:
        b = self.b
        states = b.states if b.loaded == b.turn else b.load()
        if stored is None or (self.is_map and not stored):  # an empty map is no state
            if states is None or states.pop(self.name, _MISSING) is _MISSING:
                return
        else:
            if states is None:
                states = b.states = b.values[b.row] = {}
            states[self.name] = stored
            # end_key keeps immutables as they are; a map written per element is listed once
            if type(stored) not in _IMMUTABLE and self.name not in b.turn_names:
                b.turn_names.append(self.name)
        b.dirty[b.row] = states

    def _live(self, stored: Any) -> Any:
        if stored is None or self.ttl is None:
            return stored
        value, expires = stored
        return None if expires <= self.b.clock() else value

    def _stamp(self, value: Any) -> Any:
        return value if self.ttl is None else (value, self.b.clock() + self.ttl)


class _LocalValue(_Cell, ValueCell):
    __slots__ = ()

    def get(self) -> Any:
        stored = self._stored()
        if stored is None or self.ttl is None:
            return stored
        return self._live(stored)

    def put(self, value: Any) -> None:
        self._set(value if self.ttl is None else self._stamp(value))

    def clear(self) -> None:
        self._set(None)


class _LocalMap(_Cell, MapCell):
    """A key's map as one dict ``entry key → value`` (or ``(value, expires)`` with TTL); an
    empty map is no state."""

    __slots__ = ()

    def __init__(self, backend: LocalBackend, name: str, ttl_ms: int | None) -> None:
        super().__init__(backend, name, ttl_ms)
        self.is_map = True

    def _map(self) -> dict[Any, Any]:
        stored = self._stored()
        return {} if stored is None else stored

    def get_entry(self, key: Any) -> Any:
        return self._live(self._map().get(key))

    def _unexpired(self) -> dict[Any, Any]:
        """The map less its expired entries (they leave storage as the map is written)."""
        m = self._map()
        if self.ttl is not None and m:
            now = self.b.clock()
            live = {k: v for k, v in m.items() if v[1] > now}
            if len(live) != len(m):
                return live
        return m

    def put_entry(self, key: Any, value: Any) -> None:
        m = self._unexpired()
        m[key] = self._stamp(value)
        self._set(m)

    def remove_entry(self, key: Any) -> None:
        m = self._unexpired()
        if m.pop(key, _MISSING) is not _MISSING or m is not self._map():
            self._set(m)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        for k, stored in list(self._map().items()):
            value = self._live(stored)
            if value is not None:
                yield k, value

    def entry_keys(self) -> Iterator[Any]:
        if self.ttl is None:  # every entry is live: no values to look at
            return iter(list(self._map()))
        return (k for k, _ in self.entries())

    def clear(self) -> None:
        self._set({})

    def live_entries(self) -> dict[Any, Any] | None:
        return self._map() if self.ttl is None else None

    def replace_entries(self, entries: dict[Any, Any]) -> None:
        self._set(entries)


def _timer_order(row: bytes) -> tuple[bytes, bytes, bytes]:
    """A timer row's place in firing order: time, then key group, then key."""
    return row[GROUP_BYTES + 1 : _TS_END], row[:GROUP_BYTES], row[_TS_END:]


_ts_of = operator.itemgetter(slice(GROUP_BYTES + 1, _TS_END))  # a timer row's time (bytes)
_MERGE_READ = 256  # timer rows read from a key group's index at a time


def _in_time_order(groups: list[Iterator[bytes]]) -> Iterator[bytes]:
    """The timer rows of ``groups`` (each a key group's index, in key order: time, then key)
    in firing order (:func:`_timer_order`), read a slice of each at a time: the rows before
    the earliest time some group has not read past are sorted by time alone (stable, so
    group then key within a time), in C, rather than merged a row at a time."""
    read = [list(itertools.islice(g, _MERGE_READ)) for g in groups]
    more = [len(r) == _MERGE_READ for r in read]
    while True:
        open_ = [i for i, m in enumerate(more) if m]
        bound = min((_ts_of(read[i][-1]) for i in open_), default=None)
        out: list[bytes] = []
        for rows in read:
            cut = len(rows) if bound is None else bisect.bisect_left(rows, bound, key=_ts_of)
            if cut:
                out += rows[:cut]
                del rows[:cut]
        out.sort(key=_ts_of)
        yield from out
        if bound is None:
            return
        for i in open_:  # the groups that hold the bound read on
            if not read[i] or _ts_of(read[i][-1]) == bound:
                chunk = list(itertools.islice(groups[i], _MERGE_READ))
                more[i] = len(chunk) == _MERGE_READ
                read[i] += chunk


def _noting_marks(rows: Iterator[tuple[bytes, bytes]], sole: set[bytes]) -> Iterator[bytes]:
    """The timer rows of ``rows`` (row, value), adding those marked :data:`SOLE_EXPIRY` to
    ``sole``."""
    for row, mark in rows:
        if mark:
            sole.add(row)
        yield row


def _expire(states: dict[str, Any], ttl: dict[str, bool], now: int) -> bool:
    """Drop from a key's ``states`` the TTL values and map entries (each stored beside its
    expiry, in either time domain) expired at ``now`` (``ttl``: state name → whether it is a
    map); whether anything was dropped."""
    dropped = False
    for name, is_map in ttl.items():
        stored = states.get(name)
        if stored is None:
            continue
        if type(stored) is _Encoded:
            stored = states[name] = _loads(stored.raw)
        if is_map:
            live = {k: v for k, v in stored.items() if v[1] > now}
            if len(live) != len(stored):
                dropped = True
                if live:
                    states[name] = live
                else:
                    del states[name]
        elif stored[1] <= now:
            del states[name]
            dropped = True
    return dropped


class LocalBackend(StateBackend):
    """State and timers of one task's partition in its :class:`KeyedStore`.

    A key's states are read from the store at most once (:attr:`values`, decoded) and written
    back in one write batch when the task commits (:meth:`commit`), not per key: a key's turn
    costs dictionary operations, and the store sees one batch of what changed.

    Args:
        store: the partition's store, opened at the batch's version.
        clock: the processing time (ms) processing-time TTL measures against.
        key_timers: keep each key's timestamps among its states, so that a key's timers are
            listed without a scan (the test harness lists them; a task fires due timers from
            the index and never lists a key's, so it skips their reads and writes).
        values: decoded rows (row → the key's states, None for no row) known to be the
            store's at the version it is opened at (a worker's values of its previous batch,
            see :mod:`stateful_runtime.operators.arrow_keyed`); they are read instead of the
            store.
        value_bytes: the stored size of ``values`` (:attr:`value_bytes`).
    """

    def __init__(
        self,
        store: KeyedStore,
        clock: Callable[[], int],
        *,
        key_timers: bool = True,
        values: dict[bytes, Any] | None = None,
        value_bytes: int = 0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.key_timers = key_timers
        self.values: dict[bytes, dict[str, Any] | None] = {} if values is None else values
        # What :attr:`values` take stored (each row's key and pickle as read, and as written:
        # a row written counts again, so this bounds from above).
        self.value_bytes = value_bytes if values is not None else 0
        # Written since the last flush: keys' rows (row → its states) and rows written as
        # they are (the timer index, broadcast states).
        self.dirty: dict[bytes, dict[str, Any]] = {}
        self.raw: dict[bytes, bytes | None] = {}
        self.turn_names: list[str] = []  # states written in this key's turn
        self.cells: list[_Cell] = []
        self.group: int | None = None  # set by the driver from the JVM's key group column
        # The key groups of the task's partition (every group outside Spark: the harness).
        self.groups: Iterable[int] = range(MAX_PARALLELISM)
        self.prefix = b""
        self.key: tuple = ()
        self.key_bytes = _dumps((), _PICKLE)
        self.row = b""  # the current key's row
        self.turn = 0
        self.states: dict[str, Any] | None = None  # the current key's, once loaded
        self.loaded = -1  # the turn ``states`` was loaded in
        self._timer_cell = _LocalValue(self, _TIMER_SET, None)
        self._timer_set: set[int] | None = None
        self._timer_turn = -1
        # No timer at or before this time is in the store (a due() found none; a timer
        # registered since at or before it resets it): the task's last look needs no scan.
        self._none_due_upto: int | None = None
        # The key groups and time up to which due() read the store's index.
        self._scanned: tuple[set[bytes], int] | None = None
        self._flushes = 0  # (a pass of due() over the store checks rows written since)
        self._pass_flushes = 0  # what it was when the pass began
        # The due timer rows marked SOLE_EXPIRY that the pass yielded and expire() has not
        # fired yet (kept only with sole_expiry).
        self._sole: set[bytes] = set()
        # The timer rows the task fired (taken or expired), not among its written rows: the
        # commit removes them as one range per key group, every timer up to the latest time
        # due() was asked for (:attr:`_due_upto`), which it fired whole.
        self._fired: set[bytes] = set()
        self._due_upto: int | None = None

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
        if key is not self.key:  # a due timer's take and fire hand over the same tuple
            self.key = key
            self.key_bytes = _dumps(key, _PICKLE)
        group = self.group if self.group is not None else key_group(self.key)
        self.prefix = prefix = _PREFIXES[group]
        self.row = prefix + STATE_ROW + self.key_bytes
        self.turn += 1

    def read_ahead_timers(self, rows: Iterable[bytes]) -> None:
        """The states of the keys of the coming timer ``rows`` (:meth:`due`'s) that
        :meth:`expire` reads, in one multi-get (:meth:`_read_rows`)."""
        sole = self._sole
        self._read_rows(r[:GROUP_BYTES] + STATE_ROW + r[_TS_END:] for r in rows if r not in sole)

    def _read_rows(self, rows: Iterable[bytes]) -> None:
        """Read the key rows among ``rows`` that the task has not read yet, sorted, in one
        multi-get (a present row ~3.4 µs against ~4.6 µs for a get, with the store's options)."""
        values = self.values
        wanted = sorted(set(rows).difference(values))
        if not wanted:
            return
        size = 0
        for row, raw in zip(wanted, self.store.get_many(wanted), strict=True):
            if raw is None:
                values[row] = None
                size += len(row)
            else:
                values[row] = decode_states(raw)
                size += len(row) + len(raw)
        self.value_bytes += size

    def load(self) -> dict[str, Any] | None:
        """The current key's states (None: no row), read from the store once a task."""
        row = self.row
        states = self.values.get(row, _MISSING)
        if states is _MISSING:
            raw = self.store.get(row)
            states = self.values[row] = None if raw is None else decode_states(raw)
            self.value_bytes += len(row) + (len(raw) if raw is not None else 0)
        self.states, self.loaded = states, self.turn  # type: ignore[assignment]
        return states  # type: ignore[return-value]

    def end_key(self) -> None:
        """A value written in the turn that the function could still change in place (it
        holds what it wrote) is kept encoded: a later read decodes a copy of its own, as a
        read from the store would."""
        names = self.turn_names
        if names:
            states = self.states
            if states is not None:
                for name in names:
                    value: Any = states.get(name)
                    kind = type(value)
                    if kind in _IMMUTABLE or kind is _Encoded:
                        continue
                    if kind is tuple and _IMMUTABLE.issuperset(map(type, value)):
                        continue
                    states[name] = _Encoded(_dumps(value, _PICKLE))
            names.clear()

    # -- writing back -----------------------------------------------------------------------
    def pending(self) -> dict[bytes, bytes | None]:
        """The rows written since the last flush, encoded, and forget them as pending."""
        rows = self.raw
        dirty = self.dirty
        if dirty:
            encoded = [_dumps(s, _PICKLE) if s else None for s in dirty.values()]
            rows.update(zip(dirty, encoded, strict=True))
            self.value_bytes += sum(map(len, dirty)) + sum(map(len, filter(None, encoded)))
        self.dirty, self.raw = {}, {}
        return rows

    def flush(self) -> None:
        """Write what changed since the last flush to the store (one write batch)."""
        if self.dirty or self.raw:
            self.store.write(self.pending())
            self._scanned = None  # the task's timers are the store's now
            self._flushes += 1

    def commit(self) -> int:
        """The task's changes, and the expired state its sweep found (:meth:`sweep`), as the
        store's next version (see :meth:`KeyedStore.commit`): the timers it fired go as one
        range per key group (:func:`~stateful_runtime.checkpoints.keyed.timers_fired`): each
        due() pass is read whole, so no timer up to its time is left but those the task
        registered since, which the commit writes after the ranges."""
        self.sweep()
        rows = self.pending()
        fired, upto = self._fired, self._due_upto
        self._fired = set()
        if not fired:
            return self.store.commit(rows)
        assert upto is not None  # (every fired row came from a due() pass)
        groups = {row[:GROUP_BYTES] for row in fired}
        ranges = dict(timers_fired(int.from_bytes(g, "big"), upto) for g in groups)
        return self.store.commit(rows, ranges)

    def sweep(self, limit: int = SWEEP_ROWS) -> None:
        """Look at up to ``limit`` more rows of the task's key groups, from where this
        worker's last sweep of the partition stopped, and drop their expired processing-time
        TTL state (a row left empty is deleted). Rows the task read are its own to write."""
        ttl = {c.name: c.is_map for c in self.cells if c.ttl is not None}
        if not ttl:
            return
        now, where = self.clock(), str(self.store.checkpoint)
        groups = list(self.groups)
        cursor = _sweep_from.pop(where, b"")
        first = int.from_bytes(cursor[:GROUP_BYTES], "big") if cursor else None
        at = groups.index(first) if first in groups else 0
        if first not in groups:  # (another range of key groups since: a rescale)
            cursor = b""
        looked = 0
        for group in groups[at:] + groups[:at]:
            # (the cursor's group first, from the cursor on)
            start, cursor = max(cursor, _PREFIXES[group] + STATE_ROW), b""
            for row, raw in self.store.scan(start, _PREFIXES[group] + b"l"):
                looked += 1
                if looked > limit:
                    _sweep_from[where] = row
                    return
                if row in self.values or row in self.dirty:
                    continue
                states = decode_states(raw)
                if _expire(states, ttl, now):
                    self.dirty[row] = states

    def keys_with(self, name: str) -> list[tuple[int | None, tuple]]:
        """Every key of the task's key groups (:attr:`groups`) holding state ``name``, in
        store order, with its group (what the task wrote so far included)."""
        self.flush()
        out: list[tuple[int | None, tuple]] = []
        for group in self.groups:
            start = _PREFIXES[group] + STATE_ROW
            for row, raw in self.store.scan(start, _PREFIXES[group] + b"l"):
                if name in decode_states(raw):
                    out.append((group, _loads(row[len(start) :])))
        return out

    # -- timers -----------------------------------------------------------------------------
    def _index_row(self, ts: int) -> bytes:
        return self.prefix + TIMER_ROW + encode_ts(ts) + self.key_bytes

    def _timers(self) -> set[int]:
        if self._timer_turn != self.turn:
            stored = self._timer_cell.get()
            self._timer_set = set(stored) if stored else set()
            self._timer_turn = self.turn
        assert self._timer_set is not None
        return self._timer_set

    def _save_timers(self, timers: set[int]) -> None:
        self._timer_cell.put(sorted(timers) if timers else None)

    def register_timer(self, ts: int) -> None:
        none_upto = self._none_due_upto
        if none_upto is not None and ts <= none_upto:
            self._none_due_upto = None
        mark = SOLE_EXPIRY if self.sole_expiry else b""
        if not self.key_timers:  # the index row is written (again)
            row = self._index_row(ts)
            self.raw[row] = mark
            if self._fired:
                self._fired.discard(row)  # (fired earlier in the task: pending again)
            return
        timers = self._timers()
        if ts not in timers:
            timers.add(ts)
            self._save_timers(timers)
            self.raw[self._index_row(ts)] = mark

    def delete_timer(self, ts: int) -> None:
        if not self.key_timers:  # whether it exists or not, its index row goes
            self.raw[self._index_row(ts)] = None
            return
        timers = self._timers()
        if ts in timers:
            timers.discard(ts)
            self._save_timers(timers)
            self.raw[self._index_row(ts)] = None

    def list_timers(self) -> Iterable[int]:
        if not self.key_timers:  # a scan of the key's group (no task lists a key's timers)
            self.flush()
            base = self.prefix + TIMER_ROW
            return sorted(
                decode_ts(row[GROUP_BYTES + 1 : _TS_END])
                for row, _ in self.store.scan(base, base + b"\xff" * 9)
                if row[_TS_END:] == self.key_bytes and row not in self._fired
            )
        return sorted(self._timers())

    def due(self, upto: int, groups: Iterable[int]) -> Iterator[bytes]:
        """The timer rows at or before ``upto`` in ``groups``, in time order (then group, then
        key), each for :meth:`take` (which skips one removed since this pass began) before it
        fires; the caller consumes the whole pass. The store's index as committed, with the
        task's own registrations and removals, streamed: a wave of millions of TTL cleanups is
        read as it fires, never listed. The store's part is read once up to a time (every
        timer it found there was taken since: what a later look up to that time can find is
        the task's own)."""
        if self._due_upto is None or upto > self._due_upto:
            self._due_upto = upto
        if self._none_due_upto is not None and upto <= self._none_due_upto:
            return
        stop = encode_ts(upto + 1) if upto < 2**63 - 1 else b"\xff" * 9
        wanted = {_PREFIXES[g] for g in groups}
        scanned = self._scanned
        runs: list[Iterable[bytes]] = []
        sole = self._sole if self.sole_expiry else None
        if scanned is None or scanned[0] != wanted or upto > scanned[1]:
            runs.append(
                _in_time_order(
                    [
                        self.store.keys(p + TIMER_ROW, p + TIMER_ROW + stop)
                        if sole is None
                        else _noting_marks(
                            self.store.scan(p + TIMER_ROW, p + TIMER_ROW + stop), sole
                        )
                        for p in sorted(wanted)
                    ]
                )
            )
            self._scanned = (wanted, upto)
        # The task's own registrations (bounded by what the task did); one the store holds
        # too comes out of the merge twice in a row, and fires once.
        own = sorted(
            (
                row
                for row, value in self.raw.items()
                if value is not None
                and row[GROUP_BYTES : GROUP_BYTES + 1] == TIMER_ROW
                and row[GROUP_BYTES + 1 : _TS_END] < stop
                and row[:GROUP_BYTES] in wanted
            ),
            key=_timer_order,
        )
        if sole is not None:
            sole.update(row for row in own if self.raw[row] == SOLE_EXPIRY)
        if own or not runs:
            runs.append(own)
        self._pass_flushes = self._flushes
        found = False
        last = b""
        for row in heapq.merge(*runs, key=_timer_order) if len(runs) > 1 else runs[0]:
            if row == last:
                continue
            last = row
            found = True
            yield row
        if not found:
            self._none_due_upto = upto

    def next_timer(self, groups: Iterable[int]) -> int | None:
        """The earliest timer in ``groups`` as committed (None: none)."""
        first = []
        for g in groups:
            base = _PREFIXES[g] + TIMER_ROW
            for row, _ in self.store.scan(base, base + b"\xff" * 9):
                first.append(decode_ts(row[GROUP_BYTES + 1 : _TS_END]))
                break
        return min(first, default=None)

    def _removed(self, row: bytes) -> bool:
        """Whether timer ``row`` (:meth:`due`'s) was removed since its pass began: by the
        task, or by a timer fired before it whose removal was flushed to the store since."""
        taken = self.raw.get(row, _MISSING)
        if taken is None or row in self._fired:
            return True
        return (
            taken is _MISSING
            and self._pass_flushes != self._flushes
            and self.store.get(row) is None
        )

    def take(self, row: bytes) -> tuple[int, tuple] | None:
        """Remove timer ``row`` (:meth:`due`'s) before it fires, as Spark does, and make its
        key the current one's next turn (the driver's :attr:`group` included): its time and
        key, or None when it was removed since the pass began (:meth:`_removed`)."""
        if self._removed(row):
            return None
        ts = decode_ts(row[GROUP_BYTES + 1 : _TS_END])
        self.group = int.from_bytes(row[:GROUP_BYTES], "big")
        key_bytes = row[_TS_END:]
        if key_bytes != self.key_bytes:
            self.key, self.key_bytes = _loads(key_bytes), key_bytes
        key = self.key
        if self.key_timers:
            self.begin_key(key)
            self.delete_timer(ts)
            self.end_key()
        else:
            self.raw.pop(row, None)  # (registered in the task: never written)
            self._fired.add(row)
        return ts, key

    def expire(self, rows: Iterable[bytes], ttl: dict[str, bool]) -> bool:
        """Fire cleanup timers ``rows`` (:meth:`due`'s, their keys' rows read ahead) of a
        function whose timers are all event-time TTL cleanups: each timer removed, and its
        key's TTL states ``ttl`` (state name → whether a map) cut to what outlives the timer's
        time, as the TTL cells' ``expire`` would (``operators/ttl.py``: a value and each map
        entry stored beside its expiry), without a key turn; whether any fired."""
        assert not self.key_timers  # (the keys' own timer sets would go stale)
        values, dirty, raw, sole = self.values, self.dirty, self.raw, self._sole
        taken = self._fired
        fired = False
        for row in rows:
            if self._removed(row):
                sole.discard(row)
                continue
            raw.pop(row, None)  # (registered in the task: never written)
            taken.add(row)
            fired = True
            state_row = row[:GROUP_BYTES] + STATE_ROW + row[_TS_END:]
            if row in sole:  # the key's only state expired at or before this timer
                sole.remove(row)
                dirty.pop(state_row, None)
                raw[state_row] = None
                if state_row not in values:  # (a read of it later in the task: none)
                    self.value_bytes += len(state_row)
                values[state_row] = None
                continue
            if state_row not in values:
                self._read_rows((state_row,))
            states = values[state_row]
            if states and _expire(states, ttl, decode_ts(row[GROUP_BYTES + 1 : _TS_END])):
                dirty[state_row] = states
        return fired

    def timers_of(self, key: tuple) -> list[int]:
        """Every timer of ``key`` (user and TTL cleanup; the harness shows them)."""
        self.begin_key(key)
        return sorted(self._timers())


def stored_states(backend: LocalBackend) -> set[tuple[str, tuple]]:
    """(state name, key) of every state in ``backend``'s store (the timer index and the keys'
    timer sets aside: the test harness asks what a cleanup removed)."""
    backend.flush()
    out = set()
    for row, raw in backend.store.scan(b"", b"\xff\xff"):
        _, tag, key = parse_row(row)
        if tag != STATE_ROW:
            continue
        for name in decode_states(raw):
            if name != _TIMER_SET:
                out.add((name, pickle.loads(key)))
    return out


# -- a worker's values between batches -----------------------------------------------------------
# A Python worker runs many tasks (Spark reuses workers), often of the same partition batch
# after batch. The decoded values a task ended with are kept for the next task of that
# partition in this process, valid only when the store opens at exactly the version this
# process committed, with its token: another attempt of the batch (a retry here or elsewhere),
# a batch of the partition run by another worker, a replay from an earlier version all change
# the version or its token, and the values are dropped.
# Bounded by the rows' stored size, not their count: a key holding a large map is one row of
# megabytes. 32 MiB of pickles is ~400,000 rows of a counter's or FraudCounter's size, which
# decoded take ~150-250 MB of the worker (a dict and its objects outweigh their pickle).
WARM_BYTES = 32 << 20  # stored bytes of the decoded rows kept per worker, all partitions
_warm: dict[str, tuple[int, str, dict[bytes, Any], int]] = {}


def warm_values(store: KeyedStore) -> tuple[dict[bytes, Any], int] | None:
    """The values this process committed ``store``'s current version with, if it did, and
    their stored size (:attr:`LocalBackend.value_bytes`)."""
    entry = _warm.pop(str(store.checkpoint), None)
    if entry is None:
        return None
    version, token, values, size = entry
    return (values, size) if (version, token) == (store.version, store.token) else None


def keep_values(store: KeyedStore, backend: LocalBackend) -> None:
    """Keep the backend's values (the task's, after ``store`` committed) for the
    partition's next task in this process, within :data:`WARM_BYTES`: past it, the rows the
    task read or wrote last, about the bound's share of them (the next batch's TTL cleanups
    and timers are mostly of the keys the last batches wrote; every kept row is the store's
    at this version, and a row not kept is read from the store)."""
    size, values = backend.value_bytes, backend.values
    if size > WARM_BYTES:
        keep = len(values) * WARM_BYTES // size
        if not keep:
            return
        values = dict(itertools.islice(values.items(), len(values) - keep, None))
        size = size * keep // len(backend.values)
    while _warm and sum(e[3] for e in _warm.values()) + size > WARM_BYTES:
        _warm.pop(next(iter(_warm)))
    assert store.version is not None
    _warm[str(store.checkpoint)] = (store.version, store.token, values, size)
