"""The worker backend: timers with and without each key's own timer row (the same timers
listed and due, whatever the order of registrations and deletions in and across key turns);
expired processing-time TTL state leaving storage."""

from __future__ import annotations

import itertools
import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime.checkpoints.keyed import STATE_ROW, decode_states, parse_row
from stateful_runtime.operators import local_state
from stateful_runtime.operators.keyed_store import MAX_PARALLELISM, KeyedStore
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
        due = []
        for row in b.due(3, range(128)):
            taken = b.take(row)
            assert taken is not None
            due.append((taken[0], b.group, taken[1]))
        assert due == sorted(due)
        assert {(ts, k) for ts, _, k in due} == {
            (ts, k) for k, tss in model.items() for ts in tss if ts <= 3
        }
        b.store.close()


def _ttl_backend(tmp, now: list[int]) -> LocalBackend:
    store = KeyedStore(tmp / "ck", tmp / "local")
    store.open(0)
    backend = LocalBackend(store, clock=lambda: now[0], key_timers=False)
    backend.groups = range(MAX_PARALLELISM)
    return backend


def _stored(backend: LocalBackend) -> dict:
    rows = backend.store.scan(b"", b"\xff\xff")
    return {parse_row(row)[2]: decode_states(raw) for row, raw in rows if row[2:3] == STATE_ROW}


def test_expired_processing_time_state_leaves_storage_for_every_state_kind(tmp_path):
    """Processing-time TTL frees storage, not only reads: a map's expired entries go when its
    key writes it (five puts 10 s apart under a 1 s TTL keep one entry stored, not five), and
    the commit's sweep removes the expired values and entries of keys nobody writes again."""
    now = [0]
    b = _ttl_backend(tmp_path, now)
    seen, last = b.map_cell("seen", 1_000), b.value_cell("last", 1_000)
    kept = b.value_cell("kept", None)  # no TTL: never swept
    for i in range(5):
        now[0] = i * 10_000
        b.begin_key(("user",))
        seen.put_entry(f"id{i}", i)
        b.end_key()
    b.flush()
    assert list(_stored(b)[_key("user")]["seen"]) == ["id4"]
    for k in ("a", "b"):
        b.begin_key((k,))
        seen.put_entry("x", 1)
        last.put(1)
        if k == "b":
            kept.put("forever")
        b.end_key()
    b.commit()
    b.store.publish()
    b.store.close()
    # A later batch touching none of those keys: its commit sweeps what expired.
    now[0] = 60_000
    b.store.open(1)
    fresh = LocalBackend(b.store, clock=lambda: now[0], key_timers=False)
    fresh.map_cell("seen", 1_000), fresh.value_cell("last", 1_000), fresh.value_cell("kept", None)
    fresh.commit()
    assert _stored(fresh) == {_key("b"): {"kept": "forever"}}
    fresh.store.close()


def _key(*fields) -> bytes:
    import pickle

    return pickle.dumps(fields, pickle.HIGHEST_PROTOCOL)


def test_a_workers_kept_values_are_bounded_by_their_stored_size(tmp_path, monkeypatch):
    """A worker keeps a task's decoded values for the partition's next task within a bound in
    bytes, not rows: one key holding a large map is one row of many bytes, dropped; of many
    keys past the bound, the ones the task came to last are kept, about the bound's share."""
    monkeypatch.setattr(local_state, "WARM_BYTES", 20_000)
    for name, keys, entries in (("small", 1, 10), ("large", 1, 2_000), ("many", 1_000, 1)):
        store = KeyedStore(tmp_path / name / "0", tmp_path / f"local-{name}")
        store.open(0)
        b = LocalBackend(store, clock=lambda: 0, key_timers=False)
        m = b.map_cell("m", None)
        for k in range(keys):
            b.begin_key((f"k{k}",))
            for i in range(entries):
                m.put_entry(i, f"value {i:012d}")
            b.end_key()
        b.commit()
        local_state.keep_values(store, b)
        warm = local_state.warm_values(store)
        if name == "small":
            assert warm is not None and warm[1] == b.value_bytes < 20_000
        elif name == "large":
            assert b.value_bytes > 20_000 and warm is None
        else:
            assert warm is not None and b.value_bytes > 20_000 >= warm[1]
            kept = [pickle.loads(row[3:]) for row in warm[0]]
            assert 0 < len(kept) < keys and kept == [
                (f"k{k}",) for k in range(keys - len(kept), keys)
            ]
            assert all(warm[0][row] == b.values[row] for row in warm[0])
        store.close()


def test_due_timers_stream_in_time_order_and_a_timer_removed_mid_pass_does_not_fire(tmp_path):
    """A pass over due timers reads the store's index as it goes (a wave of TTL cleanups is
    never listed whole); a timer the firing removes — held by the task, or already written
    to the store — does not fire later in the same pass, even when the task looked ahead at
    it."""
    store = KeyedStore(tmp_path / "ck" / "0", tmp_path / "local")
    store.open(0)
    b = LocalBackend(store, clock=lambda: 0, key_timers=False)
    b.groups = range(MAX_PARALLELISM)
    for key, ts in ((("a",), 10), (("a",), 20), (("b",), 15), (("c",), 30)):
        b.begin_key(key)
        b.register_timer(ts)
        b.end_key()
    b.flush()  # in the store's index now
    b.begin_key(("d",))
    b.register_timer(5)  # the task's own, not in the store yet
    b.end_key()
    passing = b.due(100, range(MAX_PARALLELISM))
    assert not isinstance(passing, list)
    fired = []
    ahead = list(itertools.islice(passing, 3))  # looked ahead at, as a task does (READ_AHEAD)
    for row in itertools.chain(ahead, passing):
        taken = b.take(row)
        if taken is None:
            continue
        ts, key = taken
        fired.append((ts, key))
        if key == ("a",) and ts == 10:  # a's first timer removes b's, then the task flushes
            b.group = None  # (b's own group, as at its registration)
            b.begin_key(("b",))
            b.delete_timer(15)
            b.end_key()
            b.flush()
    assert fired == [(5, ("d",)), (10, ("a",)), (20, ("a",)), (30, ("c",))]
    store.close()
