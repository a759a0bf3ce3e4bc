"""Planner: turns a job graph into Spark Structured Streaming queries.

One query per stateful pipeline: a keyed process function and all the sinks of its main and side
outputs share one query (its foreachBatch writes every output of a micro-batch); a window or
stateless chain gets one query per sink. The first query reading a source owns its dead
letters: its read tasks stage rejected records in the checkpoint directory
(:meth:`~stateful_runtime.checkpoints.layout.CheckpointLayout.dead_letters`) and the job
process publishes them once their batch commits
(:mod:`stateful_runtime.connectors.dead_letters`); no second query reads the source. Each query
has its own checkpoint directory ``<checkpoint.dir>/<query name>`` in which Spark commits source
offsets, state and the watermark together per micro-batch.

Windows are one node in the graph (:class:`~stateful_runtime.streams.WindowNode`); the planner
alone decides how each runs (:func:`native_window_reason`). Paths:

* ``native``: a window that needs nothing beyond Spark's semantics (tumbling, sliding or session
  event-time windows with built-in aggregates, fired by the watermark) compiles to
  ``groupBy(window(...))`` or ``groupBy(session_window(...))`` running in the JVM on the RocksDB
  state store — the fast path.
* ``process``: a keyed process function on ``transformWithStateInPandas`` (RocksDB state store,
  timers in Spark, TTL per descriptor).
* ``window``: any other window (a user aggregate or window function, global + count trigger,
  allowed lateness, late side output, early firing) on the runtime's window operator, itself a
  keyed process function on ``transformWithStateInPandas``.
* ``stateless``: filters and maps straight to a sink.

``map`` / ``flat_map`` run on any path before its stateful operator, as Spark's ``mapInArrow``
over whole Arrow batches (:mod:`stateful_runtime.operators.maps`), keeping each record's event
time and the watermark.
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime.checkpoints.layout import CheckpointLayout
from stateful_runtime.connectors.alignment import LATE_BEFORE
from stateful_runtime.connectors.base import (
    ERROR,
    META_COLUMNS,
    REPORT_SCHEMA,
    SEQUENCE,
    PartitionedSink,
    PartitionWriteTask,
    Sink,
    WritePath,
    reports_from_rows,
)
from stateful_runtime.connectors.dead_letters import DeadLetters
from stateful_runtime.exceptions import PlanError, TopicNotFoundError
from stateful_runtime.operators.keyed import describe_states
from stateful_runtime.operators.window import LATE_MARK, WindowOperator
from stateful_runtime.streams import (
    FilterNode,
    KeyByNode,
    MapNode,
    Node,
    ProcessNode,
    SideOutputNode,
    SinkNode,
    SourceNode,
    WindowNode,
    record_schema,
)
from stateful_runtime.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    spark_interval,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from stateful_runtime.aggregates import Aggregate
    from stateful_runtime.job import StreamJob

EVENT_TIME = "_event_time"
# Names of the observed metrics (Spark progress ``observedMetrics``) the runner's accounting
# reads: per source, records read and rejected; per window operator, records that came late.
SOURCE_METRICS = "srt_source"
LATE_METRICS = "srt_late"


NativeAssigner = TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows


@dataclass(frozen=True)
class NativeWindowNode:
    """A window the planner compiles to Spark's native ``groupBy(window)`` or
    ``groupBy(session_window)`` (JVM speed)."""

    parent: KeyByNode
    assigner: NativeAssigner
    aggregates: Mapping[str, Aggregate]
    name: str


def native_window_reason(node: WindowNode) -> str | None:
    """Why ``node`` cannot run on Spark's native window aggregation (None: it can)."""
    needs = []
    if not isinstance(node.assigner, NativeAssigner):
        needs.append(node.assigner.describe())
    if not isinstance(node.contents, Mapping):
        needs.append(f"a {type(node.contents).__name__}")
    if node.lateness:
        needs.append("allowed lateness")
    if node.late_tag is not None:
        needs.append("a late side output")
    if node.trigger is not None:
        needs.append("a custom trigger")
    return ", ".join(needs) or None


def _lower(node: Node) -> Node | NativeWindowNode:
    """The planner's one decision on windows: Spark's native aggregation when nothing more is
    needed, else the runtime's window operator (a keyed process function)."""
    if not isinstance(node, WindowNode):
        return node
    if native_window_reason(node) is None:
        assert isinstance(node.assigner, NativeAssigner)
        assert isinstance(node.contents, Mapping)
        return NativeWindowNode(node.parent, node.assigner, dict(node.contents), node.name)
    operator = WindowOperator(
        node.assigner,
        node.parent.keys,
        node.contents,
        node.output_schema,
        allowed_lateness=node.lateness,
        late_tag=node.late_tag,
        trigger=node.trigger,
    )
    return ProcessNode(node.parent, operator, node.name)


