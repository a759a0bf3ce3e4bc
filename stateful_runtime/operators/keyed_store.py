"""Keyed state in the Python worker: one RocksDB per operator and state partition, versioned
with Spark's micro-batches, checkpointed incrementally under the query's checkpoint directory.

Key groups (Flink's max parallelism). Every key belongs to one of :data:`MAX_PARALLELISM` key
groups (``pmod(hash(key fields), 128)``, Spark's Murmur3 in the JVM), fixed for the life of a
checkpoint. Partition ``p`` of ``n`` owns the contiguous range of key groups ``g`` with
``g * n // 128 == p`` (:func:`key_groups`), and every stored key starts with its key group (two
bytes, big-endian): a rescale hands whole ranges to new partitions without rewriting a key.

Versions. The state of a partition after batch ``N`` is version ``N + 1`` (Spark's numbering of
its own state store). The task running batch ``N`` opens version ``N``, never "the newest": a
batch replayed after a crash, a retried task or a speculative one starts from the state before
the batch, whatever an earlier attempt left behind. At the end of its task it writes what the
batch changed as ``<N + 1>.delta`` in the checkpoint (an Arrow IPC file: key, value or null for a
delete; written to a temporary name and renamed, so a retried task replaces the file whole),
and every :data:`SNAPSHOT_EVERY` versions a full ``<V>.snapshot``. The version becomes durable
with Spark's ``commits/N``: a version nobody committed is replaced by the re-run of its batch.

The local copy. A task opens a local RocksDB (``<local root>/<digest of the checkpoint
directory>/``) under an exclusive file lock (two attempts of one partition never open one store
at once). A marker row in the DB records its version and the token of the delta that made it;
the copy is used as it is when it is at the version asked for and the checkpoint's delta of that
version carries the same token (another attempt may have rewritten it), moved forward by the
checkpoint's deltas when it is behind, and rebuilt from the newest snapshot and the deltas after
it otherwise (another executor, a new machine, a fallback to an earlier batch). A task marks the
copy dirty before its first write, so a task killed half way leaves a copy that is rebuilt.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
from rocksdict import Options, Rdict, ReadOptions, WriteOptions

from stateful_runtime.exceptions import StateError

MAX_PARALLELISM = 128
# A full snapshot every this many versions bounds a rebuild to that many deltas.
SNAPSHOT_EVERY = 20
# Versions kept restorable behind the newest (Spark's minBatchesToRetain is 100).
RETAIN_VERSIONS = 100
LOCK_TIMEOUT_S = 600.0

_MARKER = b"\xff\xffsrt-version"
_DELTA = ".delta"
_SNAPSHOT = ".snapshot"
_SCHEMA = pa.schema([("k", pa.binary()), ("v", pa.binary())])
_FORMAT = "srt-keyed-1"
# A local copy's key groups live in 0x0000..0x007f: the marker sorts after every one.
_KG = 2


def key_groups(partition: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> range:
    """The key groups partition ``partition`` of ``parallelism`` owns (Flink's assignment:
    ``group * parallelism // max_parallelism == partition``)."""
    lo = -(-partition * max_parallelism // parallelism)
    hi = -(-(partition + 1) * max_parallelism // parallelism)
    return range(lo, hi)


def group_prefix(group: int) -> bytes:
    return group.to_bytes(_KG, "big")


def local_root() -> Path:
    """Where local copies live: Spark's local directory when the worker has one (a job's
    scratch on a local master), else the system's temporary directory."""
    spark_dirs = os.environ.get("SPARK_LOCAL_DIRS", "")
    base = spark_dirs.split(",")[0] if spark_dirs else tempfile.gettempdir()
    return Path(base) / "srt-keyed"


def _version_of(path: Path, suffix: str) -> int | None:
    name = path.name
    if not name.endswith(suffix) or name.startswith("."):
        return None
    stem = name[: -len(suffix)]
    return int(stem) if stem.isdigit() else None


class KeyedStore:
    """One state partition of one operator: the local RocksDB and its checkpoint files.

    Args:
        checkpoint: the partition's directory in the checkpoint (``<query>/keyed/<op>/<p>``).
        local: the local copy's directory (default: under :func:`local_root`).
    """

    def __init__(self, checkpoint: str | os.PathLike[str], local: Path | None = None) -> None:
        self.checkpoint = Path(checkpoint)
        digest = hashlib.sha256(str(self.checkpoint.resolve()).encode()).hexdigest()[:20]
        self.local = local if local is not None else local_root() / digest
        self.db: Rdict | None = None
        self.version: int | None = None
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
        opts = Options(raw_mode=True)
        opts.create_if_missing(True)
        return Rdict(str(self.local / "db"), options=opts)

    def _marker(self) -> dict:
        assert self.db is not None
        raw = self.db.get(_MARKER)
        return json.loads(raw) if raw else {"version": 0, "token": ""}

    def _token(self, version: int) -> str | None:
        """The token of the checkpoint's delta of ``version`` ("" for version 0)."""
        if version == 0:
            return ""
        path = self._file(version, _DELTA)
        if not path.exists():
            return None
        with pa.OSFile(str(path)) as f:
            meta = pa.ipc.open_file(f).schema.metadata or {}
        return meta.get(b"token", b"").decode()

    def _usable(self, version: int) -> bool:
        """Whether the local copy is at ``version``, or only deltas behind it (applied)."""
        marker = self._marker()
        at = marker.get("version")
        if marker.get("dirty") or at is None or at > version:
            return False
        if self._token(at) != marker.get("token"):
            return False
        for v in range(at + 1, version + 1):
            if not self._file(v, _DELTA).exists():
                return False
        if at < version:
            for v in range(at + 1, version + 1):
                self._apply(self._file(v, _DELTA))
            self._set_marker(version)
        return True

    def _set_marker(self, version: int) -> None:
        assert self.db is not None
        token = self._token(version) or ""
        self.db.put(_MARKER, json.dumps({"version": version, "token": token}).encode(), self._wopts)

    def _rebuild(self, version: int) -> None:
        assert self.db is not None
        self.db.close()
        self.db = None
        Rdict.destroy(str(self.local / "db"))
        self.db = self._open_db()
        base = 0
        if version > 0:
            snaps = [v for v in self._versions(_SNAPSHOT) if v <= version]
            base = max(snaps, default=0)
            missing = [
                v for v in range(base + 1, version + 1) if not self._file(v, _DELTA).exists()
            ]
            if missing:
                raise StateError(
                    f"state partition {self.checkpoint} cannot be rebuilt at version {version}: "
                    f"{'no snapshot and ' if not base else ''}the changes of version(s) "
                    f"{missing[:5]} are missing; restore the job from a savepoint "
                    f"(srt savepoint list, then srt run --from-savepoint <id>)"
                )
            if base:
                self._apply(self._file(base, _SNAPSHOT))
            for v in range(base + 1, version + 1):
                self._apply(self._file(v, _DELTA))
        self._set_marker(version)

    def _apply(self, path: Path) -> None:
        assert self.db is not None
        db, wopts = self.db, self._wopts
        with pa.memory_map(str(path)) as source:
            reader = pa.ipc.open_file(source)
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                for k, v in zip(
                    batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True
                ):
                    if v is None:
                        db.delete(k, wopts)
                    else:
                        db.put(k, v, wopts)

    # -- reading and writing ----------------------------------------------------------------
    def get(self, key: bytes) -> bytes | None:
        assert self.db is not None
        return self.db.get(key)

    def _mark(self) -> None:
        assert self.db is not None
        self.db.put(_MARKER, json.dumps({"dirty": True}).encode(), self._wopts)
        self._marked = True

    def put(self, key: bytes, value: bytes) -> None:
        assert self.db is not None
        if not self._marked:
            self._mark()
        self.db.put(key, value, self._wopts)
        self.changes[key] = value

    def delete(self, key: bytes) -> None:
        assert self.db is not None
        if not self._marked:
            self._mark()
        self.db.delete(key, self._wopts)
        self.changes[key] = None

    def scan(self, start: bytes, stop: bytes) -> Iterator[tuple[bytes, bytes]]:
        """Rows with ``start <= key < stop``, in key order."""
        assert self.db is not None
        opts = ReadOptions()
        opts.set_iterate_upper_bound(stop)
        it = self.db.iter(opts)
        it.seek(start)
        while it.valid():
            yield it.key(), it.value()
            it.next()

    # -- committing -------------------------------------------------------------------------
    def commit(self) -> int:
        """Write this task's changes as the next version in the checkpoint, then mark the local
        copy as at it; a snapshot every :data:`SNAPSHOT_EVERY` versions. Returns the version."""
        assert self.db is not None and self.version is not None
        version = self.version + 1
        token = uuid.uuid4().hex
        self.checkpoint.mkdir(parents=True, exist_ok=True)
        keys = sorted(self.changes)
        self._write(
            version,
            _DELTA,
            token,
            [
                pa.record_batch(
                    [
                        pa.array(keys, pa.binary()),
                        pa.array([self.changes[k] for k in keys], pa.binary()),
                    ],
                    schema=_SCHEMA,
                )
            ],
        )
        if version % SNAPSHOT_EVERY == 0:
            self._write(version, _SNAPSHOT, token, self._dump())
            self._clean(version)
        self.db.put(_MARKER, json.dumps({"version": version, "token": token}).encode(), self._wopts)
        self.version, self.changes = version, {}
        return version

    def _dump(self) -> Iterator[pa.RecordBatch]:
        keys: list[bytes] = []
        values: list[bytes] = []
        for k, v in self.scan(b"", _MARKER):
            keys.append(k)
            values.append(v)
            if len(keys) >= 65_536:
                yield pa.record_batch(
                    [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_SCHEMA
                )
                keys, values = [], []
        yield pa.record_batch(
            [pa.array(keys, pa.binary()), pa.array(values, pa.binary())], schema=_SCHEMA
        )

    def _write(self, version: int, suffix: str, token: str, batches) -> None:  # noqa: ANN001
        final = self._file(version, suffix)
        tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex[:8]}.tmp")
        schema = _SCHEMA.with_metadata({"format": _FORMAT, "version": str(version), "token": token})
        try:
            with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
                for batch in batches:
                    writer.write_batch(batch)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _clean(self, version: int) -> None:
        """Drop what no version from ``version - RETAIN_VERSIONS`` on needs (Spark's
        maintenance): snapshots and deltas before the newest snapshot at or below that."""
        keep_from = version - RETAIN_VERSIONS
        snaps = [v for v in self._versions(_SNAPSHOT) if v <= keep_from]
        if not snaps:
            return
        base = max(snaps)
        for suffix in (_SNAPSHOT, _DELTA):
            for v in self._versions(suffix):
                if v < base or (suffix == _DELTA and v == base):
                    self._file(v, suffix).unlink(missing_ok=True)

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

    # -- files ------------------------------------------------------------------------------
    def _file(self, version: int, suffix: str) -> Path:
        return self.checkpoint / f"{version}{suffix}"

    def _versions(self, suffix: str) -> list[int]:
        if not self.checkpoint.is_dir():
            return []
        found = (_version_of(p, suffix) for p in self.checkpoint.iterdir())
        return sorted(v for v in found if v is not None)
