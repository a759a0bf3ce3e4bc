"""Restore: lay a savepoint (or a mirror snapshot) out as a job's checkpoint, after checking
that the new code can take its state; rescale its state to a new partition count.

A checkpoint damaged on disk is :mod:`~stateful_runtime.checkpoints.recovery`'s."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints import keyed, layout, manifest
from stateful_runtime.checkpoints.layout import CheckpointLayout, CheckpointLock, QueryLayout
from stateful_runtime.checkpoints.manifest import (
    FORMAT_VERSION,
    ManifestMismatchError,
    Mismatch,
    Savepoint,
    sha256_file,
    utc,
)
from stateful_runtime.checkpoints.storage import (
    S3Path,
    checkpoint_path,
    is_s3,
    s3a_url,
    upload_tree,
)
from stateful_runtime.exceptions import (
    ConfigError,
    IncompatibleSavepointError,
    SavepointError,
)
from stateful_runtime.names import contained

# A native window's state signature names the type a sum accumulates in when it is not the
# input's (planner.native_aggregates): " in decimal(38,0)" since integral sums were widened.
_ACCUMULATOR = re.compile(r" in decimal\(\d+,\d+\)")
WIDENED_SUMS = (
    " (this runtime sums integral fields in decimal(38,0), which cannot overflow; the "
    "checkpoint's native-window state holds the bigint sums of an earlier version, and Spark "
    "cannot convert a state's schema. To keep this state, write those sums as "
    "Sum(field, wide=False), the old bigint sum, which fails the batch on overflow; to take "
    "the wider sum, stop the old job once its windows closed and start this code on a new "
    "checkpoint.dir)"
)


def widened(saved_sig: str, new_sig: str) -> bool:
    """Whether a native window's state signature changed only by sums widened to decimal."""
    return saved_sig != new_sig and _ACCUMULATOR.sub("", new_sig) == saved_sig


def widened_sums(saved: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    """The native-window states of checkpoint fingerprint ``saved`` that ``new`` reads with
    wider sums, as (query, what changed and the ways on): Spark's state schema check would
    refuse them after the first batch, so a restart refuses them first, by name."""
    out = []
    for qname, sq in (saved or {}).get("queries", {}).items():
        nq = new.get("queries", {}).get(qname) or {}
        for op, so in sq.get("operators", {}).items():
            no = nq.get("operators", {}).get(op) or {}
            if so.get("kind") != "native-window" or no.get("kind") != "native-window":
                continue
            for s, sig in so.get("states", {}).items():
                now_sig = no.get("states", {}).get(s)
                if isinstance(sig, str) and isinstance(now_sig, str) and widened(sig, now_sig):
                    out.append(
                        (
                            qname,
                            f"query {qname}, operator {op}: state {s!r} was {sig}, is now "
                            f"{now_sig}" + WIDENED_SUMS,
                        )
                    )
    return out


def _names(sources: Any) -> list[str]:
    """A fingerprint's source names as text, whatever an edited file put there."""
    return [str(s) for s in sources] if isinstance(sources, list) else [str(sources)]


def changed_sources(saved: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str]]:
    """(query, what changed) for each query of both fingerprints whose sources differ (a union's
    inputs added, removed or reordered; a fingerprint written before sources were in it is not
    compared): Spark keeps a query's offsets one line per source, by position, and cannot
    continue them."""
    out = []
    new_queries = new.get("queries", {})
    for qname, sq in saved.get("queries", {}).items():
        was, now = sq.get("sources"), (new_queries.get(qname) or {}).get("sources")
        if was is not None and now is not None and _names(was) != _names(now):
            what = (
                f"query {qname}: read sources {', '.join(_names(was))}, now reads "
                f"{', '.join(_names(now))} — "
                f"its checkpoint holds the offsets of each source by position, so a union's "
                f"inputs cannot be added, removed or reordered; keep the inputs as they were, "
                f"or run the changed union as a query of its own (another sink name) from its "
                f"sources"
            )
            out.append((qname, what))
    return out


