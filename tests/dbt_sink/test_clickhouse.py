"""ClickHouse sink on two real targets: Debian's clickhouse-server 18.16 (no insert tokens:
exactly-once as read with FINAL) and chdb 26.9 in process (insert_deduplication_token: a
replayed chunk is dropped by the server, the raw table holds no copy)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from datetime import datetime

import pyarrow as pa
import pytest

from dbt_sink.clickhouse import VERSION_COLUMN, ClickHouseUpsertSink
from dbt_sink.partitioned import RetryPolicy
from stateful_runtime.connectors.base import prepare_rows
from stateful_runtime.dbt_sources import ledger_query
from stateful_runtime.exceptions import ConfigError, SinkError
from stateful_runtime.ledger import LEDGER_TABLE
from tests.dbt_sink.helpers import KEY, W1, W2, batch
from tests.helpers import utc_naive


@pytest.fixture(params=["server-18.16", "chdb-26.9"])
def url(request: pytest.FixtureRequest, chdb_dir) -> Iterator[str]:
    if request.param == "server-18.16":
        yield request.getfixturevalue("ch_url")
    else:
        db = "t_" + re.sub(r"\W", "_", request.node.name.lower())[:50]
        yield f"chdb://{chdb_dir}?database={db}"


@pytest.fixture
def sink(url: str) -> ClickHouseUpsertSink:
    s = ClickHouseUpsertSink(url, "counts", KEY)
    s.open("job", "q")
    return s


def query(sink: ClickHouseUpsertSink, sql: str) -> list[tuple]:
    c = sink._client()
    try:
        return [tuple(utc_naive(v) for v in r) for r in c.query(sql)]
    finally:
        c.close()


def final(sink: ClickHouseUpsertSink) -> list[tuple]:
    return query(
        sink,
        "SELECT merchant_id, window_start, payments FROM counts FINAL "
        "ORDER BY merchant_id, window_start",
    )


def test_latest_batch_wins_per_key_read_with_final(sink):
    sink.write_batch(batch([("M1", W1, 1), ("M2", W1, 7), ("M1", W1, 2)]), 0)
    sink.write_batch(batch([("M1", W1, 5), ("M1", W2, 2)]), 1)
    assert final(sink) == [("M1", W1, 5), ("M1", W2, 2), ("M2", W1, 7)]
    assert query(sink, f"SELECT max({VERSION_COLUMN}) FROM counts") == [(1,)]
    sink.write_batch(batch([("M1", W1, 2)]), 0)  # committed batch replayed: nothing written
    assert final(sink) == [("M1", W1, 5), ("M1", W2, 2), ("M2", W1, 7)]


def test_interrupted_partition_is_reinserted_and_absorbed(sink):
    """kill -9 after BEFORE and the data, before AFTER: the replay inserts the same chunk
    again. With tokens the server drops it; without, FINAL reads one row per key and the raw
    copies are exactly the replayed partition's rows."""
    sink.write_batch(batch([("M1", W1, 1), ("M2", W1, 1)]), 0)
    rows = prepare_rows(batch([("M1", W1, 4), ("M2", W1, 3)]), KEY)
    assert sink.begin_batch(1, rows.schema)
    c = sink._client()
    try:  # the first attempt, as far as it got before the kill
        sink._ledger(c, 1, 0, 1, "BEFORE", rows.num_rows, 1)
        chunk = rows.append_column(VERSION_COLUMN, pa.array([1, 1], pa.uint64()))
        c.insert("`counts`", chunk, sink.token(1, 0, 1, 0, chunk))
    finally:
        c.close()
    report = sink.write_partition(rows, 1, 0, 1)
    assert report.note == "replay of an interrupted insert" and report.written == 2
    sink.commit_batch(1, [report])
    assert final(sink) == [("M1", W1, 4), ("M2", W1, 3)]
    raw = query(sink, "SELECT count() FROM counts")[0][0]
    attempts = query(
        sink, f"SELECT count() FROM {LEDGER_TABLE} WHERE batch_id = 1 AND state = 'BEFORE'"
    )[0][0]
    assert attempts == 2
    if sink.tokens:
        assert raw == 2 + 2  # batch 0's rows + batch 1's once: the replayed chunk was dropped
    else:
        assert raw == 2 + 2 * attempts  # every attempt's copy, until a merge
        c = sink._client()
        c.command("OPTIMIZE TABLE counts FINAL")
        c.close()
        assert query(sink, "SELECT count() FROM counts")[0][0] == 2


