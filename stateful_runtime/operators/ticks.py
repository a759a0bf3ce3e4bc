"""Batches for the timers of keyed state in the worker.

Spark runs a micro-batch when a source offers new offsets, or when one of its own stateful
operators asks for one. The worker's operator (``mapInArrow``) is none of Spark's, so a query
whose process function has timers that must fire without new input reads
:class:`TickDataSource`: a source of no rows whose offset moves on at a trigger where one of the
operator's timers is due. Spark then runs the batch, logging the tick in ``offsets/<N>``: a
replayed batch fires the same timers.

* **Processing time**: a timer is due once the clock passed it. The batch runs in the first
  trigger at or after the timer, with the batch's time (``batchTimestampMs``, taken after the
  sources' offsets, so at or after the tick).
* **Event time**: a timer is due once the watermark the newest commit left for the next batch
  (``nextBatchWatermarkMs``) passed it; the batch runs at that watermark. Every
  batch runs anyway while records come, so a tick adds a batch only when the input stopped
  with a timer behind the watermark (the end of an ``--available-now`` run among them: this
  reader keeps ticking after the run's sources reached their end, and stops once nothing is
  due). Before, a deduplication of Spark's that saw no row (the watermark's branch) made Spark
  run a batch whenever the watermark moved, by reading each batch's shuffle a second time;
  checkpoints written with it keep it (``QueryPlan.watermark_carrier``).

Where a timer is due. After a task commits version ``V`` of its state partition it writes the
partition's earliest timer to :data:`NEXT_TIMER` (``{"version": V, "due": ms or null}``). At
each trigger the tick's reader (on the driver) reads them for the version the newest commit
made (``commits/<N>`` → ``N + 1``); a partition without one of that version (a batch that has
not run there yet, a restore, a crash between a task and its commit) counts as due now, which
runs one batch that writes it. The reader needs no memory of its own: the last tick is the
batch's start offset, and every timer a batch leaves pending is after that batch's time (its
watermark, in event time).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    InputPartition,
    ReadLimit,
)
from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
from pyspark.sql.types import LongType, StructField, StructType

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.storage import checkpoint_path, write_file

NAME = "srt_ticks"
NEXT_TIMER = "next-timer.json"


def write_next_timer(partition_dir: Path, version: int, due: int | None) -> None:
    """Record the partition's earliest timer after version ``version`` (replaced whole)."""
    write_file(partition_dir / NEXT_TIMER, json.dumps({"version": version, "due": due}))


def earliest_due(query_checkpoint: str, partition_dirs: Sequence[Path], now: int) -> int | None:
    """The earliest processing-time timer of the partitions as their newest committed
    versions left them (``now`` for a partition that has not recorded that version), or None
    when none is pending."""
    committed = QueryLayout(query_checkpoint).last_committed()
    version = 0 if committed is None else committed + 1
    found: list[int] = []
    for directory in partition_dirs:
        try:
            record = json.loads((directory / NEXT_TIMER).read_text())
        except (OSError, ValueError):
            record = {}
        if record.get("version") != version:
            found.append(now)
        elif record.get("due") is not None:
            found.append(int(record["due"]))
    return min(found, default=None)


class TickStreamReader(DataSourceStreamReader):
    """Processing time: a bounded run (``--available-now``) fires what was due at its start
    (Spark fixes this reader's end there), so a timer that re-registers itself cannot keep the
    run going."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.query = options["checkpoint"]
        self.partition_dirs = [checkpoint_path(p) for p in json.loads(options["partitions"])]
        # Spark's noDataMicroBatches off: no batch without new data, for timers either
        self.ticks = options.get("no_data_batches", "true") != "false"
        self.splits = int(options.get("splits", "0"))

    def initialOffset(self) -> dict:
        return {"due": 0}

    def upto(self) -> int | None:
        """The time up to which timers are due: the clock."""
        return int(time.time() * 1000)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        upto = self.upto() if self.ticks else None
        if upto is None:
            return start
        due = earliest_due(self.query, self.partition_dirs, upto)
        if due is not None and int(start.get("due", 0)) < due <= upto:
            return {"due": due}
        return start

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return [InputPartition(p) for p in range(self.splits)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter(())


class EventTickStreamReader(TickStreamReader, SupportsTriggerAvailableNow):
    """Event time: due up to the watermark the newest commit left for the next batch; a
    bounded run keeps reading it after its sources ended (the watermark no longer moves, so
    it ends once nothing is due)."""

    def upto(self) -> int | None:
        layout = QueryLayout(self.query)
        committed = layout.last_committed()
        return None if committed is None else layout.next_watermark_ms(committed)

    def prepareForTriggerAvailableNow(self) -> None:
        """The end is not fixed at the run's start (see the class doc)."""


class TickDataSource(DataSource):
    """Options: ``checkpoint`` (the query's checkpoint directory), ``partitions`` (a JSON list
    of the operator's state partition directories), ``splits`` (the empty splits a batch reads
    from it: one per state partition where the operator reads its source unshuffled, else 0),
    ``domain`` (``event`` for event time, else processing time), ``no_data_batches``
    (``false``: never offer a batch, as Spark's
    ``spark.sql.streaming.noDataMicroBatches.enabled=false`` runs none for its own
    operators)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return StructType([StructField("due", LongType())])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        if self.options.get("domain") == "event":
            return EventTickStreamReader(self.options)
        return TickStreamReader(self.options)
