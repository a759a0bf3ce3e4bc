"""Builds a planned query's streaming DataFrame (:class:`~stateful_runtime.planner.QueryPlan`
is the data; this is where it meets Spark).

The source's good records get an event-time column and Spark's watermark. Records read and
rejected are counted by the read tasks themselves (:mod:`stateful_runtime.connectors.accounting`:
no Spark node looks at the rows for it); records behind the watermark as observed metrics
(:data:`LATE_METRICS`), which the job process reads from each batch's progress report. Then
each node in order: filters in the JVM, maps as ``mapInArrow`` over whole Arrow batches, a
native window as ``groupBy(window | session_window)``, a process function (the window
operator, connected streams, broadcast state, the joins) repartitioned by key group and run
over whole Arrow batches with its state in the worker's RocksDB
(:mod:`stateful_runtime.operators.arrow_keyed`).

Casts name Spark's types as objects, never as text: text goes through Spark's SQL parser,
whose first use in a JVM (ANTLR's start) took ~60 ms of every job's start (an object, ~10).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, cast

from pyspark.sql.types import IntegerType, LongType, TimestampNTZType, TimestampType

from stateful_runtime.connectors import accounting
from stateful_runtime.connectors.alignment import LATE_BEFORE
from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW, read_stream
from stateful_runtime.exceptions import ConfigError, PlanError
from stateful_runtime.functions import LATE_MARK, UNION_INPUT
from stateful_runtime.joins import JoinOperator
from stateful_runtime.operators.isolation import (
    ORIGIN_COLUMNS,
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    StepGuard,
)
from stateful_runtime.operators.window import WindowOperator
from stateful_runtime.planner import (
    NativeAssigner,
    NativeWindowNode,
    QueryPath,
    QueryPlan,
)
from stateful_runtime.runtime.input_watermarks import resumes
from stateful_runtime.runtime.session import arrow_schema
from stateful_runtime.state import TimeDomain
from stateful_runtime.streams import (
    CoInputNode,
    FilterNode,
    KeyByNode,
    MapNode,
    ProcessNode,
    SourceNode,
    record_schema,
)
from stateful_runtime.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    spark_interval,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

EVENT_TIME = "_event_time"
SKIP_STEP = "skip"  # the step srt run --skip adds (dead letters name it)
# Spark's conf for one watermark for every stateful operator of a query (before 3.5's
# per-operator propagation), which a query with keyed state in the worker starts with.
SINGLE_WATERMARK = ("spark.sql.streaming.statefulOperator.allowMultiple", "false")
# Spark's switch for batches without new data; off, the timer ticks offer none either.
NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def refuse_speculation(setting: str) -> None:
    """``spark.speculation=true`` is refused for a query with keyed state: a speculative copy
    of a task runs the same state partition's batch beside the first, on another executor, and
    both stage the dead letters of the records they isolate (their state files are each the
    attempt's own, and the batch's commit record names the one whose output Spark kept)."""
    if setting.strip().lower() == "true":
        raise ConfigError(
            "spark.speculation=true runs a second copy of a slow task, and the two would both "
            "stage the dead letters of the batch's keyed state partition: set "
            "spark.speculation=false for this job"
        )


# The observed metric (Spark progress ``observedMetrics``) of the records a window operator
# found late.
LATE_METRICS = "srt_late"


def build(
    spark: SparkSession,
    query: QueryPlan,
    checkpoint: str | None = None,
    skips: Mapping[str, Collection[tuple[int, int]]] | Collection[tuple[int, int]] = (),
) -> DataFrame:
    """The query's streaming DataFrame; ``checkpoint`` (the query's checkpoint directory) lets
    a native window count late records exactly (:func:`_count_late`); ``skips``: the source
    records (partition, offset) ``srt run --skip`` passes to the dead-letter topic, per source
    name (or, for a query of one source, that source's)."""
    if not isinstance(skips, Mapping):
        skips = {query.source.name: skips}
    _CALL_STATS.pop(query.name, None)  # (counted anew for this run)
    accounting.forget(spark, query.name)
    if query.keyed_read and checkpoint is not None and not skips.get(query.source.name):
        i = query.inputs[0]
        staging = i.dead_letters.staging if i.dead_letters is not None else None
        return _keyed_read(spark, query, checkpoint, staging)
    frames = []
    for i in query.inputs:
        df = read_source(
            spark,
            i.source,
            i.dead_letters.staging if i.dead_letters is not None else None,
            late_watermark_of=checkpoint if query.path is QueryPath.NATIVE else None,
            query_checkpoint=checkpoint,
            by_partition=query.by_partition,
            report_to=query.name,
        )
        if skips.get(i.source.name):
            df = _skip(df, query, skips[i.source.name], i.source.name)
        if query.union:
            from pyspark.sql import functions as F

            # A record's partition and offset name it only with its source, and a query's
            # step rejects are published against its first source's offsets: in a union they
            # go out without them (by batch), never under another source's name.
            df = df.withColumns(
                {
                    ORIGIN_PARTITION: F.lit(None).cast(IntegerType()),
                    ORIGIN_OFFSET: F.lit(None).cast(LongType()),
                    UNION_INPUT: F.lit(i.index),
                }
            )
        df = _steps(df, i.nodes, query, checkpoint)
        frames.append(df)
    # Flink's union: Spark keeps each input's watermark and takes their minimum
    # (spark.sql.streaming.multipleWatermarkPolicy=min, its default).
    df = frames[0]
    for other in frames[1:]:
        df = df.unionByName(other)
    df = _steps(df, query.nodes, query, checkpoint)
    if checkpoint is not None and resumes(query):
        df = df.unionByName(_resume_batch(spark, checkpoint, df))
    if query.stateful_operators:
        return df.drop(*ORIGIN_COLUMNS, UNION_INPUT)
    # Each output row is one source record's: the origin columns go on to the sinks' writer,
    # which dead-letters by them a row its sink cannot store (runtime/batch_writes.py).
    return df.drop(EVENT_TIME, UNION_INPUT)


def _resume_batch(spark: SparkSession, checkpoint: str, like: DataFrame) -> DataFrame:
    """A source of no rows that makes Spark run a batch at the start of a run after a
    committed one (:mod:`stateful_runtime.runtime.input_watermarks`), in ``like``'s columns;
    read last, so the inputs keep their lines of the offset log."""
    from pyspark.sql import functions as F

    from stateful_runtime.runtime.input_watermarks import ResumeDataSource

    resume = read_stream(spark, ResumeDataSource, {"checkpoint": checkpoint})
    return resume.select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in like.schema.fields])


