"""Nexmark q5 (hot items), per channel: in each 10 s window sliding every 2 s, the auction
with the most bids (ties: the smallest auction id).

Benchmark job (benchmarks/run.py). Nexmark's q5 takes the maximum over all auctions of a
window; a job here has one stateful operator per query, so the counting and the maximum are
one AggregateFunction keyed by channel. Sliding windows run on the runtime's window operator
(the ``window`` path: Python, state in the worker's RocksDB).
"""

from datetime import timedelta

from stateful_runtime import (
    AggregateFunction,
    LogSink,
    LogSource,
    SlidingEventTimeWindows,
    StreamJob,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "bids",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "q5",
    "checkpoint.dir": "srt-data/bench/checkpoints/q5",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}

BID = {"auction": int, "bidder": int, "price": int, "channel": str, "url": str, "ts_ms": int}


class HotItem(AggregateFunction):
    """Bids per auction; the result is the auction with the most."""

    def create_accumulator(self) -> dict:
        return {}

    def add(self, value: dict, acc: dict) -> dict:
        acc[value["auction"]] = acc.get(value["auction"], 0) + 1
        return acc

    def merge(self, a: dict, b: dict) -> dict:
        for k, v in b.items():
            a[k] = a.get(k, 0) + v
        return a

    def get_result(self, acc: dict) -> dict:
        auction, n = min(acc.items(), key=lambda kv: (-kv[1], kv[0]))
        return {"auction": auction, "bids": n}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-q5", config)
    bids = job.from_source(
        LogSource.from_config(config, BID),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="bids",
    )
    (
        bids.key_by("channel")
        .window(SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=2)))
        .aggregate(HotItem(), name="hot-items", output={"auction": int, "bids": int})
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="hot")
    )
    return job
