"""The rows a keyed operator hands to Spark: its main output's columns, then ``_tag`` (null for
the main output, else the side output's name, or the tag of the task's commit row) and
``_side`` (that record as JSON). The query's ``foreachBatch`` routes each row to its sink
(:mod:`stateful_runtime.runtime.batch_writes`)."""

from __future__ import annotations

from pyspark.sql.types import StringType, StructField, StructType

TAG = "_tag"
SIDE = "_side"
# Each input record's event time (ms), the column the operator reads it from. No leading
# underscore: Spark rebuilds pandas frames via itertuples, which renames such columns.
TS = "srt_event_ms"


def output_struct(main: StructType) -> StructType:
    """The operator's output schema: ``main``'s fields, nullable, then the tag and the side
    record."""
    fields = [StructField(f.name, f.dataType, True) for f in main.fields]
    return StructType([*fields, StructField(TAG, StringType()), StructField(SIDE, StringType())])
