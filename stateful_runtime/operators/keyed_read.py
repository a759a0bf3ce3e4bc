"""A keyed source read, decoded and run through its keyed operator in one Python task.

Where a source's partitions hold the key groups of the job's state partitions
(``QueryPlan.by_partition``), the task that reads partition ``p`` is the one that keeps its
keys' state. Read through ``mapInArrow``, that task still runs two Python workers: the source's
read hands Arrow batches to the JVM, which makes rows of them, and ``mapInArrow`` makes Arrow of
the rows again for the operator's worker. :class:`KeyedReadDataSource` wraps the source's own
reader instead: its ``read`` of split ``p`` decodes the split as the source does (its dead
letters staged, its accounting reported: ``connectors/accounting.py``), computes what the JVM
computed for each good record (its event time in ms and its key group, the same hash as
Spark's ``hash``), and hands the records to
:class:`~stateful_runtime.operators.arrow_keyed.ArrowKeyedOperator` in the same process; Spark
sees the operator's output alone. One Python hop and two conversions fewer a record.

The timer ticks (:mod:`stateful_runtime.operators.ticks`) are wrapped too, and keep their own
line of the offset log (a checkpoint of either plan runs on with the other): when a batch reads
the source, its tasks fire the due timers and the ticks give no split; in a batch of ticks alone
(Spark reads a source without new offsets as no partitions at all) each tick split runs its
state partition's operator over no records. Whether the batch reads the source is what Spark
decides from the offset log: the source's line of the batch against the batch before's.

Spark's watermark comes from the records' event times, which Spark no longer sees: the query's
per-partition watermark (``runtime/input_watermarks.py``), computed from the read tasks'
reports, sets it as it already does (the plan keeps a watermark node over the output for it).
"""

from __future__ import annotations

import base64
import importlib
import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadLimit, SupportsTriggerAvailableNow
from pyspark.sql.types import StructType

from stateful_runtime.checkpoints.keyed import column_key_groups
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION
from stateful_runtime.operators.isolation import ORIGIN_OFFSET, ORIGIN_PARTITION

NAME = "srt_keyed_read"
BATCH_ID = "streaming.sql.batchId"


def options(
    inner: type[DataSource],
    inner_options: Mapping[str, str],
    operator: Any,
    output: StructType,
    *,
    fields: pa.Schema | None = None,
    key: str | None = None,
    event_time: tuple[str, str] | None = None,
    after_source_of: str | None = None,
) -> dict[str, str]:
    """The options of a :class:`KeyedReadDataSource` over ``inner`` (a DataSource class of the
    runtime) read with ``inner_options``: ``operator`` (an ``ArrowKeyedOperator``, pickled),
    ``output`` (its output's schema); for a source, ``fields`` (the records' fields the
    operator reads, typed as Spark hands them to ``mapInArrow``), ``key`` (the key field whose
    key groups the records carry) and ``event_time`` (the field and unit of the records' event
    time); for the timer ticks read after it, ``after_source_of`` (the query's checkpoint
    directory)."""
    from pyspark import cloudpickle

    out = {
        "inner": f"{inner.__module__}:{inner.__qualname__}",
        "inner_options": json.dumps(dict(inner_options)),
        "operator": base64.b64encode(cloudpickle.dumps(operator)).decode("ascii"),
        "schema": output.json(),
    }
    if fields is not None:
        out["fields"] = base64.b64encode(fields.serialize().to_pybytes()).decode("ascii")
    if key is not None:
        out["key"] = key
    if event_time is not None:
        out["event_time"] = json.dumps(event_time)
    if after_source_of is not None:
        out["after_source_of"] = after_source_of
    return out


@dataclass
class KeyedSplit(InputPartition):
    """State partition ``partition``'s split: the source's (``inner``), or none (ticks)."""

    partition: int
    inner: InputPartition | None = None


