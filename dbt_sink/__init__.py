"""Warehouse sinks that write a stream's results by idempotent upserts, exactly once through
their ledger (its names: :mod:`stateful_runtime.ledger`).

Names are imported lazily (PEP 562): importing the package pulls in neither pyarrow nor DuckDB.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "WarehouseUpsertSink": "base",
    "DuckDBUpsertSink": "duckdb",
    "committed_batches": "duckdb",
}

__all__ = [
    "DuckDBUpsertSink",
    "WarehouseUpsertSink",
    "committed_batches",
]

if TYPE_CHECKING:
    from dbt_sink.base import WarehouseUpsertSink
    from dbt_sink.duckdb import DuckDBUpsertSink, committed_batches


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dbt_sink' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"dbt_sink.{module}"), name)
    globals()[name] = value
    return value
