"""Checkpoint directories: where each part lives, and what Spark's logs in them say.

Layout (:class:`CheckpointLayout` and :class:`QueryLayout`: no other module spells it)::

    <checkpoint.dir>/_job.json          owner marker: format version, job name, queries
    <checkpoint.dir>/_lock              held (flock) by the one process running the job
    <checkpoint.dir>/_rewind.json       the rewind a query's sinks still owe after a fallback
    <checkpoint.dir>/_quarantine/<time>/<query>/   damaged and superseded files moved aside
    <checkpoint.dir>/_dead_letters/<source>        rejected records staged until they commit
    <checkpoint.dir>/_dead_letters/<source>.event-time   the source's event-time alignment
    <checkpoint.dir>/_dead_letters/<query>.steps   records a step rejected, until they commit
    <checkpoint.dir>/_dead_letters/skips.json      records `srt run --skip` passes
    <checkpoint.dir>/<query>/           Spark's checkpoint of one query:
        offsets/<batch>                 source offsets + watermark of each planned batch
        commits/<batch>                 written after the batch's sink write and state commit
        state/<operator>/<partition>/   Spark's RocksDB state (native windows; changelogs)
        keyed/<operator>/<partition>/   keyed state of the worker's RocksDB
                                        (:mod:`~stateful_runtime.checkpoints.keyed`)
        metadata                        query id
        srt_sinks.json                  the sinks its batches went to, from which batch
                                        (runtime.sink_check; savepoints carry it)

A batch is *committed* when ``commits/<batch>`` exists; restart resumes after the last one.
:class:`QueryLayout` is the one reader of Spark's offset and commit logs, and names the files a
restart at a batch reads (what a savepoint copies and
:mod:`~stateful_runtime.checkpoints.verify` checks).

Ownership: nothing moves or deletes a checkpoint directory, or anything in it, unless
:meth:`CheckpointLayout.check_owned` passed: the directory is not the working directory, a home
directory or the root (nor a parent of one), and holds nothing the runtime did not create. The
directory's :meth:`CheckpointLayout.lock` makes one process at a time the job's.
"""

from __future__ import annotations

import fcntl
import json
import os
import pwd
import re
import socket
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.storage import S3Path, checkpoint_path, write_file
from stateful_runtime.exceptions import (
    AlreadyExistsError,
    CheckpointOwnershipError,
    ConfigError,
    JobLockedError,
    StorageError,
    UnsafeCheckpointDirError,
)
from stateful_runtime.names import Name

FORMAT_VERSION = 1
_MARKER = "_job.json"
_LOCK = "_lock"
_PENDING_REWIND = "_rewind.json"
_QUARANTINE = "_quarantine"
_DEAD_LETTERS = "_dead_letters"
_STEPS = ".steps"
# Spark's checkpoint of one query.
_OFFSETS, _COMMITS, _STATE = "offsets", "commits", "state"
_METADATA, _SOURCES = "metadata", "sources"
_SINKS = "srt_sinks.json"
# Each input's watermark after a batch, written before Spark commits it
# (runtime/input_watermarks.py).
_INPUT_WATERMARKS = "input-watermarks"
# Spark's metadata directory (of a stateful operator, of a state partition) and schema files.
_META_DIR, _STATE_SCHEMA = "_metadata", "_stateSchema"


