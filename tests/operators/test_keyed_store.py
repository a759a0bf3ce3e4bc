"""The worker's keyed store: versions bound to batches, incremental checkpoint files, local
copies used, moved forward or rebuilt, key-group ranges, the partition lock."""

from __future__ import annotations

import fcntl
import threading
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime.exceptions import StateError
from stateful_runtime.operators import keyed_store
from stateful_runtime.operators.keyed_store import MAX_PARALLELISM, KeyedStore, key_groups


def _store(tmp_path, local="a") -> KeyedStore:
    return KeyedStore(tmp_path / "ck", tmp_path / local)


def _run(store: KeyedStore, version: int, writes: dict[bytes, bytes | None]) -> int:
    store.open(version)
    try:
        for k, v in writes.items():
            if v is None:
                store.delete(k)
            else:
                store.put(k, v)
        version = store.commit()
        store.publish()  # the driver's record of this attempt, with the batch
        return version
    finally:
        store.close()


def _untokened(name: str) -> str:
    """``<V>.<suffix>`` for an attempt's ``<V>.<token>.<suffix>``."""
    version, _, suffix = name.split(".")
    return f"{version}.{suffix}"


def _contents(store: KeyedStore, version: int) -> dict[bytes, bytes]:
    store.open(version)
    try:
        return dict(store.scan(b"", b"\xff\xff"))
    finally:
        store.close()


def test_each_batch_is_a_version_and_a_replay_starts_from_the_one_before(tmp_path):
    s = _store(tmp_path)
    assert _run(s, 0, {b"\x00\x01a": b"1"}) == 1
    assert _run(s, 1, {b"\x00\x01a": b"2", b"\x00\x02b": b"x"}) == 2
    assert _run(s, 2, {b"\x00\x02b": None}) == 3
    assert _contents(s, 3) == {b"\x00\x01a": b"2"} and not s.rebuilt  # the local copy
    # Batch 1 replayed after a crash (its commit never written): from version 1, not 3.
    assert _contents(s, 1) == {b"\x00\x01a": b"1"} and s.rebuilt
    assert _run(s, 1, {b"\x00\x01a": b"9"}) == 2  # the re-run's version 2 ...
    assert _contents(s, 2) == {b"\x00\x01a": b"9"}  # ... whole: b is not in the re-run
    # Each attempt's files under its own token, each version's record naming one of them.
    names = sorted(p.name for p in (tmp_path / "ck").iterdir())
    assert [n.split(".")[0] for n in names] == ["1", "2", "2", "3"]
    assert all(n.endswith(".delta") and len(n.split(".")) == 3 for n in names)
    assert sorted(p.name for p in tmp_path.glob("*.commit")) == ["1.commit", "2.commit", "3.commit"]


def _attempt(tmp_path, local: str, version: int, writes: dict[bytes, bytes]) -> KeyedStore:
    """An attempt of batch ``version`` on a machine of its own (``local``): committed, not
    recorded."""
    store = _store(tmp_path, local)
    store.open(version)
    try:
        for k, v in writes.items():
            store.put(k, v)
        store.commit()
    finally:
        store.close()
    return store


def test_only_the_recorded_attempt_is_read_back_whatever_another_attempt_wrote_after(tmp_path):
    """Spark can run a task twice (a stage re-run after a fetch failure): the attempt whose
    output the driver committed is recorded with the batch, and a zombie attempt that finishes
    later, on another executor, changes nothing anybody reads."""
    _run(_store(tmp_path), 0, {b"\x00\x01a": b"0"})
    committed = _attempt(tmp_path, "exec-1", 1, {b"\x00\x01a": b"committed"})
    committed.publish()
    _attempt(tmp_path, "exec-2", 1, {b"\x00\x01a": b"zombie"})  # after the batch committed
    assert _contents(_store(tmp_path, "new-machine"), 2) == {b"\x00\x01a": b"committed"}
    # The zombie's own machine holds its copy: not the committed version, so rebuilt.
    zombie = _store(tmp_path, "exec-2")
    assert _contents(zombie, 2) == {b"\x00\x01a": b"committed"} and zombie.rebuilt


