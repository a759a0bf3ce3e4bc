"""The source contract: a replayable, offset-addressed stream of records."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from pyspark.sql.types import StructType

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from stateful_runtime.sources._dead_letters import DeadLetters

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
    def read_stream(self, spark: SparkSession, dead_letters: DeadLetters | None = None
                    ) -> DataFrame:
        """The decoded stream, good and bad records alike."""

    @abstractmethod
    def dead_letters(self, job: str, staging: str) -> DeadLetters:
        """Where this source's rejected records go, for job ``job``."""

    @abstractmethod
    def describe(self) -> str:
        """One line for ``explain()``."""
