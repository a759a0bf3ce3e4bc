"""Rides and revenue per pickup zone per hour, with a running count, late updates and a late
side output (seed 004's taxi example on the full window model).

* 1-hour tumbling windows by PULocationID: ``num_trips`` and ``revenue``.
* ``EarlyFiring.every(count=...)``: the row of an open window is refreshed every N rides (the
  running count); the watermark passing the hour emits the final row.
* ``allowed_lateness(10 min)``: a ride arriving up to 10 minutes after its hour closed updates
  the row (the upsert sink replaces it); later rides go to topic ``taxi-rides-late``.

    srt run examples/taxi_zone_hourly.py --available-now
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    Count,
    EarlyFiring,
    LogSink,
    LogSource,
    OutputTag,
    StreamJob,
    Sum,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "taxi-rides",
    "source.max_records_per_batch": 50_000,
    "sink.database": "srt-data/taxi.duckdb",
    "sink.table": "zone_hourly",
    "late.topic": "taxi-rides-late",
    "checkpoint.dir": "srt-data/checkpoints/taxi-zone-hourly",
    "checkpoint.interval_s": 2.0,
    "early_every": 100,
    "lateness_minutes": 10.0,
    "parallelism": 4,
}

RIDE = {"ride_id": str, "PULocationID": int, "total_amount": float, "pickup_ms": int}
LATE_RIDES = OutputTag("late-rides", RIDE)


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("taxi-zone-hourly", config)
    rides = job.from_source(
        LogSource.from_config(config, RIDE),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "pickup_ms"
        ),
        name="rides",
    )
    hourly = (
        rides.key_by("PULocationID")
        .window(TumblingEventTimeWindows.of(timedelta(hours=1)))
        .allowed_lateness(timedelta(minutes=config["lateness_minutes"]))
        .side_output_late_data(LATE_RIDES)
        .trigger(EarlyFiring.every(count=config["early_every"]))
        .aggregate({"num_trips": Count(), "revenue": Sum("total_amount")}, name="zone-hourly")
    )
    hourly.sink_to(
        DuckDBUpsertSink(
            config["sink.database"], config["sink.table"], key=("PULocationID", "window_start")
        ),
        name="zone-hourly-table",
    )
    hourly.get_side_output(LATE_RIDES).sink_to(
        LogSink(config["source.log_dir"], config["late.topic"]), name="late-rides"
    )
    return job
