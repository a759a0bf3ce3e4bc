"""``srt explain``: the plan (:mod:`stateful_runtime.planner`) rendered for people.

Each query with its path and why, then its steps in order: the source, decoding and dead
letters, the watermark, every node, when a native window emits, and each sink with where its
batches are written. With a SparkSession, Spark's own physical plan follows each query.
"""

from __future__ import annotations

import contextlib
import io
from typing import TYPE_CHECKING

from stateful_runtime.exceptions import TopicNotFoundError
from stateful_runtime.functions import BroadcastProcess, CoProcess, function_name
from stateful_runtime.job import RocksDBMemory
from stateful_runtime.joins import JoinOperator
from stateful_runtime.operators.keyed import describe_states
from stateful_runtime.operators.window import WindowOperator
from stateful_runtime.planner import (
    NativeWindowNode,
    Plan,
    PlannedNode,
    QueryPath,
    QueryPlan,
    native_aggregates,
)
from stateful_runtime.streams import CoInputNode, FilterNode, KeyByNode, MapNode, ProcessNode

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def explain(plan: Plan, spark: SparkSession | None = None) -> str:
    """The planned queries; with a SparkSession, also Spark's own plan for each."""
    job = plan.job
    lines = [
        f"job {job.name}: {len(plan.queries)} streaming queries, parallelism "
        f"{job.parallelism}, checkpoint every {job.checkpoint.interval} in "
        f"{job.checkpoint.dir}",
        state_line(job.rocksdb),
    ]
    for q in plan.queries:
        lines.append("")
        lines.append(f"query {q.name}  [path: {q.path}; output mode: {q.output_mode}]")
        lines.append(f"  why: {q.reason}")
        lines += [f"  {i}. {step}" for i, step in enumerate(steps(q), 1)]
        if spark is not None:
            lines += _spark_plan(spark, q)
    return "\n".join(lines)


def state_line(memory: RocksDBMemory) -> str:
    """Where keyed state lives, and its memory settings in each worker."""
    return (
        f"state: keyed state in a RocksDB in each Python worker ("
        f"state.rocksdb.block_cache_mb={memory.block_cache_mb}, "
        f"state.rocksdb.write_buffer_mb={memory.write_buffer_mb}, "
        f"state.rocksdb.write_buffers={memory.write_buffers}: at most {memory.bound_mb} MiB "
        f"per worker), versioned with each batch under <checkpoint>/<query>/keyed/; native "
        f"windows in Spark's RocksDB state store"
    )


def _spark_plan(spark: SparkSession, query: QueryPlan) -> list[str]:
    from stateful_runtime.runtime.dataframes import build

    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            build(spark, query).explain(mode="formatted")
    except TopicNotFoundError as exc:
        # The plan above needs no data; only Spark's own plan reads the source's partitions.
        # `srt run` refuses the missing topic with the same message.
        return [f"  Spark plan: not available until the source's topic exists ({exc})"]
    return ["  Spark plan:"] + ["    " + ln for ln in buf.getvalue().rstrip().splitlines()]


def steps(query: QueryPlan) -> list[str]:
    """What the query does, one line per step, in order."""
    out: list[str] = []
    for i in query.inputs:
        src, dead_letters = i.source, i.dead_letters
        where = (
            f"staged per split and published to the {dead_letters.sink.describe()} once the "
            f"batch commits"
            if dead_letters
            else "handled by the query that owns the source"
        )
        lead = f"input {i.index + 1}: " if query.union else ""
        out += [
            f"{lead}source {src.name}: {src.source.describe()}",
            f"decode; records that fail are {where}",
            f"watermark: {src.watermark.describe()}",
            f"event-time policy: {src.watermark.event_time_policy.describe()}",
        ]
        out += [_node_step(node, query.parallelism) for node in i.nodes]
    if query.union:
        names = ", ".join(query.source_names)
        out.append(
            f"union of {names}: the watermark is the minimum of the inputs' watermarks (each "
            f"input's own: largest event time it read minus its bound; Spark's "
            f"multipleWatermarkPolicy=min), so the input that lags holds it back, and an input "
            f"that has read nothing yet holds it at the epoch; each input's offsets are "
            f"checkpointed in the same offsets/N, its records counted apart"
        )
    out += [_node_step(node, query.parallelism) for node in query.nodes]
    if query.step_dead_letters is not None and any(
        isinstance(n, MapNode | ProcessNode) for n in query.nodes
    ):
        errors = query.errors
        out.append(
            "a record a step's function raises on: "
            + (
                f"to the {query.step_dead_letters.sink.describe()} with the step and the "
                f"reason (errors.policy={errors.policy}; the job stops past "
                f"{errors.max_consecutive} in a row or {errors.max_fraction:g} of a task's "
                f"records)"
                if errors.policy == "dead_letter"
                else "the job stops, naming it and the srt run --skip that passes it "
                "(errors.policy=fail)"
            )
        )
    if query.path is QueryPath.NATIVE:
        out.append(
            "emit: every update of an open window (the sink upserts by key)"
            if query.output_mode == "update"
            else "emit: each window once, when the watermark passes its end"
        )
    for o in query.outputs:
        sink = o.sink
        if query.process is None:
            out.append(f"sink {o.name}: {sink.describe()}")
        elif o.side is None:
            out.append(f"sink {o.name} (main output): {sink.describe()}")
        else:
            out.append(f"sink {o.name} (side output {o.side.name}): {sink.describe()}")
        wp = sink.write_placement()
        at = (
            f"on the executors, {getattr(sink, 'partitions', None) or query.parallelism} "
            f"partitions by {', '.join(sink.key_columns)}"
            if wp.where == "executors"
            else "on the driver"
        )
        out.append(f"write {o.name} {at}: {wp.why}")
    return out


