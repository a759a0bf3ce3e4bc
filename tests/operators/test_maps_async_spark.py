"""map_async on Spark against a real HTTP service on 127.0.0.1 (aiohttp's client, one per
Python worker): every payment scored, in batches of concurrent calls; a call the service
refuses once is retried, a payment it always refuses is one dead letter with the step, the
attempts and the last error, and the rest commit; a second run over more payments scores only
the new ones."""

from __future__ import annotations

import io
import json

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.contract import QueryHealth
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import append_lines, read_topic
from tests.operators.score_service import ScoreService

pytestmark = pytest.mark.slow

T0 = 1_767_225_600_000

SCORED_JOB = """
from datetime import timedelta

import aiohttp

from stateful_runtime import (LogSink, LogSource, RetryPolicy, StreamJob, WatermarkStrategy,
                              worker_resource)

DEFAULTS = {"source.log_dir": "log", "source.topic": "payments", "sink.log_dir": "out",
            "checkpoint.dir": "ck", "source.max_records_per_batch": 200, "parallelism": 2,
            "score.url": "http://127.0.0.1:1"}
PAYMENT = {"txn_id": str, "amount_paise": int, "ts_ms": int}


def build(config):
    url = config["score.url"]

    async def score(payment):
        client = worker_resource("scorer", lambda: aiohttp.ClientSession(url))
        async with client.post("/score", json=payment) as answer:
            answer.raise_for_status()
            return {"txn_id": payment["txn_id"], "score": (await answer.json())["score"]}

    job = StreamJob.from_config("scored", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2))
        .with_timestamp_field("ts_ms"), name="payments")
    (payments.map_async(score, output={"txn_id": str, "score": int}, capacity=16,
                        retry=RetryPolicy(3, backoff=timedelta(milliseconds=20)), name="score")
     .sink_to(LogSink(config["sink.log_dir"], "scored"), name="scored-out"))
    return job
"""


def _rows(log, topic: str) -> list[dict]:
    return [json.loads(r.value) for r in read_topic(log, topic)]


@pytest.fixture
def service():
    service = ScoreService()
    yield service
    service.server.shutdown()
    service.server.server_close()


def test_payments_scored_by_a_service_with_retries_and_dead_letters(spark, tmp_path, service):
    job = tmp_path / "scored.py"
    job.write_text(SCORED_JOB)
    log = tmp_path / "log"
    EventLog(log).create_topic("payments", 2)
    payments = [
        {"txn_id": f"t{i}", "amount_paise": 1_000 + i * 7, "ts_ms": T0 + i * 100}
        for i in range(600)
    ]
    settings = {
        "source.log_dir": str(log),
        "sink.log_dir": str(tmp_path / "out"),
        "score.url": service.url,
        "checkpoint.dir": str(tmp_path / "ck"),
    }
    for part in (payments[:400], payments[400:]):
        append_lines(log, [json.dumps(p).encode() for p in part], "payments", "txn_id")
        before = sum(service.calls.values())
        runner = JobRunner(load_job_file(job, settings), available_now=True, out=io.StringIO())
        assert runner.run() == 0
        # The step's calls this run, as `srt status`, /health and Dagster show them.
        calls = runner.runs[0].health.calls["score"]
        assert calls.calls == sum(service.calls.values()) - before
        assert calls.retries == calls.calls - len(part)
        assert calls.failed == sum(1 for p in part if p["txn_id"].endswith("7"))
        assert calls.percentile_ms(0.5) >= 20  # the service answers after 20 ms
        if len(part) > 200:  # (a run of more than one batch: a rate since the one before)
            assert calls.rate_per_s is not None and calls.rate_per_s > 0
        health = runner.runs[0].health
        assert QueryHealth.from_json(health.to_json()).calls == health.calls
    got = _rows(tmp_path / "out", "scored")
    refused = {p["txn_id"] for p in payments if p["txn_id"].endswith("7")}
    assert sorted((r["txn_id"], r["score"]) for r in got) == sorted(
        (p["txn_id"], p["amount_paise"] % 97) for p in payments if p["txn_id"] not in refused
    )
    dead = read_topic(log, "payments-dlq")
    assert sorted(json.loads(d.value)["txn_id"] for d in dead) == sorted(refused)
    assert {d.headers["step"] for d in dead} == {"score"}
    error = dead[0].headers["error"]
    assert "the map_async function failed 3 time(s), last: ClientResponseError: 503" in error, error
    # Every payment called once a run, a refused-once one twice, a refused one 3 times; the
    # calls of a task ran concurrently.
    assert {t: n for t, n in service.calls.items() if n != 1} == {
        **{p["txn_id"]: 2 for p in payments if p["txn_id"].endswith("3")},
        **dict.fromkeys(refused, 3),
    }
    assert service.most > 2


