"""Nexmark q7 (highest bid), per channel: the highest price in each 10 s tumbling window.

Benchmark job (benchmarks/run.py): a tumbling window with a built-in aggregate, so the planner
compiles it to Spark's native ``groupBy(window)`` (the ``native`` path).
"""

from datetime import timedelta

from stateful_runtime import (
    LogSink,
    LogSource,
    Max,
    StreamJob,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "bids",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "q7",
    "checkpoint.dir": "srt-data/bench/checkpoints/q7",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}

BID = {"auction": int, "bidder": int, "price": int, "channel": str, "url": str, "ts_ms": int}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-q7", config)
    bids = job.from_source(
        LogSource.from_config(config, BID),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="bids",
    )
    (
        bids.key_by("channel")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
        .aggregate({"max_price": Max("price")}, name="highest-bid")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="highest")
    )
    return job