def test_a_snapshot_of_an_attempt_the_record_does_not_name_is_never_read(tmp_path, monkeypatch):
    """A snapshot writer that finishes after its attempt lost (a fallback, a zombie) leaves a
    snapshot nobody uses: a rebuild takes only a snapshot whose token is the version's."""
    monkeypatch.setattr(keyed_store, "SNAPSHOT_MAX_DELTAS", 2)
    s = _store(tmp_path)
    _run(s, 0, {b"\x00\x01a": b"1"})
    _run(_store(tmp_path, "exec-3"), 1, {b"\x00\x01a": b"2"})  # the recorded attempt
    _store(tmp_path, "exec-3").wait_snapshots()
    loser = _attempt(tmp_path, "exec-2", 1, {b"\x00\x01a": b"stale"})  # finishes after
    loser.wait_snapshots()
    snaps = list((tmp_path / "ck").glob("2.*.snapshot"))
    assert len(snaps) == 2  # both attempts wrote one
    for delta in (tmp_path / "ck").glob("*.delta"):  # the snapshot alone rebuilds version 2
        delta.unlink()
    assert _contents(_store(tmp_path, "fresh"), 2) == {b"\x00\x01a": b"2"}


def test_another_machine_rebuilds_from_the_checkpoint_and_a_behind_copy_moves_forward(tmp_path):
    a, b = _store(tmp_path, "a"), _store(tmp_path, "b")
    for v in range(5):
        _run(a, v, {bytes([0, v]): str(v).encode()})
    assert _contents(b, 5) == _contents(a, 5)  # a new copy: the deltas from version 0
    _run(b, 5, {b"\x00\x09": b"b"})  # the partition ran on b once ...
    got = _contents(a, 6)  # ... a is one delta behind: applied, no rebuild
    assert got[b"\x00\x09"] == b"b" and not a.rebuilt


def test_a_copy_left_half_written_or_of_an_attempt_since_replaced_is_rebuilt(tmp_path):
    a = _store(tmp_path, "a")
    _run(a, 0, {b"\x00\x01k": b"1"})
    a.open(1)
    a.put(b"\x00\x01k", b"torn")  # the task dies before its commit
    a.close()
    assert _contents(a, 1) == {b"\x00\x01k": b"1"} and a.rebuilt
    # An attempt elsewhere rewrote version 2 after a's own attempt wrote it: a's copy is at
    # version 2 by its marker, but not at the version 2 the checkpoint holds.
    _run(a, 1, {b"\x00\x01k": b"mine"})
    _run(_store(tmp_path, "b"), 1, {b"\x00\x01k": b"theirs"})
    assert _contents(a, 2) == {b"\x00\x01k": b"theirs"} and a.rebuilt


def test_snapshots_bound_a_rebuild_and_old_files_are_cleaned(tmp_path, monkeypatch):
    monkeypatch.setattr(keyed_store, "SNAPSHOT_MAX_DELTAS", 3)
    monkeypatch.setattr(keyed_store, "RETAIN_VERSIONS", 4)
    s = _store(tmp_path)
    for v in range(12):
        _run(s, v, {bytes([0, v % 4]): str(v).encode()})
        s.wait_snapshots()  # written aside; in order here, so that each cleans what it can
    # By version, then name (a directory lists in no set order: tmpfs and ext4 differ); each
    # name without its attempt's token.
    names = sorted(
        (_untokened(p.name) for p in (tmp_path / "ck").iterdir()),
        key=lambda n: (int(n.split(".")[0]), n),
    )
    # Versions from 12 - 4 = 8 on stay restorable: snapshot 6, deltas 7..12 (and snapshots 9, 12).
    assert names == [
        "6.snapshot", "7.delta", "8.delta", "9.delta", "9.snapshot", "10.delta", "11.delta",
        "12.delta", "12.snapshot",
    ]  # fmt: skip
    expected = {bytes([0, k]): str(v).encode() for v in range(12) for k in [v % 4]}
    assert _contents(_store(tmp_path, "fresh"), 12) == expected
    assert _contents(_store(tmp_path, "fresh8"), 8) == {
        bytes([0, k]): str(v).encode() for v in range(8) for k in [v % 4]
    }


