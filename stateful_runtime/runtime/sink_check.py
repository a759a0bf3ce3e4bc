"""A job's sink tables checked against its checkpoint before it starts: never a silent hole.

Spark's checkpoint says which micro-batches committed; each warehouse sink's ledger says which
it wrote, and with each the table's rows after it (:mod:`stateful_runtime.ledger`). A table
truncated, dropped, or its database file deleted while the job was stopped (or the ledger
deleted, or the checkpoint replaced under a table that holds later batches) would otherwise
resume with exit 0: the closed windows gone for good, or later batches skipped as already
written. :func:`check` refuses instead (:class:`SinkDataLostError`, with the ways back), and
each sink checks again before every batch it writes (:attr:`Sink.expected_batch`), so a table
dropped while the job runs is not silently recreated.

Which sinks a checkpoint's batches were written to is recorded beside them, per query, in
``<query>/srt_sinks.json`` (``{"sinks": {name: {"since": first batch}}}``; savepoints and the
mirror carry it, :meth:`QueryLayout.batch_files`): a sink an upgrade added starts with nothing
expected of it, a sink that was there must hold what was committed. A checkpoint written
before the record existed counts every sink as there from batch 0.

The ways back, each one command (:func:`ways_back`): ``srt run --replay-sinks`` (a fresh table
from the source's retained records; the checkpoint moved aside, the table renamed, both
kept), the same with ``--from-savepoint`` (a fresh table from a savepoint: only what comes
after it), ``srt sink accept`` (go on over the hole: the operator's decision, in the ledger).
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints.layout import CheckpointLayout, QueryLayout
from stateful_runtime.checkpoints.storage import write_file
from stateful_runtime.exceptions import ConfigError, SinkDataLostError
from stateful_runtime.masking import mask_value
from stateful_runtime.planner import QueryPlan

RECORD_FORMAT = 1
# What a table set aside for a replay is renamed to: <table>_lost_<UTC time>.
ASIDE_SUFFIX = "_lost_%Y%m%dT%H%M%S"


def record_path(query: QueryLayout) -> Path:
    """Where a query's checkpoint records its sinks."""
    return query.sinks_record


def _read(query: QueryLayout) -> dict[str, Any] | None:
    path = record_path(query)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise ConfigError(
            f"{path} is unreadable ({exc}): it records which batches each sink of the query "
            f"was given. Restore the job from a savepoint, or delete the file (every sink is "
            f"then checked as if it had been there from the first batch)"
        ) from None
    version = data.get("format_version") if isinstance(data, dict) else None
    if version != RECORD_FORMAT:
        raise ConfigError(
            f"{path} has format {version!r}; this runtime reads format {RECORD_FORMAT}"
        )
    return data


def read_record(query: QueryLayout) -> dict[str, dict[str, Any]] | None:
    """The query's sinks as its checkpoint records them (None: nothing recorded: a new
    checkpoint, or one written before the record existed)."""
    data = _read(query)
    if data is None:
        return None
    return {str(k): dict(v) for k, v in (data.get("sinks") or {}).items()}


def write_record(
    query: QueryLayout,
    sinks: Mapping[str, Mapping[str, Any]],
    no_output: Sequence[int] | None = None,
) -> None:
    """Replace the query's record of its sinks (atomically); the batches that went to no sink
    (:func:`record_no_output`) are kept unless ``no_output`` is given."""
    if no_output is None:
        no_output = _no_output(query)
    doc: dict[str, Any] = {"format_version": RECORD_FORMAT, "sinks": dict(sinks)}
    if no_output:
        doc["no_output"] = sorted(set(no_output))
    write_file(record_path(query), json.dumps(doc, indent=1))


def _no_output(query: QueryLayout) -> list[int]:
    data = _read(query)
    return [int(b) for b in (data or {}).get("no_output") or ()]


def record_no_output(query: QueryLayout, q: QueryPlan, batch: int) -> None:
    """Record that committed batch ``batch`` of query ``q`` went to no sink: Spark's checkpoint
    repartition (a rescale) commits one batch holding the redistributed state and no input,
    which no sink is given, so no ledger has it; the check then asks the sinks for the batch
    before it. A checkpoint without a record counts every sink as there from batch 0."""
    sinks = read_record(query)
    if sinks is None:
        sinks = {o.name: {"since": 0} for o in q.outputs}
    write_record(query, sinks, [*_no_output(query), batch])


