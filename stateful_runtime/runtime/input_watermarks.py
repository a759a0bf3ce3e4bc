"""Each input's watermark across restarts of a query of several inputs.

Spark keeps a watermark per input of a query (each input's ``withWatermark``) and takes their
minimum, but in memory only: a restart starts from the global watermark its last commit logged
(``nextBatchWatermarkMs``), and an input that gets no new record after the restart counts as
the epoch, so it holds the query's watermark where the restart found it however far its
records had moved it before. Spark also runs no batch without data after a restart until a
batch with data ran (it asks the last batch's plan, which the restart lost): a bounded run after
a restart with nothing new fires nothing.

So the runtime keeps each input's watermark with the batch and starts from it:

* each input's source metrics also observe the largest event time of its good records
  (``dataframes.read_source``); in the query's ``foreachBatch``, after the sinks wrote batch N
  and before Spark commits it, :meth:`InputWatermarks.after_batch` folds them into the
  watermarks after batch N-1, as Spark's tracker does (an input's watermark is its largest
  event time less its out-of-orderness bound, and never goes back), and writes
  ``<query>/input-watermarks/<N>`` (a replay of N writes it again; a savepoint of N holds it:
  ``QueryLayout.batch_files``);
* a query of several inputs with a stateful step also reads :class:`ResumeDataSource`, a source
  of no rows whose offset moves once, at the first trigger of a run after a committed batch:
  Spark runs that batch, and after it the batches without data it decides on;
* in the first batch a run executes, before Spark updates its watermark after it,
  :meth:`InputWatermarks.after_batch` gives Spark's tracker each input's watermark as of the
  last committed batch (and the query's, their minimum, when it is ahead of the logged one).

The tracker is Spark's (4.3: ``MicroBatchExecution.watermarkTracker``); its per-input map is
private, set by reflection. Spark names the map's entries by the plan's ``EventTimeWatermark``
nodes, one per input in the order of the query's inputs (a plan that reads its inputs twice
shares them). Where Spark's classes differ, the query's watermark alone is set (public),
and the job's log says so.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import LongType, StructField, StructType

from stateful_runtime.checkpoints.layout import QueryLayout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from stateful_runtime.planner import QueryPlan

log = logging.getLogger(__name__)

NAME = "srt_resume"
EVENT_TIME_MAX = "event_time_max"  # each input's observed metric: largest event time (ms)
RETAIN = 100  # files kept (Spark's spark.sql.streaming.minBatchesToRetain)


def resumes(query: QueryPlan) -> bool:
    """Whether ``query`` keeps its inputs' watermarks (several inputs, a stateful step, and a
    checkpoint that was not written before the runtime kept them)."""
    return query.union and bool(query.stateful_operators) and query.input_watermarks


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
        metrics: Mapping[str, str],
    ) -> None:
        """``name``: the Spark query's; ``metrics``: each input's observed metric, by name."""
        self.spark = spark
        self.spark_name = name
        self.metrics = metrics
        self.layout = QueryLayout(checkpoint)
        self.names = [i.source.name for i in query.inputs]
        self.delays = [_delay_ms(i.source.watermark.max_out_of_orderness) for i in query.inputs]
        self.resumed = False
        self.execution: Any = None

    def saved(self, batch: int) -> dict[str, int | None]:
        """Each input's watermark after the newest batch at or before ``batch`` that recorded
        them (None: no record of that input yet)."""
        path = self.layout.input_watermarks_upto(batch)
        try:
            found = json.loads(path.read_text())["inputs"] if path is not None else {}
        except (OSError, ValueError, KeyError):
            found = {}
        return {n: found.get(n) for n in self.names}

    def after_batch(self, batch: int) -> None:
        """In ``foreachBatch`` of ``batch``, after its sinks ran (before Spark commits it)."""
        execution = self._execution()
        before = self.saved(batch - 1)
        if not self.resumed:
            self.resumed = True
            if execution is not None:
                self._resume(execution, before)
        maxima = _observed_maxima(execution, self.metrics) if execution is not None else {}
        after = dict(before)
        for name, delay in zip(self.names, self.delays, strict=True):
            top, was = maxima.get(name), after[name]
            if top is not None and (was is None or top - delay > was):
                after[name] = top - delay
        self.layout.input_watermarks.mkdir(parents=True, exist_ok=True)
        final = self.layout.input_watermarks / str(batch)
        tmp = final.with_name(f".{batch}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"inputs": after}))
        os.replace(tmp, final)
        (self.layout.input_watermarks / str(batch - RETAIN)).unlink(missing_ok=True)

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


def _observed_maxima(execution: Any, metrics: Mapping[str, str]) -> dict[str, int]:
    """Each input's largest event time (ms) of good records in the batch Spark is running."""
    observed = execution.lastExecution().observedMetrics()
    out = {}
    for name, metric in metrics.items():
        row = observed.get(metric)
        if row.isEmpty():
            continue
        row = row.get()
        at = row.fieldIndex(EVENT_TIME_MAX)
        if not row.isNullAt(at):
            out[name] = int(row.getLong(at))
    return out


def _set_inputs(spark: SparkSession, tracker: Any, plan: Any, values: Sequence[int | None]) -> None:
    """Spark's tracker's watermark of every ``EventTimeWatermark`` node of ``plan``: the
    value of its input (one node per input, in their order; None: left as it is)."""
    nodes: dict[str, Any] = {}  # by id, in the order first met (a plan reading an input
    stack = [plan]  # twice shares its node)
    while stack:  # pre-order, as Spark collects them
        node = stack.pop()
        if node.getClass().getSimpleName() == "EventTimeWatermark":
            nodes.setdefault(node.nodeId().toString(), node.nodeId())
        children = node.children()
        stack.extend(children.apply(k) for k in reversed(range(children.size())))
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
