"""Drop payments whose txn_id was already seen in the last 24 hours of event time.

The seed's ``Deduplicator``: one ValueState per txn_id with a 24-hour event-time TTL, so state
for old ids is removed once the watermark passes their expiry. First occurrences are appended,
exactly once, to the topic ``upi-payments-deduped``.

    srt run examples/deduplicate_payments.py --available-now

From Kafka instead (``source.keyed_by``: the topic's producers place records by the key groups
of txn_id, ``KafkaSink(partition_by="txn_id")``, so each partition is read in the task that
keeps its state, without a shuffle, when ``parallelism`` equals its partitions):

    srt run examples/deduplicate_payments.py --set source.kind=kafka \
        --set source.bootstrap_servers=127.0.0.1:9092 --set source.keyed_by=txn_id
"""

from __future__ import annotations

from datetime import timedelta

from stateful_runtime import (
    KeyedProcessFunction,
    LogSink,
    StateTtlConfig,
    StreamJob,
    TimeDomain,
    ValueStateDescriptor,
    WatermarkStrategy,
    source_from_config,
)

DEFAULTS = {
    "source.kind": "log",  # or "kafka"
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 100_000,
    "source.bootstrap_servers": "",  # Kafka
    "source.keyed_by": "",  # Kafka: the field its producers place records by (see above)
    "sink.topic": "upi-payments-deduped",
    "checkpoint.dir": "srt-data/checkpoints/deduplicate-payments",
    "checkpoint.interval_s": 2.0,
    "ttl_hours": 24.0,
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


class Deduplicator(KeyedProcessFunction):
    output_schema = PAYMENT

    def __init__(self, ttl: timedelta = timedelta(hours=24)) -> None:
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
    job = StreamJob.from_config("deduplicate-payments", config)
    payments = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="upi-source",
    )
    (
        payments.key_by("txn_id")
        .process(Deduplicator(timedelta(hours=config["ttl_hours"])), name="deduplicator")
        .sink_to(
            LogSink(
                config["source.log_dir"],
                config["sink.topic"],
                key_field="merchant_id",
                partitions=4,
            ),
            name="deduped",
        )
    )
    return job
