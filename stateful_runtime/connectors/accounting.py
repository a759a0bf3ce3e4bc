"""A source's accounting of each batch, reported by its read tasks beside the rows.

The job counts, per batch and source, the records read and those rejected (dead letters), and
keeps, per source partition, the newest event time of its good records (the per-partition
watermark: :mod:`stateful_runtime.runtime.input_watermarks`). A read task knows all of it
about its split before it yields the first row: its decoded tables are final by then (the dead
letters staged from them). So each read task reports its split once, through a PySpark
accumulator, and no Spark node looks at the rows for it (an observed aggregate over every row
was ~12% of a keyed batch).

* **Executor side**: :func:`report`, called by a source's ``read`` with its final tables. The
  report's key is (query, source, batch, partition key, split start): the batch id is Spark's
  (the ``streaming.sql.batchId`` property of every task of a micro-batch). A retried task, a
  speculative copy, a stage run again, or a plan that reads the source twice (the watermark's
  branch) writes the same entry with the same counts, so nothing counts twice; Spark merges
  the updates of successful tasks only.
* **Driver side**: :func:`option` (the source option that asks for reports, for one query and
  source), :func:`take` (a batch's reports, once its action ran: in the query's
  ``foreachBatch``, after its sinks wrote) and :func:`forget` (what a query's earlier run in
  this application left untaken, when a run builds it anew). Spark merges a task's
  accumulator updates before it counts the task done, so every split of the batch is there
  then.

A source read without the option (a test's, a benchmark's) reports nothing.
"""

from __future__ import annotations

import base64
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.accumulators import AccumulatorParam

from stateful_runtime.connectors.base import ERROR

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.accumulators import Accumulator
    from pyspark.sql import SparkSession

OPTION = "accounting"  # the source option: the pickled accumulator and what reports go under
BATCH_PROPERTY = "streaming.sql.batchId"


@dataclass(frozen=True)
class SplitReport:
    """One split of a batch: its records, those rejected, and its source partition's newest
    event time of good records in it (None: no event time, or no good record with one), and
    whether it read the partition to the end of a bounded run."""

    records: int
    dead_letters: int
    partition: int
    newest_ms: int | None = None
    ends_run: bool = False


@dataclass
class BatchCounts:
    """One source's reports of one batch, summed: records, dead letters, and each source
    partition's (newest event time, read to the end of a bounded run) over its splits."""

    records: int = 0
    dead_letters: int = 0
    partition_times: dict[int, tuple[int, bool]] = field(default_factory=dict)

    def add(self, split: SplitReport) -> None:
        self.records += split.records
        self.dead_letters += split.dead_letters
        if split.newest_ms is None:
            return
        times = self.partition_times
        newest, ended = times.get(split.partition, (split.newest_ms, False))
        times[split.partition] = (max(newest, split.newest_ms), ended or split.ends_run)


class _Merged(AccumulatorParam):
    """Reports by key, merged by update (a report written again replaces itself)."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        value1.update(value2)
        return value1


# -- executor side ------------------------------------------------------------------------------


def report(
    options: Any,
    key: str | int,
    start: int,
    partition: int,
    tables: Sequence[pa.Table],
    newest_ms: int | None = None,
    *,
    ends_run: bool = False,
) -> None:
    """Report one split of a read task (``key`` and ``start``: the split's, as its source's
    offsets name it) from its final ``tables``; nothing without :data:`OPTION` or outside a
    micro-batch."""
    spec = options.get(OPTION)
    if not spec:
        return
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty(BATCH_PROPERTY) if context is not None else None
    if batch is None:
        return
    accumulator, query, source = pickle.loads(base64.b64decode(spec))
    records = sum(t.num_rows for t in tables)
    rejected = sum(t.num_rows - t.column(ERROR).null_count for t in tables)
    accumulator.add(
        {
            (query, source, int(batch), str(key), int(start)): SplitReport(
                records, rejected, partition, newest_ms, ends_run
            )
        }
    )


# -- driver side --------------------------------------------------------------------------------

_ACCUMULATORS: dict[str, Accumulator] = {}  # by Spark application


def _accumulator(spark: SparkSession) -> Accumulator:
    sc = spark.sparkContext
    found = _ACCUMULATORS.get(sc.applicationId)
    if found is None:
        found = _ACCUMULATORS[sc.applicationId] = sc.accumulator({}, _Merged())
    return found


def option(spark: SparkSession, query: str, source: str) -> dict[str, str]:
    """The source option that has its read tasks report to ``query`` of this application."""
    spec = pickle.dumps((_accumulator(spark), query, source))
    return {OPTION: base64.b64encode(spec).decode("ascii")}


def forget(spark: SparkSession, query: str) -> None:
    """Drop what reads of ``query`` left untaken in this application (a batch that failed
    after its reads): a run that starts it anew, maybe from another checkpoint or savepoint,
    plans its batches afresh, and a split of another boundary would count beside them."""
    reports = _accumulator(spark).value
    for k in [k for k in reports.copy() if k[0] == query]:
        reports.pop(k, None)


def take(spark: SparkSession, query: str, batch: int) -> dict[str, BatchCounts]:
    """``query``'s reports of ``batch``, by source (a source none of whose splits reported:
    absent), removed from the accumulator (and those of its earlier batches, left by a batch
    that failed)."""
    reports = _accumulator(spark).value
    out: dict[str, BatchCounts] = {}
    # A copy: another query's reports arrive on the accumulator server's thread meanwhile.
    for k in [k for k in reports.copy() if k[0] == query and k[2] <= batch]:
        split = reports.pop(k, None)
        if split is not None and k[2] == batch:
            out.setdefault(k[1], BatchCounts()).add(split)
    return out
