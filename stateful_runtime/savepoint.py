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

The manifest (format :data:`FORMAT_VERSION`) holds the job name, the job's *fingerprint*
(queries, their stateful operators, key fields, state names and signatures), the Spark version,
per query the batch id, source offsets, watermark and state partition count, and each file's
size and sha256. Restore checks the checksums and the fingerprint against the new code.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from stateful_runtime import checkpoint
from stateful_runtime.exceptions import (
    AlreadyExistsError,
    IncompatibleSavepointError,
    SavepointError,
    StorageError,
)
from stateful_runtime.storage import Store, open_store

FORMAT_VERSION = 1
MANIFEST = "_manifest.json"
WRITER = "_writer.json"
# A savepoint left without a manifest by a writer on another host is garbage after this long.
ABANDONED_AFTER_S = 3600.0
CHUNK = 1 << 20


def _utc(ts: float | None = None) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def fingerprint(job_name: str, queries: Iterable[Any]) -> dict[str, Any]:
    """What a restore must agree with: the job and, per query, its stateful operators."""
    return {"job": job_name,
            "queries": {q.name: {"path": q.path, "operators": q.state_layout} for q in queries}}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Savepoint:
    """A listed (complete) savepoint: where it is and its manifest."""

    store: Store
    id: str
    manifest: dict[str, Any]

    @property
    def location(self) -> str:
        return self.store.join(self.id) if self.id else self.store.url

    def key(self, path: str) -> str:
        """Store key of one of the savepoint's files."""
        return f"{self.id}/{path}" if self.id else path

    @property
    def job(self) -> str:
        return self.manifest["job"]

    @property
    def created_at(self) -> float:
        return float(self.manifest["created_at_epoch"])

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.manifest["files"])

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "id": self.id, "job": m["job"], "location": self.location,
            "batches": {q: v["batch"] for q, v in m["queries"].items()},
            "watermark_ms": {q: v["watermark_ms"] for q, v in m["queries"].items()},
            "size_bytes": self.size, "files": len(m["files"]), "created_at": m["created_at"],
            "format_version": m["format_version"], "kind": m.get("kind", "savepoint"),
        }


def query_entry(qdir: Path, batch: int, *, pending: bool) -> dict[str, Any]:
    """What a manifest says of one query at committed ``batch``."""
    committed = checkpoint.committed_offsets(qdir, batch) or {}
    return {"batch": batch, "watermark_ms": committed.get("watermark_ms"),
            "offsets": committed.get("sources"), "pending_batch": batch + 1 if pending else None,
            "state_partitions": checkpoint.state_partitions(qdir, batch),
            "checkpoint_dir": str(qdir)}


def new_manifest(kind: str, sid: str, owner: dict[str, Any], queries: dict[str, Any],
                 files: list[dict[str, Any]]) -> dict[str, Any]:
    """A manifest (savepoints and mirror snapshots share the shape and the restore path)."""
    from importlib.metadata import version

    now = time.time()
    return {
        "format_version": FORMAT_VERSION, "kind": kind, "id": sid, "job": owner["job"],
        "fingerprint": owner.get("fingerprint"), "spark_version": version("pyspark"),
        "created_at": _utc(now), "created_at_epoch": now,
        "restored_from": owner.get("restored_from"), "queries": queries, "files": files,
    }


# -- taking a savepoint --------------------------------------------------------------------------

def new_id(job: str) -> str:
    return f"{job}-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{secrets.token_hex(2)}"