@dataclass(frozen=True, init=False)
class CheckpointLayout:
    """A job's checkpoint directory (``checkpoint.dir``): where each of its parts lives.

    Attributes:
        root: the directory.
    """

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", checkpoint_path(root))

    @property
    def marker(self) -> Path:
        """The ownership marker (written by :func:`claim` and :func:`write_marker` alone)."""
        return self.root / _MARKER

    @property
    def pending_rewind(self) -> Path:
        """Per query, the batch its sinks must still be rewound to after a fallback."""
        return self.root / _PENDING_REWIND

    @property
    def quarantine(self) -> Path:
        """Where a start moves damaged and superseded files (one directory per start)."""
        return self.root / _QUARANTINE

    @property
    def lock_file(self) -> Path:
        """The file the job's process holds an exclusive ``flock`` on (:meth:`lock`)."""
        return self.root / _LOCK

    def query(self, name: str) -> QueryLayout:
        """The checkpoint of query ``name`` (Spark's ``checkpointLocation``)."""
        return QueryLayout(self.root / name)

    # -- ownership ---------------------------------------------------------------------------
    def foreign(self) -> list[str]:
        """Names of the entries of the directory the runtime did not create (sorted): anything
        but its own files (marker, lock, rewind, quarantine, dead letters, their temporary
        files) and Spark's query checkpoints (a directory the marker names as a query, or one
        holding Spark's logs)."""
        if not self.root.is_dir():
            return []
        ours = {_MARKER, _LOCK, _PENDING_REWIND, _QUARANTINE, _DEAD_LETTERS}
        temporary = [f".{n}." for n in (_MARKER, _PENDING_REWIND)]  # write_file's temporaries
        queries: set[str] = set()
        if self.marker.is_file():
            try:
                listed = json.loads(self.marker.read_text()).get("queries", [])
                queries = {q for q in listed if isinstance(q, str)}
            except (OSError, ValueError, AttributeError):
                pass
        out = []
        for p in self.root.iterdir():
            if p.name in ours or (
                p.name.endswith(".tmp") and any(p.name.startswith(t) for t in temporary)
            ):
                continue
            if p.is_dir() and not p.is_symlink() and (p.name in queries or _spark_query(p)):
                continue
            out.append(p.name)
        return sorted(out)

    def check_owned(self, *, moving: bool = False) -> None:
        """Refuse (:class:`UnsafeCheckpointDirError`, nothing changed) a checkpoint directory the
        runtime must not claim, write into, move aside or delete: the working directory, a home
        directory, the filesystem root or a parent of one of them, or a directory holding what
        the runtime did not create. With ``moving`` (a restore moves an existing checkpoint
        aside), a directory holding anything but a lock must also carry the marker.

        The one check before every claim, move and delete of a checkpoint directory."""
        root = self.root if isinstance(self.root, S3Path) else Path(os.path.abspath(self.root))
        resolved = root.resolve()
        for what, place in [] if isinstance(root, S3Path) else _protected_places():
            if resolved == place:
                raise UnsafeCheckpointDirError(str(root), f"is {what}")
            if place.is_relative_to(resolved):
                raise UnsafeCheckpointDirError(str(root), f"is a parent of {what} ({place})")
        foreign = self.foreign()
        if foreign:
            shown = ", ".join(foreign[:8]) + (
                f" and {len(foreign) - 8} more" if foreign[8:] else ""
            )
            raise UnsafeCheckpointDirError(
                str(root), f"holds files the runtime did not create ({shown})"
            )
        if moving and not self.marker.is_file() and self._holds_data():
            raise UnsafeCheckpointDirError(
                str(root), f"holds data but no {_MARKER}: it is not a job checkpoint"
            )

    def _holds_data(self) -> bool:
        return self.root.is_dir() and any(p.name != _LOCK for p in self.root.iterdir())

    def lock(self, job: str, holder: dict[str, Any]) -> CheckpointLock:
        """Take the exclusive lock of the job's process on this directory (created if need be),
        or raise :class:`JobLockedError` naming the process that holds it. ``holder`` (``pid``,
        ``run_id``, ``since``) is written into the lock file for the refusals of others. On S3
        the lock is a lease (:class:`LeaseLock`)."""
        if isinstance(self.lock_file, S3Path):
            return LeaseLock.acquire(self.lock_file, job, holder)
        return CheckpointLock.acquire(self.lock_file, job, holder)

    def move_contents(self, to: Path) -> None:
        """Move everything in the directory but the lock to ``to`` (a checkpoint on S3, which
        cannot be renamed whole: object by object, the job's lease staying where it is)."""
        for p in self.root.iterdir():
            if p.name != _LOCK:
                p.replace(to / p.name)

    def dead_letters(self, source: str) -> Path:
        """Where the rejected records of ``source`` are staged until their batch commits."""
        return self.root / _DEAD_LETTERS / source

    @property
    def skips(self) -> Path:
        """The source records ``srt run --skip`` passes to the dead-letter topic."""
        return self.root / _DEAD_LETTERS / "skips.json"

    def step_dead_letters(self, query: str) -> Path:
        """Where the steps of ``query`` stage the records they reject until their batch
        commits."""
        return self.root / _DEAD_LETTERS / f"{query}{_STEPS}"


