"""Restore: lay a savepoint (or a mirror snapshot) out as a job's checkpoint, after checking
that the new code can take its state; rescale its state to a new partition count."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints import layout, verify
from stateful_runtime.checkpoints.layout import CheckpointLayout, QueryLayout, crc_sidecar
from stateful_runtime.checkpoints.manifest import FORMAT_VERSION, Savepoint, _utc, sha256_file
from stateful_runtime.exceptions import (
    ConfigError,
    IncompatibleSavepointError,
    SavepointError,
    StatefulRuntimeError,
)
from stateful_runtime.names import contained


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
            for s, sig in so["states"].items():
                now_sig = no["states"].get(s)
                if now_sig is None:
                    (bad if so["kind"] == "native-window" else dropped).append(
                        f"{where}: state {s!r} ({sig}) is no longer declared"
                    )
                elif now_sig != sig:
                    bad.append(f"{where}: state {s!r} was {sig}, is now {now_sig}")
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
        for qname in wanted:
            _relocate_operator_metadata(
                CheckpointLayout(tmp).query(qname), CheckpointLayout(final or dest).query(qname)
            )
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _relocate_operator_metadata(query: QueryLayout, final: QueryLayout) -> None:
    """Spark's operator metadata (v2) names state schema files by absolute path: point those
    paths into the restored checkpoint."""
    for meta in query.schema_metadata():
        lines = meta.read_text().splitlines()
        body = json.loads(lines[1])
        for store_info in body.get("stateStoreInfo", []):
            store_info["stateSchemaFilePaths"] = [
                f"file:{final.state_path(p)}" for p in store_info.get("stateSchemaFilePaths", [])
            ]
        meta.write_text("\n".join([lines[0], json.dumps(body), *lines[2:]]))


def restore(
    sp: Savepoint,
    checkpoint_dir: str | Path,
    new_fingerprint: dict[str, Any],
    *,
    allow_non_restored: bool = False,
) -> dict[str, Any]:
    """Lay ``sp`` out as the job's checkpoint at ``checkpoint_dir``.

    An existing checkpoint there is moved aside (never deleted) to
    ``<checkpoint_dir>.before-restore-<time>``. Returns what was restored (for the registry).
    """
    if sp.manifest.get("format_version") != FORMAT_VERSION:
        raise SavepointError(
            f"savepoint {sp.location} has format {sp.manifest.get('format_version')}; this "
            f"runtime reads format {FORMAT_VERSION}"
        )
    dropped = check_compatible(
        sp.manifest.get("fingerprint") or {}, new_fingerprint, allow_non_restored, sp.location
    )
    ckpt = Path(checkpoint_dir).resolve()
    restored_queries = [
        q for q in sp.manifest["queries"] if q in new_fingerprint.get("queries", {})
    ]
    staging = ckpt.with_name(f"{ckpt.name}.restore-{secrets.token_hex(3)}")
    materialize(sp, staging, restored_queries, final=ckpt)
    moved_aside = None
    if ckpt.exists() and any(ckpt.iterdir()):
        moved_aside = ckpt.with_name(
            f"{ckpt.name}.before-restore-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        )
        os.replace(ckpt, moved_aside)
    elif ckpt.exists():
        ckpt.rmdir()
    ckpt.parent.mkdir(parents=True, exist_ok=True)
    # Query dirs were materialised against their final paths; move the whole tree in one step.
    os.replace(staging, ckpt)
    marker = {
        "format_version": layout.FORMAT_VERSION,
        "job": sp.job,
        "queries": list(new_fingerprint.get("queries", {})),
        "created_at": _utc(),
        "restored_from": sp.location,
        "fingerprint": new_fingerprint,
    }
    layout.write_marker(ckpt, marker)
    return {
        "restored_from": sp.location,
        "savepoint_id": sp.id,
        "dropped_state": dropped,
        "previous_checkpoint_moved_to": str(moved_aside) if moved_aside else None,
        "batches": {q: sp.manifest["queries"][q]["batch"] for q in restored_queries},
        "state_partitions": {
            q: sp.manifest["queries"][q]["state_partitions"] for q in restored_queries
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
) -> tuple[Savepoint, dict[str, Any]]:
    """Restore a job's checkpoint from a savepoint (by id under ``savepoint_roots`` or by
    location) or from the newest snapshot of the checkpoint mirror at ``restore_from``."""
    from stateful_runtime.checkpoints import mirror, savepoints

    ckpt = Path(checkpoint_dir).resolve()
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
    return sp, restore(sp, ckpt, new_fingerprint, allow_non_restored=allow_non_restored)


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
    holding the redistributed state and no input.
    """
    notes = []
    for q in queries:
        query = CheckpointLayout(checkpoint_dir).query(q)
        batch = query.last_committed()
        current = None if batch is None else query.state_partitions(batch)
        if current is None or current == parallelism:
            continue
        if not restored:
            notes.append(
                f"note: query {q} keeps its {current} state partitions (parallelism "
                f"{parallelism} ignored); rescale through a savepoint: `srt savepoint create "
                f"{job} --stop`, then `srt run ... --from-savepoint ID --parallelism "
                f"{parallelism}`"
            )
            continue
        # a planned batch is re-planned after the rescale
        query.offsets(batch + 1).unlink(missing_ok=True)
        notes.append(f"rescaling the state of {q} from {current} to {parallelism} partitions")
        spark._streamingCheckpointManager.repartition(str(query.root), parallelism)
    return notes