def compatibility(saved: dict[str, Any], new: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(incompatible changes, state the new job no longer declares) between two fingerprints."""
    bad: list[str] = []
    dropped: list[str] = []
    if saved.get("job") != new.get("job"):
        bad.append(f"the savepoint is of job {saved.get('job')!r}, this job is {new.get('job')!r}")
        return bad, dropped
    bad += [what for _, what in changed_sources(saved, new)]
    new_queries = new.get("queries", {})
    for qname, sq in saved.get("queries", {}).items():
        nq = new_queries.get(qname)
        for op, so in sq.get("operators", {}).items():
            where = f"query {qname}, operator {op}"
            no = (nq or {}).get("operators", {}).get(op)
            if no is None:
                dropped += [
                    f"{where}: state {s!r} ({sig}) — the operator is gone"
                    for s, sig in so["states"].items()
                ]
                continue
            if so["kind"] != no["kind"]:
                why = (
                    " (sliding and session windows with built-in aggregates now run on "
                    "Spark's native aggregation, whose state the window operator's cannot "
                    "become: let the old job's windows close, then start this code on a new "
                    "checkpoint)"
                    if (so["kind"], no["kind"]) == ("window", "native-window")
                    else ""
                )
                bad.append(f"{where}: was a {so['kind']} operator, is now {no['kind']}{why}")
                continue
            if so["keys"] != no["keys"]:
                bad.append(f"{where}: keyed by {so['keys']}, now by {no['keys']}")
            elif "key_types" in so and "key_types" in no and so["key_types"] != no["key_types"]:
                # (a fingerprint written before key types were recorded compares names only)
                was, now = so["key_types"], no["key_types"]
                bad.append(
                    f"{where}: keyed by {so['keys']} of types {was}, now of types {now} (a "
                    f"key's state is found by its values: with another type every key would "
                    f"start empty and the old state stay behind)"
                )
            for s, sig in so["states"].items():
                now_sig = no["states"].get(s)
                if now_sig is None:
                    (bad if so["kind"] == "native-window" else dropped).append(
                        f"{where}: state {s!r} ({sig}) is no longer declared"
                    )
                elif now_sig != sig:
                    bad.append(
                        f"{where}: state {s!r} was {sig}, is now {now_sig}"
                        + (WIDENED_SUMS if widened(sig, now_sig) else "")
                    )
            if so["kind"] == "native-window":
                bad += [
                    f"{where}: new state {s!r} ({sig}) changes Spark's state schema"
                    for s, sig in no["states"].items()
                    if s not in so["states"]
                ]
    return bad, dropped


def check_compatible(
    saved: dict[str, Any], new: dict[str, Any], allow_non_restored: bool, where: str
) -> list[str]:
    """Raise if state with fingerprint ``saved`` (a savepoint's or a checkpoint's, at
    ``where``) cannot be restored into a job with fingerprint ``new``; returns the state left
    behind when ``allow_non_restored`` lets it go."""
    bad, dropped = compatibility(saved or {}, new)
    if bad:
        raise IncompatibleSavepointError(
            where,
            bad + dropped,
            "Restore it with the code that wrote it, or keep state names, kinds and key fields "
            "as they were (new state and new operators are fine).",
        )
    if dropped and not allow_non_restored:
        raise IncompatibleSavepointError(
            where, dropped, "Pass --allow-non-restored-state to start without that state."
        )
    return dropped


def materialize(
    sp: Savepoint, dest: Path, queries: Iterable[str] | None = None, final: Path | None = None
) -> None:
    """Copy the savepoint's files of ``queries`` (default all) into ``dest`` laid out as a
    checkpoint, verifying every file's size and sha256 and pointing Spark's operator metadata
    at ``final`` (default ``dest``), where the checkpoint will be read. ``dest`` must not
    exist; nothing is left in it on failure."""
    wanted = set(sp.manifest["queries"]) if queries is None else set(queries)
    tmp = dest.with_name(f".{dest.name}.restoring-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        # Every path first: a manifest naming one outside the checkpoint is refused whole.
        files = [
            (f, contained(tmp, f["path"], where=f"savepoint {sp.location}"))
            for f in sp.manifest["files"]
        ]
        for f, local in files:
            if f["path"].split("/", 1)[0] not in wanted:
                continue
            sp.store.get_file(sp.key(f["path"]), local)
            size, digest = local.stat().st_size, sha256_file(local)
            if size != f["size"] or digest != f["sha256"]:
                raise SavepointError(
                    f"savepoint {sp.location} is corrupt: {f['path']} has {size} bytes, sha256 "
                    f"{digest[:12]}…; the manifest says {f['size']} bytes, {f['sha256'][:12]}…"
                )
        _check_file_list(sp, tmp, wanted)
        for qname in wanted:
            relocate_operator_metadata(
                CheckpointLayout(tmp).query(qname), CheckpointLayout(final or dest).query(qname)
            )
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _check_file_list(sp: Savepoint, root: Path, wanted: Iterable[str]) -> None:
    """The files a restart of each query at its newest commit reads, as laid out at ``root``,
    are exactly the files the manifest lists: none missing, none extra."""
    bad = []
    for q in sorted(wanted):
        query = CheckpointLayout(root).query(q)
        listed = {f["path"] for f in sp.manifest["files"] if f["path"].split("/", 1)[0] == q}
        batch = query.last_committed()
        try:
            needed = (
                {f"{q}/{rel}" for rel in query.batch_files(batch)} if batch is not None else set()
            )
        except (ConfigError, OSError, ValueError, KeyError) as exc:
            bad.append(Mismatch("files", f"the files of query {q}", f"incomplete ({exc})"))
            continue
        if needed != listed:
            bad.append(
                Mismatch(
                    "files",
                    f"{len(listed)} files of query {q}"
                    + (f", also {sorted(listed - needed)}" if listed - needed else ""),
                    f"a restart at batch {batch} reads {len(needed)}"
                    + (f", also {sorted(needed - listed)}" if needed - listed else ""),
                )
            )
    if bad:
        raise ManifestMismatchError(sp.location, bad)


def relocate_operator_metadata(query: QueryLayout, final: QueryLayout) -> None:
    """Spark's operator metadata (v2) names state schema files by absolute path: point those
    paths into the restored checkpoint."""
    for meta in query.schema_metadata():
        lines = meta.read_text().splitlines()
        body = json.loads(lines[1])
        for store_info in body.get("stateStoreInfo", []):
            store_info["stateSchemaFilePaths"] = [
                _hadoop_url(final.state_path(p)) for p in store_info.get("stateSchemaFilePaths", [])
            ]
        meta.write_text("\n".join([lines[0], json.dumps(body), *lines[2:]]))
        # Hadoop's checksum of the file as it was would fail its next read.
        meta.with_name(f".{meta.name}.crc").unlink(missing_ok=True)


def _hadoop_url(path: str) -> str:
    """A file of a checkpoint as Spark's Hadoop filesystem names it."""
    return s3a_url(checkpoint_path(path)) if is_s3(path) else f"file:{path}"


def _replace_on_s3(ckpt: Path, staging: Path) -> Path | None:
    """Put the checkpoint laid out in the local directory ``staging`` at ``ckpt`` on S3, what
    was there moved aside first (the job's lease left in place). Returns where the previous
    checkpoint went."""
    moved_aside = None
    if any(p.name != CheckpointLayout(ckpt).lock_file.name for p in ckpt.iterdir()):
        moved_aside = ckpt.with_name(
            f"{ckpt.name}.before-restore-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        )
        CheckpointLayout(ckpt).move_contents(moved_aside)
    upload_tree(staging, ckpt)
    return moved_aside


def restore(
    sp: Savepoint,
    checkpoint_dir: str | Path,
    new_fingerprint: dict[str, Any],
    *,
    allow_non_restored: bool = False,
    lock: CheckpointLock | None = None,
) -> dict[str, Any]:
    """Lay ``sp`` out as the job's checkpoint at ``checkpoint_dir`` (keyed state the removed
    ``state.backend=spark`` wrote is moved into the engine when the job starts,
    :mod:`~stateful_runtime.checkpoints.migrate`).

    An existing checkpoint there is moved aside (never deleted) to
    ``<checkpoint_dir>.before-restore-<time>``, only if it is one
    (:meth:`CheckpointLayout.check_owned`: a directory holding anything else, the working or a
    home directory are refused). ``lock``, the process's lock on the directory, moves to the
    restored one. Returns what was restored (for the registry).
    """
    if sp.manifest.get("format_version") != FORMAT_VERSION:
        raise SavepointError(
            f"savepoint {sp.location} has format {sp.manifest.get('format_version')}; this "
            f"runtime reads format {FORMAT_VERSION}"
        )
    mismatches = manifest.check(sp)
    if mismatches:
        raise ManifestMismatchError(sp.location, mismatches)
    dropped = check_compatible(
        sp.manifest.get("fingerprint") or {}, new_fingerprint, allow_non_restored, sp.location
    )
    ckpt = checkpoint_path(checkpoint_dir).resolve()
    # What is there is moved aside whole: only a checkpoint of this runtime, nothing else.
    CheckpointLayout(ckpt).check_owned(moving=True)
    restored_queries = [
        q for q in sp.manifest["queries"] if q in new_fingerprint.get("queries", {})
    ]
    if isinstance(ckpt, S3Path):  # laid out on this disk, then put in place on S3
        with tempfile.TemporaryDirectory(prefix="srt-restore-") as scratch:
            staging = Path(scratch) / "checkpoint"
            materialize(sp, staging, restored_queries, final=ckpt)
            moved_aside = _replace_on_s3(ckpt, staging)
        return _restored(sp, ckpt, new_fingerprint, restored_queries, dropped, moved_aside)
    staging = ckpt.with_name(f"{ckpt.name}.restore-{secrets.token_hex(3)}")
    materialize(sp, staging, restored_queries, final=ckpt)
    if lock is not None:
        lock.follow(staging)  # the restored directory is this process's before it is in place
    moved_aside = None
    if ckpt.exists() and any(
        p.name != CheckpointLayout(ckpt).lock_file.name for p in ckpt.iterdir()
    ):
        moved_aside = ckpt.with_name(
            f"{ckpt.name}.before-restore-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        )
        os.replace(ckpt, moved_aside)
    elif ckpt.exists():  # empty, or only the lock this process holds (now on the new one)
        empty = ckpt.with_name(f".{ckpt.name}.emptied-{secrets.token_hex(3)}")
        os.replace(ckpt, empty)
        CheckpointLayout(empty).lock_file.unlink(missing_ok=True)
        empty.rmdir()
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    # Query dirs were materialised against their final paths; move the whole tree in one step.
    try:
        os.replace(staging, ckpt)
    except OSError as exc:
        raise SavepointError(
            f"{ckpt} was created by another process while this restore replaced it ({exc}); "
            f"nothing is lost: the restored checkpoint is in {staging}"
            + (f", the previous one in {moved_aside}" if moved_aside else "")
            + ". Stop the other process, then run the restore again."
        ) from None
    if lock is not None:
        lock.settle()
    return _restored(sp, ckpt, new_fingerprint, restored_queries, dropped, moved_aside)


def _restored(
    sp: Savepoint,
    ckpt: Path,
    new_fingerprint: dict[str, Any],
    restored_queries: list[str],
    dropped: Any,
    moved_aside: Path | None,
) -> dict[str, Any]:
    """Write the restored checkpoint's marker; what was restored (for the registry)."""
    marker = {
        "format_version": layout.FORMAT_VERSION,
        "job": sp.job,
        "queries": list(new_fingerprint.get("queries", {})),
        "created_at": utc(),
        "restored_from": sp.location,
        "fingerprint": new_fingerprint,
    }
    layout.write_marker(ckpt, marker)
    # What the restored checkpoint says, never what the manifest says (checked equal above).
    restored = {q: CheckpointLayout(ckpt).query(q) for q in restored_queries}
    batches = {q: query.last_committed() for q, query in restored.items()}
    return {
        "restored_from": sp.location,
        "savepoint_id": sp.id,
        "dropped_state": dropped,
        "previous_checkpoint_moved_to": str(moved_aside) if moved_aside else None,
        "batches": batches,
        "state_partitions": {
            q: None if (b := batches[q]) is None else query.state_partitions(b)
            for q, query in restored.items()
        },
    }


def restore_job(
    checkpoint_dir: str | Path,
    queries: Sequence[str],
    new_fingerprint: dict[str, Any],
    *,
    from_savepoint: str | None = None,
    savepoint_roots: Iterable[str] = (),
    restore_from: str | None = None,
    allow_non_restored: bool = False,
    lock: CheckpointLock | None = None,
) -> tuple[Savepoint, dict[str, Any]]:
    """Restore a job's checkpoint from a savepoint (by id under ``savepoint_roots`` or by
    location) or from the newest snapshot of the checkpoint mirror at ``restore_from``."""
    from stateful_runtime.checkpoints import mirror, savepoints

    ckpt = checkpoint_path(checkpoint_dir).resolve()
    if from_savepoint and restore_from:
        raise ConfigError("give --from-savepoint or --restore-from, not both")
    if from_savepoint:
        sp = savepoints.resolve(from_savepoint, savepoint_roots)
    elif restore_from:
        if ckpt.is_dir() and any(
            CheckpointLayout(ckpt).query(q).commit_log.is_dir() for q in queries
        ):
            raise ConfigError(
                f"checkpoint directory {ckpt} already holds this job's checkpoints: "
                f"--restore-from is for an empty disk; run without it to resume from them"
            )
        sp = mirror.latest(restore_from)
    else:
        raise ConfigError("restore_job needs a savepoint or a mirror location")
    return sp, restore(
        sp,
        ckpt,
        new_fingerprint,
        allow_non_restored=allow_non_restored,
        lock=lock,
    )


def rescale(
    spark: Any,
    checkpoint_dir: Path,
    queries: Sequence[str],
    parallelism: int,
    *,
    restored: bool,
    job: str,
) -> list[str]:
    """Give every stateful query ``parallelism`` state partitions; returns what was done.

    Spark fixes the count in a checkpoint's offset log; only a restore may change it (Flink's
    rule: rescale through a savepoint). Spark's checkpoint repartition writes one extra batch
    holding the redistributed state and no input (logged the same way by the runtime for a
    query whose only state is keyed, :meth:`~stateful_runtime.checkpoints.layout.QueryLayout.
    log_repartition`). Keyed state (``keyed/``) is redistributed by key-group range into
    that batch's version (:func:`~stateful_runtime.checkpoints.keyed.rescale`: staged before,
    published once Spark committed the batch); its partitioning is
    the plan's, not Spark's, so a query holding it cannot ignore a new parallelism and is
    refused instead.
    """
    notes = []
    for q in queries:
        query = CheckpointLayout(checkpoint_dir).query(q)
        batch = query.last_committed()
        current = None if batch is None else query.state_partitions(batch)
        if batch is None or current is None or current == parallelism:
            continue
        how = (
            f"rescale through a savepoint: `srt savepoint create {job} --stop`, then `srt run "
            f"... --from-savepoint ID --parallelism {parallelism}`"
        )
        if not restored and keyed.operators(query.root):
            raise ConfigError(
                f"query {q} holds keyed state in {current} partitions, and this run asks "
                f"for {parallelism}: give --parallelism "
                f"{current} to continue, or {how}"
            )
        if not restored:
            notes.append(
                f"note: query {q} keeps its {current} state partitions (parallelism "
                f"{parallelism} ignored); {how}"
            )
            continue
        # a planned batch is re-planned after the rescale
        query.offsets(batch + 1).unlink(missing_ok=True)
        notes.append(f"rescaling the state of {q} from {current} to {parallelism} partitions")
        # The repartition's batch (batch + 1) leaves state version batch + 2.
        staged = keyed.rescale(query.root, current, parallelism, batch + 1, batch + 2)
        try:
            if query.operators():
                spark._streamingCheckpointManager.repartition(str(query.root), parallelism)
            else:  # keyed state alone: no operator of Spark's to repartition
                query.log_repartition(batch, parallelism)
        except BaseException:
            keyed.discard(staged)
            raise
        keyed.publish(staged)
    return notes
