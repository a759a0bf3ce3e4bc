"""The Definitions ``workspace.yaml`` loads: the UPI example job and its table, with the
quickstart's paths under ./srt-data. Loading imports no Spark or GX and opens nothing.

An example of using the ``dagster_defs`` plugin (your own definitions file looks like this):
``dagster dev -w workspace.yaml`` loads it by path, from the repository root."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from dagster_defs import (
    DuckDBWarehouse,
    SinkTableSpec,
    StreamingJobSpec,
    WindowReconciliation,
    build_definitions,
)

# The job file sits next to this file; data goes under the working directory.
EXAMPLES = Path(__file__).resolve().parent

UPI_COUNTS = SinkTableSpec(
    table="upi_counts",
    query="upi-counts",
    key=("merchant_id", "window_start"),
    not_null=("window_end", "payments", "amount_paise"),
    min_values={"payments": 1, "amount_paise": 0},
    reconcile=WindowReconciliation(count_column="payments", window=timedelta(minutes=1)),
)

UPI_JOB = StreamingJobSpec(
    name="upi-per-minute",
    job_file=str(EXAMPLES / "upi_per_minute.py"),
    config={
        "source.log_dir": "srt-data/log",
        "checkpoint.dir": "srt-data/checkpoints/upi-per-minute",
    },
    config_from_resources={"sink.database": "warehouse.path"},
    sink_tables=[UPI_COUNTS],
)

defs = build_definitions(
    [UPI_JOB],
    resources={"warehouse": DuckDBWarehouse(path="srt-data/upi.duckdb")},
)
