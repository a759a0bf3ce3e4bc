"""``srt state inspect`` of the local backend reads the rows the worker's backend writes: each
state of a key's row and each timer parsed back to its key group, state name or timestamp and
key."""

from __future__ import annotations

import pickle

from stateful_runtime.checkpoints.state_reader import local_entries
from stateful_runtime.operators.keyed_store import KeyedStore
from stateful_runtime.operators.local_state import LocalBackend


def test_rows_of_the_local_backend_parse_back_to_group_state_timer_and_key(tmp_path):
    store = KeyedStore(tmp_path / "ck", tmp_path / "local")
    store.open(0)
    try:
        backend = LocalBackend(store, clock=lambda: 0, key_timers=True)
        count, seen = backend.value_cell("count", None), backend.map_cell("seen", None)
        backend.group = 77
        backend.begin_key(("M1", 3))
        count.put(5)
        seen.put_entry("x", 1)
        backend.register_timer(-12)
        backend.register_timer(1_700_000_000_000)
        backend.end_key()
        backend.flush()  # a task's rows reach RocksDB in one write batch, not per key
        entries = [e for row, v in store.scan(b"", b"\xff\xff") for e in local_entries(row, v)]
        parsed = sorted(
            (g, what, pickle.loads(k), value)
            for g, what, k, value, _ in entries
            if isinstance(what, str)
        )
        timers = sorted(
            (g, what, pickle.loads(k)) for g, what, k, _, _ in entries if isinstance(what, int)
        )
        # One row holds the key's states (and, in the harness, its timer set).
        assert sum(1 for row, _ in store.scan(b"", b"\xff\xff") if row[2:3] == b"k") == 1
    finally:
        store.close()
    assert parsed == [(77, "count", ("M1", 3), 5), (77, "seen", ("M1", 3), {"x": 1})]
    # The key's own timer set is the backend's, not a state: left out.
    assert timers == [(77, -12, ("M1", 3)), (77, 1_700_000_000_000, ("M1", 3))]