def _spark_query(path: Path) -> bool:
    """True if ``path`` holds what Spark writes in a query's checkpoint."""
    return any((path / n).exists() for n in (_METADATA, _OFFSETS, _COMMITS, _STATE, _SOURCES))


def _protected_places() -> list[tuple[str, Path]]:
    """Directories no checkpoint may be (or contain): the root, the working directory, the
    home directories (this user's and every account's)."""
    places = [("the filesystem root", Path("/"))]
    try:
        places.append(("the working directory", Path.cwd().resolve()))
    except FileNotFoundError:  # the working directory was removed: nothing to protect there
        pass
    homes = {Path.home(), *(Path(h) for h in [os.environ.get("HOME")] if h)}
    try:
        homes |= {Path(u.pw_dir) for u in pwd.getpwall() if u.pw_dir and u.pw_dir != "/"}
    except OSError:
        pass
    places += [("a home directory", h.resolve()) for h in sorted(homes) if h.is_dir()]
    return places


class CheckpointLock:
    """The exclusive ``flock`` of the process running a job on its checkpoint's lock file, held
    until :meth:`release` or the process's end (the kernel drops it then, ``kill -9``
    included).

    The file is opened, locked, then checked to still be the file at its path (a restore swaps
    the whole directory: :meth:`follow` locks the new one's first), so two processes never both
    believe they hold it."""

    def __init__(self, path: Path, fd: int, holder: dict[str, Any]) -> None:
        self.path, self._fd, self.holder = path, fd, holder
        self._previous: int | None = None
        self.created_dir = False  # the lock made the checkpoint directory

    @classmethod
    def acquire(cls, path: Path, job: str, holder: dict[str, Any]) -> CheckpointLock:
        created = not path.parent.exists()
        path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(50):
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise JobLockedError(job, str(path.parent), cls.holder_of(path)) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(path).st_ino
            except FileNotFoundError:
                same = False
            if same:
                lock = cls(path, fd, holder)
                lock.created_dir = created
                lock._write()
                return lock
            os.close(fd)  # the directory was swapped under us: lock the file there now
        raise JobLockedError(job, str(path.parent), cls.holder_of(path))

    @staticmethod
    def holder_of(path: Path) -> dict[str, Any]:
        """What the holder wrote into the lock file (empty while it has not yet)."""
        for _ in range(20):
            try:
                data = json.loads(path.read_text() or "null")
            except (OSError, ValueError):
                data = None
            if isinstance(data, dict):
                return data
            time.sleep(0.01)  # locked, not yet written: the holder writes it next
        return {}

    def _write(self) -> None:
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, json.dumps(self.holder).encode(), 0)

    def follow(self, new_root: Path) -> None:
        """Lock ``new_root``'s lock file as well (a directory about to replace this one);
        :meth:`settle` drops the old lock once it has."""
        path = new_root / _LOCK
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a new directory: nobody else has it
        self._previous, self._fd = self._fd, fd
        self._write()

    def settle(self) -> None:
        """The directory was swapped: drop the lock on the old one's file."""
        if self._previous is not None:
            os.close(self._previous)
            self._previous = None

    def release(self, *, tidy: bool = False) -> None:
        """Drop the lock. The file stays, except with ``tidy`` when the lock made the directory
        and it holds nothing else (a start refused before it wrote anything): both are removed,
        while still locked (a locker that opened the file finds it gone and locks the path's)."""
        self.settle()
        if tidy and self.created_dir and self._fd >= 0:
            root = self.path.parent
            if [p.name for p in root.iterdir()] == [self.path.name]:
                self.path.unlink()
                try:
                    root.rmdir()
                except OSError:  # someone else's lock file appeared: leave it to them
                    pass
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LeaseLock(CheckpointLock):
    """The job's lock on a checkpoint on S3, which has no ``flock``: the object ``_lock``,
    naming its holder, created only if absent and rewritten only over the version its writer
    last saw (S3's conditional writes), so two processes never both hold it. The holder renews
    it while the job runs (:meth:`renew`); a holder that is gone gives it up: a process of this
    host that no longer exists at once, any other once its lease has not been renewed for
    :data:`LEASE_S` (a process killed on another machine). A holder that finds its lease taken
    over (it stalled longer than that) stops: :meth:`renew` raises."""

    LEASE_S = 120.0

    def __init__(self, path: Path, holder: dict[str, Any]) -> None:
        super().__init__(path, -1, holder)
        self._etag: str | None = None  # the version of _lock this process wrote last
        self._renewed = 0.0

    @classmethod
    def acquire(cls, path: Path, job: str, holder: dict[str, Any]) -> LeaseLock:
        assert isinstance(path, S3Path)
        lock = cls(path, {**holder, "host": socket.gethostname()})
        for _ in range(5):
            try:
                lock._etag = path.put(lock._document(), create_only=True)
            except AlreadyExistsError:
                try:
                    raw, etag = path.read_versioned()
                except FileNotFoundError:
                    continue  # released meanwhile: try to create it again
                held = cls._parse(raw)
                if not cls._gone(path, held):
                    raise JobLockedError(job, str(path.parent), held) from None
                try:  # take it over from the one that is gone, unless another did first
                    lock._etag = path.put(lock._document(), if_match=etag)
                except (AlreadyExistsError, FileNotFoundError):
                    continue
            lock._renewed = time.monotonic()
            return lock
        raise JobLockedError(job, str(path.parent), cls.holder_of(path))

    @staticmethod
    def _gone(path: S3Path, held: dict[str, Any]) -> bool:
        if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int):
            try:
                os.kill(held["pid"], 0)
            except ProcessLookupError:
                return True
            except PermissionError:
                return False
            return False
        try:
            age = time.time() - path.stat().st_mtime
        except FileNotFoundError:
            return True
        return age > LeaseLock.LEASE_S

    @staticmethod
    def _parse(raw: bytes) -> dict[str, Any]:
        try:
            data = json.loads(raw or b"null")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}

    @staticmethod
    def holder_of(path: Path) -> dict[str, Any]:
        try:
            return LeaseLock._parse(path.read_bytes())
        except OSError:
            return {}

    def _document(self) -> bytes:
        return json.dumps(self.holder).encode()

    def _write(self) -> None:
        assert isinstance(self.path, S3Path)
        try:
            self._etag = self.path.put(self._document(), if_match=self._etag)
        except (AlreadyExistsError, FileNotFoundError):
            held = self.holder_of(self.path)
            self._etag = None
            who = ", ".join(f"{k} {held[k]}" for k in ("host", "pid", "run_id") if k in held)
            raise StorageError(
                f"{self.path}: this process's lease on the checkpoint lapsed and "
                + (f"another process took it over ({who})" if who else "the lease is gone")
                + f": the job stops here, committing nothing more (a stall of over "
                f"{self.LEASE_S:.0f} s, or S3 unreachable that long)"
            ) from None
        self._renewed = time.monotonic()

    def renew(self) -> None:
        """Renew the lease (once a third of it has passed since the last renewal); raises
        :class:`StorageError` if another process has taken it over."""
        if time.monotonic() - self._renewed > self.LEASE_S / 3:
            self._write()

    def follow(self, new_root: Path) -> None:
        raise StorageError(
            f"{self.path.parent}: a checkpoint on S3 cannot be replaced while locked (a restore "
            f"or a fresh start over it); restore into a new checkpoint.dir instead"
        )

    def settle(self) -> None:
        pass

    def release(self, *, tidy: bool = False) -> None:
        """Delete the lease if it is still this process's."""
        if self._etag is not None and self.holder_of(self.path).get("run_id") == self.holder.get(
            "run_id"
        ):
            self.path.unlink(missing_ok=True)
        self._etag = None


