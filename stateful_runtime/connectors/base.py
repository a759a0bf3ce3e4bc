"""The connector contracts: sources (replayable, offset-addressed streams of records), sinks
(where results go, idempotent per micro-batch) and dead letters (where rejected records go).

Every connector package (``eventlog/``, ``kafka/``, the warehouses in ``dbt_sink``) builds on
these and on nothing of another system's package.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa
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
    they come through with ``_error`` set, and the read tasks stage them per split; the job
    publishes them to :meth:`dead_letter_sink` once their micro-batch is committed
    (:mod:`stateful_runtime.connectors.dead_letters`).
    """

    name: str
    schema: StructType

    def check(self) -> None:
        """Fail fast, before Spark starts, if the source cannot be read (missing topic...)."""

    @abstractmethod
    def read_stream(self, spark: SparkSession, dead_letter_staging: str | None = None,
                    watermark: WatermarkStrategy | None = None) -> DataFrame:
        """The decoded stream, good and bad records alike. With ``dead_letter_staging``, each
        read task also stages its split's rejected records there
        (:func:`stateful_runtime.connectors.dead_letters.stage`). With ``watermark``, a source
        may align its partitions in event time (:mod:`stateful_runtime.connectors.alignment`)."""

    @abstractmethod
    def dead_letter_sink(self, job: str) -> DeadLetterSink:
        """Where this source's rejected records are published, for job ``job``."""

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

@dataclass(frozen=True)
class SinkSummary:
    """What a sink shows at the end of a run: a title, column names and a few rows."""

    title: str
    columns: list[str]
    rows: list[tuple] = field(default_factory=list)


class Sink(ABC):
    """Where a stream's results go. Subclass it to write anywhere.

    Lifecycle, all on the job's driver process:

    * ``open(job, query)`` once when the query starts (and again after every restart).
    * ``write_batch(batch, batch_id)`` once per micro-batch with that batch's whole output as an
      Arrow table. Spark commits the batch (offsets + state) only after this returns. After a
      crash, the last uncommitted batch is executed again with the same ``batch_id`` and the same
      rows, so a sink must make a repeated ``batch_id`` change nothing: record the batch id in the
      same transaction as the data (a ledger) or write idempotently.
    * ``close()`` when the query stops.
    * ``rewind(batch_id)`` after ``open`` when the job was restored from a savepoint or mirror
      at committed ``batch_id``: the batches after it run again (maybe with other boundaries
      and new code), so a sink that skips repeated batch ids must forget the later ones.

    ``upsert`` says whether the sink can take a new version of a row it already has (same key):
    the planner then emits window results on every update, not only when a window closes.
    """

    upsert: bool = False
    key_columns: tuple[str, ...] = ()

    @abstractmethod
    def default_name(self) -> str:
        """A stable name for the sink's query when the job gives none."""

    def check_schema(self, schema: pa.Schema) -> None:
        """Fail fast (before any batch runs) if the stream's output does not fit the target."""

    def open(self, job: str, query: str) -> None:
        """Connect; called on the driver when the query starts."""

    @abstractmethod
    def write_batch(self, batch: pa.Table, batch_id: int) -> None:
        """Write one micro-batch's output; a repeated ``batch_id`` must change nothing."""

    def close(self) -> None:
        """Release connections; called when the query stops."""

    def rewind(self, batch_id: int) -> None:
        """Forget batches after ``batch_id``: they will be executed again (restore)."""

    def summary(self) -> SinkSummary | None:
        """A few rows to print when the job ends (``None``: nothing to show)."""
        return None

    def describe(self) -> str:
        return self.default_name()


class DeadLetterSink(Protocol):
    """Where a source's rejected records are published: a topic of the source's own system.

    The publish protocol (:class:`stateful_runtime.connectors.dead_letters.DeadLetters`) opens
    one ``writer()`` per publish and calls ``write_split`` once per staged split, in offset
    order per source partition. ``write_split`` must append nothing for a split it already
    holds (``start`` is the split's first source offset: an idempotent producer sequence), so a
    crash between publishing and removing the staged file duplicates nothing. Each record keeps
    its raw bytes; the reason and origin travel in headers (``error``, ``source.topic``,
    ``source.partition``, ``source.offset``, ``job``).
    """

    topic: str
    job: str

    def writer(self) -> AbstractContextManager[Any]:
        """One publish: a context that commits on a clean exit, aborts on an exception."""

    def write_split(self, writer: Any, table: pa.Table, partition: int | str, start: int) -> int:
        """Append one split's rejected records; returns how many were appended (0: had it)."""

    def records(self) -> int:
        """How many dead letters the topic holds (for progress lines and summaries)."""

    def describe(self) -> str:
        """One line for ``explain()``."""

    def summary(self) -> SinkSummary | None:
        """What to print at the end of a run."""