def _node_step(node: PlannedNode, parallelism: int) -> str:
    if isinstance(node, FilterNode):
        return f"filter {node.condition}"
    if isinstance(node, MapNode):
        what = getattr(node.function, "__qualname__", None) or type(node.function).__name__
        calls = f" ({node.call.describe()})" if node.call is not None else ""
        return (
            f"{node.kind} {node.name}: {what} in Python{calls} "
            f"over whole Arrow batches → {', '.join(node.output_schema.fieldNames())}"
        )
    if isinstance(node, CoInputNode):
        own = [c for c, src in node.columns if src is not None]
        return (
            f"connect: input {node.input} of the connected streams (its records tagged "
            f"{node.input}, for {node.call}; columns {', '.join(own)})"
        )
    if isinstance(node, KeyByNode):
        return (
            f"key_by {', '.join(node.keys)} (hash-partitioned into {parallelism} state partitions)"
        )
    if isinstance(node, NativeWindowNode):
        aggs = native_aggregates(node)
        return (
            f"window {node.name}: {node.assigner.describe()} by "
            f"{', '.join(node.parent.keys)} → {aggs}"
        )
    assert isinstance(node, ProcessNode)
    fn = node.function
    if isinstance(fn, WindowOperator):
        return f"window {node.name}: {fn.describe()}"
    states = (
        ", ".join(
            f"{d.name}:{d.kind}"
            + (
                f" ttl {ttl.ttl} {ttl.time_domain.value}"
                if (ttl := getattr(d, "ttl", None))
                else ""
            )
            for d in describe_states(fn)
        )
        or "none"
    )
    if isinstance(fn, BroadcastProcess):
        keyed, broadcast = fn.inputs
        names = ", ".join(fn.descriptors)
        return (
            f"broadcast process {node.name}: {type(fn.connected).__name__} in "
            f"{fn.time_domain.value}: process_element ← input 1 ({keyed.source}); "
            f"process_broadcast_element ← input 2 ({broadcast.source}, every element to each "
            f"of the {parallelism} state partitions, before the batch's keyed elements); "
            f"broadcast state: {names} (keyed state: {states})"
        )
    if isinstance(fn, CoProcess) and isinstance(fn.connected, JoinOperator):
        join = fn.connected
        ins = "; ".join(
            f"{role} ← input {n} ({spec.source})"
            for n, (role, spec) in enumerate(zip(join.calls, fn.inputs, strict=True), start=1)
        )
        late = ", ".join(t.name for t in join.late_tags)
        return (
            f"{join.kind} {node.name}: {function_name(fn)} in event time: {ins}; "
            f"{join.describe()}; late records "
            + (f"→ side output {late}" if late else "dropped, counted as late")
            + f" (state: {states})"
        )
    if isinstance(fn, CoProcess):
        ins = "; ".join(
            f"process_element{n} ← input {n} ({spec.source})"
            for n, spec in enumerate(fn.inputs, start=1)
        )
        return (
            f"co-process {node.name}: {type(fn.connected).__name__} in {fn.time_domain.value}: "
            f"{ins}; shared state and timers by key (state: {states})"
        )
    return f"process {node.name}: {type(fn).__name__} in {fn.time_domain.value} (state: {states})"