def test_a_snapshot_is_written_aside_while_the_task_goes_on(tmp_path, monkeypatch):
    """The commit of a snapshot version returns while its writer (a process of its own) is
    still at work, the partition already free; once it is done the snapshot alone rebuilds
    the version and the copy's checkpoint it worked from is gone."""
    monkeypatch.setattr(keyed_store, "SNAPSHOT_MAX_DELTAS", 2)
    s = _store(tmp_path)
    _run(s, 0, {b"\x00\x01k": b"1"})
    _run(s, 1, {b"\x00\x02k": b"2"})
    (writer,) = keyed_store._writers[str(s.checkpoint)]
    assert writer.poll() is None  # a Python process's start alone outlasts the commit
    assert _contents(s, 2) == {b"\x00\x01k": b"1", b"\x00\x02k": b"2"}
    s.wait_snapshots()
    assert writer.returncode == 0
    next((tmp_path / "ck").glob("1.*.delta")).unlink()
    next((tmp_path / "ck").glob("2.*.delta")).unlink()
    assert _contents(_store(tmp_path, "b"), 2) == {b"\x00\x01k": b"1", b"\x00\x02k": b"2"}
    assert not list((tmp_path / "a").glob("snapshot-*"))


def test_a_snapshot_writer_that_fails_says_so_in_a_line_and_loses_nothing(
    tmp_path, monkeypatch, capfd
):
    """A writer that cannot write its snapshot (a full disk, no access) ends with one line in
    the job's log saying what to do; the task's commit has returned, the version's delta
    rebuilds it, and the copy's checkpoint the writer worked from is removed."""
    monkeypatch.setattr(keyed_store, "SNAPSHOT_MAX_DELTAS", 2)
    s = _store(tmp_path)
    _run(s, 0, {b"\x00\x01k": b"1"})
    # The attempt's token known beforehand, so that a directory stands where its snapshot goes.
    monkeypatch.setattr(keyed_store.uuid, "uuid4", lambda: uuid.UUID(int=7))
    (tmp_path / "ck" / f"2.{uuid.UUID(int=7).hex}.snapshot" / "in-the-way").mkdir(parents=True)
    _run(s, 1, {b"\x00\x02k": b"2"})
    (writer,) = keyed_store._writers[str(s.checkpoint)]
    s.wait_snapshots()
    assert writer.returncode == 1
    err = capfd.readouterr().err
    assert "snapshot of state partition" in err and "at version 2 was not written" in err
    assert "Traceback" not in err
    assert not list((tmp_path / "a").glob("snapshot-*"))
    assert _contents(_store(tmp_path, "b"), 2) == {b"\x00\x01k": b"1", b"\x00\x02k": b"2"}


