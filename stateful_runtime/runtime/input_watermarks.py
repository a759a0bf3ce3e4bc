"""Each input's watermark across restarts of a query of several inputs.

Spark keeps a watermark per input of a query (each input's ``withWatermark``) and takes their
minimum, but in memory only: a restart starts from the global watermark its last commit logged
(``nextBatchWatermarkMs``), and an input that gets no new record after the restart counts as
the epoch, so it holds the query's watermark where the restart found it however far its
records had moved it before. Spark also runs no batch without data after a restart until a
batch with data ran (it asks the last batch's plan, which the restart lost): a bounded run after
a restart with nothing new fires nothing.

So the runtime keeps each input's watermark with the batch and starts from it:

* each input's read tasks also report the largest event time of their split's good records
  (:mod:`stateful_runtime.connectors.accounting`); in the query's ``foreachBatch``, after the
  sinks wrote batch N and before Spark commits it, :meth:`InputWatermarks.after_batch` folds
  them into the watermarks after batch N-1, as Spark's tracker does (an input's watermark is
  its largest event time less its out-of-orderness bound, and never goes back), and writes
  ``<query>/input-watermarks/<N>`` (a replay of N writes it again; a savepoint of N holds it:
  ``QueryLayout.batch_files``);
* a query of several inputs with a stateful step also reads :class:`ResumeDataSource`, a source
  of no rows whose offset moves once, at the first trigger of a run after a committed batch:
  Spark runs that batch, and after it the batches without data it decides on;
* in the first batch a run executes, before Spark updates its watermark after it,
  :meth:`InputWatermarks.after_batch` gives Spark's tracker each input's watermark as of the
  last committed batch (and the query's, their minimum, when it is ahead of the logged one).

One watermark per partition (Flink's per-split watermarks). Spark's watermark of an input is
its largest event time less the bound, over all its partitions: a partition behind the others
(a slow producer, a smaller share of a backlog) would see its records late. So every query with
a stateful step tracks each input's partitions: each read task reports the newest event time of
its split's good records (``connectors.accounting``), the runner folds them into each
partition's event time after the batch (kept in the same file, so a restart and a savepoint
carry them), and the input's watermark is the smallest over its active partitions less the
bound. Idle ones are left out:

* a partition without records for the source's ``with_idleness`` timeout in batch processing
  time;
* at once for the event log, whose silent partitions hold nobody;
* in a bounded run, a partition without records in the batch, and one the batch read to the
  run's end (its split says so): the batch that reads the last records moves the watermark to
  the end, so one batch without data, not two, fires what it closes;
* a Kafka partition without idleness holds the others as long as it is silent, as in Flink;
* all idle: the largest, Spark's own.

Before Spark updates its watermark after the batch, the batch's ``EventTimeWatermarkExec``
statistics are set to that value (Spark takes ``max - delay`` from them, and only ever raises
its watermark), so Spark's windows, the keyed operators' timers and the late-record filter all
go by it. A re-run of a batch computes the same from the same records and its logged
processing time (in a bounded run, against that run's end).

The tracker is Spark's (4.3: ``MicroBatchExecution.watermarkTracker``); its per-input map is
private, set by reflection. Spark names the map's entries by the plan's ``EventTimeWatermark``
nodes, one per input in the order of the query's inputs (a plan that reads its inputs twice
shares them). Where Spark's classes differ, the query's watermark alone is set (public),
and the job's log says so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import LongType, StructField, StructType

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.storage import write_file

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from stateful_runtime.connectors.accounting import BatchCounts
    from stateful_runtime.planner import QueryPlan

log = logging.getLogger(__name__)

NAME = "srt_resume"
RETAIN = 100  # files kept (Spark's spark.sql.streaming.minBatchesToRetain)


def resumes(query: QueryPlan) -> bool:
    """Whether ``query`` keeps its inputs' watermarks (several inputs, a stateful step, and a
    checkpoint that was not written before the runtime kept them)."""
    return query.union and bool(query.stateful_operators) and query.input_watermarks


def tracks_partitions(query: QueryPlan) -> bool:
    """Whether ``query`` keeps a watermark per partition of its inputs (a stateful step, whose
    watermark matters, over inputs with event time)."""
    return bool(query.stateful_operators) and all(
        i.source.watermark.timestamp_field for i in query.inputs
    )


def idle_after_ms(query: QueryPlan, *, bounded: bool) -> list[int | None]:
    """Per input, how long a partition without records stays active (ms of batch processing
    time; None: for ever): at once in a bounded run (every partition is read to its end, a
    partition the alignment holds back is ahead) and for the event log (its silent partitions
    hold nobody in its alignment either), else the source's ``with_idleness``, else for ever
    (Kafka: Flink without idleness)."""
    out: list[int | None] = []
    for i in query.inputs:
        idle = i.source.watermark.idleness
        if idle is not None and not bounded:
            out.append(_delay_ms(idle))
        elif bounded or i.source.source.silent_partitions_idle:
            out.append(0)
        else:
            out.append(None)
    return out


def _delay_ms(delay: timedelta) -> int:
    return int(delay / timedelta(milliseconds=1))


class InputWatermarks:
    """One query's inputs' watermarks: written per batch, given to Spark's tracker at the
    first batch of a run."""

    def __init__(
        self,
        spark: SparkSession,
        query: QueryPlan,
        name: str,
        checkpoint: str,
        *,
        bounded: bool = False,
    ) -> None:
        """``name``: the Spark query's; ``bounded``: an ``--available-now`` run."""
        self.spark = spark
        self.spark_name = name
        self.layout = QueryLayout(checkpoint)
        self.names = [i.source.name for i in query.inputs]
        self.delays = [_delay_ms(i.source.watermark.max_out_of_orderness) for i in query.inputs]
        self.idle_after = idle_after_ms(query, bounded=bounded)
        self.resumes = resumes(query)
        self.resumed = False
        self.execution: Any = None
        # After the last batch: each partition's event-time lag behind its source's newest
        # (ms, by "<source>:<partition>") and the partition holding the watermark, if one is.
        self.lag_by_partition: dict[str, int] | None = None
        self.held_by: str | None = None

    def _saved(self, batch: int) -> dict[str, Any]:
        path = self.layout.input_watermarks_upto(batch)
        try:
            found = json.loads(path.read_text()) if path is not None else {}
        except (OSError, ValueError):
            found = {}
        return found if isinstance(found, dict) else {}

    def saved(self, batch: int) -> dict[str, int | None]:
        """Each input's watermark after the newest batch at or before ``batch`` that recorded
        them (None: no record of that input yet)."""
        return self._inputs(self._saved(batch))

    def _inputs(self, found: Mapping[str, Any]) -> dict[str, int | None]:
        inputs = found.get("inputs", {})
        return {n: inputs.get(n) for n in self.names}

    def _partitions(self, found: Mapping[str, Any]) -> dict[str, dict[int, tuple[int, int]]]:
        """Each input's partitions in a saved record: partition → (newest event time,
        processing time of the last batch with a record of it)."""
        parts = found.get("partitions", {})
        return {
            n: {int(k): (int(v[0]), int(v[1])) for k, v in parts.get(n, {}).items()}
            for n in self.names
        }

    def after_batch(self, batch: int, counted: Mapping[str, BatchCounts]) -> None:
        """In ``foreachBatch`` of ``batch``, after its sinks ran (before Spark commits it);
        ``counted``: what each input's read tasks reported of the batch, by source name."""
        execution = self._execution()
        found = self._saved(batch - 1)
        before = self._inputs(found)
        if not self.resumed:
            self.resumed = True
            if execution is not None and self.resumes:
                self._resume(execution, before)
        at, _ = self.layout.batch_times(batch)
        at = int(at) if at is not None else 0
        parts = self._partitions(found)
        after = dict(before)
        lags: dict[str, int] = {}
        held: list[tuple[int, str]] = []
        for name, delay, idle in zip(self.names, self.delays, self.idle_after, strict=True):
            mine = parts[name]
            reported = counted.get(name)
            seen = reported.partition_times if reported is not None else {}
            fold(mine, {k: t for k, (t, _) in seen.items()}, at)
            if not mine:
                continue
            newest = max(t for t, _ in mine.values())
            lags.update({f"{name}:{k}": newest - t for k, (t, _) in sorted(mine.items())})
            ended = {k for k, (_, last) in seen.items() if last}
            top, holder = holding(mine, at, idle, ended)
            kept = after[name]
            if kept is None or top - delay > kept:  # a watermark never goes back
                after[name] = top - delay
            if holder is not None and after[name] == top - delay:
                held.append((top - delay, f"{name}:{holder}"))
        self.lag_by_partition = lags or None
        self.held_by = min(held)[1] if held else None
        if execution is not None:
            self._hold(execution, after)
        record = {
            "inputs": after,
            "partitions": {
                n: {str(k): list(v) for k, v in sorted(parts[n].items())} for n in self.names
            },
        }
        write_file(self.layout.input_watermarks / str(batch), json.dumps(record))
        (self.layout.input_watermarks / str(batch - RETAIN)).unlink(missing_ok=True)

    def _hold(self, execution: Any, watermarks: Mapping[str, int | None]) -> None:
        """Give Spark's watermark update after this batch each input's watermark: each
        input's ``EventTimeWatermarkExec`` statistics hold its watermark plus its bound."""
        try:
            nodes = _watermark_execs(execution)
            if len(nodes) != len(self.names):
                raise ValueError(f"{len(nodes)} watermark operators for {len(self.names)} inputs")
            for node, name, delay in zip(nodes, self.names, self.delays, strict=True):
                wm = watermarks[name]
                if wm is None:
                    continue
                stats = node.eventTimeStats()
                stats.reset()
                stats.add(wm + delay)
        except Exception as e:  # noqa: BLE001 - Spark's private classes differ: its own
            if not getattr(self, "_warned", False):
                self._warned = True
                log.warning(
                    "each partition's watermark could not be given to Spark (%s): the "
                    "watermark is the largest event time of all partitions less the bound",
                    e,
                )

    def _execution(self) -> Any:
        """Spark's execution of this query (its MicroBatchExecution), None if not found."""
        if self.execution is None:
            for q in self.spark.streams.active:
                if q.name == self.spark_name:
                    self.execution = q._jsq.streamingQuery()
        return self.execution

    def _resume(self, execution: Any, saved: Mapping[str, int | None]) -> None:
        if all(w is None for w in saved.values()):
            return
        tracker = execution.watermarkTracker()
        try:
            _set_inputs(
                self.spark, tracker, execution.logicalPlan(), [saved[n] for n in self.names]
            )
        except Exception as e:  # noqa: BLE001 - Spark's private classes differ: the query's
            log.warning(
                "each input's watermark could not be given to Spark (%s): the query's "
                "watermark starts at their minimum, held there until every input has new records",
                e,
            )
        # An input never read holds the query's watermark at the epoch, as in Spark.
        if all(w is not None for w in saved.values()):
            lowest = min(w for w in saved.values() if w is not None)
            if lowest > tracker.currentWatermark():
                tracker.setWatermark(lowest)


