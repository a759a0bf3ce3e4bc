"""Poison records, part three: a value the sink's table cannot store, in a query whose sink
rows are source records (no stateful step), end to end through `srt run` on real warehouses
(issue 23). Each warehouse's table was made narrower than the job's data (an earlier version's
or by hand: an ``INTEGER`` amount, a PostgreSQL ``varchar(8)``, a ClickHouse ``FixedString(8)``
and ``DateTime``, a Delta ``int32``), and some values no column of the warehouse holds (a NUL
in a PostgreSQL string). Every row its table cannot take is dead-lettered with the sink as the
step, the reason and the record's source partition and offset, exactly once (a second run
adds nothing), and every other row is in the table; under ``errors.policy=fail`` the job stops
naming the record and the ``srt run --skip`` that passes it. (A window's row stops the job by
name: tests/faults/test_overflow.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.connectors.kafka.helpers import start_broker
from tests.helpers import EXAMPLES, UpiWorkspace, append_lines, read_topic, srt

pytestmark = [pytest.mark.slow, pytest.mark.faults]

BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SINK = "payments-out"
JOB = """
import sys
from datetime import UTC, datetime, timedelta

sys.path.insert(0, {examples!r})
from upi_per_minute import DEFAULTS  # noqa: E402

from stateful_runtime import StreamJob, WatermarkStrategy, sinks_from_config  # noqa: E402
from stateful_runtime import source_from_config  # noqa: E402

PAYMENT = {{"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int,
            "note": str, "paid_ms": int}}
ROW = {{"txn_id": str, "merchant_id": str, "amount_paise": int, "note": str,
        "paid_at": datetime}}


def row(p):
    paid = datetime.fromtimestamp(p["paid_ms"] / 1000, UTC).replace(tzinfo=None)
    return {{"txn_id": p["txn_id"], "merchant_id": p["merchant_id"],
             "amount_paise": p["amount_paise"], "note": p["note"], "paid_at": paid}}


def build(config):
    job = StreamJob.from_config("payments-copy", config)
    payments = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
        .with_timestamp_field("ts_ms"),
        name="payments",
    )
    rows = payments.map(row, output=ROW, name="as-row")
    for name, sink in sinks_from_config(config, name={sink!r}, key=("txn_id",)):
        rows.sink_to(sink, name=name)
    return job
"""
PAID_1960 = -315_619_200_000  # 1960-01-01: before ClickHouse's DateTime


def _payment(i: int, amount: int = 100, note: str = "ok", paid: int | None = None) -> dict:
    return {
        "txn_id": f"t{i:03d}",
        "merchant_id": f"M{i % 3}",
        "amount_paise": amount,
        "ts_ms": BASE + i * 100,
        "note": note,
        "paid_ms": BASE + i * 100 if paid is None else paid,
    }


def _corpus() -> list[dict]:
    out = [_payment(i, amount=100 + i) for i in range(60)]
    out[5] = _payment(5, amount=2**40)  # past an INTEGER / Int32 / int32 column
    out[17] = _payment(17, note="twelve chars")  # past varchar(8) / FixedString(8)
    out[29] = _payment(29, note="nul\x00here")  # no PostgreSQL string holds it
    out[41] = _payment(41, paid=PAID_1960)  # before ClickHouse's DateTime
    out[42] = _payment(42, amount=-(2**35), note="twelve chars")  # two columns at once
    return out


# Per warehouse: which records its narrower table cannot take.
CANNOT = {
    "duckdb": {"t005", "t042"},
    "postgres": {"t005", "t017", "t029", "t042"},
    "clickhouse": {"t005", "t017", "t041", "t042"},
    "delta": {"t005", "t042"},
}


def _narrow_table(kind: str, where: str) -> None:
    """The warehouse's table, made narrower than the job's rows (as an earlier version or a
    person would)."""
    if kind == "duckdb":
        import duckdb

        with duckdb.connect(where) as con:
            con.execute(
                "CREATE TABLE payments (txn_id VARCHAR PRIMARY KEY, merchant_id VARCHAR, "
                "amount_paise INTEGER, note VARCHAR, paid_at TIMESTAMPTZ)"
            )
    elif kind == "postgres":
        import psycopg

        with psycopg.connect(where, autocommit=True) as con:
            con.execute(
                "CREATE TABLE payments (txn_id text PRIMARY KEY, merchant_id text, amount_paise "
                "integer, note varchar(8), paid_at timestamptz)"
            )
    elif kind == "clickhouse":
        from dbt_sink.clickhouse import VERSION_COLUMN, ClickHouseUpsertSink

        client = ClickHouseUpsertSink(where, "payments", ("txn_id",))._client()
        try:
            client.command(
                f"CREATE TABLE payments (txn_id String, merchant_id Nullable(String), "
                f"amount_paise Nullable(Int32), note Nullable(FixedString(8)), paid_at "
                f"Nullable(DateTime('UTC')), {VERSION_COLUMN} UInt64) ENGINE = "
                f"ReplacingMergeTree({VERSION_COLUMN}) ORDER BY txn_id"
            )
        finally:
            client.close()
    else:
        import pyarrow as pa
        from deltalake import write_deltalake

        schema = pa.schema(
            [
                ("txn_id", pa.string()),
                ("merchant_id", pa.string()),
                ("amount_paise", pa.int32()),
                ("note", pa.string()),
                ("paid_at", pa.timestamp("us", tz="UTC")),
            ]
        )
        write_deltalake(where, schema.empty_table(), mode="append", name="payments")


def _ids(kind: str, where: str) -> set[str]:
    """The txn_ids a warehouse's table holds."""
    sql = "SELECT txn_id FROM payments"
    if kind == "duckdb":
        import duckdb

        with duckdb.connect(where, read_only=True) as con:
            return {r[0] for r in con.execute(sql).fetchall()}
    if kind == "postgres":
        import psycopg

        with psycopg.connect(where) as con:
            return {r[0] for r in con.execute(sql).fetchall()}
    if kind == "clickhouse":
        from dbt_sink.clickhouse import ClickHouseUpsertSink

        client = ClickHouseUpsertSink(where, "payments", ("txn_id",))._client()
        try:
            return {r[0] for r in client.query(sql + " FINAL")}
        finally:
            client.close()
    from dbt_sink.delta import DeltaUpsertSink

    return set(DeltaUpsertSink(where, "payments", ("txn_id",)).read_arrow()["txn_id"].to_pylist())