def _steps(
    df: DataFrame, nodes: Sequence[object], query: QueryPlan, checkpoint: str | None
) -> DataFrame:
    """``nodes`` on ``df``: one input's steps before a union, or the query's after it."""
    for node in nodes:
        if isinstance(node, FilterNode):
            df = df.filter(node.condition)
        elif isinstance(node, MapNode):
            df = _map(df, node, query)
        elif isinstance(node, CoInputNode):
            df = _co_input(df, node)
        elif isinstance(node, NativeWindowNode):
            df = _window_aggregate(df, node, query)
        elif isinstance(node, ProcessNode):
            df = _process(df, node, query, checkpoint)
        else:
            assert isinstance(node, KeyByNode)  # keys are read by the stateful node after it
    return df


def _co_input(df: DataFrame, node: CoInputNode) -> DataFrame:
    """One input of connected streams in the columns of both (the other's null), tagged with
    the input; the runtime's columns (event time and its watermark, origin, union input) are
    carried as they are."""
    from pyspark.sql import functions as F

    from stateful_runtime.functions import CO_INPUT

    own = set(record_schema(node.parent).fieldNames())
    types = {f.name: f.dataType for f in node.output_schema.fields}
    cols = [
        (F.col(src) if src is not None else F.lit(None)).cast(types[c]).alias(c)
        for c, src in node.columns
    ]
    carried = [F.col(c) for c in df.columns if c not in own]
    return df.select(*cols, F.lit(node.input).alias(CO_INPUT), *carried)


def step_guard(query: QueryPlan, step: str, source: str | None = None) -> StepGuard:
    """The guard a task of ``step`` isolates records with (shipped to the tasks)."""
    steps = query.step_dead_letters
    return StepGuard(
        step,
        source or query.source.name,
        query.errors,
        steps.rejects(step) if steps is not None else None,
    )


def _skip(
    df: DataFrame, query: QueryPlan, skips: Collection[tuple[int, int]], source: str
) -> DataFrame:
    """The records ``srt run --skip`` named, out of the stream and into the dead-letter
    topic, before any step sees them."""
    from stateful_runtime.operators.isolation import SkipOperator

    fields = [c for c in df.columns if c not in (EVENT_TIME, *ORIGIN_COLUMNS)]
    guard = step_guard(query, SKIP_STEP, source)
    return df.mapInArrow(SkipOperator(skips, fields, guard), df.schema)