class KeyedReadStreamReader(DataSourceStreamReader):
    """The inner reader's offsets and splits, its splits read through the operator."""

    def __init__(self, options: Mapping[str, str]) -> None:
        module, name = options["inner"].split(":")
        inner_options = json.loads(options["inner_options"])
        data_source = getattr(importlib.import_module(module), name)(inner_options)
        self.inner = data_source.streamReader(data_source.schema())
        self.operator_blob = options["operator"]
        self.key = options.get("key")
        found_fields = options.get("fields")
        self.fields = (
            pa.ipc.read_schema(pa.py_buffer(base64.b64decode(found_fields)))
            if found_fields
            else None
        )
        found = options.get("event_time")
        self.event_time = tuple(json.loads(found)) if found else None
        self.after_source_of = options.get("after_source_of")

    # -- driver side: the inner reader's -----------------------------------------------------
    def initialOffset(self) -> dict:
        return self.inner.initialOffset()

    def getDefaultReadLimit(self) -> ReadLimit:
        return self.inner.getDefaultReadLimit()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # type: ignore[override]
        return self.inner.latestOffset(start, limit)  # type: ignore[call-arg]

    def reportLatestOffset(self) -> dict | None:
        return self.inner.reportLatestOffset()

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        splits = self.inner.partitions(start, end)
        if self.after_source_of is not None:  # the ticks
            if _reads_source(self.after_source_of):
                return []  # the source's tasks fire the timers
            return [KeyedSplit(int(s.value)) for s in splits]
        return [KeyedSplit(int(s.partition), s) for s in splits]  # type: ignore[attr-defined]

    def commit(self, end: dict) -> None:
        self.inner.commit(end)

    def stop(self) -> None:
        self.inner.stop()

    # -- executor side -----------------------------------------------------------------------
    def read(self, partition: KeyedSplit) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        from pyspark import TaskContext, cloudpickle

        task = TaskContext.get()
        batch = task.getLocalProperty(BATCH_ID) if task is not None else None
        if batch is None:
            raise RuntimeError(f"{NAME}: Spark gave the task no batch id")
        operator = cloudpickle.loads(base64.b64decode(self.operator_blob))
        records: Iterator[pa.RecordBatch] = iter(())
        if partition.inner is not None:
            records = self._records(self.inner.read(partition.inner))
        yield from operator.run(int(batch), partition.partition, records)

    def _records(self, batches: Iterator[Any]) -> Iterator[pa.RecordBatch]:
        """The source's good records with what the operator reads beside their fields: event
        time (ms), key group, and where each came from."""
        from stateful_runtime.operators.arrow_keyed import KEY_GROUP
        from stateful_runtime.operators.output import TS

        assert self.key is not None and self.event_time is not None and self.fields is not None
        field, unit = self.event_time
        for batch in batches:
            good = batch.filter(pc.is_null(batch.column(ERROR)))
            if not good.num_rows:
                continue
            columns = {}
            for f in self.fields:  # as Spark's rows would give them (a timestamp's zone)
                column = good.column(f.name)
                columns[f.name] = column if column.type == f.type else column.cast(f.type)
            columns[TS] = _event_ms(good.column(field), unit)
            columns[KEY_GROUP] = pa.array(column_key_groups(good.column(self.key)), pa.int32())
            columns[ORIGIN_PARTITION] = good.column(PARTITION)
            columns[ORIGIN_OFFSET] = good.column(OFFSET)
            yield pa.RecordBatch.from_pydict(columns)


class KeyedReadAvailableNow(KeyedReadStreamReader, SupportsTriggerAvailableNow):
    """Over an inner reader that fixes its end for an ``--available-now`` run itself."""

    def prepareForTriggerAvailableNow(self) -> None:
        self.inner.prepareForTriggerAvailableNow()  # type: ignore[attr-defined]


class KeyedReadDataSource(DataSource):
    """``spark.readStream.format("srt_keyed_read")``; options as :func:`options` gives."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return StructType.fromJson(json.loads(self.options["schema"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        reader = KeyedReadStreamReader(self.options)
        if isinstance(reader.inner, SupportsTriggerAvailableNow):
            return KeyedReadAvailableNow(self.options)
        return reader


def _event_ms(column: pa.Array | pa.ChunkedArray, unit: str) -> pa.Array:
    """Each record's event time in ms as Spark's ``unix_millis`` of the source's event-time
    column gives it (``runtime/dataframes._event_time_column``), nulls kept."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_timestamp(column.type):
        micros = pc.cast(pc.cast(column, pa.timestamp("us")), pa.int64())
        return pc.floor(pc.divide(pc.cast(micros, pa.float64()), 1000.0)).cast(pa.int64())
    values = pc.cast(column, pa.int64())
    return pc.multiply(values, 1000) if unit == "s" else values


def _reads_source(query_checkpoint: str) -> bool:
    """Whether the batch Spark is planning reads the query's source (its first line of the
    offset log), as Spark decides: its offsets differ from the batch before's, or there is no
    batch before (the first batch reads every source)."""
    layout = QueryLayout(query_checkpoint)
    batch = layout.last_planned()
    if batch is None or batch == 0:
        return True
    try:
        now = layout.offsets(batch).read_text().splitlines()
        before = layout.offsets(batch - 1).read_text().splitlines()
    except OSError:
        return True
    return now[2:3] != before[2:3]