def test_the_scored_payments_example_upserts_each_payments_score(spark, tmp_path):
    """examples/scored_payments.py against examples/model_server.py: every payment's score in
    the DuckDB table, keyed by txn_id."""
    import socket
    import subprocess
    import sys

    from tests.helpers import EXAMPLES, poll
    from tests.operators.helpers import run, table

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "model_server.py"), "--port", str(port)]
    )
    try:

        def listening() -> bool:
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        poll(listening, 30, "the model server listening")
        lines = [
            json.dumps(
                {
                    "txn_id": f"t{i}",
                    "merchant_id": f"M{i % 9}",
                    "amount_paise": 500 + i * 31,
                    "ts_ms": T0 + i * 50,
                }
            ).encode()
            for i in range(800)
        ]
        EventLog(tmp_path / "log").create_topic("upi-payments", 2)
        append_lines(tmp_path / "log", lines)
        db = tmp_path / "scores.duckdb"
        run(
            "scored_payments.py",
            tmp_path,
            **{"sink.database": db, "score.url": f"http://127.0.0.1:{port}"},
        )
    finally:
        server.terminate()
        server.wait(10)
    got = dict(table(db, "SELECT txn_id, score FROM payment_scores"))
    assert got == {
        json.loads(line)["txn_id"]: json.loads(line)["amount_paise"] % 97 for line in lines
    }


TIERED_JOB = """
from datetime import timedelta

import aiohttp

from stateful_runtime import (LogSink, LogSource, RetryPolicy, StreamJob, WatermarkStrategy,
                              worker_resource)

DEFAULTS = {"source.log_dir": "log", "source.topic": "payments", "sink.log_dir": "out",
            "checkpoint.dir": "ck", "source.max_records_per_batch": 200, "parallelism": 2,
            "score.url": "http://127.0.0.1:1"}
PAYMENT = {"txn_id": str, "merchant_id": str, "ts_ms": int}


def build(config):
    url = config["score.url"]

    async def tier_of(merchant):
        client = worker_resource("tiers", lambda: aiohttp.ClientSession(url))
        async with client.get(f"/tier/{merchant}") as answer:
            answer.raise_for_status()
            return await answer.json()

    job = StreamJob.from_config("tiered", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2))
        .with_timestamp_field("ts_ms"), name="payments")
    (payments.key_by("merchant_id")
     .enrich_async(tier_of, output={"tier": str}, ttl=timedelta(hours=1), capacity=4,
                   retry=RetryPolicy(2, backoff=timedelta(milliseconds=10)), name="tiers")
     .sink_to(LogSink(config["sink.log_dir"], "tiered"), name="tiered-out"))
    return job
"""