def _event_time_column(src: SourceNode):  # -> Column
    from pyspark.sql import functions as F

    wm = src.watermark
    assert wm.timestamp_field is not None  # StreamJob.from_source refuses a source without one
    col = F.col(wm.timestamp_field)
    if wm.timestamp_unit == "ms":
        return F.timestamp_millis(col)
    if wm.timestamp_unit == "s":
        return F.timestamp_seconds(col)
    return col.cast(TimestampType())


def read_source(
    spark: SparkSession,
    src: SourceNode,
    staging: str | None = None,
    late_watermark_of: str | None = None,
    query_checkpoint: str | None = None,
    by_partition: bool = False,
    report_to: str | None = None,
) -> DataFrame:
    """The source's good records with event time and watermark; ``by_partition``: Spark's
    partition ``p`` is the source's (``QueryPlan.by_partition``); ``report_to``: the query
    whose batches count the source's records (its read tasks report each split:
    :mod:`stateful_runtime.connectors.accounting`)."""
    from pyspark.sql import functions as F

    df = read_stream(
        spark,
        *src.source.data_source(
            staging,
            watermark=src.watermark,
            late_watermark_of=late_watermark_of,
            query_checkpoint=query_checkpoint,
            by_partition=by_partition,
            accounting=accounting.option(spark, report_to, src.name) if report_to else None,
        ),
    )
    # Each record keeps its source partition and offset (:data:`ORIGIN_COLUMNS`): a step
    # that cannot process it names it, in its dead letter or in the message that stops the job.
    # (One projection for the drop, the renames and the event time: each DataFrame step is
    # analysed on its own, ~20-80 ms apiece in a job's start.)
    renamed = {PARTITION: ORIGIN_PARTITION, OFFSET: ORIGIN_OFFSET}
    columns = [
        F.col(c).alias(renamed[c]) if c in renamed else F.col(c)
        for c in df.columns
        if c not in (ERROR, RAW)
    ]
    df = df.filter(F.col(ERROR).isNull()).select(
        *columns, _event_time_column(src).alias(EVENT_TIME)
    )
    delay = src.watermark.max_out_of_orderness
    interval = spark_interval(delay) if delay.total_seconds() > 0 else "0 seconds"
    return df.withWatermark(EVENT_TIME, interval)


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


def _count_late(df: DataFrame, assigner: NativeAssigner, query: QueryPlan) -> DataFrame:
    """Count, record by record, what Spark's late filter will drop from the window aggregation:
    records whose last window ends at or before their batch's late-event watermark (the
    source's :data:`~stateful_runtime.connectors.alignment.LATE_BEFORE` column). Spark's own
    counter runs after the partial aggregation and counts (window, key) groups."""
    from pyspark.sql import functions as F

    if LATE_BEFORE not in df.columns:
        return df
    late = _last_window_end(assigner) <= F.col(LATE_BEFORE) * 1000
    counts = [F.sum(F.when(late, 1).otherwise(0)).alias("late")]
    if query.union:  # each input's late records apart: ``late:<source>``
        counts += [
            F.sum(F.when(late & (F.col(UNION_INPUT) == i.index), 1).otherwise(0)).alias(
                f"late:{i.source.name}"
            )
            for i in query.inputs
        ]
    return df.observe(LATE_METRICS, *counts).drop(LATE_BEFORE)


def _window_aggregate(df: DataFrame, node: NativeWindowNode, query: QueryPlan) -> DataFrame:
    from pyspark.sql import functions as F

    assigner = node.assigner
    df = _count_late(df, assigner, query)
    keys = list(node.parent.keys)
    types = {f.name: f.dataType for f in df.schema.fields}
    aggs = [
        agg.column(types.get(agg.field or "")).alias(out) for out, agg in node.aggregates.items()
    ]
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
        F.col("window.start").cast(TimestampNTZType()).alias("window_start"),
        F.col("window.end").cast(TimestampNTZType()).alias("window_end"),
        *node.aggregates.keys(),
    )