@dataclass
class QueryOutput:
    """One sink of a query, and how to cut its rows out of the query's micro-batch."""

    name: str
    sink: Sink
    select: Callable[[pa.Table], pa.Table] = field(repr=False, default=lambda t: t)


@dataclass
class QueryPlan:
    """One Spark streaming query of a job."""

    name: str
    outputs: list[QueryOutput]
    output_mode: str
    path: str
    reason: str
    steps: list[str]
    build: Callable[..., DataFrame] = field(repr=False)
    stateful_operators: list[str] = field(default_factory=list)
    dead_letters: DeadLetters | None = None
    # Operator name -> what its state looks like (kind, key fields, state name -> signature):
    # the part of a savepoint's fingerprint that decides whether new code can restore it.
    state_layout: dict[str, dict] = field(default_factory=dict)

    # Output partitions of a partitioned sink's write when the sink names none.
    parallelism: int = 1
    # The source the query reads (its records are accounted per query: input, output, dead
    # letters, late).
    source: str = ""

    def write_batch(self, df: DataFrame, batch_id: int) -> SinkWrite:
        """Write micro-batch ``batch_id`` (the query's output ``df``) to every sink, each on
        the path it asked for (:func:`write_path`); returns the rows the sinks took and the
        time their writes took."""
        import time

        many = len(self.outputs) > 1
        if many:
            df = df.persist()  # computed once for every output, not once per sink
        rows, ms = 0, 0.0
        batch: pa.Table | None = None
        try:
            for out in self.outputs:
                path = write_path(out.sink)
                if path.where == "executors":
                    assert isinstance(out.sink, PartitionedSink)
                    n, t = _write_on_executors(
                        df, out, batch_id, out.sink.partitions or self.parallelism
                    )
                else:
                    if batch is None:
                        batch = df.toArrow()
                    t0 = time.perf_counter()
                    selected = out.select(batch)
                    out.sink.write_batch(selected, batch_id)
                    n, t = selected.num_rows, (time.perf_counter() - t0) * 1000
                rows += n
                ms += t
        finally:
            if many:
                df.unpersist()
        return SinkWrite(rows, ms)


@dataclass(frozen=True)
class SinkWrite:
    """What a micro-batch's sink writes took: rows given to the sinks (after a partitioned
    sink's in-batch dedupe) and milliseconds spent writing (on the executor path: the slowest
    partition's write plus the driver's begin and commit; tasks write in parallel)."""

    rows: int
    ms: float


def write_path(sink: Sink) -> WritePath:
    """Where ``sink``'s batches are written (explain prints it)."""
    return sink.write_path()


def _write_on_executors(
    df: DataFrame, out: QueryOutput, batch_id: int, partitions: int
) -> tuple[int, float]:
    """The executor write protocol (:class:`~stateful_runtime.connectors.base.PartitionedSink`):
    begin on the driver, one task per output partition (repartitioned by the sink's key, each
    row numbered in batch order so the in-batch winner is stable), collect the small reports,
    commit on the driver after every partition succeeded."""
    import time

    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    sink = out.sink
    assert isinstance(sink, PartitionedSink)
    schema = out.select(to_arrow_schema(df.schema).empty_table()).schema
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
        select = out.select

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


@dataclass
class Plan:
    job: StreamJob
    queries: list[QueryPlan]

    def explain(self, spark: SparkSession | None = None) -> str:
        """The planned queries; with a SparkSession, also Spark's own plan for each."""
        job = self.job
        lines = [
            f"job {job.name}: {len(self.queries)} streaming queries, parallelism "
            f"{job.parallelism}, checkpoint every {job.checkpoint.interval} in "
            f"{job.checkpoint.dir}",
            "state: Spark RocksDB state store, changelog checkpointing on",
        ]
        for q in self.queries:
            lines.append("")
            lines.append(f"query {q.name}  [path: {q.path}; output mode: {q.output_mode}]")
            lines.append(f"  why: {q.reason}")
            lines += [f"  {i}. {step}" for i, step in enumerate(q.steps, 1)]
            if spark is not None:
                buf = io.StringIO()
                try:
                    with contextlib.redirect_stdout(buf):
                        q.build(spark).explain(mode="formatted")
                except TopicNotFoundError as exc:
                    # The plan above needs no data; only Spark's own plan reads the source's
                    # partitions. `srt run` refuses the missing topic with the same message.
                    lines.append(
                        f"  Spark plan: not available until the source's topic exists ({exc})"
                    )
                    continue
                lines.append("  Spark plan:")
                lines += ["    " + ln for ln in buf.getvalue().rstrip().splitlines()]
        return "\n".join(lines)


