"""Start the UPI job (examples/upi_per_minute.py) from Airflow: launch it detached, or reuse its
live process, and wait until it is RUNNING and has committed a micro-batch (in the triggerer).

The ``srt_default`` connection says where: its ``srt_home`` and ``working_directory`` (the
relative paths below resolve there). Trigger it by hand; a running job is left as it is.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG

from srt_airflow.operators.srt import SrtLaunchJobOperator

JOB_FILE = str(Path(__file__).resolve().parents[1] / "upi_per_minute.py")

with DAG(
    dag_id="upi_per_minute_start",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["stateful-runtime", "upi"],
    doc_md=__doc__,
):
    SrtLaunchJobOperator(
        task_id="launch",
        job="upi-per-minute",
        job_file=JOB_FILE,
        config={
            "source.log_dir": "srt-data/log",
            "checkpoint.dir": "srt-data/checkpoints/upi-per-minute",
            "sink.database": "srt-data/upi.duckdb",
        },
        # A warehouse password from an Airflow connection reaches the job through the
        # environment, never a command line:
        # config={"sink.kind": "postgres", "sink.dsn": "postgresql://srt@db:5432/srt"},
        # config_from_connections={"sink.password": "warehouse_pg.password"},
    )
