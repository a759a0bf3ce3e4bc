"""Payments scored by a fraud model over HTTP, the score upserted into DuckDB by txn_id.

``map_async`` calls the model server (``examples/model_server.py``) for every payment, up to
100 calls in flight per parallel instance, each within 2 s and tried 3 times; a payment the
server keeps refusing is a dead letter with the reason, and the rest commit. aiohttp's client
is made once per Python worker (``worker_resource``). Needs aiohttp (the dev extras).

    python examples/model_server.py --port 8700 &
    srt run examples/scored_payments.py --available-now
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    RetryPolicy,
    StreamJob,
    WatermarkStrategy,
    source_from_config,
    worker_resource,
)

DEFAULTS = {
    "source.kind": "log",  # or "kafka"
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 20_000,
    "source.bootstrap_servers": "",
    "sink.database": "srt-data/upi.duckdb",
    "sink.table": "payment_scores",
    "checkpoint.dir": "srt-data/checkpoints/scored-payments",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
    "score.url": "http://127.0.0.1:8700",
    "score.capacity": 100,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
SCORED = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int, "score": int}


def build(config: dict) -> StreamJob:
    url, capacity = config["score.url"], int(config["score.capacity"])

    async def score(payment: dict) -> dict:
        import aiohttp

        client = worker_resource(
            f"model-server {url}",
            lambda: aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=capacity)),
        )
        # The txn id is the idempotency key a service with side effects would take: a batch
        # replayed after a crash calls again.
        async with client.post("/score", json=payment) as answer:
            answer.raise_for_status()
            return {**payment, "score": (await answer.json())["score"]}

    job = StreamJob.from_config("scored-payments", config)
    payments = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="upi-source",
    )
    (
        payments.map_async(
            score,
            output=SCORED,
            capacity=capacity,
            timeout=timedelta(seconds=2),
            retry=RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=100)),
            name="score",
        ).sink_to(
            DuckDBUpsertSink(config["sink.database"], config["sink.table"], key=("txn_id",)),
            name="payment-scores",
        )
    )
    return job
