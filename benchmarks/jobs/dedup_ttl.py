"""Deduplication with event-time TTL: the first payment of each txn_id; the seen-flag expires
one minute of event time after it was set.

Benchmark job (benchmarks/run.py): a KeyedProcessFunction with a ValueState whose TTL runs in
event time (the runtime's own TTL, built from timers; the ``process`` path).
"""

from datetime import timedelta

from stateful_runtime import (
    KeyedProcessFunction,
    LogSink,
    LogSource,
    StateTtlConfig,
    StreamJob,
    TimeDomain,
    ValueStateDescriptor,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "upi",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "dedup",
    "checkpoint.dir": "srt-data/bench/checkpoints/dedup",
    "checkpoint.interval_s": 2.0,
    "ttl_s": 60.0,
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


class Deduplicator(KeyedProcessFunction):
    output_schema = PAYMENT

    def __init__(self, ttl: timedelta) -> None:
        self.ttl = ttl

    def open(self, ctx):
        self.seen = ctx.get_state(
            ValueStateDescriptor(
                "seen", bool, ttl=StateTtlConfig(self.ttl, time_domain=TimeDomain.EVENT_TIME)
            )
        )

    def process_element(self, payment, ctx):
        if self.seen.value():
            return
        self.seen.update(True)
        yield payment


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-dedup", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    (
        payments.key_by("txn_id")
        .process(Deduplicator(timedelta(seconds=config["ttl_s"])), name="deduplicator")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="first-payments")
    )
    return job
