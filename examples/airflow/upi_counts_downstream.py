"""Runs when the UPI job commits new results to its sink table ``upi_counts``: the table's
asset has an ``AssetWatcher`` whose event trigger (in the triggerer) fires each time the
job's ``upi-counts`` query commits new micro-batches. The run's asset events say which."""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, task

from srt_airflow.assets import sink_table_asset

UPI_COUNTS = sink_table_asset("upi-per-minute", "upi_counts", "upi-counts", poll_interval=5.0)

with DAG(
    dag_id="upi_counts_downstream",
    schedule=[UPI_COUNTS],
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["stateful-runtime", "upi"],
    doc_md=__doc__,
):

    @task
    def fresh_results(triggering_asset_events=None) -> list[dict]:
        """What the stream committed since the last run (your model refresh goes here)."""
        out = []
        for events in (triggering_asset_events or {}).values():
            for event in events:
                payload = (event.extra or {}).get("payload") or {}
                print(
                    f"{payload.get('job')} committed batches {payload.get('first_batch')}"
                    f"-{payload.get('last_batch')} to {payload.get('table')} "
                    f"(watermark {payload.get('watermark')})"
                )
                out.append(payload)
        return out

    fresh_results()