# -- a damaged checkpoint at start --------------------------------------------------------------


class CorruptCheckpointError(ConfigError):
    """A file a restart needs is damaged or missing, and the previous committed batch cannot
    take the newest one's place (its files are damaged too). Nothing was changed.

    Attributes:
        checkpoint: the query's checkpoint directory.
        problems: each damaged file and what is wrong with it.
        savepoint: id of the job's newest savepoint to restore from (None: there is none).
        mirror: the job's checkpoint mirror (None: not mirrored).
    """

    def __init__(
        self,
        checkpoint: str,
        problems: list[str],
        job_file: str,
        savepoint: str | None,
        mirror: str | None,
        savepoint_note: str,
    ) -> None:
        self.checkpoint, self.problems = checkpoint, problems
        self.savepoint, self.mirror = savepoint, mirror
        ways = []
        if savepoint:
            ways.append(
                f"from its newest savepoint: `srt run {job_file} --from-savepoint "
                f"{savepoint}` ({savepoint_note}; the damaged checkpoint is moved aside)"
            )
        if mirror:
            ways.append(
                f"from the checkpoint mirror: move {Path(checkpoint).parent} aside, then "
                f"`srt run {job_file} --restore-from {mirror}`"
            )
        if not ways:
            ways.append(
                f"there is no savepoint ({savepoint_note}) and no checkpoint mirror: "
                f"to start over, move {Path(checkpoint).parent} aside (the job reads its "
                f"sources from the start again; its sinks keep what they hold)"
            )
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(
            f"checkpoint {checkpoint} cannot be restarted; files it needs are damaged:\n{lines}\n"
            f"Falling back to the previous committed batch does not help (its files are damaged "
            f"too); nothing was changed. Restore the job " + "; or ".join(ways) + "."
        )


@dataclass
class Recovery:
    """What checking a job's checkpoint before its queries start did.

    Attributes:
        notes: what was found and done, for the job's output.
        rewind: per query, the batch its sinks must forget everything after (a batch after it
            is planned again, perhaps with other offsets, and must not be skipped as done).
        quarantine: where damaged and superseded files were moved (None: nothing moved).
    """

    notes: list[str] = field(default_factory=list)
    rewind: dict[str, int] = field(default_factory=dict)
    quarantine: Path | None = None
    checkpoint: Path | None = None

    def rewound(self, query: str) -> None:
        """Every sink of ``query`` has been rewound: the pending rewind is done."""
        if self.checkpoint is not None:
            _set_pending(self.checkpoint, query, None)


