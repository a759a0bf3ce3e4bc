"""Keyed ValueState counter: a count per merchant, emitted every 100th payment.

Benchmark job (benchmarks/run.py): a KeyedProcessFunction with one ValueState (the ``process``
path: state in the worker's RocksDB).
"""

from datetime import timedelta

from stateful_runtime import (
    KeyedProcessFunction,
    LogSink,
    LogSource,
    StreamJob,
    ValueStateDescriptor,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "upi",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "counter",
    "checkpoint.dir": "srt-data/bench/checkpoints/counter",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


class Counter(KeyedProcessFunction):
    output_schema = {"merchant_id": str, "count": int}

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", int))

    def process_element(self, payment, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if n % 100 == 0:
            yield {"merchant_id": payment["merchant_id"], "count": n}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-counter", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    (
        payments.key_by("merchant_id")
        .process(Counter(), name="counter")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="counts")
    )
    return job
