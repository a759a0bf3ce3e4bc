"""Rate-limit alerts: more than 10 payments by one merchant within a minute of its first one.

The seed's ``FraudCounter``: a keyed process function with two ValueStates and an event-time
timer that resets the counter a minute after the first payment. Alerts are upserted into DuckDB
by (merchant_id, window_start_ms), so the row carries the latest count of the tripped minute.

    srt run examples/fraud_rate_limit.py --available-now

From Kafka instead (``source.keyed_by``: the topic's producers place records by the key groups
of merchant_id, ``KafkaSink(partition_by="merchant_id")``, so each partition is read in the
task that keeps its state, without a shuffle, when ``parallelism`` equals its partitions):

    srt run examples/fraud_rate_limit.py --set source.kind=kafka \
        --set source.bootstrap_servers=127.0.0.1:9092 --set source.keyed_by=merchant_id
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    Context,
    KeyedProcessFunction,
    RuntimeContext,
    StreamJob,
    ValueStateDescriptor,
    WatermarkStrategy,
    source_from_config,
)
from stateful_runtime.functions import to_ms

DEFAULTS = {
    "source.kind": "log",  # or "kafka"
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 100_000,
    "source.bootstrap_servers": "",  # Kafka
    "source.keyed_by": "",  # Kafka: the field its producers place records by (see above)
    "sink.database": "srt-data/upi.duckdb",
    "sink.table": "rate_limit_alerts",
    "checkpoint.dir": "srt-data/checkpoints/fraud-rate-limit",
    "checkpoint.interval_s": 2.0,
    "threshold": 10,
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


class FraudCounter(KeyedProcessFunction):
    output_schema = {"merchant_id": str, "window_start_ms": int, "payments": int, "alert": str}

    def __init__(self, threshold: int = 10, span: timedelta = timedelta(minutes=1)) -> None:
        self.threshold = threshold
        self.span = span

    def open(self, ctx: RuntimeContext) -> None:
        self.count = ctx.get_state(ValueStateDescriptor("count", int))
        self.first_seen = ctx.get_state(ValueStateDescriptor("first_seen_ms", int))

    def process_element(self, event, ctx: Context):
        c = self.count.value() or 0
        if c == 0:
            self.first_seen.update(to_ms(ctx.timestamp()))
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + self.span)
        self.count.update(c + 1)
        if c + 1 > self.threshold:
            yield {
                "merchant_id": ctx.get_current_key(),
                "window_start_ms": self.first_seen.value(),
                "payments": c + 1,
                "alert": "rate-limit-trip",
            }

    def on_timer(self, timestamp, ctx: Context):
        # The minute since the first payment is over: reset the merchant's counter.
        self.count.clear()
        self.first_seen.clear()
        return ()


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("fraud-rate-limit", config)
    payments = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="upi-source",
    )
    (
        payments.key_by("merchant_id")
        .process(FraudCounter(config["threshold"]), name="fraud-counter")
        .sink_to(
            DuckDBUpsertSink(
                config["sink.database"],
                config["sink.table"],
                key=("merchant_id", "window_start_ms"),
            ),
            name="alerts",
        )
    )
    return job
