"""The connector contracts: sources (replayable, offset-addressed streams of records), sinks
(where results go, idempotent per micro-batch) and dead letters (where rejected records go).

Every connector package (``eventlog/``, ``kafka/``, the warehouses in ``dbt_sink``) builds on
these and on nothing of another system's package.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.datasource import DataSource

    from stateful_runtime.ledger import SinkObservation
    from stateful_runtime.watermarks import WatermarkStrategy

# Columns every source adds to the declared record fields.
ERROR = "_error"  # null for a good record, else why it was rejected
RAW = "_raw"  # the original bytes of a rejected record (null for good ones)
PARTITION = "_partition"
OFFSET = "_offset"
META_COLUMNS = (ERROR, RAW, PARTITION, OFFSET)


@dataclass(frozen=True)
class KeyPlacement:
    """A source whose records are placed in its ``partitions`` partitions by the key groups
    (``pmod(hash(key), 128)``, partition ``p`` owning the groups ``g`` with
    ``g * partitions // 128 == p``) of the single-field key ``field``, hashed as Spark hashes a
    column of ``spark_type`` (``string`` or ``bigint``): ``where`` says which source."""

    field: str
    spark_type: str
    partitions: int
    where: str


class Source(ABC):
    """A replayable source of records with offsets Spark keeps in its offset log.

    :meth:`data_source` names the Python DataSource that reads it: a streaming DataFrame of the
    declared record fields plus :data:`META_COLUMNS`. Records that do not decode into the
    declared schema are not dropped: they come through with ``_error`` set, and the read tasks
    stage them per split; the job publishes them to :meth:`dead_letter_sink` once their
    micro-batch is committed
    (:mod:`stateful_runtime.connectors.dead_letters`).
    """

    name: str
    schema: StructType
    # Whether a partition with nothing new stops holding the others (in the source's event-time
    # alignment and the per-partition watermark) at once, without ``with_idleness``.
    silent_partitions_idle: ClassVar[bool] = False

    def check(self) -> None:
        """Fail fast, before Spark starts, if the source cannot be read (missing topic...)."""

    def records_held(self) -> int | None:
        """How many records the source holds now, summed over its partitions: a bound on what
        a bounded (``--available-now``) run started now reads (None: it cannot be told
        cheaply). The runner sizes the run's JIT by it (``runtime/session.py``)."""
        return None

    def key_placement(self) -> KeyPlacement | None:
        """How the source's records are placed in its partitions by a key, when they are
        (None: they are not, or it cannot be known): what lets a job keyed by that key read
        each partition in the task that keeps its state, without a shuffle."""
        return None

    @abstractmethod
    def data_source(
        self,
        dead_letter_staging: str | None = None,
        watermark: WatermarkStrategy | None = None,
        late_watermark_of: str | None = None,
        query_checkpoint: str | None = None,
        *,
        by_partition: bool = False,
        accounting: Mapping[str, str] | None = None,
    ) -> tuple[type[DataSource], dict[str, str]]:
        """The Python DataSource that reads the decoded stream, good and bad records alike, and
        its options (:func:`read_stream` reads them as a streaming DataFrame). With
        ``dead_letter_staging``, each read task also stages its split's rejected records there
        (:func:`stateful_runtime.connectors.dead_letters.stage`). With ``watermark``, a source
        may align its partitions in event time (:mod:`stateful_runtime.connectors.alignment`).
        With ``late_watermark_of`` (a query's checkpoint directory), every record carries its
        batch's late-event watermark in ``alignment.LATE_BEFORE``. With ``watermark``, a record
        outside its event-time policy is rejected (:mod:`stateful_runtime.connectors.event_time`),
        judged against its batch's processing time and watermark as logged in
        ``query_checkpoint`` (the query's checkpoint directory). With ``by_partition`` (a
        source with a :meth:`key_placement`), each batch reads one split per partition, the
        split of partition ``p`` being Spark's partition ``p``, empty ones included. With
        ``accounting`` (the options :func:`~stateful_runtime.connectors.accounting.option`
        gives), each read task reports its split
        (:func:`~stateful_runtime.connectors.accounting.report`)."""

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
    return (
        out.add(ERROR, StringType())
        .add(RAW, BinaryType())
        .add(PARTITION, IntegerType())
        .add(OFFSET, LongType())
    )


_REGISTERED: set[tuple[str, str]] = set()


def register(spark: SparkSession, data_source: type[DataSource]) -> None:
    """Register a Python DataSource once per Spark application (re-registering warns)."""
    key = (spark.sparkContext.applicationId, data_source.name())
    if key not in _REGISTERED:
        spark.dataSource.register(data_source)
        _REGISTERED.add(key)


def read_stream(
    spark: SparkSession, data_source: type[DataSource], options: Mapping[str, str]
) -> DataFrame:
    """The streaming DataFrame of a Python DataSource with ``options``. The schema is given
    to Spark, computed here, so ``load()`` does not start a Python worker to ask the source
    for it (0.4 s of every job's start)."""
    register(spark, data_source)
    reader = spark.readStream.format(data_source.name()).schema(data_source(dict(options)).schema())
    for k, v in options.items():
        reader = reader.option(k, v)
    return reader.load()


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

    A sink that keeps a ledger (the warehouses) also lets the runtime check its target against
    the checkpoint, so a table truncated, dropped or deleted behind the job's back is never a
    silent hole (:mod:`stateful_runtime.runtime.sink_check`): ``observe`` before the job starts
    (and before ``rewind``), the check of :attr:`expected_batch` before each batch is written,
    ``accept`` and ``set_aside`` for the operator's ways back.

    ``upsert`` says whether the sink can take a new version of a row it already has (same key):
    the planner then emits window results on every update, not only when a window closes.

    A sink with large output can be written by Spark's executors instead of the driver:
    subclass :class:`PartitionedSink`.

    A sink a job file picks by ``sink.kind`` declares its :attr:`kind`, the
    :attr:`config_keys` it reads and its :attr:`location_key`, builds itself in
    :meth:`from_config`, and is listed in :mod:`stateful_runtime.sink_kinds`.
    """

    upsert: bool = False
    key_columns: tuple[str, ...] = ()
    # Set by the runtime (its start check, then each batch written): the newest batch this
    # sink's ledger and table must hold before it writes another; None: nothing expected yet.
    expected_batch: int | None = None
    # What ``sink.kind`` calls it ("" : it is built in code only); the catalog reports it.
    kind: ClassVar[str] = ""
    # The job-file keys ``from_config`` reads, and the one that says where the sink writes.
    config_keys: ClassVar[tuple[str, ...]] = ()
    location_key: ClassVar[str] = ""

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, key: Sequence[str] = (), summary_sql: str | None = None
    ) -> Sink:
        """The sink from a job file's ``config`` (its :attr:`config_keys`).

        Args:
            config: the job's config.
            key: the output columns that key a row (a warehouse's upsert key).
            summary_sql: what a warehouse prints at the end of a run (``{table}``: its table).
        """
        raise NotImplementedError(f"{cls.__name__} is not built from a job file's config")

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

    def unstorable(self, rows: pa.Table) -> list[tuple[int, str]]:
        """The rows of ``rows`` (a batch about to be written) the target cannot store, each
        with why: ``(row, reason)`` in row order. Asked before the write when each row is one
        source record's (a query without a stateful step): those rows are dead-lettered and
        the rest written. Default: none (the target stores any row of the stream's schema)."""
        return []

    def rewind(self, batch_id: int) -> None:
        """Forget batches after ``batch_id``: they will be executed again (restore)."""

    def summary(self) -> SinkSummary | None:
        """A few rows to print when the job ends (``None``: nothing to show)."""
        return None

    def observe(self, job: str, sink: str) -> SinkObservation | None:
        """What the target holds for sink ``sink`` of ``job``: its table, the ledger's newest
        batch, the table's rows then and now. Called before the job starts (before
        ``rewind``); ``None``: the sink keeps no ledger and nothing is checked."""
        return None

    def accept(self, job: str, sink: str, batch: int | None, note: str) -> None:
        """Record an operator's decision to go on with what the table holds now
        (``srt sink accept``): the ledger then says the table stands for every batch up to
        ``batch`` (None: forget the entries after nothing: a fresh start) with its rows now."""
        raise NotImplementedError(f"{type(self).__name__} keeps no ledger")

    def set_aside(self, job: str, sink: str, suffix: str) -> str | None:
        """Before a replay into a fresh table: rename the table to ``<table><suffix>`` (kept,
        never dropped) and forget sink ``sink``'s ledger entries; the new name (None: there
        was no table)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no ledger")

    def describe(self) -> str:
        return self.default_name()

    def write_placement(self) -> WritePlacement:
        """Where batches are written and why (``explain``): a plain sink on the driver."""
        return WritePlacement(
            "driver", "the sink takes each batch whole (collected to the job process)"
        )


@dataclass(frozen=True)
class WritePlacement:
    """Where a sink's batches are written, and why (``explain`` prints both).

    Attributes:
        where: ``"executors"`` (each output partition by the task that computed it) or
            ``"driver"`` (the batch collected to the job process as one Arrow table).
        why: the reason, one clause.
    """

    where: str
    why: str


@dataclass(frozen=True)
class PartitionReport:
    """What one task reports to the driver after writing its partition of a batch.

    Attributes:
        partition: the output partition (0 ≤ partition < partitions).
        rows: rows of the partition after the in-batch dedupe.
        written: rows written now (0 when an earlier attempt had already written them).
        write_ms: time the task spent writing.
        note: what the sink wants the driver to know (e.g. ``"replay"``), free text.
    """

    partition: int
    rows: int
    written: int
    write_ms: float
    note: str = ""


# Hidden column the executor path adds: a row's position in the batch's output (upstream
# partition, then offset in it), so the in-batch winner of a key is the same on every replay.
SEQUENCE = "__srt_seq"


def prepare_rows(batch: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The rows a sink writes for one partition: one row per key — the last in batch order
    (the row with the highest :data:`SEQUENCE` if present, else the last position) — sorted
    by key, without :data:`SEQUENCE`. Deterministic: a replayed batch gives the same rows in
    the same order, so chunks cut from it are the same too."""
    if SEQUENCE not in batch.column_names:
        batch = batch.append_column(SEQUENCE, pa.array(np.arange(batch.num_rows, dtype=np.int64)))
    # One sort (key, then place in the batch); a row wins if the next row has another key.
    # (A hash group-by of the keys first cost 4x this sort on 200k rows.)
    rows = batch.sort_by([(k, "ascending") for k in keys] + [(SEQUENCE, "ascending")])
    n = rows.num_rows
    if n > 1:
        differs = None
        for k in keys:
            col = rows.column(k)
            a, b = col.slice(0, n - 1), col.slice(1)
            ne = pc.or_(
                pc.fill_null(pc.not_equal(a, b), False), pc.not_equal(pc.is_null(a), pc.is_null(b))
            )
            differs = ne if differs is None else pc.or_(differs, ne)
        assert differs is not None
        chunks = differs.chunks if isinstance(differs, pa.ChunkedArray) else [differs]
        last = pa.concat_arrays([*chunks, pa.array([True])])
        if not pc.all(last).as_py():
            rows = rows.filter(last)
    return rows.drop_columns([SEQUENCE])


class PartitionedSink(Sink):
    """A sink whose batches are written by Spark's executors, one output partition per task.

    Per micro-batch ``N`` the runtime repartitions the batch's output by ``key_columns`` into
    ``partitions`` partitions (a key lives in exactly one), then:

    * driver: ``begin_batch(N, schema)`` — create or evolve the target; ``False`` means the
      ledger already has ``N`` committed (a replay after a crash between the sink's commit
      and Spark's), and nothing else runs for this batch.
    * executors: ``write_partition(rows, N, p, partitions)`` in the task that computed
      partition ``p``: ``rows`` has one row per key (the last in batch order wins, see
      :func:`prepare_rows`), sorted by key. The idempotency key is ``(job, sink, N, p,
      partitions)``: a repeated call (Spark's task retry, or the replay of a batch that
      crashed between partitions) must change nothing.
    * driver: ``commit_batch(N, reports)`` once every partition reported success: record
      ``N`` in the ledger. A failed task fails the batch before this; Spark replays it.

    The sink object is pickled to the executors after ``open``: keep connections out of its
    pickled state (``__getstate__``) and open them per task. ``write_batch`` runs the same
    protocol on the driver as one partition (:meth:`write_placement` says where a sink is written
    and why; `srt explain` prints it). The runtime side of the protocol, driver and executor
    halves, is :mod:`stateful_runtime.runtime.batch_writes`.
    """

    upsert = True
    # Output partitions per batch; None: the job's parallelism.
    partitions: int | None = None

    def write_placement(self) -> WritePlacement:
        return WritePlacement(
            "executors",
            "each output partition is written by the task that "
            "computed it; the driver commits the batch after all reported",
        )

    def begin_batch(self, batch_id: int, schema: pa.Schema) -> bool:
        """Driver, before the tasks: prepare the target; False if ``batch_id`` is committed."""
        return True

    @abstractmethod
    def write_partition(
        self, rows: pa.Table, batch_id: int, partition: int, partitions: int
    ) -> PartitionReport:
        """Executor: write one partition of batch ``batch_id`` idempotently."""

    @abstractmethod
    def commit_batch(self, batch_id: int, reports: Sequence[PartitionReport]) -> None:
        """Driver, after every partition succeeded: record the batch in the ledger."""

    def write_batch(self, batch: pa.Table, batch_id: int) -> None:
        """The driver path: the whole batch as partition 0 of 1."""
        if not self.begin_batch(batch_id, batch.schema):
            return
        report = self.write_partition(prepare_rows(batch, self.key_columns), batch_id, 0, 1)
        self.commit_batch(batch_id, [report])


class DeadLetterSink(Protocol):
    """Where a source's rejected records are published: a topic of the source's own system.

    The publish protocol (:class:`stateful_runtime.connectors.dead_letters.DeadLetters`) opens
    one ``writer()`` per publish and, for each staged split in offset order per source
    partition, asks ``published`` how far that partition is in the topic, then calls
    ``write_split`` with the split's rejected records at or after that mark. ``write_split``
    appends them and moves the mark to the split's ``end`` in one atomic step, so a crash
    between publishing and removing the staged file, or a batch planned again with other
    boundaries, duplicates nothing and skips nothing. Each record keeps its raw bytes; the
    reason and origin travel in headers (``error``, ``source.topic``, ``source.partition``,
    ``source.offset``, ``job``).
    """

    topic: str
    job: str

    def writer(self) -> AbstractContextManager[Any]:
        """One publish: a context that commits on a clean exit, aborts on an exception."""

    def published(self, writer: Any, partition: int | str) -> int:
        """The first offset of source ``partition`` whose rejected records are not published
        yet (0: none published)."""

    def write_split(self, writer: Any, table: pa.Table, partition: int | str, end: int) -> int:
        """Append rejected records of ``partition`` (none before ``published``) and mark it
        published up to offset ``end``, atomically; returns how many were appended."""

    def published_offsets(self, partition: int | str, start: int, end: int) -> set[int]:
        """Source offsets in ``[start, end)`` of source ``partition`` whose dead letters (of
        this job) the topic holds: read when a rewind replays records below ``published``
        (:func:`stateful_runtime.connectors.dead_letters.note_replay`)."""

    def records(self) -> int:
        """How many dead letters the topic holds (for progress lines and summaries)."""

    def describe(self) -> str:
        """One line for ``explain()``."""

    def summary(self) -> SinkSummary | None:
        """What to print at the end of a run."""