# A rewind the sinks still owe, per query (CheckpointLayout.pending_rewind): written before
# any file is moved aside and cleared once the runner rewound the sinks, so a crash in between
# cannot leave a sink ledger holding batches of the old plan that the new plan would then skip
# as done.
def _pending(ckpt: Path) -> dict[str, int]:
    path = CheckpointLayout(ckpt).pending_rewind
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} is unreadable ({exc}): it names the batch each query's "
            f"sinks must be rewound to after a checkpoint fell back. Restore the job from a "
            f"savepoint, or delete the file if no sink holds a batch after that one"
        ) from None
    return {str(q): int(b) for q, b in data.items()}


def _set_pending(ckpt: Path, query: str, batch: int | None) -> None:
    pending = _pending(ckpt)
    if batch is None:
        pending.pop(query, None)
    else:
        pending[query] = min(batch, pending.get(query, batch))
    target = CheckpointLayout(ckpt).pending_rewind
    if not pending:
        target.unlink(missing_ok=True)
        return
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(pending))
    os.replace(tmp, target)


@dataclass
class _Fallback:
    restart_at: int  # the committed batch the restart resumes after (-1: none)
    replay: int | None  # the planned batch Spark re-runs with its logged offsets
    moves: list[tuple[str, str]]  # (path relative to the query dir, why)
    rewind: bool


def _fallback(query: QueryLayout, problems: list[verify.Problem]) -> _Fallback | None:
    """The newest restart point at most one committed batch back whose files are all sound.

    Candidates, newest first: the last committed batch ``C`` without the batch planned after it;
    ``C - 1`` re-running batch ``C`` with its logged offsets; ``C - 1`` planning batch ``C``
    again. A corrupt query ``metadata`` only holds the query id: it is moved aside whatever the
    restart point (Spark writes a new one)."""
    moves = [(p.path, p.problem) for p in problems if p.kind == "metadata"]
    data = [p for p in problems if p.kind != "metadata"]
    committed, last_planned = query.last_committed(), query.last_planned()
    c = -1 if committed is None else committed
    planned = max(c, -1 if last_planned is None else last_planned)
    if not data:
        return _Fallback(c, None, moves, False)
    why = {p.path: p.problem for p in data}
    for r, keep in ((c, False), (c - 1, True), (c - 1, False)):
        if r < -1 or verify.verify(query.root, r, pending=keep):
            continue
        replay = r + 1 if keep and query.offsets(r + 1).exists() else None
        kept = r if replay is None else replay
        out = list(moves)
        for batches, entry, above, later in (
            (query.committed_batches(), query.commit, r, "re-run"),
            (query.planned_batches(), query.offsets, kept, "planned again"),
        ):
            for b in batches:
                if b > above:
                    rel = query.relative(entry(b))
                    out.append((rel, why.get(rel, f"superseded: batch {b} is {later}")))
        out += [
            (query.relative(p), "written by a batch that is re-run")
            for p in query.state_files_after(r + 1)
            if not p.name.endswith(".crc")
        ]
        return _Fallback(r, replay, out, planned > kept)
    return None


def _newest_savepoint(root: str | None, job: str) -> tuple[str | None, str]:
    """(id, a note on it or on why there is none) of the job's newest savepoint under root."""
    from stateful_runtime.checkpoints import savepoints

    if not root:
        return None, "no savepoint directory configured"
    try:
        found = savepoints.list_savepoints(root, job)
    except StatefulRuntimeError as exc:
        return None, f"savepoints under {root} could not be listed: {exc}"
    if not found:
        return None, f"none of job {job!r} under {root}"
    sp = found[-1]
    return sp.id, (
        f"batches {sp.summary()['batches']}, taken {_utc(sp.created_at)}, in {sp.location}"
    )


def _move(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dest)
    side = crc_sidecar(src)
    if side.exists():
        os.replace(side, crc_sidecar(dest))