def create(checkpoint_dir: str | Path, target: str | Path, *, kind: str = "savepoint",
           savepoint_id: str | None = None, _fail_after_files: int | None = None) -> Savepoint:
    """Copy the last committed batch of the checkpoint at ``checkpoint_dir`` to ``target``.

    Safe while the job runs: files of a committed batch are never rewritten, and state files are
    kept for 100 batches (``minBatchesToRetain``), far longer than a copy takes.
    ``_fail_after_files`` stops the copy half-way (tests of crash safety).
    """
    ckpt = Path(checkpoint_dir).resolve()
    owner = checkpoint.owner(ckpt)
    job = owner["job"]
    queries: dict[str, Any] = {}
    files: list[tuple[str, Path]] = []
    for qname in owner.get("queries", []):
        qdir = ckpt / qname
        batch = checkpoint.last_committed(qdir)
        if batch is None:
            raise SavepointError(
                f"query {qname} of job {job!r} has not committed a batch yet: take the savepoint "
                f"after its first batch (`srt status {job}` shows the last committed batch)")
        rels = checkpoint.batch_files(qdir, batch)
        queries[qname] = query_entry(qdir, batch,
                                     pending=f"offsets/{batch + 1}" in rels)
        files += [(f"{qname}/{rel}", qdir / rel) for rel in rels]

    store = open_store(target)
    cleanup_incomplete(store)
    sid = savepoint_id or new_id(job)
    store.put_bytes(f"{sid}/{WRITER}", json.dumps(
        {"pid": os.getpid(), "host": socket.gethostname(), "started_at": _utc()}).encode())
    entries = []
    for i, (key, path) in enumerate(files):
        if _fail_after_files is not None and i >= _fail_after_files:
            raise SavepointError(f"savepoint {sid} interrupted after {i} files (test hook)")
        entries.append({"path": key, "size": path.stat().st_size, "sha256": sha256_file(path)})
        store.put_file(path, f"{sid}/{key}")
    manifest = new_manifest(kind, sid, owner, queries, entries)
    try:
        store.put_bytes(f"{sid}/{MANIFEST}", json.dumps(manifest, indent=1).encode(),
                        create_only=True)
    except AlreadyExistsError:
        raise SavepointError(f"savepoint {store.join(sid)} already exists") from None
    store.delete([f"{sid}/{WRITER}"])
    return Savepoint(store, sid, manifest)


def cleanup_incomplete(store: Store) -> list[str]:
    """Remove savepoints that have no manifest and whose writer is gone."""
    removed = []
    by_id: dict[str, list[Any]] = {}
    for obj in store.list():
        if "/" in obj.key:
            by_id.setdefault(obj.key.split("/", 1)[0], []).append(obj)
    for sid, objs in by_id.items():
        names = {o.key.split("/", 1)[1] for o in objs}
        if MANIFEST in names:
            continue
        if WRITER in names:
            try:
                writer = json.loads(store.get_bytes(f"{sid}/{WRITER}"))
            except (StorageError, ValueError):
                writer = {}
            from stateful_runtime.runtime.registry import pid_alive

            same_host = writer.get("host") == socket.gethostname()
            if same_host and pid_alive(writer.get("pid")):
                continue
            newest = max(o.mtime for o in objs)
            if not same_host and time.time() - newest < ABANDONED_AFTER_S:
                continue
        store.delete([o.key for o in objs])
        removed.append(sid)
    return removed


# -- finding savepoints --------------------------------------------------------------------------

def list_savepoints(root: str | Path, job: str | None = None) -> list[Savepoint]:
    """Complete savepoints under ``root``, oldest first."""
    store = open_store(root)
    out = []
    for obj in store.list():
        parts = obj.key.split("/")
        if len(parts) == 2 and parts[1] == MANIFEST:
            manifest = json.loads(store.get_bytes(obj.key))
            if job is None or manifest.get("job") == job:
                out.append(Savepoint(store, parts[0], manifest))
    return sorted(out, key=lambda s: s.created_at)


_ID = re.compile(r"^[A-Za-z0-9._-]+$")


def resolve(ref: str | Path, roots: Iterable[str | Path] = ()) -> Savepoint:
    """A savepoint by location (a directory or s3:// URL holding a manifest) or by id under one
    of ``roots``."""
    text = str(ref).rstrip("/")
    candidates: list[tuple[Store, str]] = []
    if "/" in text or text.startswith("s3:"):
        parent, _, sid = text.rpartition("/")
        candidates.append((open_store(parent or "/"), sid))
    elif _ID.match(text):
        candidates += [(open_store(r), text) for r in roots]
    for store, sid in candidates:
        try:
            manifest = json.loads(store.get_bytes(f"{sid}/{MANIFEST}"))
        except (StorageError, FileNotFoundError, NotADirectoryError):
            continue
        return Savepoint(store, sid, manifest)
    where = ", ".join(str(r) for r in roots) or "nowhere"
    raise SavepointError(
        f"no complete savepoint {text!r} (looked in {where if '/' not in text else text}); "
        f"`srt savepoint list` shows the savepoints there")


def dispose(sp: Savepoint) -> None:
    """Delete a savepoint: the manifest first, so a half-deleted one is never listed."""
    sp.store.delete([f"{sp.id}/{MANIFEST}"])
    sp.store.delete([o.key for o in sp.store.list(f"{sp.id}/")])


