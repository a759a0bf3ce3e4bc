"""Dead letters: the one owner of a rejected record's way from its source to a topic.

A record that does not decode is never dropped and never reaches the job's operators: the
source marks it (``_error``, ``_raw``), and then it is

1. **staged** by the Spark task that read it (:func:`stage`): the split's rejected records go
   to ``<staging>/<partition key>-<start>-<end>.arrow`` (the key as in the source's offsets:
   ``0`` for the event log, ``topic:0`` for Kafka), atomically; a retried or replayed task
   writes the same file. The staging directory is the source's in the checkpoint directory
   (:meth:`~stateful_runtime.checkpoints.layout.CheckpointLayout.dead_letters`), written by
   the query that owns the source (the planner's choice);
2. **published** by the job process alone (:meth:`DeadLetters.publish`: the runner calls it
   after every committed batch, at start and at stop) to the source's
   :class:`~stateful_runtime.connectors.base.DeadLetterSink`: every staged split whose range is
   committed (by the owning query's offset log), in offset order. The sink keeps, per source
   partition and in the same write as the records, how far it has published (the end of the
   last split: every rejected record before it is in the topic), and only records at or after
   that mark are appended. So a split
   published twice (a crash between publishing and deleting the file) appends nothing the
   second time, and neither do splits of a batch planned again with other boundaries (after a
   checkpoint fell back, or a restore from an older savepoint): each rejected record reaches
   the topic once, whatever the splits that carried it.

A record a **step** of the job cannot process (a user function that raised, a value its step
cannot hold) takes the same way, from the task that ran the step (:class:`StepRejects`):

1. **staged** by that task in ``<staging>/<batch>-<step>-<task partition>.arrow``, the record
   as JSON in ``_raw``, the reason in ``_error`` (the step's name first), and where it came
   from (the source partition and offset the runtime carries to every step, null where no
   single record is to blame, as for a timer) — a retried or replayed task writes the same
   file. The batch id is Spark's (the ``streaming.sql.batchId`` property of every task of a
   micro-batch);
2. **published** by the job process (:meth:`StepDeadLetters.publish`, beside the source's)
   once the batch is committed, to the source's dead-letter topic, with a mark per step and
   source partition kept in the same write (as the source's: the end offset of the last
   batch published). Only rows inside the committed batch's offset range and at or after
   the mark go out, so neither a crash between publishing and removing the files, nor a file
   left by an attempt of a batch later planned with other boundaries, duplicates a record;
   rows without an origin are marked by batch id instead.

A rewind (``srt checkpoint rewind``) replays source records below the source's mark *under a
stricter judgement*: a record the first run accepted (a year-2100 event time) is now rejected,
and the mark alone would drop it. So the rewind first notes, per source partition, the mark and
which offsets below it are already in the topic (:func:`note_replay`, ``_replay.json`` in the
staging directory); records below the mark that are not among them are published under their
own mark (the partition key with the rewind's tag), with the same crash safety.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.storage import checkpoint_path, fill_file, read_arrow, write_file
from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW

if TYPE_CHECKING:
    from stateful_runtime.connectors.base import DeadLetterSink

SUFFIX = ".arrow"
COLUMNS = [RAW, ERROR, PARTITION, OFFSET]
STEP = "_step"  # the step that rejected a record (a column of step dead letters only)
STEP_SCHEMA = pa.schema(
    [
        pa.field(RAW, pa.binary()),
        pa.field(ERROR, pa.string()),
        pa.field(PARTITION, pa.int32()),
        pa.field(OFFSET, pa.int64()),
        pa.field(STEP, pa.string()),
    ]
)
# The mark of a step's rows that carry no source origin (a timer's): by batch id.
NO_ORIGIN = "-"


def stage(directory: str, partition: int | str, start: int, end: int, decoded: pa.Table) -> int:
    """Write the rejected rows of one split; returns how many there were."""
    bad = decoded.filter(pc.is_valid(decoded.column(ERROR))).select(COLUMNS)
    if not bad.num_rows:
        return 0
    _write_table(checkpoint_path(directory) / f"{partition}-{start}-{end}{SUFFIX}", bad)
    return bad.num_rows


def staged(directory: str) -> list[tuple[str, int, int, Path]]:
    """Staged splits as (partition key, start, end, path), in offset order per partition."""
    path = checkpoint_path(directory)
    if not path.is_dir():
        return []
    out = []
    for f in path.glob(f"*{SUFFIX}"):
        p, start, end = f.name[: -len(SUFFIX)].rsplit("-", 2)
        out.append((p, int(start), int(end), f))
    return sorted(out, key=lambda s: (s[0].zfill(12), s[1]))


REPLAY = "_replay.json"


def _key(key: str) -> int | str:
    return int(key) if key.isdigit() else key


def note_replay(directory: str, starts: Mapping[str, int], sink: DeadLetterSink, tag: str) -> int:
    """Before a rewind replays source offsets from ``starts`` (per partition key): note, for
    each partition whose published mark lies beyond its start, the mark and the offsets below it
    already in the topic, so :func:`publish` sends the replay's other rejected records there.
    Returns how many partitions replay below their mark."""
    notes = _replays(directory)
    with sink.writer() as writer:
        marks = {k: sink.published(writer, _key(k)) for k in starts}
    for key, start in starts.items():
        mark = marks[key]
        if mark > start:
            notes[key] = {
                "tag": tag,
                "from": int(start),
                "below": int(mark),
                "published": sorted(sink.published_offsets(_key(key), int(start), mark)),
            }
    write_file(checkpoint_path(directory) / REPLAY, json.dumps(notes))
    return sum(1 for k in starts if k in notes)


def _replays(directory: str) -> dict[str, dict]:
    try:
        return dict(json.loads((checkpoint_path(directory) / REPLAY).read_text()))
    except FileNotFoundError:
        return {}


def publish(directory: str, committed: Mapping[str, int], sink: DeadLetterSink) -> int:
    """Move the staged splits inside ``committed`` offsets into the dead-letter topic."""
    due = [
        (p, start, end, path)
        for p, start, end, path in staged(directory)
        if end <= int(committed.get(p, 0))
    ]  # others' batches are not committed yet
    if not due:
        return 0
    replays = _replays(directory)
    done = 0
    with sink.writer() as writer:  # one open of the topic per publish, not per split
        for key, start, end, path in due:
            partition = _key(key)
            mark = sink.published(writer, partition)
            replay = replays.get(key)
            if end <= mark and replay is None:
                continue  # in the topic already (a re-run, or a range planned again)
            table = _read(path)
            if replay is not None and start < replay["below"]:
                done += _publish_replayed(sink, writer, table, key, end, replay)
            if end <= mark:
                continue
            if start < mark:  # the front of the range went out with splits of another plan
                table = table.filter(pc.greater_equal(table.column(OFFSET), mark))
            done += sink.write_split(writer, table, partition, end)
    for *_, path in due:
        path.unlink()
    settled = {k: v for k, v in replays.items() if int(committed.get(k, 0)) < v["below"]}
    if settled != replays:  # the replay has passed the mark: the note is done
        if settled:
            (checkpoint_path(directory) / REPLAY).write_text(json.dumps(settled))
        else:
            (checkpoint_path(directory) / REPLAY).unlink(missing_ok=True)
    return done


def _publish_replayed(
    sink: DeadLetterSink, writer: object, table: pa.Table, key: str, end: int, replay: dict
) -> int:
    """A replayed split's rejected records below the noted mark that the topic lacks, under
    the rewind's own mark (a re-publish of the split appends nothing)."""
    tagged = f"{key}@{replay['tag']}"
    mark = sink.published(writer, tagged)
    if end <= mark:
        return 0
    offsets = table.column(OFFSET)
    # At or after the rewind's own mark: a range planned again after the rewind (a fallback, a
    # restore) re-stages records already published under it.
    first = max(int(replay["from"]), mark)
    below = pc.and_(pc.greater_equal(offsets, first), pc.less(offsets, replay["below"]))
    fresh = pc.and_(below, pc.invert(pc.is_in(offsets, pa.array(replay["published"], pa.int64()))))
    new = table.filter(fresh)
    if not new.num_rows:
        return 0
    return sink.write_split(writer, new, tagged, end)


