"""Count UPI payments per merchant per minute (the seed's canonical job).

Input: JSON lines on topic ``upi-payments``::

    {"txn_id": "t1", "merchant_id": "M001", "amount_paise": 12500, "ts_ms": 1767225600000}

Output: DuckDB table ``upi_counts(merchant_id, window_start, window_end, payments,
amount_paise)``, timestamps in UTC, upserted by (merchant_id, window_start) so a replayed
micro-batch changes nothing. Bad records go to topic ``upi-payments-dlq`` with the reason.

    srt run examples/upi_per_minute.py --available-now --set source.log_dir=/tmp/log

Into PostgreSQL, ClickHouse or Delta Lake instead of DuckDB (exactly-once on each, see
docs/warehouses.md):

    srt run examples/upi_per_minute.py --set sink.kind=postgres \
        --set sink.dsn=postgresql://srt@127.0.0.1:5432/srt --set sink.password=env:PGPASSWORD
    srt run examples/upi_per_minute.py --set sink.kind=clickhouse \
        --set sink.url=clickhouse://default@127.0.0.1:9000/default
    srt run examples/upi_per_minute.py --set sink.kind=delta --set sink.path=s3://bucket/upi

From Kafka, into a Kafka topic (exactly-once; read it with isolation.level=read_committed):

    srt run examples/upi_per_minute.py --set source.kind=kafka \
        --set source.bootstrap_servers=127.0.0.1:9092 --set sink.kind=kafka
"""

from datetime import timedelta

from stateful_runtime import (
    Count,
    StreamJob,
    Sum,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    sinks_from_config,
    source_from_config,
)

DEFAULTS = {
    "source.kind": "log",  # or "kafka"
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 500_000,
    "source.bootstrap_servers": "",
    "source.starting_offsets": "earliest",
    "source.fail_on_data_loss": True,  # Kafka: false goes on over records deleted unread
    "source.idle_timeout_s": 30.0,
    "kafka.security.protocol": "",  # librdkafka settings; secrets as env:VARIABLE
    "kafka.sasl.mechanism": "",
    "kafka.sasl.username": "",
    "kafka.sasl.password": "",
    # or "postgres", "clickhouse", "delta", "kafka", "both"; several comma-separated write
    # the same results to each (sink queries "upi-counts", then "upi-counts-<kind>")
    "sink.kind": "duckdb",
    "sink.kafka_topic": "upi-counts",
    "sink.delivery": "exactly_once",  # or "at_least_once"
    "sink.partition_by": "",  # Kafka: an output column placing records by its key groups
    "sink.database": "srt-data/upi.duckdb",  # duckdb
    "sink.dsn": "",  # postgres: postgresql://user@host:port/database
    "sink.url": "",  # clickhouse: clickhouse://user@host:port/database (native protocol)
    "sink.path": "",  # delta: a directory or s3://bucket/prefix
    "sink.password": "",  # postgres/clickhouse: env:VARIABLE
    "sink.partitions": 0,  # postgres/clickhouse: partitions written per batch (0: parallelism)
    "sink.table": "upi_counts",
    "checkpoint.dir": "srt-data/checkpoints/upi-per-minute",
    "checkpoint.interval_s": 2.0,
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("upi-per-minute", config)
    payments = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
        .with_timestamp_field("ts_ms")
        .with_idleness(timedelta(seconds=config["source.idle_timeout_s"])),
        name="upi-source",
    )
    counts = (
        payments.key_by("merchant_id")
        .window(TumblingEventTimeWindows.of(timedelta(minutes=1)))
        .aggregate(
            {"payments": Count(), "amount_paise": Sum("amount_paise")}, name="per-merchant-minute"
        )
    )
    for name, sink in sinks_from_config(
        config,
        name="upi-counts",
        key=("merchant_id", "window_start"),
        summary_sql=(
            "SELECT merchant_id, count(*) AS minutes, sum(payments) AS payments, "
            "round(sum(amount_paise) / 100.0, 2) AS rupees FROM {table} "
            "GROUP BY merchant_id ORDER BY payments DESC, merchant_id LIMIT 10"
        ),
    ):
        counts.sink_to(sink, name=name)
    return job
