"""The source contract: a replayable, offset-addressed stream of records."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

if TYPE_CHECKING:
    from collections.abc import Sequence

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.datasource import DataSource

    from stateful_runtime.sources._dead_letters import DeadLetters
    from stateful_runtime.watermarks import WatermarkStrategy

# Columns every source adds to the declared record fields.
ERROR = "_error"  # null for a good record, else why it was rejected
RAW = "_raw"  # the original bytes of a rejected record (null for good ones)
PARTITION = "_partition"
OFFSET = "_offset"
META_COLUMNS = (ERROR, RAW, PARTITION, OFFSET)


class Source(ABC):
    """A replayable source of records with offsets Spark keeps in its offset log.

    ``read_stream`` returns a streaming DataFrame of the declared record fields plus
    :data:`META_COLUMNS`. Records that do not decode into the declared schema are not dropped:
    they come through with ``_error`` set; given ``dead_letters``, the source also stages them
    per split and publishes them once their micro-batch is committed
    (:mod:`stateful_runtime.sources._dead_letters`).
    """

    name: str
    schema: StructType

    def check(self) -> None:
        """Fail fast, before Spark starts, if the source cannot be read (missing topic...)."""

    @abstractmethod
    def read_stream(self, spark: SparkSession, dead_letters: DeadLetters | None = None,
                    watermark: WatermarkStrategy | None = None) -> DataFrame:
        """The decoded stream, good and bad records alike. With ``watermark``, a source may
        align its partitions in event time (:mod:`stateful_runtime.sources._align`)."""

    @abstractmethod
    def dead_letters(self, job: str, staging: str) -> DeadLetters:
        """Where this source's rejected records go, for job ``job``."""

    @abstractmethod
    def describe(self) -> str:
        """One line for ``explain()``."""


def stream_schema(record_schema: StructType, extra: Sequence[StructField] = ()) -> StructType:
    """What a source's DataFrame holds: the declared fields (all nullable: a rejected record has
    nulls in every one), the source's ``extra`` columns, then :data:`META_COLUMNS`."""
    out = StructType([StructField(f.name, f.dataType, True) for f in record_schema.fields])
    for f in extra:
        out = out.add(f)
    return (out.add(ERROR, StringType()).add(RAW, BinaryType())
            .add(PARTITION, IntegerType()).add(OFFSET, LongType()))


_REGISTERED: set[tuple[str, str]] = set()


def register(spark: SparkSession, data_source: type[DataSource]) -> None:
    """Register a Python DataSource once per Spark application (re-registering warns)."""
    key = (spark.sparkContext.applicationId, data_source.name())
    if key not in _REGISTERED:
        spark.dataSource.register(data_source)
        _REGISTERED.add(key)