@dataclass
class Retention:
    """Which savepoints to keep: at most ``max_count``, none older than ``max_age``; the newest
    one and any a running job was restored from are always kept."""

    max_count: int | None = None
    max_age: timedelta | None = None
    protected: set[str] = field(default_factory=set)

    def expired(self, savepoints: list[Savepoint], now: float | None = None) -> list[Savepoint]:
        now = time.time() if now is None else now
        newest_first = sorted(savepoints, key=lambda s: s.created_at, reverse=True)
        out = []
        for i, sp in enumerate(newest_first):
            if i == 0 or sp.id in self.protected or sp.location in self.protected:
                continue
            too_many = self.max_count is not None and i >= self.max_count
            too_old = (self.max_age is not None
                       and now - sp.created_at > self.max_age.total_seconds())
            if too_many or too_old:
                out.append(sp)
        return out


def apply_retention(root: str | Path, job: str, retention: Retention) -> list[Savepoint]:
    """Dispose of the savepoints of ``job`` under ``root`` that ``retention`` lets go (never one
    a registered job was restored from)."""
    cleanup_incomplete(open_store(root))
    retention.protected |= protected_locations()
    gone = retention.expired(list_savepoints(root, job))
    for sp in gone:
        dispose(sp)
    return gone


# -- restoring -----------------------------------------------------------------------------------

