"""The Definitions ``workspace.yaml`` loads: the UPI example job, its table, and the dbt
models on that table (examples/dbt_upi), with the quickstart's paths under ./srt-data.
Loading imports no Spark or GX and opens nothing; it parses the dbt project (``dbt parse``, no
network) under ``dagster dev`` or when its manifest is missing.

One lineage graph: job ``upi_per_minute`` → table ``upi_counts`` → dbt model ``merchant_day``.
The table materialises as the stream commits (the health sensor reports it), its checks run and
the model builds by automation (``default_automation_condition_sensor``, on).

An example of using the ``dagster_defs`` plugin (your own definitions file looks like this):
``dagster dev -w workspace.yaml`` loads it by path, from the repository root."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from dagster import Definitions, in_process_executor
from dagster_dbt import DbtProject, dbt_assets

from dagster_defs import (
    SinkTableSpec,
    StreamingJobSpec,
    Warehouse,
    WindowReconciliation,
    build_definitions,
)
from dagster_defs.dbt import (
    StreamingDbtTranslator,
    dbt_resource,
    prepare_manifest,
    sink_database,
)

# The job file sits next to this file; data goes under the working directory.
EXAMPLES = Path(__file__).resolve().parent
# How often the health sensor reports commits and restarts failed jobs, and the automation
# sensor evaluates (the UI test sets a few seconds).
SENSOR_INTERVAL = timedelta(seconds=float(os.environ.get("SRT_SENSOR_INTERVAL_S", "5")))

UPI_COUNTS = SinkTableSpec(
    table="upi_counts",
    query="upi-counts",
    key=("merchant_id", "window_start"),
    not_null=("window_end", "payments", "amount_paise"),
    min_values={"payments": 1, "amount_paise": 0},
    reconcile=WindowReconciliation(count_column="payments", window=timedelta(minutes=1)),
    # Checkpoint every 2 s + watermark delay 5 s: stale after 1 minute without a commit, red
    # after 2 (what `srt dbt sources` gives the dbt source's freshness too).
    expected_latency=timedelta(seconds=7),
)

UPI_JOB = StreamingJobSpec(
    name="upi-per-minute",
    job_file=str(EXAMPLES / "upi_per_minute.py"),
    config={
        "source.log_dir": "srt-data/log",
        "checkpoint.dir": "srt-data/checkpoints/upi-per-minute",
    },
    # sink.kind and its location from the warehouse resource: the job writes where the table
    # asset and its checks read.
    config_from_resources={"sink.*": "warehouse.sink_config"},
    sink_tables=[UPI_COUNTS],
)


def streaming_definitions() -> Definitions:
    """The job's assets, checks, sensors, schedule and jobs."""
    return build_definitions(
        [UPI_JOB],
        # Another warehouse: Warehouse(kind="postgres", dsn="postgresql://srt@127.0.0.1:5432/srt",
        # password="env:PGPASSWORD"), kind="clickhouse" with url=..., or kind="delta" with path=...
        resources={"warehouse": Warehouse(kind="duckdb", path="srt-data/upi.duckdb")},
        sensor_interval=SENSOR_INTERVAL,
        automation_interval=SENSOR_INTERVAL,
    )


# dbt: models/sources.yml is `srt dbt sources examples/upi_per_minute.py --database srt_sink`;
# its meta.dagster.asset_key ties the source to the upi_counts asset above.
UPI_DBT = DbtProject(EXAMPLES / "dbt_upi")
prepare_manifest(UPI_DBT)


@dbt_assets(
    manifest=UPI_DBT.manifest_path,
    project=UPI_DBT,
    dagster_dbt_translator=StreamingDbtTranslator(),
    required_resource_keys={"dbt", "warehouse"},
)
def upi_analytics(context):  # no annotation: this file has postponed annotations
    # The profile attaches the sink's DuckDB file read-only (dbt_sink.dbt_attach) and writes
    # the models to analytics.duckdb beside it; dbt inherits this run worker's environment.
    sink_db = sink_database(context.resources.warehouse)
    os.environ["SRT_SINK_DATABASE"] = str(sink_db)
    os.environ["SRT_DBT_DATABASE"] = str(sink_db.with_name("analytics.duckdb"))
    yield from context.resources.dbt.cli(["build"], context=context).stream()


defs = Definitions.merge(
    streaming_definitions(),
    Definitions(assets=[upi_analytics], resources={"dbt": dbt_resource(UPI_DBT)}),
    # A run's ops run in the run's own process: Dagster's default (multiprocess) starts one
    # more process per op, which loads this code location again before the op can start
    # (7-25 s a run on 2 busy cores; every op here is one `srt` or `dbt` call or a check).
    Definitions(executor=in_process_executor),
)