def test_a_keyed_lookup_is_called_once_per_key_and_cached_in_keyed_state(spark, tmp_path, service):
    """enrich_async: each payment with its merchant's tier; a merchant is looked up once
    (its answer kept in keyed state for an hour), across the run's batches and across a
    restart from the checkpoint; a merchant whose lookup keeps failing makes each of its
    payments a dead letter, the rest commit."""
    job = tmp_path / "tiered.py"
    job.write_text(TIERED_JOB)
    log = tmp_path / "log"
    EventLog(log).create_topic("payments", 2)

    def merchant(i: int) -> str:  # M7's lookups fail: 10 payments of 900, within the bounds
        return "M7" if i % 90 == 7 else f"M{i % 9 if i % 9 != 7 else 8}"

    payments = [
        {"txn_id": f"t{i}", "merchant_id": merchant(i), "ts_ms": T0 + i * 100} for i in range(900)
    ]
    settings = {
        "source.log_dir": str(log),
        "sink.log_dir": str(tmp_path / "out"),
        "score.url": service.url,
        "checkpoint.dir": str(tmp_path / "ck"),
    }
    for part in (payments[:600], payments[600:]):
        append_lines(log, [json.dumps(p).encode() for p in part], "payments", "merchant_id")
        runner = JobRunner(load_job_file(job, settings), available_now=True, out=io.StringIO())
        assert runner.run() == 0
    calls = {path: n for path, n in service.calls.items() if path.startswith("/tier/")}
    assert {p: n for p, n in calls.items() if p != "/tier/M7"} == {
        f"/tier/M{m}": 1 for m in range(9) if m != 7
    }
    assert calls["/tier/M7"] >= 2  # tried twice in every batch that held M7's payments
    got = _rows(tmp_path / "out", "tiered")
    assert sorted((r["txn_id"], r["tier"]) for r in got) == sorted(
        (p["txn_id"], f"T{int(p['merchant_id'][1:]) % 3}")
        for p in payments
        if p["merchant_id"] != "M7"
    )
    dead = read_topic(log, "payments-dlq")
    assert sorted(json.loads(d.value)["txn_id"] for d in dead) == sorted(
        p["txn_id"] for p in payments if p["merchant_id"] == "M7"
    )
    error = dead[0].headers["error"]
    assert "CallFailed: failed 2 time(s), last: ClientResponseError: 503" in error, error
    lookups = runner.runs[0].health.calls["tiers"]
    assert lookups.failed >= 1 and lookups.calls >= 2  # (the second run: M7's only)


def test_the_tier_lookup_example_reads_postgresql_once_per_merchant(spark, tmp_path, pg_dsn):
    """examples/merchant_tier_lookup.py against a real PostgreSQL (psycopg's async pool, one
    per worker): every payment with its merchant's tier; a merchant missing from the table is
    a dead letter per payment, and the rest commit."""
    import psycopg

    from tests.operators.helpers import run, table

    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE merchants (merchant_id text PRIMARY KEY, tier text)")
        for m in range(8):
            conn.execute("INSERT INTO merchants VALUES (%s, %s)", (f"M{m}", f"T{m % 3}"))
    lines = [
        json.dumps(
            {
                "txn_id": f"t{i}",
                "merchant_id": "M99" if i % 100 == 5 else f"M{i % 8}",
                "amount_paise": 100 + i,
                "ts_ms": T0 + i * 50,
            }
        ).encode()
        for i in range(1_000)
    ]
    EventLog(tmp_path / "log").create_topic("upi-payments", 2)
    append_lines(tmp_path / "log", lines)
    db = tmp_path / "tiers.duckdb"
    run(
        "merchant_tier_lookup.py",
        tmp_path,
        **{"sink.database": db, "lookup.dsn": pg_dsn, "source.max_records_per_batch": 250},
    )
    payments = [json.loads(line) for line in lines]
    got = dict(table(db, "SELECT txn_id, tier FROM payment_tiers"))
    assert got == {
        p["txn_id"]: f"T{int(p['merchant_id'][1:]) % 3}"
        for p in payments
        if p["merchant_id"] != "M99"
    }
    dead = read_topic(tmp_path / "log", "upi-payments-dlq")
    assert sorted(json.loads(d.value)["txn_id"] for d in dead) == sorted(
        p["txn_id"] for p in payments if p["merchant_id"] == "M99"
    )
    assert "merchant 'M99' is not in table merchants" in dead[0].headers["error"]
