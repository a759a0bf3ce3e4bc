"""Delta Lake sink (delta-rs) on a local path and on S3 (moto's server): merge by key with the
batch as an app transaction in the same commit; readable by DuckDB and by Spark without jars."""

from __future__ import annotations

import re

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from dbt_sink.delta import DeltaUpsertSink
from stateful_runtime.exceptions import SinkError
from tests.dbt_sink.helpers import KEY, W1, W2, batch


@pytest.fixture(params=["local", "s3"])
def path(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "local":
        return str(tmp_path / "counts")
    s3 = request.getfixturevalue("s3")
    return f"s3://{s3.bucket}/delta/{re.sub(r'[^A-Za-z0-9_-]', '_', request.node.name)}"


@pytest.fixture
def sink(path: str) -> DeltaUpsertSink:
    s = DeltaUpsertSink(path, "counts", KEY)
    s.open("job", "q")
    return s


def rows(sink: DeltaUpsertSink) -> list[tuple]:
    t = sink.read_arrow().sort_by([("merchant_id", "ascending"), ("window_start", "ascending")])
    return [tuple(r.values()) for r in t.to_pylist()]


def test_merge_by_key_and_replay_is_skipped_by_the_app_transaction(sink):
    sink.write_batch(batch([("M1", W1, 1), ("M2", W1, 7), ("M1", W1, 2)]), 0)
    sink.write_batch(batch([("M1", W1, 5), ("M1", W2, 2)]), 1)
    dt = DeltaTable(sink.path, storage_options=sink.options())
    version = dt.version()
    assert dt.transaction_version("srt:job:q") == 1
    sink.write_batch(batch([("M1", W1, 99)]), 1)  # batch 1 replayed after a crash
    assert DeltaTable(sink.path, storage_options=sink.options()).version() == version
    assert rows(sink) == [("M1", W1, 5), ("M1", W2, 2), ("M2", W1, 7)]


def test_rewind_then_reexecution_is_merged_again(sink):
    for b in range(3):
        sink.write_batch(batch([("M1", W1, b)]), b)
    sink.rewind(0)
    assert (
        DeltaTable(sink.path, storage_options=sink.options()).transaction_version(sink.app_id) == 0
    )
    sink.write_batch(batch([("M1", W1, 10)]), 1)
    assert rows(sink) == [("M1", W1, 10)]


def test_schema_evolution(sink):
    sink.write_batch(batch([("M1", W1, 1)]), 0)
    sink.write_batch(batch([("M1", W2, 2)]).append_column("amount", pa.array([5], pa.int64())), 1)
    assert rows(sink) == [("M1", W1, 1, None), ("M1", W2, 2, 5)]
    with pytest.raises(SinkError, match=r"no longer writes \['amount'\]"):
        sink.write_batch(batch([("M1", W1, 3)]), 2)


def test_readable_by_duckdb_and_by_spark_without_delta_jars(tmp_path, spark):
    import duckdb

    s = DeltaUpsertSink(str(tmp_path / "counts"), "counts", KEY)
    s.open("job", "q")
    s.write_batch(batch([("M1", W1, 1), ("M2", W1, 2)]), 0)
    s.write_batch(batch([("M1", W1, 3)]), 1)  # rewrites M1's file: the old one is removed
    dt = DeltaTable(s.path)
    con = duckdb.connect()
    con.register("counts", dt.to_pyarrow_dataset())
    assert con.execute("SELECT merchant_id, payments FROM counts ORDER BY 1").fetchall() == [
        ("M1", 3),
        ("M2", 2),
    ]
    # Spark has no Delta reader without the delta-spark jars; the snapshot's files are plain
    # Parquet (this sink writes no deletion vectors), so the file list reads correctly.
    df = spark.read.parquet(*dt.file_uris())
    assert sorted((r.merchant_id, r.payments) for r in df.collect()) == [("M1", 3), ("M2", 2)]
    # Reading the directory instead would also see the superseded file.
    assert spark.read.parquet(str(tmp_path / "counts")).count() > 2
