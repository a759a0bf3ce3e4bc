"""An hourly savepoint of the UPI job, then the retention policy: keep the newest 24 and
nothing older than 7 days (the newest, and one a job was restored from, always stay).
A job that is not running gets a savepoint of its last committed batch."""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from srt_airflow.operators.srt import SrtPruneSavepointsOperator, SrtSavepointOperator

with DAG(
    dag_id="upi_per_minute_savepoints",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["stateful-runtime", "upi"],
    doc_md=__doc__,
):
    take = SrtSavepointOperator(task_id="savepoint", job="upi-per-minute")
    prune = SrtPruneSavepointsOperator(
        task_id="retention", job="upi-per-minute", keep=24, max_age=timedelta(days=7)
    )
    take >> prune
