"""Batches the warehouse sink tests write (UPI counts rows)."""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa

W1, W2 = datetime(2026, 1, 1, 0, 0), datetime(2026, 1, 1, 0, 1)
KEY = ("merchant_id", "window_start")
SCHEMA = pa.schema(
    [("merchant_id", pa.string()), ("window_start", pa.timestamp("us")), ("payments", pa.int64())]
)


def batch(rows: list[tuple], schema: pa.Schema = SCHEMA) -> pa.Table:
    return pa.table({f.name: [r[i] for r in rows] for i, f in enumerate(schema)}, schema=schema)
