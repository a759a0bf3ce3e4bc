"""Recovery: a checkpoint damaged on disk, found before a start.

:func:`recover` checks every query's checkpoint with
:func:`~stateful_runtime.checkpoints.verify.verify` and falls back to the previous committed
batch when the damage is confined to the newest one: the damaged and superseded files move to
the checkpoint's quarantine, and the rewind the sinks then owe is kept in the checkpoint until
the runner has done it. Damage a restart at the
previous batch reads as well is refused (:class:`CorruptCheckpointError`), naming the savepoint
and the mirror to restore from (:mod:`~stateful_runtime.checkpoints.restore`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints import layout, verify
from stateful_runtime.checkpoints.layout import (
    CheckpointLayout,
    QueryLayout,
    crc_sidecar,
)
from stateful_runtime.checkpoints.manifest import utc
from stateful_runtime.checkpoints.storage import checkpoint_path, write_file
from stateful_runtime.contract import QueryRewound
from stateful_runtime.exceptions import ConfigError, StatefulRuntimeError
from stateful_runtime.instants import iso_ms, span


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
        where = checkpoint_path(checkpoint).parent
        ways = []
        if savepoint:
            ways.append(
                f"from its newest savepoint: `srt run {job_file} --from-savepoint "
                f"{savepoint}` ({savepoint_note}; the damaged checkpoint is moved aside)"
            )
        if mirror:
            ways.append(
                f"from the checkpoint mirror: move {where} aside, then "
                f"`srt run {job_file} --restore-from {mirror}`"
            )
        if not ways:
            ways.append(
                f"there is no savepoint ({savepoint_note}) and no checkpoint mirror: "
                f"to start over, move {where} aside (the job reads its "
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
    write_file(target, json.dumps(pending))


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
        f"batches {sp.summary()['batches']}, taken {utc(sp.created_at)}, in {sp.location}"
    )


def _unfinished_writes(query: QueryLayout) -> list[str]:
    """Remove Spark's temporary files in the query's offset and commit logs (``.N.<id>.tmp``:
    a write killed before its rename, never part of the log). Spark's readers skip them, but a
    query whose first batch never committed is refused with one there (Spark 4.3 wants the
    offset log of a batch-0 start empty: STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY)."""
    removed = []
    for log in (query.offset_log, query.commit_log):
        for tmp in sorted(log.glob(".*.tmp")) if log.is_dir() else []:
            tmp.unlink(missing_ok=True)
            removed.append(query.relative(tmp))
    return removed


def _move(src: Path, dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    src.replace(dest)  # (a rename; on S3 a copy and a delete)
    side = crc_sidecar(src)
    if side.exists():
        side.replace(crc_sidecar(dest))


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
    ckpt = checkpoint_path(checkpoint_dir).resolve()
    CheckpointLayout(ckpt).check_owned()  # files move only inside a checkpoint of ours
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
        if unfinished := _unfinished_writes(query):
            rec.notes.append(
                f"query {q}: removed {len(unfinished)} unfinished write(s) of its batch logs "
                f"({', '.join(unfinished)}: the process stopped before renaming them into the "
                f"log)"
            )
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
    record: dict[str, Any] = {"quarantined_at": utc(), "queries": {}}
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


# -- rewinding past a poisoned watermark (`srt checkpoint rewind`) -----------------------------


@dataclass(frozen=True)
class WatermarkBounds:
    """How far a query's logged watermark may lie ahead, as the source's event-time policy
    allows (ms; None: not bounded). Plain numbers: checkpoints import no user API."""

    max_ahead_of_processing_time_ms: int | None
    max_ahead_of_watermark_ms: int | None

    def broken(self, query: QueryLayout) -> tuple[int, str] | None:
        """The first batch whose logged watermark lies further ahead than the policy lets any
        event time lie, and why; None if every logged watermark is plausible.

        A record accepted in batch ``b`` lies at most ``ahead`` past batch ``b``'s processing
        time, so batch ``b + 1``'s watermark (max event time - delay) cannot pass its own
        processing time by more; likewise for the watermark bound, batch to batch."""
        previous = 0
        for b in query.planned_batches():
            try:
                ts, wm = query.batch_times(b)
            except (OSError, ValueError, IndexError):
                continue  # a damaged entry is recover()'s business at the next start
            wm = int(wm or 0)
            ahead = self.max_ahead_of_processing_time_ms
            if ahead is not None and ts is not None and wm > ts + ahead:
                return b, (
                    f"its watermark {iso_ms(wm)} is {span(wm - ts)} ahead of its processing "
                    f"time {iso_ms(ts)} (max_ahead_of_processing_time "
                    f"{_td(ahead)})"
                )
            ahead = self.max_ahead_of_watermark_ms
            if ahead is not None and previous > 0 and wm > previous + ahead:
                return b, (
                    f"its watermark {iso_ms(wm)} jumped {span(wm - previous)} past batch "
                    f"{b - 1}'s {iso_ms(previous)} (max_ahead_of_watermark {_td(ahead)})"
                )
            previous = max(previous, wm)
        return None


def _td(ms: int) -> str:
    from datetime import timedelta

    return str(timedelta(milliseconds=ms))


def rewind(
    checkpoint_dir: str | Path,
    queries: dict[str, WatermarkBounds],
    *,
    from_batch: int | None = None,
    query: str | None = None,
    dry_run: bool = False,
) -> tuple[list[QueryRewound], Path | None]:
    """Undo a query's batches from the one that poisoned its watermark on, keeping its state.

    Per query (or only ``query``): the batch to re-run is ``from_batch`` if given, else the
    batch before the first whose logged watermark breaks its :class:`WatermarkBounds` (that
    batch read the record that moved it). The commit of that batch and of every later one,
    the offsets of every later batch and the state versions they wrote move to the
    checkpoint's quarantine (never deleted; ``quarantine.json`` says what and why), and the
    rewind the sinks owe is recorded first: the next start re-runs the batch with its logged
    offsets and watermark from the previous batch's state (with the policy now in force its
    reader dead-letters the poisoning record) and plans the rest again; the sinks forget the
    undone batches before it (their rows are written again by batch id). Refused with nothing
    changed when the state of the batch before is no longer retained.

    Returns:
        One :class:`~stateful_runtime.contract.QueryRewound` per query rewound, and the
        quarantine directory (None on a dry run or when nothing was found).
    """
    ckpt = checkpoint_path(checkpoint_dir).resolve()
    layout_ = CheckpointLayout(ckpt)
    layout_.check_owned(moving=True)
    if query is not None and query not in queries:
        raise ConfigError(
            f"the job has no query {query!r}; its queries: {', '.join(sorted(queries))}"
        )
    plans: list[tuple[QueryRewound, list[tuple[str, str]]]] = []
    for name, bounds in queries.items():
        if query not in (None, name):
            continue
        q = layout_.query(name)
        if not q.offset_log.is_dir():
            continue
        planned = q.planned_batches()
        if from_batch is not None:
            if from_batch not in planned:
                raise ConfigError(
                    f"query {name}: batch {from_batch} is not in its offset log "
                    f"({q.offset_log}: batches {planned[0] if planned else '-'}.."
                    f"{planned[-1] if planned else '-'}); name a batch it holds"
                )
            rerun, why = from_batch, f"batch {from_batch} named (--from-batch)"
        else:
            found = bounds.broken(q)
            if found is None:
                continue
            poisoned, what = found
            rerun = poisoned - 1
            why = (
                f"batch {poisoned}'s watermark is poisoned: {what}; batch {rerun} read the "
                f"record that moved it"
            )
        restart = rerun - 1
        if rerun not in planned:
            raise ConfigError(
                f"query {name}: {why}, but batch {rerun}'s offsets are no longer in the "
                f"offset log (Spark keeps the last 100 batches): restore a savepoint taken "
                f"before batch {rerun + 1} (`srt savepoint list`), then run the job"
            )
        problems = verify.verify(q.root, restart, pending=True)
        if problems:
            raise ConfigError(
                f"query {name}: {why}; re-running batch {rerun} needs batch {restart}'s files "
                f"and state, which are missing or damaged ("
                + "; ".join(str(p) for p in problems)
                + f"): restore a savepoint taken before batch {rerun + 1} (`srt savepoint "
                f"list`); nothing was changed"
            )
        moves = [
            (q.relative(q.commit(b)), f"undone: batch {b} is re-run")
            for b in q.committed_batches()
            if b >= rerun
        ]
        moves += [
            (q.relative(q.offsets(b)), f"undone: batch {b} is planned again")
            for b in planned
            if b > rerun
        ]
        moves += [
            (q.relative(p), "state written by an undone batch")
            for p in q.state_files_after(rerun)
            if not p.name.endswith(".crc")
        ]
        plans.append((QueryRewound(name, rerun, restart, why, tuple(m for m, _ in moves)), moves))
    if dry_run or not plans:
        return [r for r, _ in plans], None
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    dest, n = layout_.quarantine / stamp, 1
    while dest.exists():
        n += 1
        dest = layout_.quarantine / f"{stamp}-{n}"
    for r, _ in plans:  # durable before anything moves
        _set_pending(ckpt, r.query, r.restart_after)
    record: dict[str, Any] = {"rewound_at": utc(), "queries": {}}
    for r, moves in plans:
        qdir = layout_.query(r.query).root
        for rel, _why in moves:
            if (qdir / rel).exists():
                _move(qdir / rel, dest / r.query / rel)
        record["queries"][r.query] = {
            **r.to_json(),
            "sinks_rewound_to": r.restart_after,
            "moved": [{"path": rel, "why": why} for rel, why in moves],
        }
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "quarantine.json").write_text(json.dumps(record, indent=1))
    return [r for r, _ in plans], dest