def test_an_abandoned_snapshot_checkpoint_is_removed_and_a_busy_one_kept(tmp_path):
    """A writer killed half way leaves the copy's checkpoint it worked from: the next open
    removes it when nobody holds its lock, and leaves a writer at work alone."""
    s = _store(tmp_path)
    _run(s, 0, {b"\x00\x01k": b"1"})
    abandoned, busy = tmp_path / "a" / "snapshot-1", tmp_path / "a" / "snapshot-2"
    for aside in (abandoned, busy):
        (aside / "db").mkdir(parents=True)
        (aside / "lock").touch()
    with open(busy / "lock", "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        _contents(s, 1)
        assert not abandoned.exists() and busy.exists()


def test_a_version_whose_files_are_gone_is_refused_with_what_to_do(tmp_path):
    s = _store(tmp_path)
    for v in range(3):
        _run(s, v, {b"\x00\x00k": bytes([v])})
    next((tmp_path / "ck").glob("2.*.delta")).unlink()
    with pytest.raises(StateError, match=r"version\(s\) \[2\] are missing.*savepoint"):
        _contents(_store(tmp_path, "other"), 3)


def test_two_attempts_of_one_partition_never_open_it_at_once(tmp_path, monkeypatch):
    first, second = _store(tmp_path), _store(tmp_path)
    first.open(0)
    opened = threading.Event()
    t = threading.Thread(target=lambda: (second.open(0), opened.set()))
    t.start()
    assert not opened.wait(0.3)  # blocked on the lock
    first.put(b"\x00\x00k", b"v")
    first.commit()
    first.publish()
    first.close()
    t.join(10)
    assert opened.is_set()
    second.close()
    monkeypatch.setattr(keyed_store, "LOCK_TIMEOUT_S", 0.1)
    first.open(1)
    try:
        with pytest.raises(StateError, match="stayed locked"):
            second.open(1)
    finally:
        first.close()


@given(st.integers(1, MAX_PARALLELISM))
def test_key_group_ranges_are_contiguous_disjoint_and_cover_every_group(n):
    ranges = [key_groups(p, n) for p in range(n)]
    assert [g for r in ranges for g in r] == list(range(MAX_PARALLELISM))
    assert all(g * n // MAX_PARALLELISM == p for p, r in enumerate(ranges) for g in r)


def test_the_rocksdb_memory_settings_bound_the_cache_and_memtables(tmp_path):
    """The store's RocksDB takes the job's memory settings: memtable size and count as given,
    and a block cache shared by the worker's stores that stays within its capacity while
    state several times its size is read back (index and filter blocks included)."""
    from stateful_runtime.job import RocksDBMemory

    memory = RocksDBMemory(block_cache_mb=1, write_buffer_mb=2, write_buffers=3)
    store = KeyedStore(tmp_path / "ck", tmp_path / "local", memory)
    value = bytes(range(256)) * 4  # 1 KiB, incompressible enough
    keys = [keyed_store.group_prefix(g % 128) + b"k%07d" % g for g in range(12_000)]
    _run(store, 0, dict.fromkeys(keys, value))  # ~12 MiB: flushed through several memtables
    options = next((tmp_path / "local" / "db").glob("OPTIONS-*")).read_text()
    assert "write_buffer_size=2097152" in options
    assert "max_write_buffer_number=3" in options
    assert "cache_index_and_filter_blocks=true" in options
    store.open(1)
    try:
        assert sum(1 for _ in store.scan(b"", b"\xff\xff")) == len(keys)
        for k in keys[::7]:
            assert store.get(k) == value
    finally:
        store.close()
    cache = keyed_store._CACHES[1 << 20]
    assert 0 < cache.get_usage() <= 1 << 20
    # A second store of the worker shares the same cache (one bound per worker).
    other = KeyedStore(tmp_path / "ck2", tmp_path / "local2", memory)
    other.open(0)
    other.close()
    assert keyed_store._CACHES[1 << 20] is cache
    # Reopened with other settings (a new run of the job), the DB takes them: its reads fill
    # the new cache, not one RocksDB made from the OPTIONS file on disk.
    changed = KeyedStore(tmp_path / "ck", tmp_path / "local", RocksDBMemory(3, 1, 2))
    changed.open(1)
    try:
        for k in keys[::5]:
            assert changed.get(k) == value
    finally:
        changed.close()
    assert 0 < keyed_store._CACHES[3 << 20].get_usage() <= 3 << 20
    newest = max((tmp_path / "local" / "db").glob("OPTIONS-*"), key=lambda p: p.stat().st_mtime)
    assert "write_buffer_size=1048576" in newest.read_text()


def test_index_and_filters_are_partitioned_so_a_lookup_reads_kilobytes(tmp_path):
    """A key the store has not got (every new key of a deduplication) is answered by a
    filter. Whole, a file's filter is megabytes, more than a cache shard holds, so each lookup
    read and parsed it again; the files the store writes carry partitioned index and filters."""
    from rocksdict import Options, Rdict

    store = _store(tmp_path)
    keys = [keyed_store.group_prefix(g % 128) + b"k%07d" % g for g in range(60_000)]
    _run(store, 0, dict.fromkeys(keys, b"v" * 100))  # flushed to SST files at close
    options = next((tmp_path / "a" / "db").glob("OPTIONS-*")).read_text()
    assert "index_type=kTwoLevelIndexSearch" in options
    assert "partition_filters=true" in options
    db = Rdict(str(tmp_path / "a" / "db"), options=Options(raw_mode=True))
    try:
        tables = db.property_value("rocksdb.aggregated-table-properties") or ""
    finally:
        db.close()
    partitions = int(tables.split("# index partitions=")[1].split(";")[0])
    assert partitions > 1, tables
    store.open(1)
    try:
        assert store.get(keys[123]) == b"v" * 100
        assert store.get(keyed_store.group_prefix(3) + b"missing") is None
    finally:
        store.close()


def test_a_snapshots_cost_follows_what_changed(tmp_path, monkeypatch):
    """A large state that changes little gets no new snapshot batch after batch (its versions
    share the snapshot and the deltas after it); one rewritten every batch is compacted as
    soon as the deltas add up to the snapshot's size."""
    monkeypatch.setattr(keyed_store, "SNAPSHOT_MIN_BYTES", 0)
    rows = {bytes([0, k % 100]) + k.to_bytes(4, "big"): b"v" * 64 for k in range(3_000)}

    def snapshots(store: KeyedStore) -> list[int]:
        store.wait_snapshots()
        return sorted(int(p.name.split(".")[0]) for p in store.checkpoint.glob("*.snapshot"))

    small = _store(tmp_path / "small")
    _run(small, 0, rows)
    assert snapshots(small) == [1]  # the first delta holds the whole state: compacted
    for v in range(1, 30):  # one key of 3,000 a batch
        _run(small, v, {next(iter(rows)): str(v).encode()})
    assert snapshots(small) == [1]
    big = _store(tmp_path / "big")
    _run(big, 0, rows)
    for v in range(1, 6):  # every key a batch
        _run(big, v, {k: str(v).encode() * 64 for k in rows})
    assert snapshots(big) == [1, 2, 3, 4, 5, 6]
    assert _contents(_store(tmp_path / "big", "fresh"), 6) == {k: b"5" * 64 for k in rows}
    # The worker's count and the files' agree: a worker that never committed it starts anew.
    keyed_store._chains.clear()
    _run(small, 30, {next(iter(rows)): b"x"})
    assert snapshots(small) == [1]


def test_a_snapshot_writer_whose_worker_is_gone_stops_and_leaves_no_snapshot(tmp_path, monkeypatch):
    """A writer runs in a session of its own (a stop of the task's process group does not
    stop it), so it watches its worker: once its parent is another process than the worker
    that started it (the job stopped or was killed), it stops half way and writes nothing."""
    import os

    from rocksdict import Checkpoint

    monkeypatch.setattr(keyed_store, "_APPLY_ROWS", 10)  # a look at the parent every 10 rows
    s = _store(tmp_path)
    s.open(0)
    s.commit({bytes([0, i % 100]) + i.to_bytes(4, "big"): b"v" for i in range(100)})
    s.publish()
    aside = tmp_path / "aside"
    aside.mkdir()
    Checkpoint(s.db).create_checkpoint(str(aside / "db"))
    s.close()
    gone = os.getppid() + 1 if os.getppid() + 1 != os.getpid() else os.getppid() + 2
    with pytest.raises(keyed_store._Orphaned):
        keyed_store.write_snapshot(aside, s.checkpoint, 1, "t", 100, parent=gone)
    assert not list(s.checkpoint.glob("*.snapshot*")) and not aside.exists()
    # Its worker still there: the snapshot is written.
    aside.mkdir()
    s.open(1)
    Checkpoint(s.db).create_checkpoint(str(aside / "db"))
    s.close()
    keyed_store.write_snapshot(aside, s.checkpoint, 1, "t", 100, parent=os.getppid())
    assert [p.name for p in s.checkpoint.glob("*.snapshot")] == ["1.t.snapshot"]


@settings(max_examples=25)  # (each batch opens and commits a RocksDB)
@given(
    st.lists(
        st.tuples(
            st.lists(st.tuples(st.integers(0, 40), st.integers(0, 120)), max_size=25),
            st.booleans(),
            st.lists(st.tuples(st.integers(0, 40), st.integers(0, 120)), max_size=4),
        ),
        min_size=1,
        max_size=6,
    )
)
def test_fired_timers_leave_as_ranges_and_every_reader_agrees(tmp_path_factory, batches):
    """A task fires every timer due at its batch's time, so its commit removes them as one
    range per key group, not a delete each. Per batch: the due timers fire, new ones are
    registered (a flush to the store among them, or not), those already due fire, and some
    are registered after that, due or not (they stay). The live copy, a copy rebuilt from
    the files and the files read alone (a rescale's, ``srt state inspect``'s) agree with the
    model, and the deltas hold no delete of a fired timer."""
    import pickle

    import pyarrow as pa

    from stateful_runtime.checkpoints import keyed as files
    from stateful_runtime.operators.local_state import LocalBackend

    tmp = tmp_path_factory.mktemp("ranges")
    store = KeyedStore(tmp / "ck", tmp / "a")
    model: set[tuple[int, int]] = set()
    version = 0

    def register(backend: LocalBackend, key: int, ts: int) -> None:
        backend.group = files.key_group((key,))
        backend.begin_key((key,))
        backend.register_timer(ts)
        backend.end_key()

    def fire(backend: LocalBackend, upto: int) -> None:
        for row in list(backend.due(upto, backend.groups)):
            taken = backend.take(row)
            if taken is not None:
                model.discard((taken[1][0], taken[0]))

    for n, (early, flush, late) in enumerate(batches):
        upto = 20 * n
        store.open(version)
        backend = LocalBackend(store, clock=lambda: 0, key_timers=False)
        backend.groups = range(MAX_PARALLELISM)
        fire(backend, upto)
        for i, (key, ts) in enumerate(early):
            register(backend, key, ts)
            model.add((key, ts))
            if flush and i == len(early) // 2:
                backend.flush()
        fire(backend, upto)
        assert not any(ts <= upto for _, ts in model)
        for key, ts in late:  # after the last look: these stay, due or not
            register(backend, key, ts)
            model.add((key, ts))
        version = backend.commit()
        store.publish()
        store.close()
        with pa.ipc.open_file(next((tmp / "ck").glob(f"{version}.*.delta"))) as f:
            rows = f.read_all()
        deleted = [k for k, v in zip(*rows.to_pydict().values(), strict=True) if v is None]
        assert not [k for k in deleted if k[2:3] == files.TIMER_ROW], "a fired timer's delete"

    def timers(rows: dict[bytes, bytes]) -> set[tuple[int, int]]:
        return {
            (pickle.loads(k[11:])[0], files.decode_ts(k[3:11]))
            for k in rows
            if k[2:3] == files.TIMER_ROW
        }

    assert timers(_contents(store, version)) == model
    assert timers(_contents(KeyedStore(tmp / "ck", tmp / "b"), version)) == model  # rebuilt
    assert timers(files.state_at(tmp / "ck", version)) == model
