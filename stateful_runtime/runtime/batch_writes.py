"""The per-batch write protocol: how one micro-batch of a query reaches every sink of it.

Spark calls the query's ``foreachBatch`` with the batch's DataFrame and id; a
:class:`BatchWriter` (one per query) cuts each sink's rows out of it (a process function's main
or side output) and writes them where the sink asks (:meth:`Sink.write_placement`):

* driver: the batch is collected to the job process once, as one Arrow table, and handed to
  ``sink.write_batch`` (for a :class:`~stateful_runtime.connectors.base.PartitionedSink` that
  runs its protocol as one partition);
* executors (a :class:`~stateful_runtime.connectors.base.PartitionedSink`): the driver half
  calls ``begin_batch``; the rows are numbered in batch order (:data:`SEQUENCE`) and
  repartitioned by the sink's key; the executor half (:class:`PartitionWriteTask`, one Spark
  task per output partition) writes its partition's rows and reports; the driver half collects
  the small reports and calls ``commit_batch`` after every partition succeeded.

Spark commits the batch (offsets + state) only after this returns, so a batch that fails here
is replayed with the same id and rows; the sinks' ledgers make that replay change nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime._process import freeze_worker_heap
from stateful_runtime.connectors.base import (
    SEQUENCE,
    PartitionedSink,
    PartitionReport,
    prepare_rows,
)
from stateful_runtime.exceptions import SinkDataLostError
from stateful_runtime.planner import QueryOutput, QueryPlan

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

Rows = Callable[[pa.Table], pa.Table]

REPORT_SCHEMA = pa.schema(
    [
        ("partition", pa.int32()),
        ("rows", pa.int64()),
        ("written", pa.int64()),
        ("write_ms", pa.float64()),
        ("note", pa.string()),
    ]
)


@dataclass(frozen=True)
class SinkWrite:
    """What a micro-batch's sink writes took: rows given to the sinks (after a partitioned
    sink's in-batch dedupe) and milliseconds spent writing (on the executor path: the slowest
    partition's write plus the driver's begin and commit; tasks write in parallel)."""

    rows: int
    ms: float


def _all_rows(batch: pa.Table) -> pa.Table:
    return batch


def _main_rows(columns: list[str]) -> Rows:
    from stateful_runtime.operators.spark import TAG

    def select(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.is_null(batch.column(TAG))).select(columns)

    return select


def _side_rows(tag_name: str, schema: pa.Schema) -> Rows:
    from stateful_runtime.operators.spark import SIDE, TAG

    def select(batch: pa.Table) -> pa.Table:
        rows = batch.filter(pc.equal(batch.column(TAG), tag_name)).column(SIDE).to_pylist()
        return pa.Table.from_pylist([json.loads(r) for r in rows], schema=schema)

    return select


def rows_of(query: QueryPlan, out: QueryOutput) -> Rows:
    """How ``out``'s rows are cut from a batch of ``query``: a process function's batch holds
    its main and side outputs, tagged; any other query's batch is the sink's rows as they are."""
    from stateful_runtime.connectors.formats.json import arrow_schema, to_struct

    proc = query.process
    if proc is None:
        return _all_rows
    if out.side is None:
        return _main_rows(to_struct(proc.function.output_schema).fieldNames())
    return _side_rows(out.side.name, arrow_schema(to_struct(out.side.schema)))


class BatchWriter:
    """Writes each micro-batch of one query to all of its sinks (the query's
    ``foreachBatch``)."""

    def __init__(self, query: QueryPlan) -> None:
        self.query = query
        self.rows = {out.name: rows_of(query, out) for out in query.outputs}
        # A sink that found its table without the batches it had written (dropped, truncated
        # while the job runs): the batch fails, and the runner ends the run with this error.
        self.refused: SinkDataLostError | None = None

    def check_schemas(self, output: pa.Schema) -> None:
        """Each sink's check of the rows it will get, given the query's output schema (before
        any batch runs)."""
        empty = output.empty_table()
        for out in self.query.outputs:
            out.sink.check_schema(self.rows[out.name](empty).schema)

    def write(self, df: DataFrame, batch_id: int) -> SinkWrite:
        """Write micro-batch ``batch_id`` (the query's output ``df``) to every sink, each
        where it asked to be written; the rows the sinks took and the time their writes took."""
        many = len(self.query.outputs) > 1
        if many:
            df = df.persist()  # computed once for every output, not once per sink
        rows, ms = 0, 0.0
        batch: pa.Table | None = None
        try:
            for out in self.query.outputs:
                select = self.rows[out.name]
                try:
                    if out.sink.write_placement().where == "executors":
                        assert isinstance(out.sink, PartitionedSink)
                        partitions = out.sink.partitions or self.query.parallelism
                        n, t = _write_on_executors(df, out.sink, select, batch_id, partitions)
                    else:
                        if batch is None:
                            batch = df.toArrow()
                        t0 = time.perf_counter()
                        selected = select(batch)
                        out.sink.write_batch(selected, batch_id)
                        n, t = selected.num_rows, (time.perf_counter() - t0) * 1000
                except SinkDataLostError as exc:
                    self.refused = exc
                    raise
                # The batch is in the sink's table and ledger now: the next write checks
                # they still hold it.
                out.sink.expected_batch = batch_id
                rows += n
                ms += t
        finally:
            if many:
                df.unpersist()
        return SinkWrite(rows, ms)


def _write_on_executors(
    df: DataFrame, sink: PartitionedSink, select: Rows, batch_id: int, partitions: int
) -> tuple[int, float]:
    """The driver half of the executor path: begin, one task per output partition
    (repartitioned by the sink's key, each row numbered in batch order so the in-batch winner
    is stable), collect the small reports, commit after every partition succeeded."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    schema = select(to_arrow_schema(df.schema).empty_table()).schema
    t0 = time.perf_counter()
    if not sink.begin_batch(batch_id, schema):
        # Already in the sink's ledger: a replay after a crash between the sink's commit and
        # Spark's. Nothing is written, but the batch still runs (the noop sink evaluates every
        # partition), so its stateful operators commit this batch's state: skipped, the state
        # would stay at the previous batch, and Spark 4.3 fails the query on the missing state
        # store commits (STATE_STORE_COMMIT_VALIDATION_FAILED).
        df.write.format("noop").mode("overwrite").save()
        return 0, (time.perf_counter() - t0) * 1000
    begin_ms = (time.perf_counter() - t0) * 1000
    rows = df
    if schema != to_arrow_schema(df.schema):

        def cut(batches):  # the sink's rows of each upstream partition (side outputs...)
            for b in batches:
                yield from select(pa.Table.from_batches([b])).to_batches()

        rows = df.mapInArrow(cut, from_arrow_schema(schema))
    rows = rows.withColumn(SEQUENCE, F.monotonically_increasing_id()).repartition(
        partitions, *[F.col(k) for k in sink.key_columns]
    )
    task = PartitionWriteTask(
        sink, batch_id, partitions, schema.append(pa.field(SEQUENCE, pa.int64(), False))
    )
    reports = reports_from_rows(rows.mapInArrow(task, from_arrow_schema(REPORT_SCHEMA)).collect())
    t1 = time.perf_counter()
    sink.commit_batch(batch_id, reports)
    commit_ms = (time.perf_counter() - t1) * 1000
    slowest = max((r.write_ms for r in reports), default=0.0)
    return sum(r.rows for r in reports), begin_ms + slowest + commit_ms


class PartitionWriteTask:
    """The executor half: the function ``mapInArrow`` runs per output partition — gather the
    partition, :func:`~stateful_runtime.connectors.base.prepare_rows`,
    ``sink.write_partition``, yield one report row. Picklable (the sink is, after ``open``)."""

    def __init__(
        self, sink: PartitionedSink, batch_id: int, partitions: int, schema: pa.Schema
    ) -> None:
        self.sink, self.batch_id, self.partitions, self.schema = sink, batch_id, partitions, schema

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        freeze_worker_heap()
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        table = pa.Table.from_batches(list(batches), schema=self.schema)
        rows = prepare_rows(table, self.sink.key_columns)
        report = self.sink.write_partition(rows, self.batch_id, partition, self.partitions)
        yield pa.RecordBatch.from_pylist(
            [
                {
                    "partition": report.partition,
                    "rows": report.rows,
                    "written": report.written,
                    "write_ms": report.write_ms,
                    "note": report.note,
                }
            ],
            schema=REPORT_SCHEMA,
        )


def reports_from_rows(rows: Sequence[Any]) -> list[PartitionReport]:
    """Collected report rows (Spark ``Row`` objects or dicts) as
    :class:`~stateful_runtime.connectors.base.PartitionReport`, by partition."""
    out = []
    for r in rows:
        d = r.asDict() if hasattr(r, "asDict") else dict(r)
        out.append(
            PartitionReport(
                int(d["partition"]),
                int(d["rows"]),
                int(d["written"]),
                float(d["write_ms"]),
                d.get("note") or "",
            )
        )
    return sorted(out, key=lambda r: r.partition)
