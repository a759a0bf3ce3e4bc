"""Keyed state in the Python worker: one RocksDB per operator and state partition, versioned
with Spark's micro-batches, checkpointed incrementally under the query's checkpoint directory.

Key groups (Flink's max parallelism). Every key belongs to one of :data:`MAX_PARALLELISM` key
groups (``pmod(hash(key fields), 128)``, Spark's Murmur3 in the JVM), fixed for the life of a
checkpoint. Partition ``p`` of ``n`` owns the contiguous range of key groups ``g`` with
``g * n // 128 == p`` (:func:`key_groups`), and every stored key starts with its key group (two
bytes, big-endian): a rescale hands whole ranges to new partitions without rewriting a key.

Versions. The state of a partition after batch ``N`` is version ``N + 1`` (Spark's numbering of
its own state store). The task running batch ``N`` opens version ``N`` as committed, never "the
newest": a batch replayed after a crash, a retried task or a zombie one starts from the state
before the batch, whatever another attempt left behind. At the end of its task it writes what
the batch changed as ``<N + 1>.<token>.delta`` in the checkpoint (an Arrow IPC file: key, value
or null for a delete), ``token`` being the attempt's own, and now and then a full
``<V>.<token>.snapshot`` (:func:`snapshot_due`). The attempt's files become the version only
when the driver records ``token`` in the operator's ``<N + 1>.commit`` with the batch
(:mod:`stateful_runtime.checkpoints.keyed`: attempts are not commits); :meth:`KeyedStore.publish`
records it for a store used alone (tests, benchmarks).

A checkpoint's cost follows what changed, as Flink's incremental checkpoints share their SST
files between checkpoints: each version's files are the newest snapshot and the deltas after it,
shared with the versions before (a savepoint or the mirror copies each once), and a snapshot —
the compaction that bounds a rebuild — comes only once the deltas since the last one add up to
:data:`SNAPSHOT_CHANGED` of its size (at least :data:`SNAPSHOT_MIN_BYTES`), or number
:data:`SNAPSHOT_MAX_DELTAS`: a large state that changes little is not written again every few
batches, and one rewritten every batch is compacted often.

Snapshots are written off the commit (as Spark's RocksDB provider's maintenance and Flink's
asynchronous snapshots are): the commit takes a RocksDB checkpoint of the copy (hard links of
its files, ~0.1 s) into a directory beside it and hands it to a process of its own, which
writes ``<V>.snapshot`` from it, drops the files no retained version needs and removes the
directory; the task goes on. Written inside the commit, the snapshot of 5M keys held a task
for 6 s every 20 batches (``benchmarks/keyed_churn.py``). Until it is written a rebuild reads
the snapshot before and more deltas; a writer that dies leaves the deltas, which is all a
rebuild needs, and a directory whose lock nobody holds, which the next open removes. A writer
that fails (a full disk, no access) says so in one line of the job's log and removes it.

The local copy. A task opens a local RocksDB (``<local root>/<digest of the checkpoint
directory>/``) under an exclusive file lock (two attempts of one partition never open one store
at once). A marker row in the DB records its version and the token of the delta that made it;
the copy is used as it is when it is at the version asked for and its token is the one the
commit record names (another attempt's copy is not), moved forward by the committed deltas when
it is behind, and rebuilt from the newest committed snapshot and the deltas after it otherwise
(another executor, a new machine, a fallback to an earlier batch). Writes reach
the copy in RocksDB write batches (atomic; the WAL is off, so a killed process loses whole
batches not yet flushed, never part of one): the first of a task marks the copy dirty, so a task
killed half way leaves a copy that is rebuilt, and the commit's batch carries the new marker.
Moving a copy forward writes each delta the same way, its marker after its rows.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path

import pyarrow as pa
from rocksdict import (
    AccessType,
    BlockBasedIndexType,
    BlockBasedOptions,
    Cache,
    Checkpoint,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from stateful_runtime.checkpoints import keyed as files
from stateful_runtime.checkpoints.keyed import MAX_PARALLELISM, group_prefix, key_groups
from stateful_runtime.checkpoints.storage import checkpoint_path
from stateful_runtime.exceptions import StateError
from stateful_runtime.job import RocksDBMemory

__all__ = ["MAX_PARALLELISM", "KeyedStore", "group_prefix", "key_groups", "local_root"]
# A snapshot once the deltas since the last one add up to this fraction of its size (at least
# SNAPSHOT_MIN_BYTES), or number SNAPSHOT_MAX_DELTAS (bounding the files a rebuild reads: at
# most the state once more, or 64 MiB). At half the size and 4 MiB, a state of new keys (the
# deduplication's) was snapshotted almost every batch, the writer's process taking a core
# from the batches: 1M events 56-60k/s steady against 64-68k/s without (NOTES.md).
SNAPSHOT_CHANGED = 1.0
SNAPSHOT_MIN_BYTES = 64 << 20
SNAPSHOT_MAX_DELTAS = 50
# Versions kept restorable behind the newest (Spark's minBatchesToRetain is 100).
RETAIN_VERSIONS = 100
LOCK_TIMEOUT_S = 600.0

_MARKER = b"\xff\xffsrt-version"
_DELTA = files.DELTA
_SNAPSHOT = files.SNAPSHOT
_SCHEMA = files.schema()
_DIRTY = json.dumps({"dirty": True}).encode()
# Rows of a snapshot or delta applied to the local copy per write batch (bounds its memory).
_APPLY_ROWS = 65_536
# A local copy's key groups live in 0x0000..0x007f: the marker sorts after every one.
# Checkpoints of a copy a snapshot writer works from, beside the copy (hard links need one
# file system), each with the lock its writer holds.
_ASIDE = "snapshot-"
# The snapshot writers this process started, by checkpoint directory (see wait_snapshots).
_writers: dict[str, list[subprocess.Popen]] = {}
# Per partition this worker committed: (version, bytes of its snapshot, bytes and number of the
# deltas after it), so that a commit need not list the checkpoint's files (see _chain).
_chains: dict[str, tuple[int, int, int, int]] = {}


def snapshot_due(snapshot_bytes: int, delta_bytes: int, deltas: int) -> bool:
    """Whether a version whose newest snapshot takes ``snapshot_bytes`` and whose ``deltas``
    deltas after it ``delta_bytes`` gets a snapshot of its own (see the module doc)."""
    if deltas >= SNAPSHOT_MAX_DELTAS:
        return True
    return delta_bytes >= max(SNAPSHOT_MIN_BYTES, SNAPSHOT_CHANGED * snapshot_bytes)


def local_root() -> Path:
    """Where local copies live: Spark's local directory when the worker has one (a job's
    scratch on a local master), else the system's temporary directory."""
    spark_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    base = spark_dirs.split(",")[0] if spark_dirs else tempfile.gettempdir()
    return Path(base) / "srt-keyed"


