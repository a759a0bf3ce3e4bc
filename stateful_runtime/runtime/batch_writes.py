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

A query without a stateful step writes one row per source record, and its rows come with the
record's origin (source partition and offset): a row the sink's table cannot store
(:meth:`Sink.unstorable`: a string longer than its ``varchar(n)``, a sum past a ``BIGINT``
column, a NUL in a PostgreSQL string...) is isolated as a step's failed record is
(:func:`isolate`): dead-lettered with the sink as the step, staged before the sink's write
(so a replay of the batch stages the same file) and published once the batch commits, while
the rest of the batch is written; or, under ``errors.policy=fail``, the job stops naming the
record and the ``srt run --skip`` that passes it. A row of a window or a process function
stands for many records or none, so there the sink's table stops the job by name
(:func:`dbt_sink.limits.storable`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime._process import freeze_worker_heap
from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.storage import checkpoint_path
from stateful_runtime.connectors.base import (
    SEQUENCE,
    PartitionedSink,
    PartitionReport,
    Sink,
    prepare_rows,
)
from stateful_runtime.exceptions import (
    SinkDataLostError,
    SinkError,
    StateError,
    UserFunctionError,
)
from stateful_runtime.operators.isolation import (
    ORIGIN_COLUMNS,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    StepGuard,
)
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


# How Spark's stop of a query reaches a batch in flight, in the JVM: the thread interrupted in a
# wait, or the batch's job cancelled (``SPARK_JOB_CANCELLED``, "Query ... was stopped").
INTERRUPTIONS = frozenset(
    {
        "java.lang.InterruptedException",
        "java.io.InterruptedIOException",
        "java.nio.channels.ClosedByInterruptException",
    }
)
CALLING = "An error occurred while calling "  # py4j's words for a Java call that threw


class BatchInterrupted(Exception):  # noqa: N818 - a stop's interruption, not an error
    """A stop that did not wait for the batch in flight interrupted it (``query.stop()``: a
    second stop signal, or a batch longer than the stop's drain); the batch is replayed on
    restart.

    Spark learns that a Python ``foreachBatch`` was interrupted, not failed, only by matching
    the text of its traceback against ``Py4JJavaError: An error occurred while calling ...
    java.lang.InterruptedException`` (or its two kin). Its pattern recurses once per character
    after that line, and the JVM's stack overflows past one or two thousand of them: the Java
    stack trace py4j puts there is ten times that, and the query thread died of
    ``StackOverflowError`` on the job's terminal. A cancelled job is not in the pattern at all: the
    query failed instead of stopping. This exception's traceback ends with that line, naming
    the interruption, and what Spark said (raised ``from None``: no chained traceback before
    it)."""


def interrupted(error: BaseException) -> BatchInterrupted | None:
    """``error`` (raised in a ``foreachBatch``, or what it was raised while handling) as the
    stop's interruption of the batch in flight, or None if it is anything else."""
    from py4j.protocol import Py4JJavaError

    seen: BaseException | None = error
    for _ in range(8):
        if seen is None:
            return None
        if isinstance(seen, Py4JJavaError):
            try:
                said = _stopped_by(seen.java_exception)
            except Exception:  # noqa: BLE001 - the gateway gone: not a stop's interruption
                return None
            if said is not None:
                call = str(seen.errmsg).removeprefix(CALLING).strip()
                return BatchInterrupted(
                    f"py4j.protocol.Py4JJavaError: {CALLING}{call}\n"
                    f": java.lang.InterruptedException: {said}"
                )
        seen = seen.__cause__ or seen.__context__
    return None


def _stopped_by(java: Any) -> str | None:
    """What a Java exception (or one of its causes) says of the query's stop, or None."""
    for _ in range(16):
        if java is None:
            return None
        name = java.getClass().getName()
        if name in INTERRUPTIONS:
            return name
        if name == "org.apache.spark.SparkException":
            message = str(java.getMessage())
            if java.getCondition() == "SPARK_JOB_CANCELLED" and " was stopped" in message:
                return message
        java = java.getCause()
    return None


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
    from stateful_runtime.operators.output import TAG

    def select(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.is_null(batch.column(TAG))).select(columns)

    return select


def _side_rows(tag_name: str, schema: pa.Schema) -> Rows:
    from stateful_runtime.operators.output import SIDE, TAG

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

    def __init__(self, query: QueryPlan, checkpoint: str | None = None) -> None:
        self.query = query
        self.rows = {out.name: rows_of(query, out) for out in query.outputs}
        # The keyed operator's state directory: each batch records the attempts whose output
        # it wrote (record_keyed_commits).
        self.keyed: Path | None = None
        if checkpoint is not None and query.process is not None:
            self.keyed = checkpoint_path(checkpoint) / keyed.KEYED_DIR / query.process.name
        # A sink that found its table without the batches it had written (dropped, truncated
        # while the job runs): the batch fails, and the runner ends the run with this error.
        self.refused: SinkDataLostError | None = None

    def check_schemas(self, output: pa.Schema) -> None:
        """Each sink's check of the rows it will get, given the query's output schema (before
        any batch runs)."""
        empty = _without_origin(output.empty_table())
        for out in self.query.outputs:
            out.sink.check_schema(self.rows[out.name](empty).schema)

    def guard(self, out: QueryOutput) -> StepGuard | None:
        """A fresh guard for ``out``'s rows of one batch (None: a query with a stateful step,
        whose rows carry no single record's origin)."""
        if self.query.stateful_operators:
            return None
        from stateful_runtime.runtime.dataframes import step_guard

        return step_guard(self.query, out.name)

    def write(self, df: DataFrame, batch_id: int) -> SinkWrite:
        """Write micro-batch ``batch_id`` (the query's output ``df``) to every sink, each
        where it asked to be written; the rows the sinks took and the time their writes took."""
        many = len(self.query.outputs) > 1
        on_driver = any(o.sink.write_placement().where != "executors" for o in self.query.outputs)
        cached = many or (self.keyed is not None and not on_driver)
        if cached:
            # Computed once for every output (and the keyed operator's commit rows), not once
            # per sink.
            df = df.persist()
        rows, ms = 0, 0.0
        batch: pa.Table | None = None
        commits: list[str] = []
        try:
            if self.keyed is not None and not on_driver:
                commits = _commit_rows(df)
            for out in self.query.outputs:
                select = self.rows[out.name]
                try:
                    guard = self.guard(out)
                    if out.sink.write_placement().where == "executors":
                        assert isinstance(out.sink, PartitionedSink)
                        partitions = out.sink.partitions or self.query.parallelism
                        n, t = _write_on_executors(
                            df, out.sink, select, batch_id, partitions, guard
                        )
                    else:
                        if batch is None:
                            batch = df.toArrow()
                        t0 = time.perf_counter()
                        n = _write_on_driver(out.sink, select(batch), batch_id, guard)
                        t = (time.perf_counter() - t0) * 1000
                except SinkDataLostError as exc:
                    self.refused = exc
                    raise
                # The batch is in the sink's table and ledger now: the next write checks
                # they still hold it.
                out.sink.expected_batch = batch_id
                rows += n
                ms += t
            if self.keyed is not None:
                if batch is not None:
                    commits = _commit_rows(batch)
                record_keyed_commits(self.keyed, batch_id, self.query.parallelism, commits)
        finally:
            if cached:
                df.unpersist()
        return SinkWrite(rows, ms)


def _commit_rows(rows: pa.Table | DataFrame) -> list[str]:
    """The keyed operator's commit rows of a batch (the collected batch, or its DataFrame)."""
    from stateful_runtime.operators.output import SIDE, TAG

    if isinstance(rows, pa.Table):
        return rows.filter(pc.equal(rows.column(TAG), keyed.COMMIT_TAG)).column(SIDE).to_pylist()
    from pyspark.sql import functions as F

    return [r[0] for r in rows.filter(F.col(TAG) == keyed.COMMIT_TAG).select(SIDE).collect()]


# How often (in batches) the keyed state's commit records that no state file needs are removed.
PRUNE_RECORDS_EVERY = 20


def record_keyed_commits(operator: Path, batch_id: int, parallelism: int, rows: list[str]) -> None:
    """Record the attempts whose output batch ``batch_id`` wrote as the keyed operator's
    version ``batch_id + 1`` (:func:`stateful_runtime.checkpoints.keyed.record`), before Spark
    commits the batch: one commit row per state partition, each naming the token of the task
    attempt that produced it. Every :data:`PRUNE_RECORDS_EVERY` batches the records no state
    file needs any more are removed."""

    version = batch_id + 1
    tokens: dict[int, str] = {}
    for raw in rows:
        done = json.loads(raw)
        if done["operator"] != operator.name or done["version"] != version:
            raise StateError(
                f"batch {batch_id}: a commit row of operator {done['operator']!r} at version "
                f"{done['version']} in the output of operator {operator.name!r} at version "
                f"{version}; the batch is not committed (it runs again when the job restarts)"
            )
        tokens[int(done["partition"])] = str(done["token"])
    lacking = sorted(set(range(parallelism)) - set(tokens))
    if lacking:
        raise StateError(
            f"batch {batch_id}: operator {operator.name!r} committed no state for partitions "
            f"{lacking[:5]}; the batch is not committed (it runs again when the job restarts)"
        )
    keyed.record(operator, version, tokens)
    if version % PRUNE_RECORDS_EVERY == 0:
        keyed.prune_records(operator, parallelism)


def _without_origin(rows: pa.Table) -> pa.Table:
    present = [c for c in ORIGIN_COLUMNS if c in rows.column_names]
    return rows.drop_columns(present) if present else rows


def isolate(
    sink: Sink, rows: pa.Table, guard: StepGuard | None, batch_id: int, partition: int
) -> pa.Table:
    """``rows`` for ``sink`` without the origin columns, less those its table cannot store
    (:meth:`Sink.unstorable`): each dead-lettered by ``guard`` with the sink as the step, the
    reason and the record's origin, staged now (before the sink writes: a replay of the batch
    stages the same file), or the job stopped as the error policy says. Rows without origin
    columns (a query with a stateful step) are the sink's as they are."""
    data = _without_origin(rows)
    if guard is None or ORIGIN_PARTITION not in rows.column_names or not rows.num_rows:
        return data
    bad = sink.unstorable(data)
    if not bad:
        return data
    parts = rows.column(ORIGIN_PARTITION).to_pylist()
    offs = rows.column(ORIGIN_OFFSET).to_pylist()
    fields = [c for c in data.column_names if c != SEQUENCE]
    guard.seen += data.num_rows
    try:
        for i, why in bad:
            record = data.slice(i, 1).select(fields).to_pylist()[0]
            guard.reject(i, record, why, parts[i], offs[i])
        guard.stage(batch_id, partition)
    except UserFunctionError as exc:
        if exc.skippable:
            raise  # errors.policy=fail: the record, its origin and the --skip command
        raise SinkError(
            f"sink {guard.step!r}: {len(bad)} of the {data.num_rows} rows of batch {batch_id} "
            f"hold a value the table cannot store (the first: {bad[0][1]}). So many are a "
            f"table narrower than the job's data rather than bad records, so none was "
            f"dead-lettered and the batch was not committed (it is replayed when the job runs "
            f"again): widen the column (ALTER TABLE) or write to a new sink.table; if these "
            f"records are bad, raise the bound with --set errors.max_fraction=F or "
            f"errors.max_consecutive=N"
        ) from exc
    keep = np.ones(data.num_rows, dtype=bool)
    keep[[i for i, _ in bad]] = False
    return data.filter(pa.array(keep))


def _write_on_driver(sink: Sink, rows: pa.Table, batch_id: int, guard: StepGuard | None) -> int:
    """The driver path: the batch's rows (collected) to ``sink``; a partitioned sink runs its
    protocol as one partition, its rows checked once it has read its table's columns."""
    if not isinstance(sink, PartitionedSink):
        rows = isolate(sink, rows, guard, batch_id, 0)
        sink.write_batch(rows, batch_id)
        return rows.num_rows
    if not sink.begin_batch(batch_id, _without_origin(rows.slice(0, 0)).schema):
        return 0  # already in the ledger: a replay (its rejects were staged the first time)
    rows = prepare_rows(isolate(sink, rows, guard, batch_id, 0), sink.key_columns)
    sink.commit_batch(batch_id, [sink.write_partition(rows, batch_id, 0, 1)])
    return rows.num_rows


def _write_on_executors(
    df: DataFrame,
    sink: PartitionedSink,
    select: Rows,
    batch_id: int,
    partitions: int,
    guard: StepGuard | None = None,
) -> tuple[int, float]:
    """The driver half of the executor path: begin, one task per output partition
    (repartitioned by the sink's key, each row numbered in batch order so the in-batch winner
    is stable), collect the small reports, commit after every partition succeeded."""
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from stateful_runtime.runtime.session import arrow_schema

    arrow = arrow_schema(df.schema)
    schema = select(arrow.empty_table()).schema
    t0 = time.perf_counter()
    if not sink.begin_batch(batch_id, _without_origin(schema.empty_table()).schema):
        # Already in the sink's ledger: a replay after a crash between the sink's commit and
        # Spark's. Nothing is written, but the batch still runs (the noop sink evaluates every
        # partition), so its stateful operators commit this batch's state: skipped, the state
        # would stay at the previous batch, and Spark 4.3 fails the query on the missing state
        # store commits (STATE_STORE_COMMIT_VALIDATION_FAILED).
        df.write.format("noop").mode("overwrite").save()
        return 0, (time.perf_counter() - t0) * 1000
    begin_ms = (time.perf_counter() - t0) * 1000
    rows = df
    if schema != arrow:

        def cut(batches):  # the sink's rows of each upstream partition (side outputs...)
            for b in batches:
                yield from select(pa.Table.from_batches([b])).to_batches()

        rows = df.mapInArrow(cut, from_arrow_schema(schema))
    rows = rows.withColumn(SEQUENCE, F.monotonically_increasing_id()).repartition(
        partitions, *[F.col(k) for k in sink.key_columns]
    )
    task = PartitionWriteTask(
        sink, batch_id, partitions, schema.append(pa.field(SEQUENCE, pa.int64(), False)), guard
    )
    reports = reports_from_rows(rows.mapInArrow(task, from_arrow_schema(REPORT_SCHEMA)).collect())
    t1 = time.perf_counter()
    sink.commit_batch(batch_id, reports)
    commit_ms = (time.perf_counter() - t1) * 1000
    slowest = max((r.write_ms for r in reports), default=0.0)
    return sum(r.rows for r in reports), begin_ms + slowest + commit_ms


class PartitionWriteTask:
    """The executor half: the function ``mapInArrow`` runs per output partition — gather the
    partition, :func:`isolate` the rows its table cannot store (a query without a stateful
    step), :func:`~stateful_runtime.connectors.base.prepare_rows`, ``sink.write_partition``,
    yield one report row. Picklable (the sink is, after ``open``)."""

    def __init__(
        self,
        sink: PartitionedSink,
        batch_id: int,
        partitions: int,
        schema: pa.Schema,
        guard: StepGuard | None = None,
    ) -> None:
        self.sink, self.batch_id, self.partitions, self.schema = sink, batch_id, partitions, schema
        self.guard = guard

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        freeze_worker_heap()
        ctx = TaskContext.get()
        partition = ctx.partitionId() if ctx is not None else 0
        table = pa.Table.from_batches(list(batches), schema=self.schema)
        table = isolate(self.sink, table, self.guard, self.batch_id, partition)
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
