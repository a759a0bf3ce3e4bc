"""DuckDB upsert sink: key upserts, in-batch dedupe, ledger makes a replayed batch a no-op."""

from __future__ import annotations

from datetime import datetime

import duckdb
import pyarrow as pa
import pytest

from dbt_sink import DuckDBUpsertSink
from stateful_runtime.exceptions import ConfigError, SinkError
from stateful_runtime.ledger import LEDGER_TABLE

W1, W2 = datetime(2026, 1, 1, 0, 0), datetime(2026, 1, 1, 0, 1)


def batch(rows: list[tuple]) -> pa.Table:
    return pa.table(
        {
            "merchant_id": [r[0] for r in rows],
            "window_start": [r[1] for r in rows],
            "payments": [r[2] for r in rows],
        },
        schema=pa.schema(
            [
                ("merchant_id", pa.string()),
                ("window_start", pa.timestamp("us")),
                ("payments", pa.int64()),
            ]
        ),
    )


@pytest.fixture
def sink(tmp_path):
    s = DuckDBUpsertSink(str(tmp_path / "w.duckdb"), "counts", key=("merchant_id", "window_start"))
    s.open("job", "q")
    yield s
    s.close()


def rows(sink) -> list[tuple]:
    con = duckdb.connect(sink.database, read_only=True)
    try:
        return con.execute("SELECT * FROM counts ORDER BY 1, 2").fetchall()
    finally:
        con.close()


def test_upsert_replaces_by_key(sink):
    sink.write_batch(batch([("M1", W1, 3), ("M2", W1, 1)]), 0)
    sink.write_batch(batch([("M1", W1, 5), ("M1", W2, 2)]), 1)
    assert rows(sink) == [("M1", W1, 5), ("M1", W2, 2), ("M2", W1, 1)]


def test_replayed_batch_changes_nothing(sink):
    sink.write_batch(batch([("M1", W1, 3)]), 0)
    sink.write_batch(batch([("M1", W1, 4)]), 1)
    sink.write_batch(batch([("M1", W1, 3)]), 0)  # batch 0 re-executed after a crash
    assert rows(sink) == [("M1", W1, 4)]
    con = duckdb.connect(sink.database, read_only=True)
    ledger = con.execute(f"SELECT job, sink, batch_id, rows FROM {LEDGER_TABLE} ORDER BY 3")
    assert ledger.fetchall() == [("job", "q", 0, 1), ("job", "q", 1, 1)]
    con.close()


def test_duplicates_inside_a_batch_keep_the_last(sink):
    sink.write_batch(batch([("M1", W1, 1), ("M2", W1, 7), ("M1", W1, 2), ("M1", W1, 9)]), 0)
    assert rows(sink) == [("M1", W1, 9), ("M2", W1, 7)]


def test_table_is_created_with_the_key_as_primary_key(sink):
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    con = duckdb.connect(sink.database)
    try:
        with pytest.raises(duckdb.ConstraintException):
            con.execute("INSERT INTO counts VALUES ('M1', ?, 1)", [W1])
    finally:
        con.close()


def test_a_failed_batch_leaves_no_trace(sink):
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    broken = batch([(None, W2, 1)])  # a NULL key: the upsert fails inside the transaction
    with pytest.raises(duckdb.Error):
        sink.write_batch(broken, 1)
    assert rows(sink) == [("M1", W1, 1)]
    sink.write_batch(batch([("M1", W2, 2)]), 1)  # the retry of batch 1 is not mistaken for done
    assert rows(sink) == [("M1", W1, 1), ("M1", W2, 2)]


def test_schema_mismatch_is_a_clear_error(sink, tmp_path):
    with pytest.raises(SinkError, match="key column"):
        sink.check_schema(pa.schema([("merchant_id", pa.string())]))
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    other = pa.table({"merchant_id": ["M1"], "window_start": [W1], "amount": [1]})
    with pytest.raises(SinkError, match="migrate the table"):
        sink.write_batch(other, 1)
    retyped = pa.table({"merchant_id": ["M1"], "window_start": [W1], "payments": ["x"]})
    with pytest.raises(SinkError, match=r"changes the type of \['payments BIGINT -> VARCHAR'\]"):
        sink.write_batch(retyped, 1)
    with pytest.raises(ConfigError, match="plain SQL identifier"):
        DuckDBUpsertSink(str(tmp_path / "x.duckdb"), "a b", key=("merchant_id",))