def test_guarantee_is_detected_from_the_server(sink, url):
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    text = sink.describe()
    if url.startswith("chdb:"):
        assert sink.tokens and "insert_deduplication_token" in text and "26." in text
        settings = query(sink, "SELECT engine_full FROM system.tables WHERE name = 'counts'")
        assert "non_replicated_deduplication_window = 1000" in settings[0][0]
    else:
        assert sink.tokens is False and "18.16" in text and "FINAL" in text


def test_rewind_deletes_later_versions_and_ledger(sink):
    for b in range(3):
        sink.write_batch(batch([("M1", W1, b), (f"N{b}", W1, b)]), b)
    sink.rewind(0)
    assert final(sink) == [("M1", W1, 0), ("N0", W1, 0)]
    assert sink.committed_batches() == [(0, 2)]
    sink.write_batch(batch([("M1", W1, 7)]), 1)  # re-executed: written, and it wins
    assert final(sink)[0] == ("M1", W1, 7)


def test_dbt_freshness_query_reads_the_commit_time_of_this_ledger(sink):
    # dbt's loaded_at_query for a ClickHouse table: ClickHouse's ledger keeps the commit time
    # in a column of its own, and a batch's commit in one row among its partitions' rows.
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    [(at,)] = query(sink, ledger_query("job", "q", kind="clickhouse"))
    assert isinstance(at, datetime) and at.year >= 2026
    [(other,)] = query(sink, ledger_query("job", "another query", kind="clickhouse"))
    assert other in (None, datetime(1970, 1, 1))  # max() of nothing: NULL, or 18.16's zero


def test_schema_evolution_and_names(sink):
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    wider = batch([("M1", W2, 2)]).append_column("amount", pa.array([5], pa.int64()))
    sink.write_batch(wider, 1)
    assert query(sink, "SELECT payments, amount FROM counts FINAL ORDER BY window_start") == [
        (1, None),
        (2, 5),
    ]
    with pytest.raises(SinkError, match="changes the type of"):
        sink.write_batch(
            pa.table(
                {"merchant_id": ["M1"], "window_start": [W1], "payments": ["x"], "amount": [1]}
            ),
            2,
        )
    with pytest.raises(ConfigError, match="plain SQL identifier"):
        ClickHouseUpsertSink(sink.url, "t`; DROP TABLE x", KEY)


def test_password_is_masked_and_server_outage_is_retried(clickhouse, ch_url):
    secret = ClickHouseUpsertSink(ch_url.replace("default@", "default:hunter2@"), "c", KEY)
    assert "hunter2" not in secret.describe()
    s = ClickHouseUpsertSink(
        ch_url,
        "counts",
        KEY,
        retry=RetryPolicy(attempts=40, initial_backoff_s=0.2, max_backoff_s=0.5),
    )
    s.open("job", "q")
    s.write_batch(batch([("M1", W1, 1)]), 0)
    clickhouse.stop()
    restart = threading.Timer(2.0, clickhouse.start)  # the outage's length, not a wait
    restart.start()
    try:
        s.write_batch(batch([("M1", W1, 2)]), 1)
    finally:
        restart.join()
    assert final(s) == [("M1", W1, 2)]
    clickhouse.stop()
    try:
        quick = ClickHouseUpsertSink(
            ch_url, "counts", KEY, retry=RetryPolicy(attempts=2, initial_backoff_s=0.05)
        )
        quick.open("job", "q")
        with pytest.raises(SinkError, match=r"failed 2 times.*Is the warehouse up"):
            quick.write_batch(batch([("M1", W1, 3)]), 2)
    finally:
        clickhouse.start()
