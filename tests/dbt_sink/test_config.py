"""sink.kind → sinks, and what explain says about each sink's write path (no Spark)."""

from __future__ import annotations

import pytest

from dbt_sink.clickhouse import ClickHouseUpsertSink
from dbt_sink.delta import DeltaUpsertSink
from dbt_sink.duckdb import DuckDBUpsertSink
from dbt_sink.postgres import PostgresUpsertSink
from stateful_runtime.connectors.config import sinks_from_config
from stateful_runtime.connectors.kafka.sink import KafkaSink
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.masking import mask_config
from stateful_runtime.planner import plan
from stateful_runtime.runtime.explain import explain
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.sink_kinds import configured_kinds
from tests.helpers import EXAMPLES

KEY = ("merchant_id", "window_start")
BASE = {
    "sink.database": "w.duckdb",
    "sink.table": "upi_counts",
    "sink.dsn": "postgresql://srt@127.0.0.1:1/db",
    "sink.url": "clickhouse://default@127.0.0.1:1/db",
    "sink.path": "/tmp/delta-x",
}


def test_kinds_names_and_sinks():
    config = {**BASE, "sink.kind": "postgres,clickhouse,delta"}
    assert configured_kinds(config) == ["postgres", "clickhouse", "delta"]
    sinks = sinks_from_config(config, name="upi-counts", key=KEY)
    assert [(n, type(s)) for n, s in sinks] == [
        ("upi-counts", PostgresUpsertSink),
        ("upi-counts-clickhouse", ClickHouseUpsertSink),
        ("upi-counts-delta", DeltaUpsertSink),
    ]
    assert configured_kinds({"sink.kind": "both"}) == ["duckdb", "kafka"]
    both = {**BASE, "sink.kind": "both", "sink.kafka_topic": "t", "sink.bootstrap_servers": "h:1"}
    assert [(n, type(s)) for n, s in sinks_from_config(both, name="q", key=KEY)] == [
        ("q", DuckDBUpsertSink),
        ("q-kafka", KafkaSink),
    ]
    [(_, duck)] = sinks_from_config({**BASE, "sink.kind": "duckdb"}, name="q", key=KEY)
    assert isinstance(duck, DuckDBUpsertSink) and duck.database == "w.duckdb"
    with pytest.raises(ConfigError, match="'oracle' is not one of"):
        configured_kinds({"sink.kind": "postgres,oracle"})
    with pytest.raises(ConfigError, match="needs sink.dsn"):
        sinks_from_config({**BASE, "sink.kind": "postgres", "sink.dsn": ""}, name="q", key=KEY)


def test_explain_names_each_write_path_and_masks_the_password(srt_home):
    jf = load_job_file(
        EXAMPLES / "upi_per_minute.py",
        {
            "sink.kind": "postgres,delta,duckdb",
            "sink.dsn": "postgresql://srt:hunter2@127.0.0.1:1/db",
            "sink.path": "/tmp/delta-x",
            "sink.database": "/tmp/x.duckdb",
            "parallelism": "3",
        },
    )
    text = explain(plan(jf.job))
    assert "hunter2" not in text and "postgresql://srt:***@127.0.0.1:1/db" in text
    assert (
        "write upi-counts on the executors, 3 partitions by merchant_id, window_start: "
        "each output partition is written by the task that computed it"
    ) in text
    assert "write upi-counts-delta on the driver: a Delta table takes one commit" in text
    assert "write upi-counts-duckdb on the driver: DuckDB is embedded" in text
    assert "hunter2" not in str(mask_config(jf.config))


def test_prepare_rows_keeps_the_last_row_per_key_in_batch_order_sorted_by_key():
    import pyarrow as pa

    from stateful_runtime.connectors.base import SEQUENCE, prepare_rows

    b = pa.table(
        {"k": ["b", "a", "b", "a", None, None], "w": [1, 1, 1, 2, 1, 1], "v": [1, 2, 3, 4, 5, 6]}
    )
    assert prepare_rows(b, ("k", "w")).to_pylist() == [
        {"k": "a", "w": 1, "v": 2},
        {"k": "a", "w": 2, "v": 4},
        {"k": "b", "w": 1, "v": 3},
        {"k": None, "w": 1, "v": 6},
    ]
    # On the executor path the place in the batch is SEQUENCE (shuffles reorder rows).
    seq = b.append_column(SEQUENCE, pa.array([9, 1, 2, 3, 4, 5], pa.int64()))
    assert [r["v"] for r in prepare_rows(seq, ("k", "w")).to_pylist()] == [2, 4, 1, 6]
    assert prepare_rows(b.slice(0, 0), ("k",)).num_rows == 0