def compatibility(saved: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(incompatible changes, state the new job no longer declares) between two fingerprints."""
    bad: list[str] = []
    dropped: list[str] = []
    if saved.get("job") != new.get("job"):
        bad.append(f"the savepoint is of job {saved.get('job')!r}, this job is {new.get('job')!r}")
        return bad, dropped
    new_queries = new.get("queries", {})
    for qname, sq in saved.get("queries", {}).items():
        nq = new_queries.get(qname)
        for op, so in sq.get("operators", {}).items():
            where = f"query {qname}, operator {op}"
            no = (nq or {}).get("operators", {}).get(op)
            if no is None:
                dropped += [f"{where}: state {s!r} ({sig}) — the operator is gone"
                            for s, sig in so["states"].items()]
                continue
            if so["kind"] != no["kind"]:
                bad.append(f"{where}: was a {so['kind']} operator, is now {no['kind']}")
                continue
            if so["keys"] != no["keys"]:
                bad.append(f"{where}: keyed by {so['keys']}, now by {no['keys']}")
            for s, sig in so["states"].items():
                now_sig = no["states"].get(s)
                if now_sig is None:
                    (bad if so["kind"] == "native-window" else dropped).append(
                        f"{where}: state {s!r} ({sig}) is no longer declared")
                elif now_sig != sig:
                    bad.append(f"{where}: state {s!r} was {sig}, is now {now_sig}")
            if so["kind"] == "native-window":
                bad += [f"{where}: new state {s!r} ({sig}) changes Spark's state schema"
                        for s, sig in no["states"].items() if s not in so["states"]]
    return bad, dropped


def check_compatible(saved: dict[str, Any], new: dict[str, Any], allow_non_restored: bool,
                     where: str) -> list[str]:
    """Raise if state with fingerprint ``saved`` (a savepoint's or a checkpoint's, at
    ``where``) cannot be restored into a job with fingerprint ``new``; returns the state left
    behind when ``allow_non_restored`` lets it go."""
    bad, dropped = compatibility(saved or {}, new)
    if bad:
        raise IncompatibleSavepointError(
            where, bad + dropped,
            "Restore it with the code that wrote it, or keep state names, kinds and key fields "
            "as they were (new state and new operators are fine).")
    if dropped and not allow_non_restored:
        raise IncompatibleSavepointError(
            where, dropped, "Pass --allow-non-restored-state to start without that state.")
    return dropped


def materialize(sp: Savepoint, dest: Path, queries: Iterable[str] | None = None,
                final: Path | None = None) -> None:
    """Copy the savepoint's files of ``queries`` (default all) into ``dest`` laid out as a
    checkpoint, verifying every file's size and sha256 and pointing Spark's operator metadata
    at ``final`` (default ``dest``), where the checkpoint will be read. ``dest`` must not
    exist; nothing is left in it on failure."""
    wanted = set(sp.manifest["queries"]) if queries is None else set(queries)
    tmp = dest.with_name(f".{dest.name}.restoring-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for f in sp.manifest["files"]:
            if f["path"].split("/", 1)[0] not in wanted:
                continue
            local = tmp / f["path"]
            sp.store.get_file(sp.key(f["path"]), local)
            size, digest = local.stat().st_size, sha256_file(local)
            if size != f["size"] or digest != f["sha256"]:
                raise SavepointError(
                    f"savepoint {sp.location} is corrupt: {f['path']} has {size} bytes, sha256 "
                    f"{digest[:12]}…; the manifest says {f['size']} bytes, {f['sha256'][:12]}…")
        for qname in wanted:
            _relocate_operator_metadata(tmp / qname, (final or dest) / qname)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _relocate_operator_metadata(qdir: Path, final_qdir: Path) -> None:
    """Spark's operator metadata (v2) names state schema files by absolute path: point those
    paths into the restored checkpoint."""
    for meta in qdir.glob("state/*/_metadata/v2/*"):
        lines = meta.read_text().splitlines()
        body = json.loads(lines[1])
        for store_info in body.get("stateStoreInfo", []):
            store_info["stateSchemaFilePaths"] = [
                f"file:{final_qdir}/state/{p.rsplit('/state/', 1)[1]}"
                for p in store_info.get("stateSchemaFilePaths", [])]
        meta.write_text("\n".join([lines[0], json.dumps(body), *lines[2:]]))


def restore(sp: Savepoint, checkpoint_dir: str | Path, new_fingerprint: dict[str, Any],
            *, allow_non_restored: bool = False) -> dict[str, Any]:
    """Lay ``sp`` out as the job's checkpoint at ``checkpoint_dir``.

    An existing checkpoint there is moved aside (never deleted) to
    ``<checkpoint_dir>.before-restore-<time>``. Returns what was restored (for the registry).
    """
    if sp.manifest.get("format_version") != FORMAT_VERSION:
        raise SavepointError(
            f"savepoint {sp.location} has format {sp.manifest.get('format_version')}; this "
            f"runtime reads format {FORMAT_VERSION}")
    dropped = check_compatible(sp.manifest.get("fingerprint") or {}, new_fingerprint,
                               allow_non_restored, sp.location)
    ckpt = Path(checkpoint_dir).resolve()
    restored_queries = [q for q in sp.manifest["queries"]
                        if q in new_fingerprint.get("queries", {})]
    staging = ckpt.with_name(f"{ckpt.name}.restore-{secrets.token_hex(3)}")
    materialize(sp, staging, restored_queries, final=ckpt)
    moved_aside = None
    if ckpt.exists() and any(ckpt.iterdir()):
        moved_aside = ckpt.with_name(
            f"{ckpt.name}.before-restore-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
        os.replace(ckpt, moved_aside)
    elif ckpt.exists():
        ckpt.rmdir()
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    # Query dirs were materialised against their final paths; move the whole tree in one step.
    os.replace(staging, ckpt)
    marker = {
        "format_version": checkpoint.FORMAT_VERSION, "job": sp.job,
        "queries": list(new_fingerprint.get("queries", {})),
        "created_at": _utc(), "restored_from": sp.location,
        "fingerprint": new_fingerprint,
    }
    (ckpt / checkpoint.MARKER).write_text(json.dumps(marker, indent=2))
    return {"restored_from": sp.location, "savepoint_id": sp.id, "dropped_state": dropped,
            "previous_checkpoint_moved_to": str(moved_aside) if moved_aside else None,
            "batches": {q: sp.manifest["queries"][q]["batch"] for q in restored_queries},
            "state_partitions": {q: sp.manifest["queries"][q]["state_partitions"]
                                 for q in restored_queries}}


# -- for a registered job ------------------------------------------------------------------------

def for_job(job: str, *, target: str | None = None, stop: bool = False,
            timeout: float = 120.0) -> Savepoint:
    """Savepoint of a job known to the registry (running or not); with ``stop``, stop it first
    (stop-with-savepoint: the batch in flight commits, then the last committed batch is saved).
    The registry entry records it as ``last_savepoint``."""
    from stateful_runtime.runtime import launcher, registry

    entry = registry.require(job)
    if stop:
        entry = launcher.stop(job, timeout=timeout)
    root = target or entry.get("savepoint_dir") or str(registry.home() / "savepoints")
    sp = create(entry["checkpoint_dir"], root, kind="stop-with-savepoint" if stop else "savepoint")
    registry.update(job, last_savepoint={"id": sp.id, "location": sp.location,
                                         "created_at": sp.manifest["created_at"]})
    return sp


def protected_locations() -> set[str]:
    """Savepoints a registered job was restored from: retention never deletes them."""
    from stateful_runtime.runtime import registry

    return {e["restored_from"] for e in registry.entries() if e.get("restored_from")}
