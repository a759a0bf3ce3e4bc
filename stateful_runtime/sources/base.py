"""The source contract: a replayable, offset-addressed stream of records."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from stateful_runtime.sinks.base import Sink

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
    they come through with ``_error`` set and go to ``dead_letter_sink()``.
    """

    name: str
    schema: StructType

    def check(self) -> None:
        """Fail fast, before Spark starts, if the source cannot be read (missing topic...)."""

    @abstractmethod
    def read_stream(self, spark: SparkSession) -> DataFrame:
        """The decoded stream, good and bad records alike."""

    @abstractmethod
    def dead_letter_sink(self) -> Sink:
        """Where records that fail to decode are written, with their reason."""

    @abstractmethod
    def describe(self) -> str:
        """One line for ``explain()``."""
