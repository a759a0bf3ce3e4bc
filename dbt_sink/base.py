"""What every warehouse upsert sink shares: in-batch dedupe, the ledger contract, summaries."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import pyarrow as pa

from stateful_runtime.connectors.base import Sink, prepare_rows
from stateful_runtime.exceptions import SinkError


class WarehouseUpsertSink(Sink):
    """Upserts each micro-batch into a table keyed by ``key``, exactly once.

    Per batch, in one warehouse transaction: skip if the ledger already has
    ``(job, sink, batch_id)``; otherwise upsert the batch (one row per key, the last in batch
    order: :func:`~stateful_runtime.connectors.base.prepare_rows`, as on the executor path) and
    insert the ledger row. A replayed batch therefore changes nothing, and the ledger records
    which batch wrote what.
    """

    upsert = True

    def __init__(self, table: str, key: Sequence[str], summary_sql: str | None = None) -> None:
        if not key:
            raise SinkError(f"upsert sink for {table!r} needs the table's unique key columns")
        self.table = table
        self.key_columns = tuple(key)
        self.summary_sql = summary_sql
        self.job = ""
        self.sink_name = ""

    def default_name(self) -> str:
        return f"upsert-{self.table}"

    def open(self, job: str, query: str) -> None:
        self.job, self.sink_name = job, query

    def check_schema(self, schema: pa.Schema) -> None:
        missing = [k for k in self.key_columns if k not in schema.names]
        if missing:
            raise SinkError(
                f"table {self.table!r}: key column(s) {missing} are not in the stream's output "
                f"columns {schema.names}; set key= to output columns"
            )

    def write_batch(self, batch: pa.Table, batch_id: int) -> None:
        self._write(prepare_rows(batch, self.key_columns), batch_id)

    @abstractmethod
    def _write(self, batch: pa.Table, batch_id: int) -> None:
        """Ledger check + upsert + ledger row, in one transaction."""
