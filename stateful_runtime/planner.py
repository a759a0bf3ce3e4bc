"""Planner: turns a job graph into Spark Structured Streaming queries.

One query per sink, plus one dead-letter query per source. Each query has its own checkpoint
directory ``<checkpoint.dir>/<query name>`` in which Spark commits source offsets, state and the
watermark together per micro-batch.

Window paths:

* ``native``: a window that needs nothing beyond Spark's semantics (tumbling event-time windows
  with built-in aggregates, fired by the watermark) compiles to ``groupBy(window(...))`` running
  in the JVM on the RocksDB state store — the fast path.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stateful_runtime.exceptions import PlanError
from stateful_runtime.sinks.base import Sink
from stateful_runtime.sources.base import ERROR, META_COLUMNS
from stateful_runtime.streams import (
    FilterNode,
    KeyByNode,
    Node,
    SinkNode,
    SourceNode,
    WindowAggregateNode,
)
from stateful_runtime.windows import TumblingEventTimeWindows, spark_interval

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from stateful_runtime.job import StreamJob

EVENT_TIME = "_event_time"
DEAD_LETTER_PREFIX = "dead-letters-"


@dataclass
class QueryPlan:
    """One Spark streaming query of a job."""

    name: str
    sink: Sink
    output_mode: str
    path: str
    reason: str
    steps: list[str]
    build: Callable[[SparkSession], DataFrame] = field(repr=False)
    stateful_operators: list[str] = field(default_factory=list)


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
                with contextlib.redirect_stdout(buf):
                    q.build(spark).explain(mode="formatted")
                lines.append("  Spark plan:")
                lines += ["    " + ln for ln in buf.getvalue().rstrip().splitlines()]
        return "\n".join(lines)


def _chain(node: Node) -> list[Node]:
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


def _read_good(spark: SparkSession, src: SourceNode) -> DataFrame:
    from pyspark.sql import functions as F

    df = src.source.read_stream(spark)
    df = df.filter(F.col(ERROR).isNull()).drop(*META_COLUMNS)
    delay = spark_interval(src.watermark.max_out_of_orderness) if (
        src.watermark.max_out_of_orderness.total_seconds() > 0
    ) else "0 seconds"
    return df.withColumn(EVENT_TIME, _event_time_column(src)).withWatermark(EVENT_TIME, delay)


def _plan_sink(job: StreamJob, sink_node: SinkNode) -> QueryPlan:
    chain = _chain(sink_node.parent)
    src = chain[0]
    if not isinstance(src, SourceNode):
        raise PlanError(f"sink {sink_node.name!r} is not connected to a source")
    steps = [
        f"source {src.name}: {src.source.describe()}",
        f"decode + route bad records to dead-letters-{src.name}",
        f"watermark: {src.watermark.describe()}",
    ]
    stateful: list[str] = []
    path, reason = "stateless", "no stateful operator: records pass straight to the sink"
    ops: list[Callable[[DataFrame], DataFrame]] = []
    for node in chain[1:]:
        if isinstance(node, FilterNode):
            steps.append(f"filter {node.condition}")
            ops.append(lambda df, c=node.condition: df.filter(c))
        elif isinstance(node, KeyByNode):
            steps.append(f"key_by {', '.join(node.keys)} (hash-partitioned into "
                         f"{job.parallelism} state partitions)")
        elif isinstance(node, WindowAggregateNode):
            if not isinstance(node.assigner, TumblingEventTimeWindows):
                raise PlanError(f"operator {node.name!r}: {node.assigner.describe()} "
                                "is not supported by this planner")
            aggs = ", ".join(f"{k}={a.describe()}" for k, a in node.aggregates.items())
            steps.append(f"window {node.name}: {node.assigner.describe()} by "
                         f"{', '.join(node.parent.keys)} → {aggs}")
            stateful.append(node.name)
            path = "native"
            reason = ("tumbling event-time window with built-in aggregates and no allowed "
                      "lateness, side output or custom trigger: Spark's groupBy(window) in the "
                      "JVM, state in RocksDB")
            ops.append(lambda df, n=node: _window_aggregate(df, n))
        else:  # pragma: no cover - the API builds no other nodes
            raise PlanError(f"unknown node {node!r}")
    if not any(isinstance(n, WindowAggregateNode) for n in chain):
        ops.append(lambda df: df.drop(EVENT_TIME))
    sink = sink_node.sink
    output_mode = "append"
    if stateful:
        output_mode = "update" if sink.upsert else "append"
        steps.append(
            "emit: every update of an open window (the sink upserts by key)"
            if sink.upsert else "emit: each window once, when the watermark passes its end"
        )
    steps.append(f"sink {sink_node.name}: {sink.describe()}")

    def build(spark: SparkSession) -> DataFrame:
        df = _read_good(spark, src)
        for op in ops:
            df = op(df)
        return df

    return QueryPlan(sink_node.name, sink, output_mode, path, reason, steps, build, stateful)


def _window_aggregate(df: DataFrame, node: WindowAggregateNode) -> DataFrame:
    from pyspark.sql import functions as F

    assert isinstance(node.assigner, TumblingEventTimeWindows)
    keys = list(node.parent.keys)
    aggs = [agg.column().alias(out) for out, agg in node.aggregates.items()]
    grouped = df.groupBy(F.window(EVENT_TIME, spark_interval(node.assigner.size)), *keys).agg(*aggs)
    # Session time zone is UTC, so the NTZ cast keeps the UTC wall clock.
    return grouped.select(
        *keys,
        F.col("window.start").cast("timestamp_ntz").alias("window_start"),
        F.col("window.end").cast("timestamp_ntz").alias("window_end"),
        *node.aggregates.keys(),
    )


def _plan_dead_letters(src: SourceNode) -> QueryPlan:
    from stateful_runtime.sources.base import OFFSET, PARTITION, RAW

    sink = src.source.dead_letter_sink()

    def build(spark: SparkSession) -> DataFrame:
        from pyspark.sql import functions as F

        df = src.source.read_stream(spark)
        return df.filter(F.col(ERROR).isNotNull()).select(RAW, ERROR, PARTITION, OFFSET)

    return QueryPlan(
        DEAD_LETTER_PREFIX + src.name,
        sink,
        "append",
        "stateless",
        "records that fail to decode are kept, with the reason, in the dead-letter topic",
        [f"source {src.name}: {src.source.describe()}", "keep records whose decoding failed",
         f"sink: {sink.describe()}"],
        build,
    )


def plan(job: StreamJob) -> Plan:
    """Plan every sink of ``job`` (and a dead-letter query per source) into Spark queries."""
    queries = [_plan_sink(job, s) for s in job.sinks]
    used = {id(_chain(s.parent)[0]) for s in job.sinks}
    queries += [_plan_dead_letters(src) for src in job.sources if id(src) in used]
    names = [q.name for q in queries]
    if len(set(names)) != len(names):
        raise PlanError(f"query names collide: {names}; rename a sink or source")
    return Plan(job, queries)
