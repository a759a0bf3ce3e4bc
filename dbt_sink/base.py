"""What every warehouse upsert sink shares: in-batch dedupe, the ledger contract, summaries."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime.connectors.base import Sink
from stateful_runtime.exceptions import SinkError

_ROW = "__srt_row"


def dedupe_last(batch: pa.Table, keys: Sequence[str]) -> pa.Table:
    """Keep the last row of each key, in batch order (a later update supersedes an earlier
    one; warehouses disagree on which duplicate an upsert keeps, so none is left to choose)."""
    if batch.num_rows < 2:
        return batch
    indexed = batch.append_column(_ROW, pa.array(range(batch.num_rows), pa.int64()))
    last = indexed.group_by(list(keys), use_threads=False).aggregate([(_ROW, "max")])
    if last.num_rows == batch.num_rows:
        return batch
    rows = last.column(f"{_ROW}_max")
    return batch.take(pc.take(rows, pc.sort_indices(rows)))


class WarehouseUpsertSink(Sink):
    """Upserts each micro-batch into a table keyed by ``key``, exactly once.

    Per batch, in one warehouse transaction: skip if the ledger already has
    ``(job, sink, batch_id)``; otherwise upsert the batch (deduped by key, last row wins) and
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
        self._write(dedupe_last(batch, self.key_columns), batch_id)

    @abstractmethod
    def _write(self, batch: pa.Table, batch_id: int) -> None:
        """Ledger check + upsert + ledger row, in one transaction."""