def chain(node: Node) -> list[Node]:
    """The nodes from the source down to ``node``."""
    out: list[Node] = []
    cur: Node | None = node
    while cur is not None:
        out.append(cur)
        cur = getattr(cur, "parent", None)
    return out[::-1]


def _event_time_column(src: SourceNode):  # -> Column
    from pyspark.sql import functions as F

    wm = src.watermark
    col = F.col(wm.timestamp_field)
    if wm.timestamp_unit == "ms":
        return F.timestamp_millis(col)
    if wm.timestamp_unit == "s":
        return F.timestamp_seconds(col)
    return col.cast("timestamp")


def _read_good(
    spark: SparkSession,
    src: SourceNode,
    dead_letters: DeadLetters | None = None,
    late_watermark_of: str | None = None,
) -> DataFrame:
    from pyspark.sql import functions as F

    staging = dead_letters.staging if dead_letters is not None else None
    df = src.source.read_stream(
        spark, staging, watermark=src.watermark, late_watermark_of=late_watermark_of
    )
    # Per-batch accounting of the source (in Spark's progress as observed metrics): every
    # record read, and those rejected (dead letters); late ones are counted downstream.
    df = df.observe(
        SOURCE_METRICS,
        F.count(F.lit(1)).alias("input"),
        F.sum(F.when(F.col(ERROR).isNotNull(), 1).otherwise(0)).alias("dead_letters"),
    )
    df = df.filter(F.col(ERROR).isNull()).drop(*META_COLUMNS)
    delay = src.watermark.max_out_of_orderness
    interval = spark_interval(delay) if delay.total_seconds() > 0 else "0 seconds"
    return df.withColumn(EVENT_TIME, _event_time_column(src)).withWatermark(EVENT_TIME, interval)


def _source_steps(src: SourceNode, dead_letters: DeadLetters | None) -> list[str]:
    where = (
        f"staged per split and published to the {dead_letters.sink.describe()} once the "
        f"batch commits"
        if dead_letters
        else "handled by the query that owns the source"
    )
    return [
        f"source {src.name}: {src.source.describe()}",
        f"decode; records that fail are {where}",
        f"watermark: {src.watermark.describe()}",
    ]


def _type_name(t: object) -> str:
    return getattr(t, "__name__", None) or repr(t)


def _state_signature(desc: object) -> str:
    """A descriptor as restore compatibility sees it: kind, types and TTL clock (not its
    duration, which may change between runs)."""
    from stateful_runtime.state import MapStateDescriptor

    if isinstance(desc, MapStateDescriptor):
        types = f"{_type_name(desc.key_type)}, {_type_name(desc.value_type)}"
    else:
        types = _type_name(getattr(desc, "type", object))
    ttl = getattr(desc, "ttl", None)
    clock = f" ttl:{ttl.time_domain.value}" if ttl else ""
    return f"{desc.kind}<{types}>{clock}"  # type: ignore[attr-defined]


def state_layout(node: NativeWindowNode | ProcessNode) -> dict:
    """Kind, key fields and named states of one stateful operator."""
    keys = list(node.parent.keys)
    if isinstance(node, NativeWindowNode):
        # Spark keeps one state row per (window, key) whose schema follows every aggregate.
        return {
            "kind": "native-window",
            "keys": keys,
            "states": {
                "window": f"{node.assigner.describe()}: "
                + ", ".join(f"{k}={a.describe()}" for k, a in node.aggregates.items())
            },
        }
    fn = node.function
    kind = "window" if isinstance(fn, WindowOperator) else "process"
    return {
        "kind": kind,
        "keys": keys,
        "function": type(fn).__name__,
        "states": {d.name: _state_signature(d) for d in describe_states(fn)},
    }


def _micros(value: timedelta):  # -> Column
    from pyspark.sql import functions as F

    return F.lit(int(value / timedelta(microseconds=1)))


