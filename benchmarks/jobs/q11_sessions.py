"""Nexmark q11 (user sessions): bids per bidder per session, sessions ending after 10 s
without a bid.

Benchmark job (benchmarks/run.py): session windows with a built-in aggregate run on Spark's own
``session_window`` (the ``native`` path: JVM, RocksDB state).
"""

from datetime import timedelta

from stateful_runtime import (
    Count,
    EventTimeSessionWindows,
    LogSink,
    LogSource,
    StreamJob,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "bids",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "q11",
    "checkpoint.dir": "srt-data/bench/checkpoints/q11",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}

BID = {"auction": int, "bidder": int, "price": int, "channel": str, "url": str, "ts_ms": int}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-q11", config)
    bids = job.from_source(
        LogSource.from_config(config, BID),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="bids",
    )
    (
        bids.key_by("bidder")
        .window(EventTimeSessionWindows.with_gap(timedelta(seconds=10)))
        .aggregate({"bids": Count()}, name="sessions")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="bidder-sessions")
    )
    return job
