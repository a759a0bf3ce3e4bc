"""Keyed state files in a checkpoint: versions rebuilt from snapshot and deltas, a rescale by
key-group ranges, damage named, and the checkpoint machinery (batch files, verify, files of
later versions) seeing ``keyed/``."""

from __future__ import annotations

import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.checkpoints import keyed, verify
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.exceptions import ConfigError, StateError
from stateful_runtime.operators.keyed_store import KeyedStore


def _commit(directory, version: int, rows: dict[bytes, bytes | None]) -> None:
    """Version ``version + 1`` of a partition, as a task of batch ``version`` writes it."""
    store = KeyedStore(directory, directory.parent / f".local-{directory.name}")
    store.open(version)
    try:
        for k, v in rows.items():
            if v is None:
                store.delete(k)
            else:
                store.put(k, v)
        store.commit()
        store.publish()
    finally:
        store.close()


def _delta(part, version: int):
    """The committed delta of ``version`` of a partition."""
    path = keyed.committed(part, version, keyed.DELTA)
    assert path is not None, (part, version)
    return path


def _key(group: int, name: bytes) -> bytes:
    return keyed.group_prefix(group) + b"s" + name


def _query(tmp_path, batches: int, parallelism: int = 2):
    """A query checkpoint with Spark's logs of ``batches`` committed batches and keyed state of
    operator ``op`` written by each (every partition writes every version)."""
    q = QueryLayout(tmp_path / "q")
    conf = {"spark.sql.shuffle.partitions": str(parallelism)}
    q.state.mkdir(parents=True)  # Spark's (the carrier's operator holds no rows here)
    q.offset_log.mkdir(parents=True)
    q.commit_log.mkdir(parents=True)
    q.metadata.write_text(json.dumps({"id": "x"}))
    for b in range(batches):
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 0, "conf": conf}
        q.offsets(b).write_text(f"v1\n{json.dumps(meta)}\n{{}}\n")
        q.commit(b).write_text('v1\n{"nextBatchWatermarkMs":0}\n')
        for p in range(parallelism):
            group = keyed.key_groups(p, parallelism)[b % 3]
            _commit(q.keyed / "op" / str(p), b, {_key(group, b"k%d" % b): b"%d" % b})
    return q


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.dictionaries(
        st.tuples(st.integers(0, keyed.MAX_PARALLELISM - 1), st.binary(max_size=4)),
        st.binary(max_size=6),
        max_size=60,
    ),
    old=st.integers(1, 5),
    new=st.integers(1, 5),
)
def test_a_rescale_gives_each_new_partition_exactly_its_key_groups(
    tmp_path_factory, rows, old, new
):
    tmp = tmp_path_factory.mktemp("rescale")
    op = tmp / "q" / keyed.KEYED_DIR / "op"
    everything = {_key(g, k): v for (g, k), v in rows.items()}
    for p in range(old):
        mine = {
            k: v for k, v in everything.items() if keyed.group_of(k) in keyed.key_groups(p, old)
        }
        _commit(op / str(p), 0, mine)
        _commit(op / str(p), 1, {})  # version 2: nothing changed
    reads: list[str] = []
    real = keyed.state_at
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(keyed, "state_at", lambda d, *a: reads.append(d.name) or real(d, *a))
        staged = keyed.rescale(tmp / "q", old, new, 2, 3)
    assert sorted(reads) == [str(q) for q in range(old)]  # each old partition rebuilt once
    assert all(keyed.versions(op / str(p), keyed.SNAPSHOT) == [] for p in range(new))
    keyed.publish(staged)
    union: dict[bytes, bytes] = {}
    for p in range(new):
        got = keyed.state_at(op / str(p), 3)
        assert {keyed.group_of(k) for k in got} <= set(keyed.key_groups(p, new))
        union.update(got)
        # A task of the next batch opens version 3 and finds the same rows.
        store = KeyedStore(op / str(p), tmp / f".local-{p}")
        store.open(3)
        try:
            assert dict(store.scan(b"", b"\xff\xff")) == got
        finally:
            store.close()
    assert union == everything
    # Versions up to the rescale's are untouched: a restore of an earlier batch reads them.
    for p in range(min(old, new)):
        assert keyed.state_at(op / str(p), 2) == {
            k: v for k, v in everything.items() if keyed.group_of(k) in keyed.key_groups(p, old)
        }


def test_a_version_is_the_newest_snapshot_and_the_deltas_after_it(tmp_path):
    part = tmp_path / "0"
    _commit(part, 0, {b"\x00\x01a": b"1", b"\x00\x02b": b"2"})
    _commit(part, 1, {b"\x00\x01a": None, b"\x00\x03c": b"3"})
    rows = keyed.as_batches(keyed.state_at(part, 2))
    snapshot = keyed.write(part, 2, keyed.SNAPSHOT, keyed.committed_token(part, 2) or "", rows)
    # Another attempt's snapshot of version 2 (its token is not the one recorded): never read.
    keyed.write(part, 2, keyed.SNAPSHOT, "lost", keyed.as_batches({b"\x00\x09z": b"?"}))
    _commit(part, 2, {b"\x00\x03c": b"4"})
    assert keyed.needs(part, 3) == ([snapshot, _delta(part, 3)], [])
    assert keyed.needs(part, 1) == ([_delta(part, 1)], [])
    assert keyed.state_at(part, 1) == {b"\x00\x01a": b"1", b"\x00\x02b": b"2"}
    assert keyed.state_at(part, 3) == {b"\x00\x02b": b"2", b"\x00\x03c": b"4"}
    assert keyed.state_at(part, 3, groups=[3]) == {b"\x00\x03c": b"4"}
    _delta(part, 1).unlink()
    with pytest.raises(StateError, match=r"version\(s\) \[1\] are missing"):
        keyed.state_at(part, 1)