def _last_window_end(assigner: NativeAssigner):  # -> Column
    """Where the last window holding a record ends (µs): Spark drops a record for every window
    of it that ends at or before the late-event watermark, so a record is late (counted, and
    in no result) when its last window does."""
    from pyspark.sql import functions as F

    ts = F.unix_micros(EVENT_TIME)
    if isinstance(assigner, EventTimeSessionWindows):
        return ts + _micros(assigner.gap)  # a record's own session, before any merge
    step = assigner.slide if isinstance(assigner, SlidingEventTimeWindows) else assigner.size
    return ts - F.pmod(ts, _micros(step)) + _micros(assigner.size)  # epoch-aligned, as Spark


def _count_late(df: DataFrame, assigner: NativeAssigner) -> DataFrame:
    """Count, record by record, what Spark's late filter will drop from the window aggregation:
    records whose last window ends at or before their batch's late-event watermark (the
    source's :data:`~stateful_runtime.connectors.alignment.LATE_BEFORE` column). Spark's own
    counter runs after the partial aggregation and counts (window, key) groups."""
    from pyspark.sql import functions as F

    if LATE_BEFORE not in df.columns:
        return df
    late = _last_window_end(assigner) <= F.col(LATE_BEFORE) * 1000
    return df.observe(LATE_METRICS, F.sum(F.when(late, 1).otherwise(0)).alias("late")).drop(
        LATE_BEFORE
    )


def _window_aggregate(df: DataFrame, node: NativeWindowNode) -> DataFrame:
    from pyspark.sql import functions as F

    assigner = node.assigner
    df = _count_late(df, assigner)
    keys = list(node.parent.keys)
    aggs = [agg.column().alias(out) for out, agg in node.aggregates.items()]
    if isinstance(assigner, EventTimeSessionWindows):
        window = F.session_window(EVENT_TIME, spark_interval(assigner.gap))
    elif isinstance(assigner, SlidingEventTimeWindows):
        window = F.window(EVENT_TIME, spark_interval(assigner.size), spark_interval(assigner.slide))
    else:
        window = F.window(EVENT_TIME, spark_interval(assigner.size))
    grouped = df.groupBy(window.alias("window"), *keys).agg(*aggs)
    # Session time zone is UTC, so the NTZ cast keeps the UTC wall clock.
    return grouped.select(
        *keys,
        F.col("window.start").cast("timestamp_ntz").alias("window_start"),
        F.col("window.end").cast("timestamp_ntz").alias("window_end"),
        *node.aggregates.keys(),
    )


def _process(df: DataFrame, node: ProcessNode) -> DataFrame:
    from pyspark.sql import functions as F

    from stateful_runtime.connectors.formats.json import to_struct
    from stateful_runtime.operators.spark import (
        TAG,
        TS,
        SparkKeyedProcessor,
        output_struct,
        transform_with_state,
    )
    from stateful_runtime.state import TimeDomain

    fn = node.function
    main = to_struct(fn.output_schema)
    fields = [c for c in df.columns if c != EVENT_TIME]
    hidden = [c for c in fields if c.startswith("_")]
    if hidden:
        raise PlanError(
            f"operator {node.name!r}: field(s) {hidden} start with '_', which Spark's pandas "
            f"state API renames; rename them in the source schema"
        )
    df = df.withColumn(TS, F.unix_millis(EVENT_TIME)).drop(EVENT_TIME)
    mode = "EventTime" if fn.time_domain is TimeDomain.EVENT_TIME else "ProcessingTime"
    out = transform_with_state(
        df.groupBy(*node.parent.keys),
        SparkKeyedProcessor(fn, fields, main.fieldNames()),
        output_struct(main),
        mode,
    )
    if isinstance(fn, WindowOperator):  # late records: to the late side output, or dropped
        late = [t.name for t in fn.side_outputs] + [LATE_MARK]
        out = out.observe(
            LATE_METRICS, F.sum(F.when(F.col(TAG).isin(late), 1).otherwise(0)).alias("late")
        )
    return out


def _map(df: DataFrame, node: MapNode) -> DataFrame:
    """A stateless Python function over whole Arrow batches (Spark's ``mapInArrow``); the
    columns it does not see (event time, the late-data bound) are carried to its outputs with
    their metadata, the watermark's among them."""
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    from stateful_runtime.operators.maps import MapOperator

    fields = record_schema(node.parent).fieldNames()
    carried = [f for f in df.schema.fields if f.name not in fields]
    clash = [f.name for f in carried if f.name in node.output_schema.fieldNames()]
    if clash:
        raise PlanError(
            f"map {node.name!r}: output column(s) {clash} are reserved by the runtime; rename them"
        )
    operator = MapOperator(
        node.name,
        node.function,
        node.flat,
        fields,
        to_arrow_schema(node.output_schema),
        [f.name for f in carried],
    )
    return df.mapInArrow(operator, StructType([*node.output_schema.fields, *carried]))