def _process(
    df: DataFrame, node: ProcessNode, query: QueryPlan, checkpoint: str | None
) -> DataFrame:
    """A process node, its state in the Python worker: repartition by key group (unless the
    source's partitions already hold their key groups, ``QueryPlan.by_partition``), then
    :class:`~stateful_runtime.operators.arrow_keyed.ArrowKeyedOperator` over whole Arrow
    batches (see that module).

    Spark runs a batch without new data only when a source offers new offsets or a stateful
    operator of its own asks for one, and ``mapInArrow`` is none. So the query of a function
    whose timers must fire without new input (``QueryPlan.ticks``) also reads the operator's
    timer ticks (:func:`_tick_options`), a source of no rows whose offset moves when one of
    its timers is due. A checkpoint written before the event-time ticks carries a
    deduplication that never sees a row instead (:func:`_watermark_carrier`,
    ``QueryPlan.watermark_carrier``), which makes Spark run a batch whenever the watermark
    moved; behind the shared shuffle Spark's per-operator watermark propagation cannot see the
    source's watermark, so a query with keyed state runs with one global watermark
    (:data:`SINGLE_WATERMARK`, set by the runner while it starts the query)."""
    from pyspark.sql import functions as F

    from stateful_runtime.functions import BroadcastProcess
    from stateful_runtime.operators.arrow_keyed import KEY_GROUP, ROUTE, route_values
    from stateful_runtime.operators.keyed_store import MAX_PARALLELISM
    from stateful_runtime.operators.output import TAG, TS

    fn = node.function
    parallelism = query.parallelism
    keys = list(node.parent.keys)
    fields = [c for c in df.columns if c not in (EVENT_TIME, *ORIGIN_COLUMNS, UNION_INPUT)]
    operator, out_struct = _keyed_operator(df.sparkSession, node, query, checkpoint, fields)
    df = df.withColumn(TS, F.unix_millis(EVENT_TIME))
    df = df.withColumn(KEY_GROUP, F.pmod(F.hash(*keys), F.lit(MAX_PARALLELISM)))
    if isinstance(fn, BroadcastProcess):
        # Every broadcast element to every partition: a copy each, in its first key group.
        df = _broadcast_copies(df, parallelism)
    ticks = None
    if query.ticks is not None and checkpoint is not None:
        splits = parallelism if query.by_partition else 0
        ticks = _as_rows_of(
            read_stream(
                df.sparkSession,
                *_tick_options(
                    df.sparkSession, checkpoint, node.name, parallelism, query.ticks, splits
                ),
            ),
            df.schema,
        )
    if query.by_partition:
        # The source's partition p holds exactly the keys of partition p's key groups: the
        # operator runs in the task that read them (a record that is not is refused there).
        # The ticks, when they moved, come after them as one empty split per state partition:
        # Spark reads a source without new offsets as a relation of no partitions, so in a
        # batch of ticks alone split p is task p; after a read they are tasks P.. and do
        # nothing (ArrowKeyedOperator).
        shuffled = df if ticks is None else df.unionByName(ticks)
    else:
        routes = F.array(*[F.lit(v) for v in route_values(parallelism)])
        owner = F.floor(F.col(KEY_GROUP) * parallelism / MAX_PARALLELISM).cast(IntegerType()) + 1
        df = df.withColumn(ROUTE, F.element_at(routes, owner))
        shuffled = df.repartition(parallelism, ROUTE)
    out = shuffled.mapInArrow(operator, out_struct)
    if query.watermark_carrier:
        out = out.unionByName(_watermark_carrier(shuffled, out_struct))
    if ticks is not None and not query.by_partition:
        out = out.unionByName(_as_rows_of(ticks, out_struct))
    return _observe_late(out, fn, TAG, query)


def _keyed_operator(
    spark: SparkSession,
    node: ProcessNode,
    query: QueryPlan,
    checkpoint: str | None,
    fields: Sequence[str],
) -> tuple[Any, StructType]:
    """The process node's operator over records of ``fields``, and its output's schema."""
    from stateful_runtime.connectors.formats.json import to_struct
    from stateful_runtime.operators.arrow_keyed import ArrowKeyedOperator
    from stateful_runtime.operators.output import TS, output_struct

    fn = node.function
    out_struct = output_struct(to_struct(fn.output_schema))
    operator = ArrowKeyedOperator(
        fn,
        node.name,
        list(node.parent.keys),
        fields,
        TS,
        arrow_schema(out_struct),
        checkpoint,
        query.parallelism,
        step_guard(query, node.name),
        query.rocksdb,
        placed_by=query.copartitioned.where if query.by_partition and query.copartitioned else None,
    )
    if getattr(fn, "tally", None) is not None:  # an enrich_async lookup's calls
        operator.stats = call_stats(spark, query.name)
    return operator, out_struct


