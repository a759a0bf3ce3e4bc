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
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW

if TYPE_CHECKING:
    from stateful_runtime.connectors.base import DeadLetterSink

SUFFIX = ".arrow"
COLUMNS = [RAW, ERROR, PARTITION, OFFSET]


def stage(directory: str, partition: int | str, start: int, end: int, decoded: pa.Table) -> int:
    """Write the rejected rows of one split; returns how many there were."""
    bad = decoded.filter(pc.is_valid(decoded.column(ERROR))).select(COLUMNS)
    if not bad.num_rows:
        return 0
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    final = path / f"{partition}-{start}-{end}{SUFFIX}"
    tmp = path / f".{final.name}.{os.getpid()}.tmp"
    with ipc.new_file(str(tmp), bad.schema) as writer:
        writer.write_table(bad)
    os.replace(tmp, final)
    return bad.num_rows


def staged(directory: str) -> list[tuple[str, int, int, Path]]:
    """Staged splits as (partition key, start, end, path), in offset order per partition."""
    path = Path(directory)
    if not path.is_dir():
        return []
    out = []
    for f in path.glob(f"*{SUFFIX}"):
        p, start, end = f.name[: -len(SUFFIX)].rsplit("-", 2)
        out.append((p, int(start), int(end), f))
    return sorted(out, key=lambda s: (s[0].zfill(12), s[1]))


def publish(directory: str, committed: Mapping[str, int], sink: DeadLetterSink) -> int:
    """Move the staged splits inside ``committed`` offsets into the dead-letter topic."""
    due = [
        (p, start, end, path)
        for p, start, end, path in staged(directory)
        if end <= int(committed.get(p, 0))
    ]  # others' batches are not committed yet
    if not due:
        return 0
    done = 0
    with sink.writer() as writer:  # one open of the topic per publish, not per split
        for key, start, end, path in due:
            partition = int(key) if key.isdigit() else key
            mark = sink.published(writer, partition)
            if end <= mark:
                continue  # in the topic already (a re-run, or a range planned again)
            with ipc.open_file(str(path)) as reader:
                table = reader.read_all()
            if start < mark:  # the front of the range went out with splits of another plan
                table = table.filter(pc.greater_equal(table.column(OFFSET), mark))
            done += sink.write_split(writer, table, partition, end)
    for *_, path in due:
        path.unlink()
    return done


@dataclass(frozen=True)
class DeadLetters:
    """Where one source's rejected records are staged, and the sink they are published to."""

    staging: str
    sink: DeadLetterSink

    def publish(self, query: QueryLayout) -> int:
        """Publish the staged splits that the last committed batch of ``query`` (the query
        that reads the source and stages its rejected records) covers."""
        committed = query.committed_offsets()
        if committed and committed["sources"] and isinstance(committed["sources"][0], dict):
            return publish(self.staging, committed["sources"][0], self.sink)
        return 0
