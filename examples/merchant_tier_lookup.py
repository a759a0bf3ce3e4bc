"""Payments with their merchant's tier from PostgreSQL, looked up once an hour per merchant.

``enrich_async`` keeps each merchant's answer in keyed state for an hour of event time, and
looks up a batch's merchants without one at once, through psycopg's async connection pool
(one pool per Python worker, ``worker_resource``; up to ``lookup.pool_size`` queries in
flight). A merchant missing from the table is a dead letter with the reason. The payments go
to DuckDB, upserted by txn_id. Needs psycopg and psycopg-pool (the dev extras) and a table
``merchants (merchant_id text primary key, tier text)``.

    srt run examples/merchant_tier_lookup.py --available-now \\
        --set lookup.dsn=postgresql://user@127.0.0.1:5432/crm
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import StreamJob, WatermarkStrategy, source_from_config, worker_resource

DEFAULTS = {
    "source.kind": "log",  # or "kafka"
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 20_000,
    "source.bootstrap_servers": "",
    "sink.database": "srt-data/upi.duckdb",
    "sink.table": "payment_tiers",
    "checkpoint.dir": "srt-data/checkpoints/merchant-tier-lookup",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
    "lookup.dsn": "postgresql://postgres@127.0.0.1:5432/postgres",
    "lookup.pool_size": 10,
    "lookup.ttl_minutes": 60,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def build(config: dict) -> StreamJob:
    dsn, size = config["lookup.dsn"], int(config["lookup.pool_size"])

    async def tier_of(merchant_id: str) -> dict:
        from psycopg_pool import AsyncConnectionPool

        pool = worker_resource(
            f"merchants {dsn}",
            lambda: AsyncConnectionPool(dsn, min_size=1, max_size=size, open=False),
        )
        await pool.open()  # (once: later calls find it open)
        async with pool.connection() as conn:
            cursor = await conn.execute(
                "SELECT tier FROM merchants WHERE merchant_id = %s", (merchant_id,)
            )
            row = await cursor.fetchone()
        if row is None:
            raise LookupError(f"merchant {merchant_id!r} is not in table merchants")
        return {"tier": row[0]}

    job = StreamJob.from_config("merchant-tier-lookup", config)
    payments = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="upi-source",
    )
    (
        payments.key_by("merchant_id")
        .enrich_async(
            tier_of,
            output={"tier": str},
            ttl=timedelta(minutes=float(config["lookup.ttl_minutes"])),
            capacity=size,
            timeout=timedelta(seconds=5),
            name="tiers",
        )
        .sink_to(
            DuckDBUpsertSink(config["sink.database"], config["sink.table"], key=("txn_id",)),
            name="payment-tiers",
        )
    )
    return job
