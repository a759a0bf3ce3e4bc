"""Stop the UPI job with a savepoint of its final batch (Flink's stop-with-savepoint): the
batch in flight commits, the queries stop, the sinks close. Launching it again resumes from
its checkpoint; the savepoint is for an upgrade or a rescale
(``SrtUpgradeJobOperator``/``SrtRescaleJobOperator``)."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG

from srt_airflow.operators.srt import SrtSavepointOperator

with DAG(
    dag_id="upi_per_minute_stop",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["stateful-runtime", "upi"],
    doc_md=__doc__,
):
    SrtSavepointOperator(task_id="stop_with_savepoint", job="upi-per-minute", stop=True)