@dataclass(frozen=True)
class DeadLetters:
    """Where one source's rejected records are staged, and the sink they are published to;
    ``index``: the source's place in its query's offset log (a union reads several)."""

    staging: str
    sink: DeadLetterSink
    index: int = 0

    def publish(self, query: QueryLayout) -> int:
        """Publish the staged splits that the last committed batch of ``query`` (the query
        that reads the source and stages its rejected records) covers."""
        committed = query.committed_offsets()
        sources = (committed or {}).get("sources") or []
        if len(sources) > self.index and isinstance(sources[self.index], dict):
            return publish(self.staging, sources[self.index], self.sink)
        return 0


# ----------------------------------------------------------------------------- steps

BATCH_ID_PROPERTY = "streaming.sql.batchId"  # Spark sets it on every task of a micro-batch
# Test hook: with committed step rejects due, the job process touches
# $SRT_TEST_STEP_DLQ_HOOK/<point>-<batch> and blocks, at the point $SRT_TEST_STEP_DLQ_POINT
# names ("before": between the batch's commit and the publication, the default; "after":
# between the publication and removing the staged files), so a test can kill -9 it there.
HOOK = "SRT_TEST_STEP_DLQ_HOOK"
HOOK_POINT = "SRT_TEST_STEP_DLQ_POINT"


