"""PostgreSQL sink against a real server: upserts, ledger per batch and per partition,
schema evolution, names, masked secrets, a server that goes away and comes back."""

from __future__ import annotations

import pickle
import threading

import psycopg
import pyarrow as pa
import pytest

from dbt_sink.partitioned import RetryPolicy
from dbt_sink.postgres import PostgresUpsertSink
from stateful_runtime.connectors.base import prepare_rows
from stateful_runtime.exceptions import ConfigError, SinkError
from tests.dbt_sink.helpers import KEY, W1, W2, batch


def rows(dsn: str, table: str = "counts") -> list[tuple]:
    with psycopg.connect(dsn) as con:
        return con.execute(f"SELECT * FROM {table} ORDER BY 1, 2").fetchall()


@pytest.fixture
def sink(pg_dsn):
    s = PostgresUpsertSink(pg_dsn, "counts", KEY)
    s.open("job", "q")
    return s


def test_upsert_by_key_last_row_of_a_batch_wins(sink, pg_dsn):
    sink.write_batch(batch([("M1", W1, 1), ("M2", W1, 7), ("M1", W1, 2)]), 0)
    sink.write_batch(batch([("M1", W1, 5), ("M1", W2, 2)]), 1)
    assert rows(pg_dsn) == [("M1", W1, 5), ("M1", W2, 2), ("M2", W1, 7)]


def test_replayed_batch_and_replayed_partition_change_nothing(sink, pg_dsn):
    sink.write_batch(batch([("M1", W1, 3)]), 0)
    sink.write_batch(batch([("M1", W1, 4)]), 1)
    sink.write_batch(batch([("M1", W1, 3)]), 0)  # batch 0 again after a crash: skipped
    assert rows(pg_dsn) == [("M1", W1, 4)]
    # Batch 2 crashed between its partitions: partition 0 of 2 is in, 1 is not.
    b2 = prepare_rows(batch([("M1", W2, 9)]), KEY)
    assert sink.begin_batch(2, b2.schema)
    first = sink.write_partition(b2, 2, 0, 2)
    assert first.written == 1
    replay = sink.write_partition(b2, 2, 0, 2)  # the replay skips what is there
    assert (replay.written, replay.note) == (0, "already written")
    other = sink.write_partition(prepare_rows(batch([("M2", W2, 1)]), KEY), 2, 1, 2)
    sink.commit_batch(2, [first, other])
    assert not sink.begin_batch(2, b2.schema)
    with psycopg.connect(pg_dsn) as con:
        assert con.execute("SELECT batch_id, rows FROM srt_sink_ledger ORDER BY 1").fetchall() == [
            (0, 1),
            (1, 1),
            (2, 2),
        ]
        # Partition rows are kept only for the batch in flight.
        assert (
            con.execute("SELECT count(*) FROM srt_sink_partitions WHERE batch_id < 2").fetchone()[0]
            == 0
        )


def test_rewind_forgets_later_batches(sink, pg_dsn):
    for b in range(3):
        sink.write_batch(batch([("M1", W1, b)]), b)
    sink.rewind(0)
    sink.write_batch(batch([("M1", W1, 10)]), 1)  # re-executed after a restore: written
    assert rows(pg_dsn) == [("M1", W1, 10)]


def test_new_columns_added_removed_or_retyped_refused(sink, pg_dsn):
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    wider = batch([("M1", W2, 2)]).append_column("amount", pa.array([5], pa.int64()))
    sink.write_batch(wider, 1)
    assert rows(pg_dsn) == [("M1", W1, 1, None), ("M1", W2, 2, 5)]
    with pytest.raises(SinkError, match=r"no longer writes \['amount'\].*new sink.table"):
        sink.write_batch(batch([("M1", W1, 3)]), 2)
    retyped = pa.table(
        {"merchant_id": ["M1"], "window_start": [W1], "payments": ["x"], "amount": [1]}
    )
    with pytest.raises(SinkError, match="changes the type of"):
        sink.write_batch(retyped, 2)


def test_names_validated_and_password_masked(pg_dsn, monkeypatch):
    with pytest.raises(ConfigError, match="plain SQL identifier"):
        PostgresUpsertSink(pg_dsn, 'counts"; DROP TABLE x; --', KEY)
    s = PostgresUpsertSink(pg_dsn, "counts", KEY)
    with pytest.raises(ConfigError, match="plain SQL identifier"):
        s.check_schema(
            pa.schema(
                [
                    ("merchant_id", pa.string()),
                    ("window_start", pa.date32()),
                    ("bad name", pa.int64()),
                ]
            )
        )
    secret = pg_dsn.replace("srt@", "srt:hunter2@")
    s = PostgresUpsertSink(secret, "counts", KEY)
    assert "hunter2" not in s.describe() and "***" in s.describe()
    s.open("job", "q")
    s.write_batch(batch([("M1", W1, 1)]), 0)  # trust auth: the password is sent, not needed
    s = PostgresUpsertSink(pg_dsn, "counts", KEY, password="env:SRT_TEST_PG_PASSWORD")
    monkeypatch.setenv("SRT_TEST_PG_PASSWORD", "hunter2")
    assert "hunter2" not in pickle.dumps(s).decode("latin-1")  # resolved where it connects
    s.open("job", "q")
    s.write_batch(batch([("M1", W1, 2)]), 1)


def test_server_down_then_back_retries_and_down_for_good_fails_clearly(postgres, pg_dsn):
    s = PostgresUpsertSink(
        pg_dsn,
        "counts",
        KEY,
        retry=RetryPolicy(attempts=30, initial_backoff_s=0.2, max_backoff_s=0.5),
    )
    s.open("job", "q")
    s.write_batch(batch([("M1", W1, 1)]), 0)
    postgres.stop()
    restart = threading.Timer(2.0, postgres.start)  # the outage's length, not a wait
    restart.start()
    try:
        s.write_batch(batch([("M1", W1, 2)]), 1)  # retried until the server is back
    finally:
        restart.join()
    assert rows(pg_dsn) == [("M1", W1, 2)]
    postgres.stop()
    try:
        quick = PostgresUpsertSink(
            pg_dsn, "counts", KEY, retry=RetryPolicy(attempts=3, initial_backoff_s=0.05)
        )
        quick.open("job", "q")
        with pytest.raises(SinkError, match=r"failed 3 times.*Is the warehouse up.*replays"):
            quick.write_batch(batch([("M1", W1, 3)]), 2)
    finally:
        postgres.start()
    assert rows(pg_dsn) == [("M1", W1, 2)]