def _main_rows(columns: list[str]) -> Callable[[pa.Table], pa.Table]:
    from stateful_runtime.operators.spark import TAG

    def select(batch: pa.Table) -> pa.Table:
        return batch.filter(pc.is_null(batch.column(TAG))).select(columns)

    return select


def _side_rows(tag_name: str, schema: pa.Schema) -> Callable[[pa.Table], pa.Table]:
    from stateful_runtime.operators.spark import SIDE, TAG

    def select(batch: pa.Table) -> pa.Table:
        rows = batch.filter(pc.equal(batch.column(TAG), tag_name)).column(SIDE).to_pylist()
        return pa.Table.from_pylist([json.loads(r) for r in rows], schema=schema)

    return select


@dataclass
class _Pipeline:
    """What the planner gathers for one query before building it."""

    name: str
    src: SourceNode
    nodes: list[Node | NativeWindowNode]
    sinks: list[tuple[SinkNode, SideOutputNode | None]] = field(default_factory=list)


def _split(sink_node: SinkNode) -> tuple[str, _Pipeline, SideOutputNode | None]:
    nodes = [_lower(n) for n in chain(sink_node.parent)]
    src = nodes[0]
    if not isinstance(src, SourceNode):
        raise PlanError(f"sink {sink_node.name!r} is not connected to a source")
    side = nodes[-1] if isinstance(nodes[-1], SideOutputNode) else None
    body = nodes[1:-1] if side else nodes[1:]
    procs = [n for n in body if isinstance(n, ProcessNode)]
    if procs:
        proc = procs[0]
        if body[-1] is not proc:
            raise PlanError(
                f"operator {proc.name!r}: only sink_to() and get_side_output() may follow a "
                f"process function in this version; sink its output and read it back"
            )
        return proc.name, _Pipeline(proc.name, src, body), side
    return sink_node.name, _Pipeline(sink_node.name, src, body), None