def _letters(ws: UpiWorkspace) -> list:
    return read_topic(ws.log_dir, "upi-payments-dlq")


def _origins(ws: UpiWorkspace) -> dict[str, str]:
    """txn_id -> payments:<partition>:<offset>, as the source's log holds each record."""
    return {
        json.loads(r.value)["txn_id"]: f"payments:{r.partition}:{r.offset}"
        for r in read_topic(ws.log_dir, "upi-payments")
    }


def _job(tmp_path: Path) -> Path:
    job = tmp_path / "payments_copy.py"
    job.write_text(JOB.format(examples=str(EXAMPLES), sink=SINK))
    return job


def test_rows_a_table_cannot_store_are_dead_lettered_once_and_the_rest_commits(
    upi: UpiWorkspace, srt_env, pg_dsn, ch_url, tmp_path: Path, trials
):
    """One job writes the same rows to the four warehouses (a query each, as
    ``sink.kind=a,b,...`` makes them): each query dead-letters what its own table refuses."""
    records = _corpus()
    append_lines(upi.log_dir, [json.dumps(r).encode() for r in records])
    where = {
        "duckdb": str(upi.database),
        "postgres": pg_dsn,
        "clickhouse": ch_url,
        "delta": str(upi.root / "delta" / "payments"),
    }
    kinds = sorted(CANNOT)
    for kind in kinds:
        _narrow_table(kind, where[kind])
    # The first sink's query is named SINK, the others SINK-<kind> (sinks_from_config).
    step = {kind: SINK if i == 0 else f"{SINK}-{kind}" for i, kind in enumerate(kinds)}
    upi.extra.update(
        {
            "sink.kind": ",".join(kinds),
            "sink.table": "payments",
            "sink.dsn": where["postgres"],
            "sink.url": where["clickhouse"],
            "sink.path": where["delta"],
            "source.max_records_per_batch": "25",
        }
    )
    run = ["run", str(_job(tmp_path)), *upi.sets(), "--available-now"]
    result = srt(run, srt_env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    origins = _origins(upi)
    letters = _letters(upi)
    assert {r.headers["step"] for r in letters} <= set(step.values())
    everyone = {r["txn_id"] for r in records}
    health = json.loads(srt(["status", "payments-copy", "--json"], srt_env).stdout)[0]["health"]
    for kind in kinds:
        mine = [r for r in letters if r.headers["step"] == step[kind]]
        seen = [json.loads(r.value)["txn_id"] for r in mine]
        assert len(seen) == len(set(seen)), f"{kind}: a row dead-lettered twice"
        assert set(seen) == CANNOT[kind], kind
        for r in mine:
            origin = f"payments:{r.headers['source.partition']}:{r.headers['source.offset']}"
            assert origin == origins[json.loads(r.value)["txn_id"]]
            assert r.headers["error"].startswith(f"{step[kind]}: "), r.headers["error"]
            assert "column" in r.headers["error"] and "table payments" in r.headers["error"]
        assert _ids(kind, where[kind]) == everyone - CANNOT[kind], kind
        # The accounting identity: a refused row counts as a dead letter, not as output.
        counts = health[step[kind]]["records"]
        assert (counts["input"], counts["dead_letters"]) == (len(records), len(CANNOT[kind]))
        assert counts["input"] == counts["output"] + counts["dead_letters"] + counts["late"]
    again = srt(run, srt_env)  # nothing replayed, nothing published twice
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(_letters(upi)) == len(letters)
    for kind in kinds:
        trials.record(
            fault="poison record: a value the sink cannot store",
            input=f"a stateless query's rows past the table's columns, {kind}",
            result="pass",
            detail=f"{len(CANNOT[kind])} rows dead-lettered by origin once; the other "
            f"{len(everyone) - len(CANNOT[kind])} committed; a second run added nothing",
        )


def test_under_errors_policy_fail_the_job_names_the_record_and_skip_passes_it(
    upi: UpiWorkspace, srt_env, tmp_path: Path, trials
):
    records = [_payment(i, amount=100 + i) for i in range(30)]
    records[11] = _payment(11, amount=2**40)
    append_lines(upi.log_dir, [json.dumps(r).encode() for r in records])
    _narrow_table("duckdb", str(upi.database))
    upi.extra.update({"sink.table": "payments", "errors.policy": "fail"})
    job = _job(tmp_path)
    run = ["run", str(job), *upi.sets(), "--available-now"]
    stopped = srt(run, srt_env)
    assert stopped.returncode != 0
    named = _origins(upi)["t011"]
    err = stopped.stderr
    assert f"--skip {named}" in err, err[-3000:]
    assert f"{2**40} is outside the range of INTEGER" in err and "Traceback" not in err, err
    assert _ids("duckdb", str(upi.database)) <= {r["txn_id"] for r in records} - {"t011"}
    passed = srt([*run, "--skip", named], srt_env)
    assert passed.returncode == 0, passed.stderr[-3000:]
    assert _ids("duckdb", str(upi.database)) == {r["txn_id"] for r in records} - {"t011"}
    letters = _letters(upi)
    assert [(r.headers["step"], json.loads(r.value)["txn_id"]) for r in letters] == [
        ("skip", "t011")
    ]
    trials.record(
        fault="poison record: a value the sink cannot store",
        input="errors.policy=fail, a stateless query's row past an INTEGER column, duckdb",
        result="pass",
        detail=f"stopped naming {named} and the --skip command; skipped once, the rest committed",
    )


def test_a_record_too_large_for_the_kafka_topic_is_dead_lettered_once_and_the_rest_is_in_it(
    upi: UpiWorkspace, srt_env, tmp_path: Path, trials
):
    """The Kafka sink's limit is a record's size: one past the topic's max.message.bytes is
    dead-lettered with its size, the limit and the setting, the rest of its batch is produced
    (read_committed), and a second run adds nothing."""
    (tmp_path / "kafka").mkdir()
    broker = start_broker(tmp_path / "kafka" / "data")
    topic = "payments-copy-out"
    try:
        broker.create_topic(topic, 2, **{"max.message.bytes": "4000"})
        records = [_payment(i, amount=100 + i) for i in range(30)]
        records[11] = _payment(11, note="n" * 5000)
        append_lines(upi.log_dir, [json.dumps(r).encode() for r in records])
        upi.extra.update(
            {
                "sink.kind": "kafka",
                "sink.kafka_topic": topic,
                "source.bootstrap_servers": broker.bootstrap,
                "source.max_records_per_batch": "10",
            }
        )
        run = ["run", str(_job(tmp_path)), *upi.sets(), "--available-now"]
        result = srt(run, srt_env)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
        letters = _letters(upi)
        assert [json.loads(r.value)["txn_id"] for r in letters] == ["t011"]
        [letter] = letters
        assert letter.headers["step"] == SINK
        origin = f"payments:{letter.headers['source.partition']}:{letter.headers['source.offset']}"
        assert origin == _origins(upi)["t011"]
        assert "over the topic's max.message.bytes of 4000" in letter.headers["error"]
        written = [json.loads(m.value())["txn_id"] for m in broker.read(topic)]
        everyone = {r["txn_id"] for r in records}
        assert sorted(written) == sorted(everyone - {"t011"})
        again = srt(run, srt_env)  # nothing replayed, nothing published twice
        assert again.returncode == 0, again.stderr[-3000:]
        assert len(_letters(upi)) == 1 and len(broker.read(topic)) == len(written)
    finally:
        broker.stop()
    trials.record(
        fault="poison record: a value the sink cannot store",
        input="a stateless query's record past the Kafka topic's max.message.bytes",
        result="pass",
        detail=f"1 record dead-lettered by origin once (its size, the limit, the setting); the "
        f"other {len(written)} in the topic; a second run added nothing",
    )
