"""The worker backend's timers with and without each key's own timer row: the same timers
listed and due, whatever the order of registrations and deletions in and across key turns."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime.operators.keyed_store import KeyedStore
from stateful_runtime.operators.local_state import LocalBackend

KEYS = [("a",), ("b",)]
OPS = st.lists(
    st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=6),  # one key turn
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(OPS)
def test_timers_without_the_keys_row_are_the_same_timers(tmp_path_factory, turns):
    tmp = tmp_path_factory.mktemp("ls")
    backends = []
    for track in (True, False):
        store = KeyedStore(tmp / f"ck{track}", tmp / f"local{track}")
        store.open(0)
        backends.append(LocalBackend(store, clock=lambda: 0, key_timers=track))
    model: dict[tuple, set[int]] = {k: set() for k in KEYS}
    for i, turn in enumerate(turns):
        key = KEYS[i % 2]
        for b in backends:
            b.begin_key(key)
            for register, ts in turn:
                (b.register_timer if register else b.delete_timer)(ts)
            b.end_key()
        for register, ts in turn:
            (model[key].add if register else model[key].discard)(ts)
    for b in backends:
        for key in KEYS:
            b.begin_key(key)
            assert sorted(b.list_timers()) == sorted(model[key])
            b.end_key()
        due = b.due(3, range(128))
        assert due == sorted((ts, g, k) for ts, g, k in due)
        assert {(ts, k) for ts, _, k in due} == {
            (ts, k) for k, tss in model.items() for ts in tss if ts <= 3
        }
        b.store.close()
