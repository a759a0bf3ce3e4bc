"""Latency probe: payments from a Kafka topic straight into another, exactly once.

Benchmark job (benchmarks/run.py latency): KafkaSource -> filter -> KafkaSink (transactions
bound to Spark's micro-batch), on a short trigger. Each event's ``ts_ms`` is the time it was
produced, so a read_committed consumer of the output measures append-to-visible latency.
"""

from datetime import timedelta

from stateful_runtime import KafkaSink, KafkaSource, StreamJob, WatermarkStrategy

DEFAULTS = {
    "source.bootstrap_servers": "127.0.0.1:9092",
    "source.topic": "latency-in",
    "source.max_records_per_batch": 200_000,
    "sink.topic": "latency-out",
    "sink.partitions": 2,
    "checkpoint.dir": "srt-data/bench/checkpoints/latency",
    "checkpoint.interval_s": 0.2,
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-latency", config)
    payments = job.from_source(
        KafkaSource(
            config["source.bootstrap_servers"],
            config["source.topic"],
            PAYMENT,
            max_records_per_batch=config["source.max_records_per_batch"],
        ),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    (
        payments.filter("amount_paise >= 0").sink_to(
            KafkaSink(
                config["source.bootstrap_servers"],
                config["sink.topic"],
                partitions=config["sink.partitions"],
            ),
            name="passthrough",
        )
    )
    return job
