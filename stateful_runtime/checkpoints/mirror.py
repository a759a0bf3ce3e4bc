"""Incremental checkpoint mirror: checkpoints that survive the loss of the disk.

Spark writes checkpoints to a local (or shared) filesystem; there are no s3a jars here. After
each committed batch, :class:`CheckpointMirror` uploads to ``checkpoint.mirror`` (a directory or
``s3://bucket/prefix``) only the files that batch added — the batch's offsets and commit, the
RocksDB changelogs of the keys it touched, and now and then a new snapshot with its new SST
files — then a small mirror manifest naming every file a restart at that batch needs. Files no
longer named by the last :data:`KEEP_MANIFESTS` manifests are deleted.

Layout under the mirror location::

    <query>/...                     checkpoint files, as in the checkpoint directory
    _mirror/<epoch ms>.json         one manifest per mirrored batch (the newest is the restore
                                    point); same shape as a savepoint manifest

``srt run JOB --restore-from <location>`` lays the newest manifest's files out as the job's
checkpoint on an empty disk (checksums verified) and the job continues exactly once from there.

An unreachable location never stops the job: a sync that fails writes no manifest (the newest
one still names a complete earlier batch), says so once, and the next sync after a committed
batch uploads everything missing since (the mirror catches up).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints import keyed, layout
from stateful_runtime.checkpoints.layout import CheckpointLayout
from stateful_runtime.checkpoints.manifest import (
    Savepoint,
    new_manifest,
    query_entry,
    read_manifest,
    seal_mismatch,
    sha256_file,
)
from stateful_runtime.checkpoints.storage import Store, checkpoint_path, open_store
from stateful_runtime.exceptions import SavepointError, StorageError

PREFIX = "_mirror/"
KEEP_MANIFESTS = 3


@dataclass
class MirrorSync:
    """What one sync uploaded."""

    batches: dict[str, int]
    files_uploaded: int
    bytes_uploaded: int
    bytes_referenced: int


def _manifests(store: Store) -> list[str]:
    return sorted(o.key for o in store.list(PREFIX) if o.key.endswith(".json"))


class CheckpointMirror:
    """Mirror one job's checkpoint directory to ``location`` after each committed batch."""

    def __init__(
        self, checkpoint_dir: str | Path, location: str, warn: Callable[[str], None] | None = None
    ) -> None:
        self.checkpoint_dir = checkpoint_path(checkpoint_dir).resolve()
        self.store = open_store(location)
        self.location = location
        # path -> {"size", "sha256"} of every file already in the mirror (from its newest
        # manifest, read at the first sync, so a restarted job does not upload its state again).
        self.known: dict[str, dict[str, Any]] = {}
        self._loaded = False
        # Keyed state's commit records (``keyed/<op>/<V>.commit``) keep their name when a
        # batch runs again after a fallback at start, at the same size (its state files are
        # the new attempt's, named by its token): one known from an earlier run's manifest is
        # compared by checksum, once per run, not by size.
        self._seen: set[str] = set()
        self.synced: dict[str, int] = {}
        self.failed_syncs = 0  # in a row; 0 while the location answers
        self.warn = warn or (lambda text: print(text, file=sys.stderr, flush=True))

    def sync(self) -> MirrorSync | None:
        """Upload what the newest committed batches added; None if nothing was committed since
        the last sync, or if the location could not be reached (said once per outage; the next
        sync retries and catches up)."""
        try:
            done = self._sync()
        except StorageError as exc:
            if not self.failed_syncs:
                self.warn(
                    f"checkpoint mirror: sync to {self.location} failed ({exc}); the job "
                    f"keeps running and the mirror retries until it answers (mirrored so "
                    f"far: batches {self.synced or 'none'})"
                )
            self.failed_syncs += 1
            return None
        if self.failed_syncs:
            self.warn(
                f"checkpoint mirror: {self.location} answers again after "
                f"{self.failed_syncs} failed sync(s); caught up to batches {self.synced}"
            )
            self.failed_syncs = 0
        return done

    def _sync(self) -> MirrorSync | None:
        if not self._loaded:
            names = _manifests(self.store)
            if names:
                latest = read_manifest(self.store, names[-1])
                # An edited manifest is not believed: everything is uploaded again.
                if seal_mismatch(latest) is None:
                    self.known = {f["path"]: f for f in latest["files"]}
            self._loaded = True
        owner = layout.owner(self.checkpoint_dir)
        batches: dict[str, int] = {}
        for q in owner.get("queries", []):
            b = CheckpointLayout(self.checkpoint_dir).query(q).last_committed()
            if b is not None:
                batches[q] = b
        if not batches or batches == self.synced:
            return None
        entries, queries = [], {}
        uploaded = uploaded_bytes = 0
        for q, batch in batches.items():
            query = CheckpointLayout(self.checkpoint_dir).query(q)
            queries[q] = query_entry(query, batch, pending=False)
            for rel in query.batch_files(batch, pending=False):
                key, path = f"{q}/{rel}", query.root / rel
                entry = self.known.get(key)
                # Offsets/commits/changelogs are new names every batch; a file with a known
                # name is immutable in Spark's checkpoint except the query metadata.
                if entry is not None and key not in self._seen:
                    self._seen.add(key)
                    if rel.startswith(f"{keyed.KEYED_DIR}/") and rel.endswith(keyed.COMMIT):
                        entry = entry if sha256_file(path) == entry["sha256"] else None
                if entry is None or entry["size"] != path.stat().st_size:
                    entry = {"path": key, "size": path.stat().st_size, "sha256": sha256_file(path)}
                    self.store.put_file(path, key)
                    uploaded += 1
                    uploaded_bytes += entry["size"]
                    self.known[key] = entry
                    self._seen.add(key)
                entries.append(entry)
        manifest = new_manifest("mirror", "", owner, queries, entries)
        self.store.put_bytes(
            f"{PREFIX}{int(manifest['created_at_epoch'] * 1000):015d}.json",
            json.dumps(manifest).encode(),
        )
        self._prune()
        self.synced = batches
        return MirrorSync(batches, uploaded, uploaded_bytes, sum(e["size"] for e in entries))

    def _prune(self) -> None:
        names = _manifests(self.store)
        old, keep = names[:-KEEP_MANIFESTS], names[-KEEP_MANIFESTS:]
        if not old:
            return
        live = {f["path"] for n in keep for f in read_manifest(self.store, n)["files"]}
        self.store.delete(old)
        dead = [k for k in list(self.known) if k not in live]
        self.store.delete(dead)
        for k in dead:
            del self.known[k]


def latest(location: str) -> Savepoint:
    """The newest mirrored batch at ``location``, as a savepoint to restore."""
    store = open_store(location)
    names = _manifests(store)
    if not names:
        raise SavepointError(
            f"no mirrored checkpoint at {location}: a job mirrors there only with "
            f"checkpoint.mirror set and after its first committed batch"
        )
    return Savepoint(store, "", read_manifest(store, names[-1]))