def _build_pipeline(job: StreamJob, p: _Pipeline, dead_letters: DeadLetters | None) -> QueryPlan:
    from stateful_runtime.connectors.formats.json import arrow_schema, to_struct

    steps = _source_steps(p.src, dead_letters)
    stateful: list[str] = []
    layout: dict[str, dict] = {}
    path, reason = "stateless", "no stateful operator: records pass straight to the sink"
    if any(isinstance(n, MapNode) for n in p.nodes):
        reason = "no stateful operator: records pass through the map(s) to the sink"
    ops: list[Callable[[DataFrame], DataFrame]] = []
    upsert_required = session = False
    for node in p.nodes:
        if isinstance(node, FilterNode):
            steps.append(f"filter {node.condition}")
            ops.append(lambda df, c=node.condition: df.filter(c))
        elif isinstance(node, MapNode):
            what = getattr(node.function, "__qualname__", None) or type(node.function).__name__
            steps.append(
                f"{node.kind} {node.name}: {what} in Python "
                f"over whole Arrow batches → {', '.join(node.output_schema.fieldNames())}"
            )
            ops.append(lambda df, n=node: _map(df, n))
        elif isinstance(node, KeyByNode):
            steps.append(
                f"key_by {', '.join(node.keys)} (hash-partitioned into "
                f"{job.parallelism} state partitions)"
            )
        elif isinstance(node, NativeWindowNode):
            aggs = ", ".join(f"{k}={a.describe()}" for k, a in node.aggregates.items())
            steps.append(
                f"window {node.name}: {node.assigner.describe()} by "
                f"{', '.join(node.parent.keys)} → {aggs}"
            )
            stateful.append(node.name)
            layout[node.name] = state_layout(node)
            path = "native"
            session = isinstance(node.assigner, EventTimeSessionWindows)
            reason = (
                f"{node.assigner.describe()} with built-in aggregates and no allowed "
                f"lateness, side output or custom trigger: Spark's groupBy("
                f"{'session_window' if session else 'window'}) in the JVM, state in "
                f"RocksDB"
            )
            upsert_required = True
            ops.append(lambda df, n=node: _window_aggregate(df, n))
        elif isinstance(node, ProcessNode):
            fn = node.function
            states = (
                ", ".join(
                    f"{d.name}:{d.kind}"
                    + (
                        f" ttl {d.ttl.ttl} {d.ttl.time_domain.value}"
                        if getattr(d, "ttl", None)
                        else ""
                    )
                    for d in describe_states(fn)
                )
                or "none"
            )
            stateful.append(node.name)
            layout[node.name] = state_layout(node)
            if isinstance(fn, WindowOperator):
                steps.append(f"window {node.name}: {fn.describe()}")
                path = "window"
                reason = (
                    "the window needs " + fn.needs() + ": the runtime's window operator "
                    "on transformWithStateInPandas (state in RocksDB, timers in Spark)"
                )
            else:
                steps.append(
                    f"process {node.name}: {type(fn).__name__} in "
                    f"{fn.time_domain.value} (state: {states})"
                )
                path = "process"
                reason = (
                    "keyed process function: transformWithStateInPandas, named state in "
                    "the RocksDB state store, timers in Spark"
                )
            ops.append(lambda df, n=node: _process(df, n))
    if not stateful:
        ops.append(lambda df: df.drop(EVENT_TIME))

    outputs = []
    first_sink_step = len(steps)
    for sink_node, side in p.sinks:
        sink = sink_node.sink
        if path in ("process", "window"):
            proc = p.nodes[-1]
            assert isinstance(proc, ProcessNode)
            if side is None:
                cols = to_struct(proc.function.output_schema).fieldNames()
                select = _main_rows(cols)
                steps.append(f"sink {sink_node.name} (main output): {sink.describe()}")
            else:
                select = _side_rows(side.tag.name, arrow_schema(to_struct(side.tag.schema)))
                steps.append(
                    f"sink {sink_node.name} (side output {side.tag.name}): {sink.describe()}"
                )
            outputs.append(QueryOutput(sink_node.name, sink, select))
        else:
            steps.append(f"sink {sink_node.name}: {sink.describe()}")
            outputs.append(QueryOutput(sink_node.name, sink))
        wp = write_path(sink)
        where = (
            f"on the executors, {getattr(sink, 'partitions', None) or job.parallelism} "
            f"partitions by {', '.join(sink.key_columns)}"
            if wp.where == "executors"
            else "on the driver"
        )
        steps.append(f"write {sink_node.name} {where}: {wp.why}")
    output_mode = "append"
    if upsert_required:
        # Sessions are emitted once, closed: an open session's start moves when it merges with
        # an earlier one, so its earlier updates would stay behind in an upsert sink as rows
        # of their own.
        sink = outputs[0].sink
        output_mode = "update" if sink.upsert and not session else "append"
        steps.insert(
            first_sink_step,
            "emit: every update of an open window (the sink upserts by key)"
            if output_mode == "update"
            else "emit: each window once, when the watermark passes its end",
        )
    src = p.src

    def build(spark: SparkSession, checkpoint: str | None = None) -> DataFrame:
        """The query's DataFrame; ``checkpoint`` (its checkpoint directory) lets the native
        window count late records exactly (:func:`_count_late`)."""
        df = _read_good(
            spark, src, dead_letters, late_watermark_of=checkpoint if path == "native" else None
        )
        for op in ops:
            df = op(df)
        return df

    return QueryPlan(
        p.name,
        outputs,
        output_mode,
        path,
        reason,
        steps,
        build,
        stateful,
        dead_letters,
        layout,
        job.parallelism,
        src.name,
    )


def plan(job: StreamJob) -> Plan:
    """Plan every sink of ``job`` into Spark queries; the first query reading a source owns
    its dead letters (:mod:`stateful_runtime.connectors.dead_letters`)."""
    pipelines: dict[str, _Pipeline] = {}
    for sink_node in job.sinks:
        name, pipeline, side = _split(sink_node)
        pipelines.setdefault(name, pipeline).sinks.append((sink_node, side))
    queries = []
    owners: set[int] = set()
    for p in pipelines.values():
        # The first query reading a source owns its dead letters (one writer per topic).
        dead_letters = None
        if id(p.src) not in owners:
            owners.add(id(p.src))
            staging = CheckpointLayout(Path(job.checkpoint.dir).resolve()).dead_letters(p.src.name)
            dead_letters = DeadLetters(str(staging), p.src.source.dead_letter_sink(job.name))
        queries.append(_build_pipeline(job, p, dead_letters))
    names = [q.name for q in queries]
    if len(set(names)) != len(names):
        raise PlanError(f"query names collide: {names}; rename a sink, operator or source")
    return Plan(job, queries)