@dataclass(frozen=True, init=False)
class QueryLayout:
    """One query's checkpoint directory, and the one reader of Spark's logs in it.

    The offset log (``offsets/<batch>``: a version line, the batch's metadata as JSON —
    watermark, time, Spark conf —, then one line of offsets per source) is written when a
    batch is planned; the commit log (``commits/<batch>``) once its sinks and state committed.

    Attributes:
        root: the directory.
    """

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", checkpoint_path(root))

    # -- where things are ---------------------------------------------------------------------
    @property
    def metadata(self) -> Path:
        """Spark's query metadata (the query id)."""
        return self.root / _METADATA

    @property
    def sinks_record(self) -> Path:
        """The runtime's record of the sinks this query's batches were written to, and from
        which batch (:mod:`stateful_runtime.runtime.sink_check`)."""
        return self.root / _SINKS

    @property
    def input_watermarks(self) -> Path:
        """``<N>``: each input's watermark after batch N (JSON), written before ``commits/N``."""
        return self.root / _INPUT_WATERMARKS

    def input_watermarks_upto(self, batch: int) -> Path | None:
        """The newest file of :attr:`input_watermarks` of a batch at or before ``batch``."""
        found = [n for n in _numbered(self.input_watermarks) if n <= batch]
        return self.input_watermarks / str(max(found)) if found else None

    @property
    def offset_log(self) -> Path:
        """Spark's offset log: ``<batch>`` per planned batch."""
        return self.root / _OFFSETS

    @property
    def commit_log(self) -> Path:
        """Spark's commit log: ``<batch>`` per committed batch."""
        return self.root / _COMMITS

    @property
    def state(self) -> Path:
        """The state store: ``<operator>/<partition>/`` per stateful operator."""
        return self.root / _STATE

    @property
    def keyed(self) -> Path:
        """The keyed state of the worker's RocksDB: ``<operator>/<partition>/``
        per operator (:mod:`~stateful_runtime.checkpoints.keyed`)."""
        return self.root / keyed.KEYED_DIR

    def offsets(self, batch: int) -> Path:
        """The offset log entry of ``batch``."""
        return self.offset_log / str(batch)

    def commit(self, batch: int) -> Path:
        """The commit log entry of ``batch``."""
        return self.commit_log / str(batch)

    def relative(self, path: Path) -> str:
        """``path`` relative to the query's directory (``offsets/7``), as savepoints name it."""
        return path.relative_to(self.root).as_posix()

    # -- what Spark's offset and commit logs say ---------------------------------------------
    def planned_batches(self) -> list[int]:
        """Every batch in the offset log (planned; committed or not), oldest first."""
        return _numbered(self.offset_log)

    def committed_batches(self) -> list[int]:
        """Every batch in the commit log, oldest first."""
        return _numbered(self.commit_log)

    def last_planned(self) -> int | None:
        """The newest batch in the offset log (planned; committed or not)."""
        batches = self.planned_batches()
        return batches[-1] if batches else None

    def last_committed(self) -> int | None:
        """The newest committed batch, or None before the first commit."""
        batches = self.committed_batches()
        return batches[-1] if batches else None

    def last_commit_time(self) -> float | None:
        """Wall-clock time (epoch seconds) of the last commit marker, or None."""
        batch = self.last_committed()
        if batch is None:
            return None
        return self.commit(batch).stat().st_mtime

    def watermark_ms(self, batch: int) -> int | None:
        """The watermark Spark logged for ``batch`` when it planned it."""
        return _batch_metadata(self._offset_lines(batch)).get("batchWatermarkMs")

    def batch_times(self, batch: int) -> tuple[int | None, int | None]:
        """(processing time, watermark) in epoch ms that Spark logged for ``batch`` when it
        planned it (``batchTimestampMs``, ``batchWatermarkMs``): a re-run of the batch reads
        the same values."""
        meta = _batch_metadata(self._offset_lines(batch))
        return meta.get("batchTimestampMs"), meta.get("batchWatermarkMs")

    def committed_offsets(self, batch: int | None = None) -> dict[str, Any] | None:
        """Source offsets of a committed batch (default: the last), as Spark logged them:
        ``batch``, ``watermark_ms`` and ``sources`` (one entry per source, JSON decoded)."""
        batch = self.last_committed() if batch is None else batch
        if batch is None:
            return None
        lines = self._offset_lines(batch)
        return {
            "batch": batch,
            "watermark_ms": _batch_metadata(lines).get("batchWatermarkMs"),
            "sources": [json.loads(s) if s.startswith("{") else s for s in lines[2:]],
        }

    @property
    def holds_state(self) -> bool:
        """Whether the query keeps state: in Spark's state store, or keyed in the worker (a
        query of keyed state may have no Spark operator at all)."""
        return self.state.is_dir() or self.keyed.is_dir()

    def state_partitions(self, batch: int) -> int | None:
        """Number of state partitions the query ran with at ``batch`` (Spark's shuffle
        partitions, fixed in the offset log), or None for a query without state."""
        if not self.holds_state:
            return None
        conf = _batch_metadata(self._offset_lines(batch)).get("conf", {})
        n = conf.get("spark.sql.shuffle.partitions")
        return int(n) if n else None

    # -- the state store -------------------------------------------------------------------
    def operators(self) -> list[Path]:
        """The state directory of each of Spark's stateful operators (``state/<operator>``),
        sorted."""
        if not self.state.is_dir():
            return []
        return sorted(p for p in self.state.iterdir() if p.is_dir())

    def operator_metadata(self, operator: Path) -> list[Path]:
        """Spark's metadata files of one stateful operator (``state/<operator>/_metadata``)."""
        return sorted(
            p
            for p in (operator / _META_DIR).rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def schema_metadata(self) -> list[Path]:
        """Spark's operator metadata files (v2) that name state schema files by absolute path
        (not Hadoop's checksum files beside them)."""
        return [p for p in self.state.glob(f"*/{_META_DIR}/v2/*") if not p.name.startswith(".")]

    def state_path(self, recorded: str) -> str:
        """Where a state file that ``recorded`` names under some query's ``state/`` directory
        lies under this query's."""
        return f"{self.state}/{recorded.rsplit(f'/{_STATE}/', 1)[1]}"

    @staticmethod
    def partitions(operator: Path, count: int) -> list[Path]:
        """The directories of an operator's state partitions below ``count`` (a rescale leaves
        the partitions above the new count behind, unused)."""
        return [p for p in sorted(operator.iterdir()) if p.name.isdigit() and int(p.name) < count]

    def batch_files(self, batch: int, *, pending: bool = True) -> list[str]:
        """Paths (relative to the query's directory) of every file a restart at committed
        ``batch`` reads: the query metadata, offsets and commits of ``batch`` and the one before
        it (Spark reads both), the planned-but-uncommitted batch after it when ``pending`` (so a
        restore replays exactly its range), and, per stateful operator and partition, what
        state version ``batch + 1`` needs. Hadoop's ``.crc`` side files are left out (Spark
        does not need them).
        """
        files = [self.metadata]
        if self.sinks_record.exists():  # a restore checks the sinks as this run would
            files.append(self.sinks_record)
        for b in (batch - 1, batch):
            if b >= 0:
                files += [self.offsets(b), self.commit(b)]
        if pending and self.offsets(batch + 1).exists():
            files.append(self.offsets(batch + 1))
        watermarks = self.input_watermarks_upto(batch)
        if watermarks is not None:
            files.append(watermarks)
        files += [
            p
            for p in (self.root / _SOURCES).rglob("*")
            if p.is_file() and not p.name.startswith(".")
        ]
        partitions = self.state_partitions(batch) or 0
        for op in self.operators():
            for meta in (_META_DIR, _STATE_SCHEMA):
                files += _numbered_upto(op / meta, batch)
            for part in self.partitions(op, partitions):
                files += _state_partition_files(part, batch + 1)
        for op in keyed.operators(self.root):
            for part in keyed.partitions(op, partitions):
                needed, missing = keyed.needs(part, batch + 1)
                if missing:
                    raise ConfigError(
                        f"keyed state partition {part} lacks the committed changes of versions "
                        f"{missing[:5]}: the checkpoint is incomplete"
                    )
                files += needed
                files += [r for r in keyed.records_of(needed) if r not in files]
        return [self.relative(p) for p in files]

    def state_files_after(self, version: int) -> list[Path]:
        """State files of versions after ``version`` (written by batches not committed), with
        their checksum files: what a restart at an earlier batch must not find (RocksDB would
        prefer a stale snapshot of a version the re-run writes again)."""
        out = []
        stores = [d for d in (self.state, self.keyed) if d.is_dir()]
        for p in (p for d in stores for p in d.rglob("*")):
            v = state_version(p)
            if v is not None and p.is_file() and v > version:
                out.append(p)
                if crc_sidecar(p).exists():
                    out.append(crc_sidecar(p))
        return out

    def log_repartition(self, batch: int, partitions: int) -> None:
        """Log batch ``batch + 1`` as Spark's checkpoint repartition does, for a query with no
        stateful operator of Spark's (whose repartition refuses it): the offsets of committed
        ``batch`` with ``partitions`` state partitions and no new input, committed with the
        same watermark (:meth:`log_batch_without_input`)."""
        self.log_batch_without_input(batch, conf={"spark.sql.shuffle.partitions": str(partitions)})

    def log_batch_without_input(
        self,
        batch: int,
        *,
        conf: dict[str, str] | None = None,
        watermark: int | None = None,
        timestamp: int | None = None,
    ) -> None:
        """Log batch ``batch + 1`` as run and committed with no new input: the offsets of
        committed ``batch`` (with ``conf`` added to its conf, at ``watermark`` and processing
        time ``timestamp`` when given), committed as ``batch`` was. The offsets first, each file
        whole: a crash between the two leaves a planned batch of no input, which the restart
        runs."""
        lines = self._offset_lines(batch)
        meta = _batch_metadata(lines)
        meta["conf"] = {**meta.get("conf", {}), **(conf or {})}
        if watermark is not None:
            meta["batchWatermarkMs"] = watermark
        if timestamp is not None:
            meta["batchTimestampMs"] = timestamp
        entry = [lines[0], json.dumps(meta, separators=(",", ":")), *lines[2:]]
        for path, text in (
            (self.offsets(batch + 1), "\n".join(entry)),
            (self.commit(batch + 1), self.commit(batch).read_text()),
        ):
            write_file(path, text)

    def next_watermark_ms(self, batch: int) -> int | None:
        """The watermark committed ``batch`` left for the next (``nextBatchWatermarkMs``)."""
        lines = self.commit(batch).read_text().splitlines()
        return json.loads(lines[1]).get("nextBatchWatermarkMs") if len(lines) > 1 else None

    def _offset_lines(self, batch: int) -> list[str]:
        return self.offsets(batch).read_text().splitlines()


def _batch_metadata(offset_lines: list[str]) -> dict[str, Any]:
    """The batch metadata of an offset log entry (its second line)."""
    return json.loads(offset_lines[1])


def claim(
    directory: str | Path, job: str, queries: Sequence[str], fingerprint: dict | None = None
) -> Path:
    """Bind ``directory`` to ``job`` (first run) or check that it is bound to ``job``; record the
    running code's queries and state fingerprint (what a savepoint of it will carry)."""
    path = checkpoint_path(directory).resolve()
    CheckpointLayout(path).check_owned()
    path.mkdir(parents=True, exist_ok=True)
    marker = CheckpointLayout(path).marker
    if marker.exists():
        data = _read_marker(marker)
        if data.get("format_version") != FORMAT_VERSION:
            raise ConfigError(
                f"checkpoint {path} has format {data.get('format_version')!r}; this runtime "
                f"reads format {FORMAT_VERSION}. Restore it with the version that wrote it."
            )
        if data.get("job") != job:
            raise CheckpointOwnershipError(str(path), str(data.get("job")), job)
    else:
        # A Spark checkpoint with no marker was not made by us: refuse rather than adopt it.
        foreign = [
            p.name
            for p in path.iterdir()
            if QueryLayout(p).offset_log.is_dir() or p.name == _OFFSETS
        ]
        if foreign:
            raise ConfigError(
                f"checkpoint directory {path} holds Spark checkpoints ({', '.join(foreign)}) but "
                f"no {_MARKER}: it was not written by job {job!r}. Use an empty directory."
            )
        data = {
            "format_version": FORMAT_VERSION,
            "job": job,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    data["queries"] = list(queries)
    if fingerprint is not None:
        data["fingerprint"] = fingerprint
    write_marker(path, data)
    return path


def owner(directory: str | Path) -> dict:
    """The marker of a job checkpoint directory."""
    marker = CheckpointLayout(directory).marker
    if not marker.exists():
        raise ConfigError(f"{directory} is not a job checkpoint (no {_MARKER})")
    return _read_marker(marker)


def write_marker(directory: Path, data: dict) -> None:
    """Write the ownership marker (atomically): the one place it is written."""
    write_file(CheckpointLayout(directory).marker, json.dumps(data, indent=2))


def _read_marker(marker: Path) -> dict:
    """The marker's JSON, or a :class:`ConfigError` naming the file and what to do."""
    try:
        data = json.loads(marker.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        data["job"] = Name(data.get("job"), "job")
        data["queries"] = [Name(q, "query") for q in data.get("queries", [])]
    except (ValueError, UnicodeDecodeError, ConfigError) as exc:
        raise ConfigError(
            f"checkpoint marker {marker} is corrupt ({exc}): the checkpoint's ownership cannot "
            f"be proved. Restore the job from a savepoint or the mirror into an empty directory "
            f"(`srt run JOB_FILE --from-savepoint ID` / `--restore-from LOCATION`)"
        ) from None
    return data


def _numbered(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


# State file names in a partition directory: "<version>.changelog", "<version>.zip", and the
# same with "_<unique id>" after the version (Spark's checkpoint format v2).
_STATE_FILE = re.compile(r"^(\d+)(?:[_.][^.]+)?\.(changelog|zip|delta|snapshot|commit)$")


def state_version(path: Path) -> int | None:
    """The state version a state file holds (``8`` for ``8.changelog``, ``8_<id>.zip``), or
    None if ``path`` is not a state file."""
    m = _STATE_FILE.match(path.name)
    return int(m.group(1)) if m else None


def crc_sidecar(path: Path) -> Path:
    """Hadoop's checksum file of ``path`` (``.<name>.crc`` beside it)."""
    return path.with_name(f".{path.name}.crc")


def _state_partition_files(part_dir: Path, version: int) -> list[Path]:
    """The files RocksDB needs to load ``version`` of one state partition: the newest snapshot
    at or below it, the SST files that snapshot lists, and the changelogs after it."""
    files, missing = partition_needs(part_dir, version)
    if missing:
        raise ConfigError(
            f"state partition {part_dir} lacks changelogs for versions {missing}: "
            f"the checkpoint is incomplete"
        )
    return files


def partition_needs(part_dir: Path, version: int) -> tuple[list[Path], list[int]]:
    """(files needed to load ``version`` of one state partition, changelog versions missing)."""
    by_kind: dict[str, dict[int, Path]] = {
        k: {} for k in ("changelog", "zip", "delta", "snapshot", "commit")
    }
    for p in part_dir.iterdir():
        m = _STATE_FILE.match(p.name)
        if m and int(m.group(1)) <= version:
            by_kind[m.group(2)][int(m.group(1))] = p
    snaps = by_kind["zip"]
    base = max(snaps) if snaps else 0
    out = [snaps[base]] if snaps else []
    if by_kind["zip"] and base:
        meta = zipfile.ZipFile(snaps[base]).read("metadata").decode().splitlines()[1]
        out += [
            part_dir / "SSTs" / f["dfsSstFileName"] for f in json.loads(meta).get("sstFiles", [])
        ]
    deltas = by_kind["changelog"]
    out += [deltas[v] for v in sorted(deltas) if v > base]
    missing = [v for v in range(base + 1, version + 1) if v not in deltas]
    out += [
        p for p in (part_dir / _META_DIR).glob("*") if p.is_file() and not p.name.startswith(".")
    ]
    return out, missing


def _numbered_upto(directory: Path, batch: int) -> list[Path]:
    """Files of an operator metadata dir whose name starts with a batch id <= ``batch``."""
    out = []
    for p in directory.rglob("*"):
        head = p.name.split("_", 1)[0]
        if (
            p.is_file()
            and not p.name.startswith(".")
            and (not head.isdigit() or int(head) <= batch)
        ):
            out.append(p)
    return out