def fold(partitions: dict[int, tuple[int, int]], observed: Mapping[int, int], at: int) -> None:
    """Each partition's (newest event time, processing time of its last batch with a record)
    after a batch planned at ``at`` whose records' newest event times were ``observed``."""
    for k, top in observed.items():
        seen = partitions.get(k)
        partitions[k] = (top if seen is None else max(top, seen[0]), at)


def holding(
    partitions: Mapping[int, tuple[int, int]],
    at: int,
    idle_ms: int | None,
    ended: Collection[int] = (),
) -> tuple[int, int | None]:
    """The event time the input's watermark follows after the batch planned at ``at`` (its
    watermark plus the bound), and the partition holding it back if one of several does:
    the oldest newest event time of the active partitions (those with a record within
    ``idle_ms`` of ``at``, None: for ever; ``ended``, read to the end of a bounded run in this
    batch, are idle at once), or the newest of all when all are idle."""
    newest = max(t for t, _ in partitions.values())
    active = {
        k: t
        for k, (t, seen) in partitions.items()
        if k not in ended and (idle_ms is None or at - seen <= idle_ms)
    }
    if not active:
        return newest, None
    oldest = min(active, key=lambda k: (active[k], k))
    return active[oldest], (oldest if len(partitions) > 1 and active[oldest] < newest else None)