# One block cache per worker process and size, shared by every store the worker opens (a
# reused Python worker runs many tasks): the cache bounds the worker's reads, not each store's.
_CACHES: dict[int, Cache] = {}


def rocksdb_options(memory: RocksDBMemory) -> Options:
    """RocksDB options bounded by ``memory``: the worker's shared block cache, holding index
    and filter blocks too (else they grow with the state, outside any bound), and the
    memtables' size and count."""
    capacity = memory.block_cache_mb << 20
    cache = _CACHES.get(capacity)
    if cache is None:
        cache = _CACHES[capacity] = Cache(capacity)
    table = BlockBasedOptions()
    table.set_block_cache(cache)
    table.set_cache_index_and_filter_blocks(True)
    table.set_pin_l0_filter_and_index_blocks_in_cache(True)
    # Most reads of a task are of keys the store has not got (every new key): a bloom filter
    # answers those without reading a block of each file.
    table.set_bloom_filter(10, False)
    # ... in partitions of a few KiB, as the index. Whole, a file's filter is megabytes: more
    # than a block cache shard holds (a 256 MiB cache has 64), so every lookup read and parsed
    # it again: ~0.6 ms a missing key at 4M keys, whatever the cache's size (a deduplication
    # then ran at ~3k events/s). Partitioned: 10-20 µs (NOTES.md, "Partitioned filters").
    table.set_index_type(BlockBasedIndexType.two_level_index_search())
    table.set_partition_filters(True)
    table.set_metadata_block_size(4096)
    table.set_pin_top_level_index_and_filter(True)
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    opts.set_block_based_table_factory(table)
    opts.set_write_buffer_size(memory.write_buffer_mb << 20)
    opts.set_max_write_buffer_number(memory.write_buffers)
    return opts


