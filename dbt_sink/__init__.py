"""Warehouse sinks that write a stream's results by idempotent upserts, and their ledger."""

from dbt_sink.base import LEDGER_TABLE, LedgerEntry, WarehouseUpsertSink, dedupe_last
from dbt_sink.duckdb import DuckDBUpsertSink, committed_batches

__all__ = [
    "LEDGER_TABLE",
    "DuckDBUpsertSink",
    "LedgerEntry",
    "WarehouseUpsertSink",
    "committed_batches",
    "dedupe_last",
]
