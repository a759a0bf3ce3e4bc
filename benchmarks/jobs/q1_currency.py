"""Nexmark q1: every bid with its price converted from dollars to euros (x 0.908).

Benchmark job (benchmarks/run.py): a stateless ``map`` in Python (the ``stateless`` path:
Spark's mapInArrow over whole Arrow batches).
"""

from datetime import timedelta

from stateful_runtime import LogSink, LogSource, StreamJob, WatermarkStrategy

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "bids",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "q1",
    "checkpoint.dir": "srt-data/bench/checkpoints/q1",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}

BID = {"auction": int, "bidder": int, "price": int, "channel": str, "url": str, "ts_ms": int}


def to_euro(bid: dict) -> dict:
    return {
        "auction": bid["auction"],
        "bidder": bid["bidder"],
        "price_eur": bid["price"] * 908 // 1000,
        "ts_ms": bid["ts_ms"],
    }


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-q1", config)
    bids = job.from_source(
        LogSource.from_config(config, BID),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="bids",
    )
    (
        bids.map(
            to_euro, output={"auction": int, "bidder": int, "price_eur": int, "ts_ms": int}
        ).sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="euro-bids")
    )
    return job
