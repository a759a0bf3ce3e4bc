"""Nexmark q2: bids on auctions whose id is a multiple of 123.

Benchmark job (benchmarks/run.py): a filter straight to the sink (the ``stateless`` path).
"""

from datetime import timedelta

from stateful_runtime import LogSink, LogSource, StreamJob, WatermarkStrategy

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "bids",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "q2",
    "checkpoint.dir": "srt-data/bench/checkpoints/q2",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}

BID = {"auction": int, "bidder": int, "price": int, "channel": str, "url": str, "ts_ms": int}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-q2", config)
    bids = job.from_source(
        LogSource.from_config(config, BID),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="bids",
    )
    (
        bids.filter("auction % 123 = 0").sink_to(
            LogSink(config["sink.log_dir"], config["sink.topic"]), name="selected-bids"
        )
    )
    return job
