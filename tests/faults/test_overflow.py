"""Poison records, part one: an aggregate that would overflow (issue 23). Two valid payments of
``amount_paise`` = 2^63-1 made the native ``SUM(BIGINT)`` fail with ``ARITHMETIC_OVERFLOW`` on
every replay: nothing committed, the stream was blocked. Now every integral sum accumulates in
``decimal(38,0)``: the job commits and each warehouse holds the exact sum (20 digits, compared
exactly), on Spark's native window path and on the runtime's Python window operator. (Kafka and
the event log write it as an exact JSON integer: tests/connectors/formats/test_json_properties.)
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.helpers import EXAMPLES, UpiWorkspace, append_lines, read_counts, srt

pytestmark = [pytest.mark.slow, pytest.mark.faults]

BASE = 1_767_225_600_000  # 2026-01-01T00:00:00Z
MAX = 2**63 - 1
FIRST = ("M1", datetime(2026, 1, 1))  # the minute of the two payments of 2^63-1


def _payment(i: int, merchant: str, amount: int, ts: int) -> bytes:
    return json.dumps(
        {"txn_id": f"t{i}", "merchant_id": merchant, "amount_paise": amount, "ts_ms": ts}
    ).encode()


def _corpus() -> list[bytes]:
    """The issue's trial: two payments of 2^63-1 in one merchant's minute among good ones (and
    a third merchant whose minute sums to below -2^63); a last payment ten minutes later
    moves the watermark past every other window, so the Python window operator fires them."""
    lines = [_payment(i, f"M{i % 3}", 100 + i, BASE + i * 700) for i in range(60)]
    lines[7:7] = [_payment(1000, "M1", MAX, BASE + 5_000), _payment(1001, "M1", MAX, BASE + 9_000)]
    lines += [_payment(1002 + i, "M2", -(2**63), BASE + 20_000 + i) for i in range(3)]
    lines.append(_payment(2000, "M9", 1, BASE + 600_000))
    return lines


def _oracle(lines: list[bytes]) -> dict:
    """{(merchant, window_start): (payments, exact sum)} from the input alone."""
    out: dict = defaultdict(lambda: [0, 0])
    for line in lines:
        r = json.loads(line)
        minute = r["ts_ms"] - r["ts_ms"] % 60_000
        key = (r["merchant_id"], datetime.fromtimestamp(minute / 1000, UTC).replace(tzinfo=None))
        out[key][0] += 1
        out[key][1] += r["amount_paise"]
    return {k: tuple(v) for k, v in out.items()}


def _exact(table: dict) -> dict:
    """Amounts as ints, refusing anything that is not a whole number stored exactly (a float
    that rounded 2 * (2^63-1) would fail here)."""
    out = {}
    for key, (payments, amount) in table.items():
        assert not isinstance(amount, float), f"{key}: amount stored as a float ({amount!r})"
        assert amount == int(amount), f"{key}: {amount!r} is not whole"
        out[key] = (payments, int(amount))
    return out


def test_sums_past_int64_commit_exactly_on_the_native_path(
    upi: UpiWorkspace, srt_env, pg_dsn, ch_url, trials
):
    lines = _corpus()
    append_lines(upi.log_dir, lines)
    upi.extra.update(
        {
            "sink.kind": "duckdb,postgres,clickhouse,delta",
            "sink.dsn": pg_dsn,
            "sink.url": ch_url,
            "sink.path": str(upi.root / "delta" / "upi_counts"),
            "source.max_records_per_batch": "20",
        }
    )
    result = srt(upi.run_args("--available-now"), srt_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ARITHMETIC_OVERFLOW" not in result.stderr
    oracle = _oracle(lines)
    assert oracle[FIRST][1] == 2 * MAX + sum(
        100 + i for i in range(60) if i % 3 == 1 and i * 700 < 60_000
    )
    tables = {
        "duckdb": _exact(upi.table()),
        "postgres": _exact(read_counts("postgres", pg_dsn)),
        "clickhouse": _exact(read_counts("clickhouse", ch_url)),
        "delta": _exact(read_counts("delta", str(upi.root / "delta" / "upi_counts"))),
    }
    for kind, table in tables.items():
        assert table == oracle, kind
        trials.record(
            fault="poison record: an aggregate past int64",
            input=f"two amounts of 2^63-1, native window, {kind}",
            result="pass",
            detail=f"{len(table)} windows; M1's first minute {table[FIRST][1]}",
        )


JOB = """
import sys
from datetime import timedelta