def _held(query: QueryLayout, committed: int | None) -> int | None:
    """The newest committed batch a sink was given: ``committed`` less the batches that went
    to no sink at the end of the log."""
    silent = set(_no_output(query))
    while committed is not None and committed in silent:
        committed = committed - 1 if committed > 0 else None
    return committed


@dataclass(frozen=True)
class Checked:
    """One sink as the start check left it.

    Attributes:
        query: its query.
        sink: its name.
        since: the first batch of the checkpoint it was given.
        expected_batch: the newest batch its table must hold before the next write (None:
            nothing yet).
        note: what the check says of it (a sink added by an upgrade...), or "".
    """

    query: str
    sink: str
    since: int
    expected_batch: int | None
    note: str = ""


def check(
    job: str,
    queries: Sequence[QueryPlan],
    layout: CheckpointLayout,
    *,
    rewinds: Mapping[str, int],
) -> list[Checked]:
    """Compare each warehouse sink's table and ledger with the checkpoint; raise
    :class:`SinkDataLostError` (without its ways back: :func:`ways_back`) at the first
    sink that lacks what was committed into it, or whose ledger holds batches the checkpoint
    does not (and no rewind will forget). Called before ``rewind``: a restore's or a
    fallback's batch is in ``rewinds``. Records sinks new to the checkpoint and sets each
    sink's :attr:`~stateful_runtime.connectors.base.Sink.expected_batch`."""
    out = []
    for q in queries:
        query = layout.query(q.name)
        committed = query.last_committed()
        last = -1 if committed is None else committed
        record = read_record(query)
        sinks = dict(record or {})
        for o in q.outputs:
            observed = o.sink.observe(job, o.name)
            if observed is None:
                continue
            note = ""
            if o.name not in sinks:
                # Not in the record: new to the checkpoint if it keeps one (an upgrade added
                # it); else the checkpoint is older than the record: there from the start.
                since = last + 1 if record is not None else 0
                if record is not None and committed is not None:
                    note = (
                        f"sink {o.name} is new to the checkpoint (added by an upgrade?): it "
                        f"takes the batches after {committed}"
                    )
                sinks[o.name] = {"since": since}
            since = int(sinks[o.name]["since"])
            rewind = rewinds.get(q.name)
            held = _held(query, committed)
            if held is not None and held >= since:
                observed.check_holds(job, o.name, held)
            ahead = observed.last_batch
            if rewind is None and ahead is not None and ahead > last + 1:
                # One batch ahead is a crash between the sink's commit and Spark's; more is
                # a checkpoint replaced or deleted: those batches would be skipped as written.
                raise observed.lost(
                    job,
                    o.name,
                    "ledger_ahead",
                    f"its {observed.ledger} records batches up to {ahead} but the job's "
                    f"checkpoint {'has none committed' if committed is None else f'ends at {committed}'}"  # noqa: E501
                    f" (the checkpoint was deleted or replaced): batches "
                    f"{last + 1}..{ahead} would be skipped as already written",
                    committed,
                )
            expected = observed.last_batch
            if expected is not None and rewind is not None:
                expected = min(expected, rewind)
            if expected is not None and expected < since - 1:
                expected = None
            o.sink.expected_batch = expected
            out.append(Checked(q.name, o.name, since, expected, note))
        # A query that has committed nothing and has no record yet is recorded once Spark has
        # started it (record_started): a start refused later must not leave a directory.
        if sinks != (record or {}) and (record is not None or committed is not None):
            write_record(query, sinks)
    return out


def record_started(query: QueryLayout, q: QueryPlan) -> None:
    """Once Spark started query ``q``: record its sinks, from batch 0, if nothing is recorded
    (a new checkpoint), so a sink an upgrade adds later is known to be new."""
    if read_record(query) is None and query.last_committed() is None:
        write_record(query, {o.name: {"since": 0} for o in q.outputs})


