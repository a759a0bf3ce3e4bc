"""Payments scored by a model server over HTTP (benchmarks/async_calls.py): ``map_async`` with
aiohttp's client, one per Python worker, or the same call made synchronously in a ``map``
(``score.mode=sync``), to the event log.
"""

from __future__ import annotations

from datetime import timedelta

from stateful_runtime import LogSink, LogSource, StreamJob, WatermarkStrategy, worker_resource

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "scored-in",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "checkpoint.dir": "srt-data/bench/checkpoints/scored",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
    "score.url": "http://127.0.0.1:8700",
    "score.mode": "async",  # or "sync": one call at a time in a map
    "score.capacity": 100,
}
PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
SCORED = {"txn_id": str, "score": int}


def build(config: dict) -> StreamJob:
    url = config["score.url"]
    host, port = url.removeprefix("http://").split(":")

    async def score(payment: dict) -> dict:
        import aiohttp

        client = worker_resource(
            "scorer",
            lambda: aiohttp.ClientSession(
                url, connector=aiohttp.TCPConnector(limit=int(config["score.capacity"]))
            ),
        )
        async with client.post("/score", json=payment) as answer:
            answer.raise_for_status()
            return {"txn_id": payment["txn_id"], "score": (await answer.json())["score"]}

    def score_now(payment: dict) -> dict:
        import http.client
        import json

        client = worker_resource("scorer-sync", lambda: http.client.HTTPConnection(host, port))
        client.request("POST", "/score", json.dumps(payment), {"Content-Type": "application/json"})
        answer = client.getresponse()
        if answer.status != 200:
            raise RuntimeError(f"score: HTTP {answer.status}")
        return {"txn_id": payment["txn_id"], "score": json.loads(answer.read())["score"]}

    job = StreamJob.from_config("scored", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    if config["score.mode"] == "sync":
        scored = payments.map(score_now, output=SCORED, name="score")
    else:
        scored = payments.map_async(
            score, output=SCORED, capacity=int(config["score.capacity"]), name="score"
        )
    scored.sink_to(LogSink(config["sink.log_dir"], "scored"), name="scored-out")
    return job
