"""UPI tumbling count: payments per merchant per 1-minute event-time window.

Benchmark job (benchmarks/run.py): reads topic ``upi`` of the embedded event log, writes each
closed window once to topic ``upi-count`` of an output log. The planner compiles it to
Spark's native ``groupBy(window)`` (JVM, RocksDB state).

    srt run benchmarks/jobs/upi_count.py --available-now --set source.log_dir=/tmp/log
"""

from datetime import timedelta

from stateful_runtime import (
    Count,
    LogSink,
    LogSource,
    StreamJob,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "upi",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "upi-count",
    "checkpoint.dir": "srt-data/bench/checkpoints/upi-count",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-upi-count", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    (
        payments.key_by("merchant_id")
        .window(TumblingEventTimeWindows.of(timedelta(minutes=1)))
        .aggregate({"count": Count()}, name="per-merchant-minute")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="counts")
    )
    return job