def ways_back(
    error: SinkDataLostError,
    job_file: str,
    config: Mapping[str, Any],
    defaults: Mapping[str, Any],
    newest_savepoint: tuple[str, int | None] | None,
) -> list[str]:
    """The commands that bring the job back after ``error``, each with what it gives."""
    # Secrets masked (the message goes to the registry and to Dagster): the user gives them
    # as the job's own run did.
    sets = "".join(
        f" --set {shlex.quote(f'{k}={mask_value(k, v)}')}"
        for k, v in config.items()
        if k in defaults and defaults[k] != v
    )
    run = f"srt run {shlex.quote(job_file)}{sets}"
    ways = [
        f"`{run} --replay-sinks`: a fresh table from the source's retained records (the "
        f"checkpoint is moved aside, the table renamed to {error.table}_lost_<time>, both "
        f"kept): every window is computed again, complete if the source still holds every "
        f"record since the job's first batch",
    ]
    if newest_savepoint is not None:
        sid, batch = newest_savepoint
        ways.append(
            f"`{run} --from-savepoint {sid} --replay-sinks`: a fresh table from savepoint "
            f"{sid} (batch {batch}): only the results of the batches after it; windows "
            f"closed before it are not in the table"
        )
    else:
        ways.append(
            f"`{run} --from-savepoint <savepoint> --replay-sinks`: a fresh table from a "
            f"savepoint (none of this job found): only the results after it"
        )
    ways.append(
        f"`srt sink accept {shlex.quote(job_file)}{sets} --sink {error.sink}`: go on with "
        f"the table as it is, the hole included (recorded in the ledger as your decision)"
    )
    return ways


def set_aside(
    job: str, queries: Sequence[QueryPlan], layout: CheckpointLayout, since: Mapping[str, int]
) -> list[str]:
    """Before a replay into fresh tables: each warehouse sink's table renamed (kept) and its
    ledger entries forgotten; the record starts each sink at ``since[query]`` (0: from the
    source, or the batch after a restored savepoint's). What was done, one line each."""
    suffix = time.strftime(ASIDE_SUFFIX, time.gmtime())
    notes = []
    for q in queries:
        sinks = {}
        for o in q.outputs:
            if o.sink.observe(job, o.name) is None:
                continue
            moved = o.sink.set_aside(job, o.name, suffix)
            sinks[o.name] = {"since": since.get(q.name, 0)}
            notes.append(
                f"sink {o.name}: the table was set aside as {moved}, its ledger entries "
                f"forgotten; it is written again from batch {since.get(q.name, 0)}"
                if moved
                else f"sink {o.name}: no table to set aside; its ledger entries forgotten"
            )
        if sinks:
            write_record(
                layout.query(q.name), {**(read_record(layout.query(q.name)) or {}), **sinks}
            )
    return notes


def accept(
    job: str,
    queries: Sequence[QueryPlan],
    layout: CheckpointLayout,
    *,
    sinks: Sequence[str] = (),
    by: str = "",
) -> list[str]:
    """The operator's decision to go on over what a sink's table lost: for each warehouse
    sink (those named in ``sinks``, else every one the check refuses), the ledger records
    that the table as it is stands for every batch the checkpoint committed, and the record
    starts the sink over after that batch. What was accepted, one line each."""
    done = []
    for q in queries:
        query = layout.query(q.name)
        committed = query.last_committed()
        record = dict(read_record(query) or {})
        for o in q.outputs:
            if sinks and o.name not in sinks:
                continue
            try:
                check(job, [_only(q, o.name)], layout, rewinds={})
                if not sinks:
                    continue
                problem = "nothing missing"
            except SinkDataLostError as exc:
                problem = f"{exc.problem}: {exc.what}"
            note = (
                f"accepted by {by or os.environ.get('USER', 'operator')} at "
                f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}: {problem}"
            )
            o.sink.accept(job, o.name, committed, note)
            record = dict(read_record(query) or record)
            record[o.name] = {
                "since": (-1 if committed is None else committed) + 1,
                "accepted": note,
            }
            write_record(query, record)
            done.append(f"sink {o.name} of query {q.name}: {note}")
    unknown = set(sinks) - {o.name for q in queries for o in q.outputs}
    if unknown:
        raise ConfigError(
            f"no sink named {sorted(unknown)} in job {job!r} (its sinks: "
            f"{sorted(o.name for q in queries for o in q.outputs)})"
        )
    return done


def _only(q: QueryPlan, sink: str) -> QueryPlan:
    from dataclasses import replace

    return replace(q, outputs=tuple(o for o in q.outputs if o.name == sink))
