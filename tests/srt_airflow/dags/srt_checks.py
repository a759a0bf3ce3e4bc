"""DAGs the Airflow lifecycle test runs beside the examples (``airflow dags test -f``): every
sensor on the running UPI job, a savepoint awaited by a sensor, a rescale from a
savepoint; and, once the job is stopped, a stop of a job that is not running, a sensor that
fails because the job can no longer get where it waits, and a launch of a file under another
job's name."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from airflow.sdk import DAG

from srt_airflow.operators.srt import (
    SrtLaunchJobOperator,
    SrtRescaleJobOperator,
    SrtSavepointOperator,
    SrtStopJobOperator,
)
from srt_airflow.sensors.srt import SrtCommittedSensor, SrtJobHealthySensor, SrtSavepointSensor

JOB = "upi-per-minute"
JOB_FILE = str(Path(__file__).resolve().parents[3] / "examples" / "upi_per_minute.py")
CONFIG = {
    "source.log_dir": "srt-data/log",
    "checkpoint.dir": "srt-data/checkpoints/upi-per-minute",
    "sink.database": "srt-data/upi.duckdb",
}

with DAG(dag_id="srt_checks_running", schedule=None, start_date=datetime(2026, 1, 1)):
    healthy = SrtJobHealthySensor(task_id="healthy", job=JOB, timeout=300)
    committed = SrtCommittedSensor(
        task_id="committed_batch", job=JOB, query="upi-counts", batch=0, timeout=300
    )
    # The first events are at 2026-01-01T00:00:00Z, 40 a second for 50 s; the watermark
    # trails the newest by 5 s.
    watermark = SrtCommittedSensor(
        task_id="watermark",
        job=JOB,
        query="upi-counts",
        watermark="2026-01-01T00:00:30Z",
        timeout=300,
        deferrable=False,
        poke_interval=1,
    )
    savepoint = SrtSavepointOperator(task_id="savepoint", job=JOB)
    complete = SrtSavepointSensor(
        task_id="savepoint_complete", job=JOB, since="{{ dag_run.start_date }}", timeout=300
    )
    rescale = SrtRescaleJobOperator(
        task_id="rescale", job=JOB, job_file=JOB_FILE, config=CONFIG, parallelism=3
    )
    healthy >> committed >> watermark >> savepoint >> complete >> rescale


with DAG(dag_id="srt_checks_stopped", schedule=None, start_date=datetime(2026, 1, 1)):
    SrtStopJobOperator(task_id="stop_again", job=JOB)
    # A user's mistake: the file builds upi-per-minute, not this job; refused before anything.
    SrtLaunchJobOperator(task_id="wrong_job", job="not-upi", job_file=JOB_FILE, config=CONFIG)
    SrtCommittedSensor(task_id="never", job=JOB, batch=1_000_000, timeout=300)