def test_batch_files_verify_and_later_versions_see_keyed_state(tmp_path):
    q = _query(tmp_path, 3)
    files = q.batch_files(2)
    deltas = {q.relative(_delta(q.keyed / "op" / str(p), v)) for p in (0, 1) for v in (1, 2, 3)}
    records = {f"keyed/op/{v}.commit" for v in (1, 2, 3)}
    assert {f for f in files if f.startswith("keyed/")} == deltas | records
    assert verify.verify(q.root) == []
    # A task of an uncommitted batch wrote version 4: files of later versions name it.
    _commit(q.keyed / "op" / "0", 3, {_key(0, b"late"): b"x"})
    assert _delta(q.keyed / "op" / "0", 4) in q.state_files_after(3)
    assert q.relative(_delta(q.keyed / "op" / "0", 4)) not in q.batch_files(2)
    # A truncated delta of the version a restart rebuilds is named, as is a missing one.
    delta = _delta(q.keyed / "op" / "1", 3)
    delta.write_bytes(delta.read_bytes()[:40])
    _delta(q.keyed / "op" / "0", 2).unlink()
    problems = {p.path: p.problem for p in verify.verify(q.root)}
    assert set(problems) == {q.relative(delta), "keyed/op/0/2.delta"}
    assert "not a readable Arrow file" in problems[q.relative(delta)]
    assert problems["keyed/op/0/2.delta"] == "missing"
    with pytest.raises(StateError, match=r"3\.\w+\.delta cannot be read"):
        keyed.state_at(q.keyed / "op" / "1", 3)


def test_a_missing_partition_is_refused_by_verify_by_savepoints_and_by_a_rebuild(tmp_path):
    """Every partition commits every batch: a partition whose directory is gone is a damaged
    checkpoint, named by verify, refused by a savepoint's file list and by a rebuild."""
    q = _query(tmp_path, 3)
    shutil.rmtree(q.keyed / "op" / "1")
    problems = {p.path: p.problem for p in verify.verify(q.root)}
    assert problems == {f"keyed/op/1/{v}.delta": "missing" for v in (1, 2, 3)}
    with pytest.raises(ConfigError, match="keyed/op/1 lacks the committed changes"):
        q.batch_files(2)
    with pytest.raises(StateError, match=r"version\(s\) \[1, 2, 3\] are missing"):
        keyed.state_at(q.keyed / "op" / "1", 3)


def test_an_older_keyed_file_a_restart_needs_is_refused_and_a_newest_one_falls_back(tmp_path):
    """`srt run`'s check at start (recovery.recover) treats keyed files as Spark's changelogs:
    damage to the newest version moves the newest batch aside; damage to a version the batch
    before needs as well refuses, naming the file, and moves nothing."""
    from stateful_runtime.checkpoints import layout, recovery

    layout.claim(tmp_path / "ck", "job", ["q"])
    q = _query(tmp_path / "ck", 3)

    def before() -> list[str]:
        return sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))

    older = _delta(q.keyed / "op" / "1", 2)  # version 2: what batch 1 left, batch 2's start
    saved = older.read_bytes()
    older.write_bytes(saved[:40])
    tree = before()
    with pytest.raises(recovery.CorruptCheckpointError, match=q.relative(older)):
        recovery.recover(tmp_path / "ck", ["q"])
    assert before() == tree
    older.write_bytes(saved)

    newest = _delta(q.keyed / "op" / "0", 3)
    newest.write_bytes(b"")
    rec = recovery.recover(tmp_path / "ck", ["q"])
    assert q.last_committed() == 1 and rec.quarantine is not None
    assert (rec.quarantine / "q" / q.relative(newest)).exists()
    assert verify.verify(q.root) == []


def _previous_layout(directory, version: int, suffix: str, rows: dict[bytes, bytes | None]):
    """A file as the previous layout wrote it: a row per state and key."""
    import pyarrow as pa

    directory.mkdir(parents=True, exist_ok=True)
    meta = {"format": keyed.PREVIOUS_FORMAT, "version": str(version), "token": f"old{version}"}
    batch = pa.record_batch(
        [pa.array(list(rows), pa.binary()), pa.array(list(rows.values()), pa.binary())],
        schema=keyed.schema(),
    )
    path = keyed.file(directory, version, suffix)
    with (
        pa.OSFile(str(path), "wb") as sink,
        pa.ipc.new_file(sink, keyed.schema().with_metadata(meta)) as writer,
    ):
        writer.write_batch(batch)