def recover(
    checkpoint_dir: str | Path,
    queries: Sequence[str],
    *,
    job_file: str = "JOB_FILE",
    savepoint_dir: str | None = None,
    mirror: str | None = None,
) -> Recovery:
    """Check every query's checkpoint before a start (:func:`verify.verify`) and make it
    restartable, or refuse.

    Damage confined to the newest batch — a truncated, garbage, empty or missing newest
    ``commits/N`` or ``offsets/N``, or the newest state version — falls back to the previous
    committed batch: the damaged file and everything newer are moved (never deleted) to
    ``<checkpoint.dir>/_quarantine/<UTC time>/<query>/``, and Spark re-runs the batch from the
    previous batch's state. A re-run with the logged offsets is skipped by the sinks (they are
    idempotent by batch id); a batch planned again, perhaps with other offsets, is named in
    :attr:`Recovery.rewind` (the runner rewinds its sinks). Damage that a restart at the
    previous batch reads as well (older offsets, older state files) raises
    :class:`CorruptCheckpointError` naming every file, the newest savepoint and the mirror to
    restore from; then nothing moves.
    """
    ckpt = Path(checkpoint_dir).resolve()
    job = layout.owner(ckpt)["job"]
    rec = Recovery(checkpoint=ckpt)
    for q, batch in _pending(ckpt).items():  # an earlier start moved files, then stopped
        if q in queries:
            rec.rewind[q] = batch
            rec.notes.append(
                f"query {q}: its sinks still owe a rewind to batch {batch} (an "
                f"earlier start fell back and stopped before rewinding them)"
            )
    plans: dict[str, tuple[_Fallback, list[verify.Problem]]] = {}
    for q in queries:
        query = CheckpointLayout(ckpt).query(q)
        if not query.offset_log.is_dir():
            continue
        problems = verify.verify(query.root)
        if not problems:
            continue
        fb = _fallback(query, problems)
        if fb is None:
            sid, note = _newest_savepoint(savepoint_dir, job)
            raise CorruptCheckpointError(
                str(query.root), [str(p) for p in problems], job_file, sid, mirror, note
            )
        plans[q] = (fb, problems)
    if not plans:
        return rec
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    quarantine = CheckpointLayout(ckpt).quarantine
    dest, n = quarantine / stamp, 1
    while dest.exists():
        n += 1
        dest = quarantine / f"{stamp}-{n}"
    replanned = {q for q, (fb, _) in plans.items() if fb.rewind}
    for q in replanned:  # durable before anything moves
        _set_pending(ckpt, q, plans[q][0].restart_at)
    record: dict[str, Any] = {"quarantined_at": _utc(), "queries": {}}
    for q, (fb, problems) in plans.items():
        qdir = CheckpointLayout(ckpt).query(q).root
        for rel, _why in fb.moves:
            if (qdir / rel).exists():
                _move(qdir / rel, dest / q / rel)
        record["queries"][q] = {
            "problems": [str(p) for p in problems],
            "restart_after_batch": fb.restart_at,
            "rerun_batch": fb.replay,
            "sinks_rewound_to": fb.restart_at if fb.rewind else None,
            "moved": [{"path": rel, "why": why} for rel, why in fb.moves],
        }
        damaged = "; ".join(str(p) for p in problems)
        if fb.replay is not None:
            what = (
                f"batch {fb.replay} is re-run with its logged offsets from batch "
                f"{fb.restart_at}'s state (its sinks skip or rewrite it by batch id)"
            )
        elif fb.restart_at >= 0:
            what = f"it resumes after committed batch {fb.restart_at}"
        else:
            what = "no batch is committed any more: it starts from its first batch"
        rec.notes.append(
            f"checkpoint of query {q} is damaged ({damaged}); moved "
            f"{len(fb.moves)} file(s) to {dest / q}; {what}"
        )
        if fb.rewind:
            rec.rewind[q] = min(fb.restart_at, rec.rewind.get(q, fb.restart_at))
            rec.notes.append(
                f"query {q}: batches after {fb.restart_at} are planned again from "
                f"the source offsets; its sinks forget them first (rewind)"
            )
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "quarantine.json").write_text(json.dumps(record, indent=1))
    rec.quarantine = dest
    return rec
