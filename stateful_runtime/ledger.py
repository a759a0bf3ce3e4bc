"""The sink ledger's names: the table in which a warehouse sink records each micro-batch it
committed, in the same transaction as the batch's rows (so a replayed batch changes nothing).

The warehouse sinks (``dbt_sink``) write it; ``srt dbt sources`` (a dbt source's
``loaded_at_query``) and Dagster's sink-table assets read it. Plain data: Dagster imports this
at definition load.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

LEDGER_TABLE = "srt_sink_ledger"

# Its columns on every warehouse: which job's sink (its query) committed which batch, and the
# rows the batch upserted. ClickHouse has no transactions: its ledger adds per-partition rows
# and states and keeps the commit time in a column of its own (dbt_sink.clickhouse).
JOB = "job"
SINK = "sink"
BATCH_ID = "batch_id"
ROWS = "rows"
# When the warehouse transaction committed (the warehouse's clock).
COMMITTED_AT = "committed_at"


@dataclass(frozen=True)
class LedgerEntry:
    """One micro-batch a sink committed to its warehouse (a row of :data:`LEDGER_TABLE`).

    Attributes:
        batch_id: Spark's micro-batch id.
        rows: rows the batch upserted (after the in-batch dedupe).
        committed_at: when the warehouse transaction committed (the warehouse's clock, UTC).
    """

    batch_id: int
    rows: int
    committed_at: datetime | None