def test_a_checkpoint_of_the_previous_layout_restores_into_one_row_per_key(tmp_path):
    """Files of the row-per-state layout (a checkpoint or savepoint taken before the layout
    changed) are read, not refused and not skipped: their rows merge into each key's row, a
    task's store rebuilt from them reads every state, and the versions it writes after are of
    this layout. A local copy the previous layout left is rebuilt, not used."""
    import pickle

    from stateful_runtime.checkpoints.state_reader import local_entries
    from stateful_runtime.operators.local_state import LocalBackend

    def dumps(value):
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def state(group, name, key):
        return keyed.group_prefix(group) + b"s" + name + b"\x00" + dumps(key)

    timer = keyed.group_prefix(3) + b"t" + keyed.encode_ts(60_000) + dumps(("M1",))
    part = tmp_path / "q" / "keyed" / "fraud" / "0"
    _previous_layout(
        part,
        2,
        keyed.SNAPSHOT,
        {
            state(3, b"count", ("M1",)): dumps(4),
            state(3, b"first_seen_ms", ("M1",)): dumps(1_000),
            timer: b"",
            state(9, b"count", ("M2",)): dumps(7),
        },
    )
    _previous_layout(
        part,
        3,
        keyed.DELTA,
        {state(3, b"count", ("M1",)): dumps(5), state(9, b"count", ("M2",)): None},
    )
    assert keyed.problem(keyed.file(part, 2, keyed.SNAPSHOT)) is None
    rows = keyed.state_at(part, 3)
    assert rows == {
        keyed.group_prefix(3) + b"k" + dumps(("M1",)): dumps({"count": 5, "first_seen_ms": 1_000}),
        timer: b"",
    }
    entries = [e for row, raw in rows.items() for e in local_entries(row, raw)]
    assert {(name, pickle.loads(key), value) for _, name, key, value, _ in entries} == {
        ("count", ("M1",), 5),
        ("first_seen_ms", ("M1",), 1_000),
        (60_000, ("M1",), None),
    }  # what srt state inspect shows: each state by name, and the timer

    local = tmp_path / "local"
    for attempt in ("rebuilt from the files", "a local copy of the previous layout"):
        if attempt == "a local copy of the previous layout":
            # The previous layout's copy at version 3: its marker names no layout.
            store = KeyedStore(part, local)
            store.open(3)
            assert store.db is not None
            store.db.put(keyed.group_prefix(3) + b"s" + b"count\x00" + dumps(("M1",)), dumps(99))
            store.db.put(
                b"\xff\xffsrt-version", json.dumps({"version": 3, "token": "old3"}).encode()
            )
            store.close()
        store = KeyedStore(part, local)
        store.open(3)
        try:
            assert store.rebuilt, attempt
            backend = LocalBackend(store, clock=lambda: 0, key_timers=False)
            count, first = (
                backend.value_cell("count", None),
                backend.value_cell("first_seen_ms", None),
            )
            backend.group = 3
            backend.begin_key(("M1",))
            assert (count.get(), first.get()) == (5, 1_000), attempt
            count.put(6)
            backend.end_key()
            due = [backend.take(row) for row in backend.due(60_000, [3])]
            assert due == [(60_000, ("M1",))] and backend.group == 3
            backend.commit()
        finally:
            store.close()
    # The version written after is this layout's: a key's row, nothing per state.
    assert keyed.problem(keyed.file(part, 4, keyed.DELTA, store.token)) is None
    assert keyed.token(keyed.file(part, 4, keyed.DELTA, store.token)) == store.token
    store.publish()
    assert keyed.state_at(part, 4)[keyed.group_prefix(3) + b"k" + dumps(("M1",))] == dumps(
        {"count": 6, "first_seen_ms": 1_000}
    )


def test_a_damaged_commit_record_is_named_by_verify_and_the_newest_falls_back(tmp_path):
    """A commit record is a checkpoint file like any other: verify names a damaged one (which
    files are its version is then unknown), the start falls back a batch when it is the newest
    version's, and refuses, naming it, when an earlier batch needs it too."""
    from stateful_runtime.checkpoints import layout, recovery

    layout.claim(tmp_path / "ck", "job", ["q"])
    q = _query(tmp_path / "ck", 3)
    older = keyed.record_path(q.keyed / "op", 2)
    saved = older.read_bytes()
    older.write_bytes(saved[:10])
    problems = {p.path: p.problem for p in verify.verify(q.root)}
    assert list(problems) == ["keyed/op/2.commit"]
    assert "not a readable commit record" in problems["keyed/op/2.commit"]
    with pytest.raises(recovery.CorruptCheckpointError, match="keyed/op/2.commit"):
        recovery.recover(tmp_path / "ck", ["q"])
    older.write_bytes(saved)

    keyed.record_path(q.keyed / "op", 3).write_text("{}")
    rec = recovery.recover(tmp_path / "ck", ["q"])
    assert q.last_committed() == 1 and rec.quarantine is not None
    assert verify.verify(q.root) == []
