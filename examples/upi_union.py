"""UPI payments from two feeds, unioned, counted per merchant per minute.

Input: the app's payments on event-log topic ``upi-payments`` and a partner bank's payments on
a second topic (Kafka ``bank-payments`` by default, or another event-log topic), both JSON
lines of one schema::

    {"txn_id": "t1", "merchant_id": "M001", "amount_paise": 12500, "ts_ms": 1767225600000}

Each feed has its own watermark strategy (the bank's arrives later: a 30 s bound); the union's
watermark is the minimum of the two, so a minute closes when both feeds passed it. Records are
accounted per feed (``srt status --json``: ``records.by_source``); bad records of each feed go
to that feed's dead-letter topic.

Output: DuckDB table ``upi_union_counts(merchant_id, window_start, window_end, payments,
amount_paise)``, upserted by (merchant_id, window_start).

    srt run examples/upi_union.py --available-now --set source.log_dir=/tmp/log \
        --set bank.bootstrap_servers=127.0.0.1:9092
    srt run examples/upi_union.py --set bank.kind=log --set bank.topic=bank-payments
"""

from datetime import timedelta

from stateful_runtime import (
    Count,
    DataStream,
    StreamJob,
    Sum,
    TumblingEventTimeWindows,
    WatermarkStrategy,
    sinks_from_config,
    source_from_config,
)

DEFAULTS = {
    "source.kind": "log",
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 500_000,
    "source.starting_offsets": "earliest",
    # the second feed: bank.<key> is that source's source.<key>
    "bank.kind": "kafka",  # or "log" (then bank.log_dir defaults to source.log_dir)
    "bank.topic": "bank-payments",
    "bank.bootstrap_servers": "127.0.0.1:9092",
    "bank.log_dir": "",
    "bank.starting_offsets": "earliest",
    "bank.fail_on_data_loss": True,
    "bank.max_records_per_batch": 500_000,
    "sink.kind": "duckdb",
    "sink.database": "srt-data/upi-union.duckdb",
    "sink.table": "upi_union_counts",
    "checkpoint.dir": "srt-data/checkpoints/upi-union",
    "checkpoint.interval_s": 2.0,
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def _bank(config: dict) -> dict:
    """The second feed's keys as the ``source.*`` keys ``source_from_config`` reads."""
    keys = {k.removeprefix("bank."): v for k, v in config.items() if k.startswith("bank.")}
    keys["log_dir"] = keys.get("log_dir") or config["source.log_dir"]
    return {f"source.{k}": v for k, v in keys.items()}


def payments(job: StreamJob, config: dict) -> DataStream:
    """Both feeds as one stream: each with its own watermark strategy, then ``union``."""
    app = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="app-payments",
    )
    bank = job.from_source(
        source_from_config(_bank(config), PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=30)).with_timestamp_field(
            "ts_ms"
        ),
        name="bank-payments",
    )
    return app.union(bank)


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("upi-union", config)
    counts = (
        payments(job, config)
        .filter("amount_paise > 0")
        .key_by("merchant_id")
        .window(TumblingEventTimeWindows.of(timedelta(minutes=1)))
        .aggregate(
            {"payments": Count(), "amount_paise": Sum("amount_paise")}, name="per-merchant-minute"
        )
    )
    for name, sink in sinks_from_config(
        config, name="upi-union-counts", key=("merchant_id", "window_start")
    ):
        counts.sink_to(sink, name=name)
    return job