def _keyed_read(
    spark: SparkSession, query: QueryPlan, checkpoint: str, staging: str | None
) -> DataFrame:
    """The query's keyed operator inside its source's read (``QueryPlan.keyed_read``:
    :mod:`stateful_runtime.operators.keyed_read`), with its timer ticks; Spark's watermark
    node over the output, which the query's input watermarks set
    (:mod:`stateful_runtime.runtime.input_watermarks`)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StructType

    from stateful_runtime.operators import keyed_read
    from stateful_runtime.operators.output import TAG

    src = query.source
    node = query.process
    assert node is not None
    wm = src.watermark
    assert wm.timestamp_field is not None
    inner, inner_options = src.source.data_source(
        staging,
        watermark=wm,
        query_checkpoint=checkpoint,
        by_partition=True,
        accounting=accounting.option(spark, query.name, src.name),
    )
    schema = cast(StructType, inner(inner_options).schema())  # (the runtime's sources')
    fields = [f for f in schema.fields if f.name not in (ERROR, RAW, PARTITION, OFFSET)]
    operator, out_struct = _keyed_operator(spark, node, query, checkpoint, [f.name for f in fields])
    options = keyed_read.options(
        inner,
        inner_options,
        operator,
        out_struct,
        fields=arrow_schema(StructType(fields)),
        key=node.parent.keys[0],
        event_time=(wm.timestamp_field, wm.timestamp_unit),
    )
    out = read_stream(spark, keyed_read.KeyedReadDataSource, options)
    # Spark's watermark over no column of the records: the input watermarks set it
    delay = wm.max_out_of_orderness
    interval = spark_interval(delay) if delay.total_seconds() > 0 else "0 seconds"
    out = (
        out.withColumn(EVENT_TIME, F.lit(None).cast(TimestampType()))
        .withWatermark(EVENT_TIME, interval)
        .drop(EVENT_TIME)
    )
    if query.ticks is not None:
        ticks_source, ticks_options = _tick_options(
            spark, checkpoint, node.name, query.parallelism, query.ticks, query.parallelism
        )
        ticks = keyed_read.options(
            ticks_source, ticks_options, operator, out_struct, after_source_of=checkpoint
        )
        out = out.unionByName(read_stream(spark, keyed_read.KeyedReadDataSource, ticks))
    return _observe_late(out, node.function, TAG, query)


def _watermark_carrier(shuffled: DataFrame, like: StructType) -> DataFrame:
    """No rows, through a deduplication of Spark's: Spark runs a batch whenever the watermark
    moved. Its filter passes no row and reads every column, so the optimizer cannot prune the
    branch's input: both branches share one shuffle (ReusedExchange) and the source is read
    once. Deduplicating by the route (the shuffle's own key and partition count) needs no
    exchange of its own: the branch runs in the operator's stage. It still reads the whole
    shuffle a second time, which is why only functions whose timers can emit carry it."""
    from pyspark.sql import functions as F

    from stateful_runtime.operators.arrow_keyed import ROUTE

    task = F.spark_partition_id()  # non-deterministic: the optimizer moves none of it
    never = (task < 0) & (F.hash(task, *shuffled.columns) == 1)
    return _as_rows_of(shuffled.filter(never).dropDuplicatesWithinWatermark([ROUTE]), like)


def _observe_late(out: DataFrame, fn: Any, tag_column: str, query: QueryPlan) -> DataFrame:
    """A window's or join's late records (to a late side output, or dropped: a marker row)
    counted as the batch's late records; in a query of several sources also per source
    (``late:<source>``), by the input each late row names (:data:`UNION_INPUT`)."""
    from pyspark.sql import functions as F

    from stateful_runtime.operators.output import SIDE

    join = getattr(fn, "connected", None)
    if isinstance(fn, WindowOperator):
        tags = list(fn.side_outputs)
    elif isinstance(join, JoinOperator):
        tags = list(join.late_tags)
    else:
        return out
    is_late = F.col(tag_column).isin([t.name for t in tags] + [LATE_MARK])
    counts = [F.sum(F.when(is_late, 1).otherwise(0)).alias("late")]
    if query.union:
        source = F.get_json_object(F.col(SIDE), f"$.{UNION_INPUT}").cast(IntegerType())
        counts += [
            F.sum(F.when(is_late & (source == i.index), 1).otherwise(0)).alias(
                f"late:{i.source.name}"
            )
            for i in query.inputs
        ]
    return out.observe(LATE_METRICS, *counts)


def _broadcast_copies(df: DataFrame, parallelism: int) -> DataFrame:
    """The broadcast input's records (tagged 2) once per state partition, each copy in the
    partition's first key group (where the task looks for it); the keyed input's as they
    are."""
    from pyspark.sql import functions as F

    from stateful_runtime.checkpoints.keyed import key_groups
    from stateful_runtime.functions import CO_INPUT
    from stateful_runtime.operators.arrow_keyed import KEY_GROUP

    copy = "srt_broadcast_copy"
    broadcast = F.col(CO_INPUT) == 2
    firsts = F.array(*[F.lit(key_groups(p, parallelism).start) for p in range(parallelism)])
    copies = F.when(broadcast, F.sequence(F.lit(1), F.lit(parallelism))).otherwise(
        F.array(F.lit(0))
    )
    df = df.withColumn(copy, F.explode(copies))
    group = F.when(broadcast, F.element_at(firsts, F.col(copy))).otherwise(F.col(KEY_GROUP))
    return df.withColumn(KEY_GROUP, group).drop(copy)


def _tick_options(
    spark: SparkSession,
    checkpoint: str,
    operator: str,
    parallelism: int,
    domain: TimeDomain,
    splits: int,
) -> tuple[type, dict[str, str]]:
    """The timer ticks' DataSource and options: no rows, from a source whose offset moves when
    a timer of ``operator`` in ``domain`` is due (:mod:`stateful_runtime.operators.ticks`):
    Spark runs that batch. ``splits``: the empty splits it gives a batch it moved in."""
    from stateful_runtime.operators.arrow_keyed import store_dir
    from stateful_runtime.operators.ticks import TickDataSource

    dirs = [str(store_dir(checkpoint, operator, p)) for p in range(parallelism)]
    options = {"checkpoint": checkpoint, "partitions": json.dumps(dirs), "splits": str(splits)}
    if domain is TimeDomain.EVENT_TIME:
        options["domain"] = "event"
    if (spark.conf.get(NO_DATA_BATCHES, "true") or "").lower() == "false":
        options["no_data_batches"] = "false"  # as for Spark's own operators: none
    return TickDataSource, options


def _as_rows_of(rows: DataFrame, like: StructType) -> DataFrame:
    """``rows`` (of no row) as rows of ``like``'s columns, all null."""
    from pyspark.sql import functions as F

    return rows.select(*[F.lit(None).cast(f.dataType).alias(f.name) for f in like.fields])


# Each query's accumulator of its map_async steps' calls (driver side, read by the runner).
_CALL_STATS: dict[str, Any] = {}


def call_stats(spark: SparkSession, query: str) -> Any:
    """Query ``query``'s accumulator of its ``map_async`` steps' calls (one for all of its
    steps: step → ``contract.CallStats``), made on first use in a :func:`build`."""
    from stateful_runtime.operators.maps import CallStatsParam

    acc = _CALL_STATS.get(query)
    if acc is None:
        acc = _CALL_STATS[query] = spark.sparkContext.accumulator({}, CallStatsParam())
    return acc


def calls_of(query: str) -> dict[str, Any] | None:
    """The calls of query ``query``'s ``map_async`` steps this run (None: it has none)."""
    acc = _CALL_STATS.get(query)
    return None if acc is None else dict(acc.value)


def _map(df: DataFrame, node: MapNode, query: QueryPlan) -> DataFrame:
    """A stateless Python function over whole Arrow batches (Spark's ``mapInArrow``); the
    columns it does not see (event time, the late-data bound) are carried to its outputs with
    their metadata, the watermark's among them."""
    from pyspark.sql.types import StructType

    from stateful_runtime.operators.maps import AsyncMapOperator, MapOperator

    fields = record_schema(node.parent).fieldNames()
    carried = [f for f in df.schema.fields if f.name not in fields]
    clash = [f.name for f in carried if f.name in node.output_schema.fieldNames()]
    if clash:
        raise PlanError(
            f"map {node.name!r}: output column(s) {clash} are reserved by the runtime; rename them"
        )
    args = (node.name, node.function, node.flat, fields, arrow_schema(node.output_schema))
    carried_names = [f.name for f in carried]
    guard = step_guard(query, node.name)
    if node.call is None:
        operator = MapOperator(*args, carried_names, guard)
    else:
        operator = AsyncMapOperator(*args, carried_names, node.call, guard)
        operator.stats = call_stats(df.sparkSession, query.name)
    return df.mapInArrow(operator, StructType([*node.output_schema.fields, *carried]))
