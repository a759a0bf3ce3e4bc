"""The sink contract every output of a job implements."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import pyarrow as pa


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
