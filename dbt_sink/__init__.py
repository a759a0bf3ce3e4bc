"""Warehouse sinks that write a stream's results by idempotent upserts."""

from dbt_sink.base import LEDGER_TABLE, WarehouseUpsertSink, dedupe_last
from dbt_sink.duckdb import DuckDBUpsertSink

__all__ = ["LEDGER_TABLE", "DuckDBUpsertSink", "WarehouseUpsertSink", "dedupe_last"]