def _watermark_execs(execution: Any) -> list[Any]:
    """The ``EventTimeWatermarkExec`` operators of the batch Spark is running, in the order
    of the query's inputs (the logical plan's ``EventTimeWatermark`` nodes, pre-order, as
    :func:`_set_inputs` finds them)."""
    order = [n.toString() for n in _watermark_nodes(execution.logicalPlan()).values()]
    found: dict[str, Any] = {}
    stack = [execution.lastExecution().executedPlan()]
    while stack:
        node = stack.pop()
        if node.getClass().getSimpleName() == "EventTimeWatermarkExec":
            found[node.nodeId().toString()] = node
        children = node.children()
        stack.extend(children.apply(k) for k in range(children.size()))
    return [found[k] for k in order if k in found]


def _watermark_nodes(plan: Any) -> dict[str, Any]:
    """The plan's ``EventTimeWatermark`` node ids by their text, in the order first met
    (pre-order, as Spark collects them; a plan reading an input twice shares its node)."""
    nodes: dict[str, Any] = {}
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.getClass().getSimpleName() == "EventTimeWatermark":
            nodes.setdefault(node.nodeId().toString(), node.nodeId())
        children = node.children()
        stack.extend(children.apply(k) for k in reversed(range(children.size())))
    return nodes


def _set_inputs(spark: SparkSession, tracker: Any, plan: Any, values: Sequence[int | None]) -> None:
    """Spark's tracker's watermark of every ``EventTimeWatermark`` node of ``plan``: the
    value of its input (one node per input, in their order; None: left as it is)."""
    nodes = _watermark_nodes(plan)
    if len(nodes) != len(values):
        raise ValueError(f"{len(nodes)} watermark nodes for {len(values)} inputs")
    jvm, gateway = spark.sparkContext._jvm, spark.sparkContext._gateway
    assert jvm is not None and gateway is not None
    field = tracker.getClass().getDeclaredField("operatorToWatermarkMap")
    field.setAccessible(True)
    entries = field.get(tracker)
    if entries.size() != len(nodes):
        raise ValueError(f"the tracker has {entries.size()} inputs, the plan {len(nodes)}")
    for node, value in zip(nodes.values(), values, strict=True):
        if value is None:
            continue
        # Some(java.lang.Long) made in the JVM: py4j sends a Python int below 2^31 as an
        # Integer, which Spark cannot read as a Long.
        one = gateway.new_array(jvm.long, 1)
        one[0] = value
        entries.put(node, jvm.scala.collection.immutable.ArraySeq.unsafeWrapArray(one).headOption())


class ResumeStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.query = options["checkpoint"]
        self.offset: dict | None = None

    def initialOffset(self) -> dict:
        return {"run": 0}

    def prepareForTriggerAvailableNow(self) -> None:
        """The run's offset is fixed at its first trigger, bounded or not."""

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        if self.offset is None:
            resumed = QueryLayout(self.query).last_committed() is not None
            self.offset = {"run": int(start.get("run", 0)) + 1} if resumed else dict(start)
        return self.offset

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        return []

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return iter(())


class ResumeDataSource(DataSource):
    """Options: ``checkpoint`` (the query's checkpoint directory)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return StructType([StructField("run", LongType())])

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return ResumeStreamReader(self.options)
