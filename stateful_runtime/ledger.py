"""The sink ledger's names: the table in which a warehouse sink records each micro-batch it
committed, in the same transaction as the batch's rows (so a replayed batch changes nothing).

The warehouse sinks (``dbt_sink``) write it; ``srt dbt sources`` (a dbt source's
``loaded_at_query``) and Dagster's sink-table assets read it. Plain data: Dagster imports this
at definition load.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from stateful_runtime.exceptions import SinkDataLostError

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
# The table's rows (one per key) after the batch, recorded with it: at start the table must
# hold at least as many, else rows the ledger says were written are gone (truncated, deleted).
# NULL in rows written before this column existed (nothing to compare).
TABLE_ROWS = "table_rows"
# NULL for a batch; an operator's decision (``srt sink accept``) says here what was accepted.
NOTE = "note"

# ClickHouse has no transactions: its ledger holds a row per partition and state, and a batch is
# committed by the driver's row for partition -1 in state COMMITTED, whose time is in ``at``.
CLICKHOUSE_COMMITTED_AT = "at"
CLICKHOUSE_COMMITTED = "partition = -1 and state = 'COMMITTED'"


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


@dataclass(frozen=True)
class SinkObservation:
    """What a warehouse sink finds of its own table and ledger, read before it writes (the
    runtime compares it with the checkpoint: :mod:`stateful_runtime.runtime.sink_check`).

    Attributes:
        table: the table's name.
        location: where it is (database file, masked URL, path).
        table_exists: the table is there.
        last_batch: the newest batch the ledger records for this job's sink (None: no entry,
            or no ledger table).
        expected_rows: the table's rows after ``last_batch`` as recorded with it (None:
            not recorded).
        rows: the table's rows now, one per key (None: no table).
        ledger: where the ledger is, for messages.
    """

    table: str
    location: str
    table_exists: bool
    last_batch: int | None
    expected_rows: int | None
    rows: int | None
    ledger: str = f"ledger {LEDGER_TABLE}"

    def lost(
        self, job: str, sink: str, problem: str, what: str, committed: int | None
    ) -> SinkDataLostError:
        """The refusal of ``problem`` (see :class:`SinkDataLostError`), with what was seen."""
        return SinkDataLostError(
            job,
            sink,
            self.table,
            self.location,
            problem,
            what,
            committed_batch=committed,
            ledger_batch=self.last_batch,
            rows=self.rows,
            expected_rows=self.expected_rows,
        )

    def check_holds(self, job: str, sink: str, batch: int) -> None:
        """Raise :class:`SinkDataLostError` unless the table and its ledger hold everything
        batch ``batch`` (committed into them) left: the table (unless the ledger says it was
        empty), a ledger entry at or after ``batch``, at least the rows recorded then."""
        if not self.table_exists and self.expected_rows != 0:
            raise self.lost(
                job,
                sink,
                "table_missing",
                f"the table does not exist (dropped, or its database deleted), but batches up "
                f"to {batch} were committed into it",
                batch,
            )
        if self.last_batch is None or self.last_batch < batch:
            now = (
                "has no entry of this sink"
                if self.last_batch is None
                else (f"ends at batch {self.last_batch}")
            )
            raise self.lost(
                job,
                sink,
                "ledger_missing",
                f"its {self.ledger} {now}, but batches up to {batch} were committed into it "
                f"(the ledger, or entries of it, deleted; or the table is not the one the job "
                f"wrote)",
                batch,
            )
        if (
            self.expected_rows is not None
            and self.rows is not None
            and self.rows < self.expected_rows
        ):
            raise self.lost(
                job,
                sink,
                "rows_missing",
                f"the table holds {self.rows} rows but held {self.expected_rows} after batch "
                f"{self.last_batch} ({self.ledger}): {self.expected_rows - self.rows} rows were "
                f"deleted behind the job's back (truncated?)",
                batch,
            )