def _hook(point: str, batch: int) -> None:
    where = os.environ.get(HOOK)
    if where and os.environ.get(HOOK_POINT, "before") == point:
        import threading

        Path(where).mkdir(parents=True, exist_ok=True)
        (Path(where) / f"{point}-{batch}").touch()
        threading.Event().wait(600)  # the test kills the job here


def running_batch() -> tuple[int, int]:
    """(micro-batch id, partition) of the Spark task calling this; (-1, 0) outside a task."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return -1, 0
    batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
    return (int(batch) if batch is not None else -1), ctx.partitionId()


def as_json(record: object) -> bytes:
    """A record as the JSON a dead letter keeps in ``_raw`` (non-JSON values as text)."""
    import json

    return json.dumps(record, default=str, ensure_ascii=False, sort_keys=True).encode()


class StepRejects:
    """One task's rejected records of one step, staged at the end of the task.

    A step calls :meth:`add` for a record it cannot process and :meth:`stage` once its task's
    output is complete (before the task reports success: a failed task's rejects are
    written again by its retry, to the same file). Picklable while empty (built on the driver
    and shipped with the step)."""

    def __init__(self, directory: str | None, step: str) -> None:
        self.directory, self.step = directory, step
        self.rows: list[tuple[bytes, str, int | None, int | None]] = []

    def __getstate__(self) -> dict[str, object]:
        return {"directory": self.directory, "step": self.step, "rows": []}

    def add(self, record: object, reason: str, partition: int | None, offset: int | None) -> None:
        """Reject ``record`` (a dict, kept as JSON; or raw bytes) for ``reason``; ``partition``
        and ``offset``: where in the source it came from (None: not one record's)."""
        raw = record if isinstance(record, bytes) else as_json(record)
        self.rows.append((raw, f"{self.step}: {reason}", partition, offset))

    def __len__(self) -> int:
        return len(self.rows)

    def stage(self, batch: int | None = None, partition: int | None = None) -> int:
        """Write the rows rejected so far to ``<directory>/<batch>-<step>-<partition>.arrow``
        (default: the running task's batch and partition), atomically; returns how many."""
        if not self.rows or self.directory is None:
            return 0
        if batch is None or partition is None:
            batch, partition = running_batch()
        raw, error, part, offset = (list(c) for c in zip(*self.rows, strict=True))
        table = pa.table([raw, error, part, offset, [self.step] * len(raw)], schema=STEP_SCHEMA)
        _write_table(
            checkpoint_path(self.directory) / f"{batch}-{_quote(self.step)}-{partition}{SUFFIX}",
            table,
        )
        return table.num_rows


def _quote(step: str) -> str:
    """A step's name as part of a file name (no separator, no path)."""
    from urllib.parse import quote

    return quote(step, safe="").replace("-", "%2D")


def staged_steps(directory: str) -> list[tuple[int, Path]]:
    """Staged step files as (batch, path), in batch order."""
    path = checkpoint_path(directory)
    if not path.is_dir():
        return []
    out = []
    for f in path.glob(f"*{SUFFIX}"):
        batch = f.name.split("-", 1)[0]
        if batch.lstrip("-").isdigit():
            out.append((int(batch), f))
    return sorted(out, key=lambda s: (s[0], s[1].name))


def _source_key(partition: int, offsets: Mapping[str, int]) -> str | None:
    """The source's offset key of partition ``partition`` (``"0"``; Kafka ``"topic:0"``):
    None when no key, or more than one (topics of a pattern), names it."""
    if str(partition) in offsets:
        return str(partition)
    keys = [k for k in offsets if k.rsplit(":", 1)[-1] == str(partition)]
    return keys[0] if len(keys) == 1 else None


def _batch_offsets(query: QueryLayout, batch: int) -> dict[str, int] | None:
    try:
        facts = query.committed_offsets(batch)
    except (OSError, ValueError, IndexError):
        return None  # older than Spark keeps
    if facts and facts["sources"] and isinstance(facts["sources"][0], dict):
        return {str(k): int(v) for k, v in facts["sources"][0].items()}
    return None


def publish_steps(directory: str, query: QueryLayout, sink: DeadLetterSink) -> int:
    """Move the staged step rejects of ``query``'s committed batches into the dead-letter
    topic, each record once (see the module's docstring); returns how many went out."""
    last = query.last_committed()
    due = [(b, f) for b, f in staged_steps(directory) if last is not None and b <= last]
    if not due:
        return 0
    _hook("before", due[-1][0])
    done = 0
    with sink.writer() as writer:
        batches = sorted({b for b, _ in due})
        for batch in batches:
            files = [f for b, f in due if b == batch]
            table = pa.concat_tables(_read(f) for f in files)
            end = _batch_offsets(query, batch) or {}
            start = (_batch_offsets(query, batch - 1) or {}) if batch > 0 else {}
            done += _publish_batch(writer, sink, table, batch, start, end)
    _hook("after", due[-1][0])
    for _, f in due:
        f.unlink()
    return done


def _read(path: Path) -> pa.Table:
    with read_arrow(path) as source, ipc.open_file(source) as reader:
        return reader.read_all()


def _write_table(final: Path, table: pa.Table) -> None:
    def fill(tmp: Path) -> None:
        with ipc.new_file(str(tmp), table.schema) as writer:
            writer.write_table(table)

    fill_file(final, fill)


def _publish_batch(
    writer: object,
    sink: DeadLetterSink,
    table: pa.Table,
    batch: int,
    start: Mapping[str, int],
    end: Mapping[str, int],
) -> int:
    """One committed batch's step rejects: per (step, source partition) those inside the
    batch's range and at or after the mark; the rest by batch id."""
    groups: dict[tuple[str, str], list[dict]] = {}
    seen: set[tuple] = set()
    for row in table.to_pylist():
        ident = (row[STEP], row[PARTITION], row[OFFSET], row[RAW])
        if ident in seen:  # the same record from two attempts' files
            continue
        seen.add(ident)
        key = None
        if row[PARTITION] is not None and row[OFFSET] is not None:
            key = _source_key(row[PARTITION], end)
        if key is not None and not start.get(key, 0) <= row[OFFSET] < end[key]:
            continue  # an attempt of another plan of this batch: its own batch rejects it
        groups.setdefault((row[STEP], key or NO_ORIGIN), []).append(row)
    done = 0
    for (step, key), rows in sorted(groups.items()):
        mark_key = f"{key}@{step}"
        mark = sink.published(writer, mark_key)
        if key == NO_ORIGIN:
            upto, rows = batch + 1, rows if batch + 1 > mark else []
        else:
            upto = end[key]
            rows = sorted((r for r in rows if r[OFFSET] >= mark), key=lambda r: r[OFFSET])
        if rows and upto > mark:
            done += sink.write_split(
                writer, pa.Table.from_pylist(rows, schema=STEP_SCHEMA), mark_key, upto
            )
    return done


@dataclass(frozen=True)
class StepDeadLetters:
    """Where one query's steps stage the records they reject, and the sink (the dead-letter
    topic of the query's source) they are published to."""

    staging: str
    sink: DeadLetterSink

    def rejects(self, step: str) -> StepRejects:
        """An empty collector for step ``step``'s rejects (shipped to the tasks with it)."""
        return StepRejects(self.staging, step)

    def publish(self, query: QueryLayout) -> int:
        """Publish the staged rejects of ``query``'s committed batches; how many went out."""
        return publish_steps(self.staging, query, sink=self.sink)