sys.path.insert(0, {examples!r})
from upi_per_minute import DEFAULTS, PAYMENT  # noqa: E402

from stateful_runtime import (  # noqa: E402
    Count, StreamJob, Sum, TumblingEventTimeWindows, WatermarkStrategy, sinks_from_config,
    source_from_config,
)


def build(config):
    job = StreamJob.from_config("upi-per-minute", config)
    payments = job.from_source(
        source_from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
        .with_timestamp_field("ts_ms"),
        name="upi-source",
    )
    counts = (
        payments.key_by("merchant_id")
        .window(TumblingEventTimeWindows.of(timedelta(minutes=1)))
        {lateness}
        .aggregate({{"payments": Count(), "amount_paise": Sum("amount_paise"{wide})}},
                   name="per-merchant-minute")
    )
    for name, sink in sinks_from_config(config, name="upi-counts", key=("merchant_id",
                                        "window_start")):
        counts.sink_to(sink, name=name)
    return job
"""


def test_sums_past_int64_commit_exactly_on_the_window_operator(
    upi: UpiWorkspace, srt_env, tmp_path: Path, trials
):
    job_file = tmp_path / "upi_window_operator.py"
    # Allowed lateness: the runtime's window operator, not Spark's aggregation.
    job_file.write_text(
        JOB.format(
            examples=str(EXAMPLES), lateness=".allowed_lateness(timedelta(seconds=1))", wide=""
        )
    )
    lines = _corpus()
    append_lines(upi.log_dir, lines)
    upi.extra["source.max_records_per_batch"] = "20"
    explain = srt(["explain", str(job_file), "--no-spark", *upi.sets()], srt_env)
    assert explain.returncode == 0 and "window operator" in explain.stdout, explain.stdout
    result = srt(["run", str(job_file), *upi.sets(), "--available-now"], srt_env)
    assert result.returncode == 0, result.stderr[-3000:]
    oracle = _oracle(lines)
    table = _exact(upi.table())
    # Every window the last payment's watermark closed fired, each exactly once, exact.
    closed = {k: v for k, v in oracle.items() if k[0] != "M9"}
    assert {k: v for k, v in table.items() if k[0] != "M9"} == closed
    trials.record(
        fault="poison record: an aggregate past int64",
        input="two amounts of 2^63-1, window operator (Python), duckdb",
        result="pass",
        detail=f"{len(closed)} windows; M1's first minute {table[FIRST][1]}",
    )


def test_a_checkpoint_of_bigint_sums_is_refused_by_name_and_runs_on_with_wide_false(
    upi: UpiWorkspace, srt_env, tmp_path: Path, trials
):
    """Compatibility: a native window's state checkpointed with bigint sums (the code before
    the widening, here ``Sum(..., wide=False)``) is refused at start by the widened code —
    naming the state, the change and both ways on, the checkpoint untouched — where Spark
    would fail the first batch with a state schema error; the old sum keeps running on it."""
    narrow = tmp_path / "upi_bigint_sums.py"
    narrow.write_text(JOB.format(examples=str(EXAMPLES), lateness="", wide=", wide=False"))
    first = [_payment(i, f"M{i % 3}", 100 + i, BASE + i * 700) for i in range(30)]
    append_lines(upi.log_dir, first)
    result = srt(["run", str(narrow), *upi.sets(), "--available-now"], srt_env)
    assert result.returncode == 0, result.stderr[-3000:]
    before = sorted(p.name for p in upi.checkpoint_dir.rglob("*"))

    refused = srt(upi.run_args("--available-now"), srt_env)
    assert refused.returncode != 0
    assert "state 'window'" in refused.stderr and "in decimal(38,0)" in refused.stderr
    assert "Sum(field, wide=False)" in refused.stderr and "new checkpoint.dir" in refused.stderr
    assert "Traceback" not in refused.stderr and "STATE_STORE" not in refused.stderr
    assert sorted(p.name for p in upi.checkpoint_dir.rglob("*")) == before

    more = [_payment(100 + i, "M1", 5, BASE + 30_000 + i) for i in range(5)]
    append_lines(upi.log_dir, more)
    again = srt(["run", str(narrow), *upi.sets(), "--available-now"], srt_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert _exact(upi.table()) == _oracle(first + more)
    trials.record(
        fault="poison record: an aggregate past int64",
        input="checkpoint of bigint sums, restarted by the widened code",
        result="pass",
        detail="refused at start naming the state and both ways on; runs on with wide=False",
    )


def _narrow_table(database: Path) -> None:
    """upi_counts as an earlier version created it: amount_paise BIGINT."""
    import duckdb

    with duckdb.connect(str(database)) as con:
        con.execute(
            "CREATE TABLE upi_counts (merchant_id VARCHAR NOT NULL, window_start TIMESTAMP NOT "
            "NULL, window_end TIMESTAMP, payments BIGINT, amount_paise BIGINT, PRIMARY KEY "
            "(merchant_id, window_start))"
        )


@pytest.mark.parametrize("kind", ["duckdb", "postgres"])
def test_a_sum_the_table_cannot_store_stops_naming_the_row_until_the_column_is_widened(
    kind, upi: UpiWorkspace, srt_env, request, trials
):
    """A table of BIGINT sums (made by an earlier version) takes the decimal(38,0) sums that
    fit; a batch with a sum past int64 stops the job, naming the table, the row's key, the
    value, the column's type and the way on (no traceback, nothing truncated or wrapped);
    once the column is widened the same command commits every window exactly."""
    lines = _corpus()
    append_lines(upi.log_dir, lines)
    if kind == "duckdb":
        _narrow_table(upi.database)
        widen = "ALTER TABLE upi_counts ALTER amount_paise TYPE DECIMAL(38,0)"
    else:
        import psycopg

        dsn = request.getfixturevalue("pg_dsn")
        upi.extra.update({"sink.kind": "postgres", "sink.dsn": dsn})
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute(
                "CREATE TABLE upi_counts (merchant_id text NOT NULL, window_start timestamp NOT "
                "NULL, window_end timestamp, payments bigint, amount_paise bigint, PRIMARY KEY "
                "(merchant_id, window_start))"
            )
        widen = "ALTER TABLE upi_counts ALTER amount_paise TYPE numeric"
    stopped = srt(upi.run_args("--available-now"), srt_env)
    assert stopped.returncode != 0
    err = stopped.stderr
    first = _oracle(lines)[FIRST][1]  # 2^64-2 and M1's other payments of that minute
    assert "merchant_id='M1'" in err and f"{first} is outside the range of" in err, err
    assert "widen amount_paise to" in err and "Traceback" not in err, err

    if kind == "duckdb":
        import duckdb

        with duckdb.connect(str(upi.database)) as con:
            con.execute(widen)
    else:
        with psycopg.connect(dsn, autocommit=True) as con:
            con.execute(widen)
    again = srt(upi.run_args("--available-now"), srt_env)
    assert again.returncode == 0, again.stderr[-3000:]
    table = upi.table() if kind == "duckdb" else read_counts("postgres", dsn)
    assert _exact(table) == _oracle(lines)
    trials.record(
        fault="poison record: a value the sink cannot store",
        input=f"a sum past int64 into a BIGINT column, {kind}",
        result="pass",
        detail="stopped naming the row, the value and the column; exact once widened",
    )


def test_an_overflow_inside_spark_stops_naming_the_step_the_batch_and_the_ways_on(
    upi: UpiWorkspace, srt_env, tmp_path: Path, trials
):
    """Where no record can be isolated (Spark's own bigint sum, ``wide=False``), the job
    stops with the step, Spark's reason, the batch and its offsets, and the ways on: no JVM
    stack, no traceback."""
    narrow = tmp_path / "upi_bigint_sums.py"
    narrow.write_text(JOB.format(examples=str(EXAMPLES), lateness="", wide=", wide=False"))
    append_lines(upi.log_dir, _corpus())
    stopped = srt(["run", str(narrow), *upi.sets(), "--available-now"], srt_env)
    assert stopped.returncode != 0
    err = stopped.stderr
    assert "step 'per-merchant-minute'" in err and "ARITHMETIC_OVERFLOW" in err, err
    assert "source 'upi-source', partition" in err and "--skip upi-source:" in err, err
    assert "Sum(field) sums in decimal(38,0)" in err, err
    assert "\tat org.apache" not in err and "Traceback" not in err, err
    trials.record(
        fault="poison record: an aggregate past int64",
        input="Spark's bigint sum (wide=False) past int64",
        result="pass",
        detail="stopped naming the step, the batch's offsets and the ways on; no stack",
    )