class KeyedStore:
    """One state partition of one operator: the local RocksDB and its checkpoint files.

    Args:
        checkpoint: the partition's directory in the checkpoint (``<query>/keyed/<op>/<p>``).
        local: the local copy's directory (default: under :func:`local_root`).
        memory: the RocksDB's memory (default :meth:`RocksDBMemory.default`).
    """

    def __init__(
        self,
        checkpoint: str | os.PathLike[str],
        local: Path | None = None,
        memory: RocksDBMemory | None = None,
    ) -> None:
        self.checkpoint = checkpoint_path(checkpoint)
        self.memory = memory or RocksDBMemory.default()
        digest = hashlib.sha256(str(self.checkpoint.resolve()).encode()).hexdigest()[:20]
        self.local = local if local is not None else local_root() / digest
        self.db: Rdict | None = None
        self.version: int | None = None
        self.token = ""  # the token of the version the local copy is at (see the marker)
        self.changes: dict[bytes, bytes | None] = {}
        self._lock_fd: int | None = None
        self._marked = False  # the copy is marked dirty (before the first write of a task)
        self._wopts = WriteOptions()
        # The checkpoint is the durable copy (see the marker); a property, typed as a method.
        self._wopts.disable_wal = True  # type: ignore[method-assign,assignment]
        self.rebuilt = False  # whether the last open rebuilt from the checkpoint (tests read it)

    # -- opening ----------------------------------------------------------------------------
    def open(self, version: int) -> None:
        """Lock the partition and bring the local copy to ``version`` (see the module doc)."""
        self.local.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            _remove_abandoned(self.local)
            self.db = self._open_db()
            self.rebuilt = False
            if not self._usable(version):
                self._rebuild(version)
                self.rebuilt = True
        except BaseException:
            self.close()
            raise
        self.version = version
        self.changes = {}
        self._marked = False

    def _lock(self) -> None:
        fd = os.open(self.local / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    os.close(fd)
                    raise StateError(
                        f"state partition {self.checkpoint} stayed locked by another task for "
                        f"{LOCK_TIMEOUT_S:.0f} s; a stuck Python worker holds it: stop the job "
                        f"and start it again"
                    ) from None
                time.sleep(0.01)
        self._lock_fd = fd

    def _open_db(self) -> Rdict:
        opts = rocksdb_options(self.memory)
        # Given only ``options``, rocksdict reopens an existing DB with its column family's
        # options from the OPTIONS file: a new 8 MiB block cache of its own, not the worker's.
        return Rdict(str(self.local / "db"), options=opts, column_families={"default": opts})

    def _marker(self) -> dict:
        assert self.db is not None
        raw = self.db.get(_MARKER)
        return json.loads(raw) if raw else {"version": 0, "token": ""}

    def _usable(self, version: int) -> bool:
        """Whether the local copy is at ``version``, or only committed deltas behind it
        (applied)."""
        marker = self._marker()
        at = marker.get("version")
        if marker.get("dirty") or at is None or at > version:
            return False
        if at and marker.get("layout") != files.FORMAT:  # a copy of the previous row layout
            return False
        if files.committed_token(self.checkpoint, at) != marker.get("token"):
            return False
        deltas = [files.committed(self.checkpoint, v, _DELTA) for v in range(at + 1, version + 1)]
        if None in deltas:
            return False
        self.token = marker.get("token", "")
        for v, delta in enumerate(deltas, start=at + 1):
            assert delta is not None
            self._apply(delta, v)
        return True

    @staticmethod
    def _marker_row(version: int, token: str) -> bytes:
        return json.dumps({"version": version, "token": token, "layout": files.FORMAT}).encode()

    def _rebuild(self, version: int) -> None:
        assert self.db is not None
        self.db.close()
        self.db = None
        Rdict.destroy(str(self.local / "db"))
        self.db = self._open_db()
        self.token = ""
        if version == 0:
            self.db.write(self._batch({_MARKER: self._marker_row(0, "")}), self._wopts)
            return
        # Dirty until the last file is applied: a copy without a marker would read as version 0.
        self.db.write(self._batch({_MARKER: _DIRTY}), self._wopts)
        needed, missing = files.needs(self.checkpoint, version)
        if missing:
            raise StateError(
                f"state partition {self.checkpoint} cannot be rebuilt at version {version}: "
                f"the committed changes of version(s) {missing[:5]} are missing; restore the "
                f"job from a savepoint (srt savepoint list, then srt run --from-savepoint <id>)"
            )
        for path in needed:
            suffix = _SNAPSHOT if path.name.endswith(_SNAPSHOT) else _DELTA
            v = files.version_of(path, suffix)
            assert v is not None
            self._apply(path, v)

    def _apply(self, path: Path, version: int) -> None:
        """Apply a delta or snapshot file to the local copy, which is then at ``version``: in
        write batches of at most :data:`_APPLY_ROWS` rows, the first marking the copy dirty,
        the marker of the version written last (a file's rows are its version's final values:
        applying it again over a copy killed half way gives the same copy)."""
        assert self.db is not None
        token = files.token(path) or ""
        first = True
        for keys, values in files.rows(path, self.db.get):
            for lo in range(0, len(keys), _APPLY_ROWS):
                rows = dict(
                    zip(keys[lo : lo + _APPLY_ROWS], values[lo : lo + _APPLY_ROWS], strict=True)
                )
                ranges = {k: v for k, v in rows.items() if files.is_timer_range(k)}
                for k in ranges:
                    del rows[k]
                if first:
                    rows[_MARKER] = _DIRTY
                    first = False
                self.db.write(self._batch(rows, ranges), self._wopts)  # type: ignore[arg-type]
        self.db.write(self._batch({_MARKER: self._marker_row(version, token)}), self._wopts)
        self.token = token

    @staticmethod
    def _batch(
        rows: dict[bytes, bytes | None], ranges: dict[bytes, bytes] | None = None
    ) -> WriteBatch:
        # In the order given: sorting first made a task's commit slower (NOTES.md, "One row
        # per key"), though a long-lived memtable takes a sorted batch faster. The fired
        # timers' ranges (files.timers_fired) first: a row the batch puts outlives them.
        wb = WriteBatch(raw_mode=True)
        for start, bound in (ranges or {}).items():
            wb.delete_range(*files.timer_range(start, bound))
        put, delete = wb.put, wb.delete
        for k, v in rows.items():
            if v is None:
                delete(k)
            else:
                put(k, v)
        return wb

    # -- reading and writing ----------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        assert self.db is not None
        return self.db.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (sorted: RocksDB's multi-get reads them in one pass)."""
        assert self.db is not None
        got: list[bytes | None] = self.db.get(keys)  # type: ignore[arg-type,assignment]
        return got

    def write(self, rows: dict[bytes, bytes | None]) -> None:
        """Write ``rows`` (None deletes) to the local copy in one write batch; they are part
        of this task's version. The first write of a task marks the copy dirty in the same
        batch (a task killed before its commit leaves a copy that is rebuilt)."""
        assert self.db is not None
        if not rows:
            return
        self.changes.update(rows)
        if not self._marked:
            rows = {**rows, _MARKER: _DIRTY}
            self._marked = True
        self.db.write(self._batch(rows), self._wopts)

    def put(self, key: bytes, value: bytes) -> None:
        self.write({key: value})

    def delete(self, key: bytes) -> None:
        self.write({key: None})

    def scan(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Rows with ``start <= key < stop``, in key order."""
        assert self.db is not None
        opts = ReadOptions()  # held by this frame while the iterator lives
        opts.set_iterate_upper_bound(stop)
        yield from self.db.items(from_key=start, read_opt=opts)

    def keys(self, start: bytes, stop: bytes) -> Iterator[bytes]:
        """Keys ``start <= key < stop``, in key order, as of the call's first step (RocksDB's
        iterator reads one point in time)."""
        assert self.db is not None
        opts = ReadOptions()  # held by this frame while the iterator lives
        opts.set_iterate_upper_bound(stop)
        yield from self.db.keys(from_key=start, read_opt=opts)

    # -- committing -------------------------------------------------------------------------
    def commit(
        self,
        rows: dict[bytes, bytes | None] | None = None,
        ranges: dict[bytes, bytes] | None = None,
    ) -> int:
        """Write this task's changes (and ``rows``, not yet written, after the fired timers'
        ``ranges``: :func:`~stateful_runtime.checkpoints.keyed.timers_fired` rows) as the next
        version in the checkpoint, under this attempt's token (:attr:`token` afterwards),
        then the same and the marker of the version to the local copy in one write batch; a
        snapshot when :func:`snapshot_due`. Returns the version, which is read back only
        once a commit record names the token (the driver's, or :meth:`publish`)."""
        assert self.db is not None and self.version is not None
        version = self.version + 1
        token = uuid.uuid4().hex
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        rows = rows or {}
        parts: list[Mapping[bytes, bytes | None]]
        if ranges:
            # In the order the local copy took them: what the task wrote before (flushed),
            # the ranges, then its rows (a row of either part is written once).
            parts = [{k: v for k, v in self.changes.items() if k not in rows}, ranges, rows]
        else:
            self.changes.update(rows)  # (a delta's keys are distinct: no order to keep)
            parts = [self.changes]
        delta = files.write(
            self.checkpoint,
            version,
            _DELTA,
            token,
            [
                pa.record_batch(
                    [pa.array(list(part), pa.binary()), pa.array(list(part.values()), pa.binary())],
                    schema=_SCHEMA,
                )
                for part in parts
            ],
        )
        batch = self._batch(rows, ranges)
        batch.put(_MARKER, self._marker_row(version, token))
        self.db.write(batch, self._wopts)
        self._marked = False
        base, changed, count = self._chain(version - 1)
        changed, count = changed + delta.stat().st_size, count + 1
        key = str(self.checkpoint)
        if snapshot_due(base, changed, count):
            self._snapshot_aside(version, token)
            # Its size until a commit reads the written one: at least the larger of the two
            # it compacts (at most their sum, all of the deltas new keys).
            _chains[key] = (version, max(base, changed), 0, 0)
        else:
            _chains[key] = (version, base, changed, count)
        self.version, self.token, self.changes = version, token, {}
        return version

    def _chain(self, version: int) -> tuple[int, int, int]:
        """(bytes of the newest snapshot at or below committed ``version``, bytes and number of
        the deltas after it): this worker's own count when it committed ``version`` of the
        partition, else from the checkpoint's files."""
        known = _chains.get(str(self.checkpoint))
        if known is not None and known[0] == version:
            return known[1:]
        needed, _ = files.needs(self.checkpoint, version)
        snap = needed[0] if needed and needed[0].name.endswith(_SNAPSHOT) else None
        deltas = needed[1:] if snap is not None else needed
        size = snap.stat().st_size if snap is not None else 0
        return size, sum(d.stat().st_size for d in deltas), len(deltas)

    def _snapshot_aside(self, version: int, token: str) -> None:
        """Hand the copy at ``version`` to a snapshot writer of its own (see the module doc)."""
        assert self.db is not None
        aside = Path(tempfile.mkdtemp(prefix=_ASIDE, dir=self.local))
        lock = os.open(aside / "lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # the writer's from here: it inherits the lock
            Checkpoint(self.db).create_checkpoint(str(aside / "db"))
            writers = _writers.setdefault(str(self.checkpoint), [])
            writers[:] = [w for w in writers if w.poll() is None]  # reaps those that ended
            writers.append(
                subprocess.Popen(
                    [sys.executable, "-m", __name__, str(aside), str(self.checkpoint)]
                    + [str(version), token, str(RETAIN_VERSIONS), str(os.getpid())],
                    pass_fds=(lock,),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    # Not stopped with the task's process group; it stops with its worker
                    # instead (see write_snapshot).
                    start_new_session=True,
                )
            )
        except BaseException:
            shutil.rmtree(aside, ignore_errors=True)
            raise
        finally:
            os.close(lock)

    def publish(self) -> None:
        """Record this store's last commit as its partition's committed version: what the
        driver does for every partition of a batch, for a store used alone (tests,
        benchmarks; the record's other partitions are kept)."""
        assert self.version is not None
        operator, version = self.checkpoint.parent, self.version
        tokens = files.recorded(operator, version) or {}
        tokens[self.checkpoint.name] = self.token
        files.record(operator, version, tokens)

    def wait_snapshots(self) -> None:
        """Wait for the snapshot writers this process started for this partition (tests and
        benchmarks; a task never waits)."""
        for writer in _writers.pop(str(self.checkpoint), []):
            writer.wait()

    # -- closing ----------------------------------------------------------------------------
    def close(self) -> None:
        """Close the local copy and release the partition's lock (a copy left dirty by a task
        that did not commit is rebuilt by the next)."""
        if self.db is not None:
            with contextlib.suppress(Exception):
                self.db.close()
            self.db = None
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                os.close(self._lock_fd)
            self._lock_fd = None

    def destroy_local(self) -> None:
        """Remove the local copy (tests; a machine's copy is rebuilt when needed)."""
        self.close()
        shutil.rmtree(self.local, ignore_errors=True)


def _remove_abandoned(local: Path) -> None:
    """Remove the checkpoints of a copy whose snapshot writer is gone (nobody holds the lock)."""
    for aside in local.glob(_ASIDE + "*"):
        try:
            fd = os.open(aside / "lock", os.O_RDWR)
        except OSError:  # a writer's directory before its lock exists: not abandoned yet
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its writer is at work
        finally:
            os.close(fd)
        shutil.rmtree(aside, ignore_errors=True)


class _Orphaned(Exception):
    """The worker that started a snapshot writer is gone (the job stopped or was killed)."""


def _rows_of(db: Rdict, parent: int | None = None) -> Iterator[pa.RecordBatch]:
    """Every row of a copy but its marker, in key order, in Arrow batches; stops with
    :class:`_Orphaned` once ``parent`` (the worker's pid) is no longer this process's parent."""
    opts = ReadOptions()
    opts.set_iterate_upper_bound(_MARKER)
    opts.fill_cache(False)  # type: ignore[call-arg]
    it = db.iter(opts)
    it.seek_to_first()
    keys: list[bytes] = []
    values: list[bytes] = []
    while it.valid():
        keys.append(it.key())
        values.append(it.value())
        if len(keys) >= _APPLY_ROWS:
            if parent is not None and os.getppid() != parent:
                raise _Orphaned
            yield pa.record_batch(
                [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_SCHEMA
            )
            keys, values = [], []
        it.next()
    yield pa.record_batch(
        [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_SCHEMA
    )


def clean(checkpoint: Path, version: int, retain: int) -> None:
    """Drop what no version from ``version - retain`` on needs (Spark's maintenance): every
    attempt's snapshots and deltas before the newest committed snapshot at or below that."""
    keep_from = version - retain
    snaps = [v for v in files.versions(checkpoint, _SNAPSHOT) if v <= keep_from]
    if not snaps:
        return
    base = max(snaps)
    for path in checkpoint.iterdir():
        for suffix in (_SNAPSHOT, _DELTA):
            v = files.version_of(path, suffix)
            if v is not None and (v < base or (suffix == _DELTA and v == base)):
                path.unlink(missing_ok=True)


def write_snapshot(
    aside: Path, checkpoint: Path, version: int, token: str, retain: int, parent: int | None = None
) -> None:
    """A snapshot writer's work: ``<version>.<token>.snapshot`` from the copy's checkpoint in
    ``aside``, the files no retained version needs dropped; ``aside`` removed whether or not
    that succeeded. The writer's life is its worker's (``parent``): once the worker is gone it
    stops, leaving no file (a snapshot is read only when the version's commit record names
    ``token``, so even a writer that outlived its job could not put a stale one in place)."""
    try:
        opts = Options(raw_mode=True)
        db = Rdict(str(aside / "db"), options=opts, access_type=AccessType.read_only())
        try:
            files.write(checkpoint, version, _SNAPSHOT, token, _rows_of(db, parent))
        finally:
            db.close()
        clean(checkpoint, version, retain)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def _writer_main(argv: list[str]) -> int:
    """A snapshot writer's process: one line on stderr (the job's log) when it fails, which
    costs no data: the version's delta is durable, and a rebuild reads the deltas after the
    last snapshot written (more of them while snapshots fail; nothing is cleaned either)."""
    aside, checkpoint, version, token, retain, parent = argv
    try:
        write_snapshot(
            Path(aside), checkpoint_path(checkpoint), int(version), token, int(retain), int(parent)
        )
    except _Orphaned:
        return 0
    except Exception as exc:
        print(
            f"srt: the snapshot of state partition {checkpoint} at version {version} was not "
            f"written ({type(exc).__name__}: {exc}); the job goes on from the deltas, which a "
            f"restart rebuilds from, more slowly while snapshots fail and the files grow: free "
            f"space or grant write access under the checkpoint directory",
            file=sys.stderr,
            flush=True,
        )
        return 1
    return 0


if __name__ == "__main__":  # a snapshot writer: aside, checkpoint, version, token, retain, pid
    sys.exit(_writer_main(sys.argv[1:]))
