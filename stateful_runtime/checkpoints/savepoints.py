"""Savepoints: self-contained, portable copies of one committed batch of a job.

A checkpoint belongs to one run of one job and Spark reads it only in place. A savepoint is what
Flink users upgrade, migrate and rescale through: every file a restart at committed batch ``N``
needs (offsets and commits of ``N`` and ``N-1``, the query metadata, and per state partition the
newest RocksDB snapshot, its SST files and the changelogs up to version ``N+1``), copied to a
local directory or S3 with a manifest.

Layout under a savepoint root (``savepoint.dir`` of the job, or ``--target``)::

    <root>/<id>/_writer.json          who is writing it (removed when done)
    <root>/<id>/<query>/...           the checkpoint files, as in the checkpoint
    <root>/<id>/_manifest.json        written last, create-only: the commit point

A savepoint without ``_manifest.json`` is never listed and is removed once its writer is gone.

The manifest is described in :mod:`stateful_runtime.checkpoints.manifest`; retention in
:mod:`~stateful_runtime.checkpoints.retention`, restore in
:mod:`~stateful_runtime.checkpoints.restore`.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from stateful_runtime import _process
from stateful_runtime.checkpoints import layout
from stateful_runtime.checkpoints.layout import CheckpointLayout
from stateful_runtime.checkpoints.manifest import (
    MANIFEST,
    CorruptManifestError,
    ManifestMismatchError,
    Savepoint,
    new_manifest,
    query_entry,
    read_manifest,
    seal_mismatch,
    sha256_file,
    utc,
)
from stateful_runtime.checkpoints.storage import Store, checkpoint_path, local_copy, open_store
from stateful_runtime.exceptions import AlreadyExistsError, SavepointError, StorageError
from stateful_runtime.names import InvalidNameError, Name, check_name

WRITER = "_writer.json"
# What a savepoint writer writes first: the proof that a directory without a manifest is an
# unfinished savepoint of ours (anything else in a savepoint root is never deleted).
WRITER_MARK = "srt-savepoint-writer/1"
# A savepoint left without a manifest by a writer on another host is garbage after this long.
ABANDONED_AFTER_S = 3600.0


def new_id(job: str) -> str:
    return f"{job}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def create(
    checkpoint_dir: str | Path,
    target: str | Path,
    *,
    kind: str = "savepoint",
    savepoint_id: str | None = None,
    _fail_after_files: int | None = None,
) -> Savepoint:
    """Copy the last committed batch of the checkpoint at ``checkpoint_dir`` to ``target``.

    Safe while the job runs: files of a committed batch are never rewritten, and state files are
    kept for 100 batches (``minBatchesToRetain``), far longer than a copy takes.
    ``_fail_after_files`` stops the copy half-way (tests of crash safety).
    """
    ckpt = checkpoint_path(checkpoint_dir).resolve()
    owner = layout.owner(ckpt)
    job = owner["job"]
    store = open_store(target)
    sid = check_name("savepoint id", savepoint_id or new_id(job))
    if any(True for _ in store.list(f"{sid}/")):
        raise SavepointError(f"{store.join(sid)} already exists; choose another savepoint id")
    queries: dict[str, Any] = {}
    files: list[tuple[str, Path]] = []
    for qname in owner.get("queries", []):
        query = CheckpointLayout(ckpt).query(qname)
        batch = query.last_committed()
        if batch is None:
            raise SavepointError(
                f"query {qname} of job {job!r} has not committed a batch yet: take the savepoint "
                f"after its first batch (`srt status {job}` shows the last committed batch)"
            )
        rels = query.batch_files(batch)
        pending = query.relative(query.offsets(batch + 1)) in rels
        queries[qname] = query_entry(query, batch, pending=pending)
        files += [(f"{qname}/{rel}", query.root / rel) for rel in rels]

    cleanup_incomplete(store)
    store.put_bytes(
        f"{sid}/{WRITER}",
        json.dumps(
            {
                "mark": WRITER_MARK,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_at": utc(),
            }
        ).encode(),
        create_only=True,
    )
    entries = []
    for i, (key, path) in enumerate(files):
        if _fail_after_files is not None and i >= _fail_after_files:
            raise SavepointError(f"savepoint {sid} interrupted after {i} files (test hook)")
        with local_copy(path) as local:  # (a checkpoint on S3: each file read once)
            entries.append(
                {"path": key, "size": local.stat().st_size, "sha256": sha256_file(local)}
            )
            store.put_file(local, f"{sid}/{key}")
    manifest = new_manifest(kind, sid, owner, queries, entries)
    try:
        store.put_bytes(
            f"{sid}/{MANIFEST}", json.dumps(manifest, indent=1).encode(), create_only=True
        )
    except AlreadyExistsError:
        raise SavepointError(f"savepoint {store.join(sid)} already exists") from None
    store.delete([f"{sid}/{WRITER}"])
    return Savepoint(store, sid, manifest)


def _writer_of(store: Store, sid: str) -> dict[str, Any] | None:
    """The writer record of an unfinished savepoint of ours, or None if ``sid`` is not one."""
    try:
        writer = json.loads(store.get_bytes(f"{sid}/{WRITER}"))
    except (StorageError, ValueError, UnicodeDecodeError):
        return None
    return writer if isinstance(writer, dict) and writer.get("mark") == WRITER_MARK else None


def cleanup_incomplete(store: Store) -> list[str]:
    """Remove unfinished savepoints whose writer is gone.

    Only a directory this runtime can prove it created is removed: one whose writer record
    (:data:`WRITER_MARK`) is there and whose manifest is not. Anything else under a savepoint
    root (an event log, a checkpoint, someone's files) is left alone.
    """
    removed = []
    by_id: dict[str, list[Any]] = {}
    for obj in store.list():
        if "/" in obj.key:
            by_id.setdefault(obj.key.split("/", 1)[0], []).append(obj)
    for sid, objs in by_id.items():
        names = {o.key.split("/", 1)[1] for o in objs}
        if MANIFEST in names or WRITER not in names:
            continue
        writer = _writer_of(store, sid)
        if writer is None:
            continue
        same_host = writer.get("host") == socket.gethostname()
        if same_host and _process.pid_alive(writer.get("pid")):
            continue
        newest = max(o.mtime for o in objs)
        if not same_host and time.time() - newest < ABANDONED_AFTER_S:
            continue
        store.delete([o.key for o in objs])
        removed.append(sid)
    return removed


# -- finding savepoints --------------------------------------------------------------------------


def list_savepoints(
    root: str | Path, job: str | None = None, problems: list[CorruptManifestError] | None = None
) -> list[Savepoint]:
    """Complete savepoints under ``root``, oldest first. A savepoint whose manifest is corrupt
    or was edited after it was written (its checksum) is left out (and appended to
    ``problems`` when given): one bad manifest never hides the others, and retention never
    decides on an edited one."""
    store = open_store(root)
    out = []
    for obj in store.list():
        parts = obj.key.split("/")
        if len(parts) == 2 and parts[1] == MANIFEST:
            try:
                Name(parts[0], "savepoint id")
                manifest = read_manifest(store, obj.key)
                if (edited := seal_mismatch(manifest)) is not None:
                    raise ManifestMismatchError(store.join(obj.key), [edited])
            except (CorruptManifestError, InvalidNameError) as exc:
                if problems is not None:
                    problems.append(
                        exc
                        if isinstance(exc, CorruptManifestError)
                        else CorruptManifestError(store.join(obj.key), str(exc))
                    )
                continue
            if job is None or manifest.get("job") == job:
                out.append(Savepoint(store, parts[0], manifest))
    return sorted(out, key=lambda s: s.created_at)


def resolve(ref: str | Path, roots: Iterable[str | Path] = ()) -> Savepoint:
    """A savepoint by location (a directory or s3:// URL holding a manifest) or by id under one
    of ``roots``."""
    text = str(ref).rstrip("/")
    candidates: list[tuple[Store, str]] = []
    if "/" in text or text.startswith("s3:"):
        parent, _, sid = text.rpartition("/")
        candidates.append((open_store(parent or "/"), check_name("savepoint id", sid)))
    else:
        candidates += [(open_store(r), check_name("savepoint id", text)) for r in roots]
    for store, sid in candidates:
        try:
            manifest = read_manifest(store, f"{sid}/{MANIFEST}")
        except (StorageError, FileNotFoundError, NotADirectoryError):
            continue
        return Savepoint(store, sid, manifest)
    where = ", ".join(str(r) for r in roots) or "nowhere"
    raise SavepointError(
        f"no complete savepoint {text!r} (looked in {where if '/' not in text else text}); "
        f"`srt savepoint list` shows the savepoints there"
    )


def dispose(sp: Savepoint) -> None:
    """Delete a savepoint: the manifest first, so a half-deleted one is never listed."""
    _delete(sp.store, check_name("savepoint id", sp.id))


def dispose_unreadable(root: str | Path, savepoint_id: str) -> str:
    """Delete a savepoint whose manifest cannot be read (``srt savepoint dispose --force``):
    only if the directory holds a manifest file or a writer record of ours. Returns where."""
    store = open_store(root)
    sid = check_name("savepoint id", savepoint_id)
    names = {o.key.split("/", 1)[1] for o in store.list(f"{sid}/")}
    if MANIFEST not in names and _writer_of(store, sid) is None:
        raise SavepointError(
            f"{store.join(sid)} is not a savepoint (no {MANIFEST} and no writer record of this "
            f"runtime): nothing was deleted"
        )
    _delete(store, sid)
    return store.join(sid)


def _delete(store: Store, sid: Name) -> None:
    store.delete([f"{sid}/{MANIFEST}"])
    store.delete([o.key for o in store.list(f"{sid}/")])
