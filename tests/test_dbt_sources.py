"""`srt dbt sources`: the UPI job's sink table as a dbt source, stable, keyed like the Dagster
sink asset, with freshness and tests; the example project's sources.yml is what it generates."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dagster_defs import SinkTableSpec, StreamingJobSpec, StreamingJobTranslator
from stateful_runtime import dbt_sources
from stateful_runtime.ledger import LEDGER_TABLE
from tests.helpers import EXAMPLES, srt

SOURCES = EXAMPLES / "dbt_upi" / "models" / "sources.yml"
ARGS = ["dbt", "sources", "examples/upi_per_minute.py", "--database", "srt_sink"]


def test_example_sources_are_what_srt_generates(srt_env, tmp_path: Path):
    from tests.helpers import ROOT

    out = srt([*ARGS, "--json"], srt_env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    [table] = doc["sources"]["sources"][0]["tables"]
    assert table["name"] == "upi_counts"
    meta = table["config"]["meta"]
    translator = StreamingJobTranslator()
    job = StreamingJobSpec("upi-per-minute", "examples/upi_per_minute.py")
    key = translator.get_sink_asset_key(job, SinkTableSpec("upi_counts", "upi-counts", ("k",)))
    assert meta["dagster"]["asset_key"] == list(key.path)
    assert meta["srt"]["expected_latency_s"] == 7.0  # checkpoint 2 s + watermark 5 s
    assert table["config"]["freshness"]["error_after"] == {"count": 2, "period": "minute"}
    assert "srt_sink_ledger" in table["config"]["loaded_at_query"]
    columns = {c["name"]: c for c in table["columns"]}
    assert columns["payments"]["data_type"] == "BIGINT"
    assert columns["window_start"]["data_type"] == "TIMESTAMP"
    [not_null] = columns["merchant_id"]["data_tests"]
    assert "has no nulls" in not_null["not_null"]["description"]
    [unique] = table["data_tests"]
    assert "merchant_id" in unique["unique"]["column_name"]

    # Regenerating the committed file changes nothing.
    copy = tmp_path / "sources.yml"
    shutil.copy(SOURCES, copy)
    again = srt([*ARGS, "-o", str(copy)], srt_env, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout
    assert copy.read_text() == SOURCES.read_text()


def test_union_example_sources_are_what_srt_generates(srt_env, tmp_path: Path):
    """A union's table: its columns name both sources, its latency the larger watermark bound."""
    from tests.helpers import ROOT

    committed = EXAMPLES / "dbt_upi_union" / "models" / "sources.yml"
    copy = tmp_path / "sources.yml"
    shutil.copy(committed, copy)
    args = ["dbt", "sources", "examples/upi_union.py", "--database", "srt_sink", "-o", str(copy)]
    again = srt(args, srt_env, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout
    text = committed.read_text()
    assert "expected_latency_s: 32.0" in text  # checkpoint 2 s + the bank feed's 30 s bound
    assert "key_by field merchant_id of source app-payments, bank-payments" in text


# Each example's sink tables and upsert keys, as its job file declares them (written here by
# hand: an expectation that does not come from the generator).
CONNECTED_TABLES = {
    "payment_refunds": {"refund_matches": ["refund_id"], "unmatched_refunds": ["refund_id"]},
    "fraud_rules": {"fraud_alerts": ["txn_id", "rule_id"]},
    "merchant_tiers": {
        "payment_tiers": ["txn_id"],
        "refund_pairs": ["refund_id"],
        "same_hour_refunds": ["refund_id"],
    },
}


@pytest.mark.parametrize("example", sorted(CONNECTED_TABLES))
def test_connected_examples_sources_are_what_srt_generates(srt_env, tmp_path: Path, example):
    """The sink tables of a co-process and of a broadcast process function, as dbt sources:
    each table the job writes with its upsert key, each key column tested not null, and the
    committed example file what `srt dbt sources` writes."""
    from tests.helpers import ROOT

    args = ["dbt", "sources", f"examples/{example}.py", "--database", "srt_sink"]
    out = srt([*args, "--json"], srt_env, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    tables = json.loads(out.stdout)["sources"]["sources"][0]["tables"]
    keys = {t["name"]: t["config"]["meta"]["srt"]["unique_key"] for t in tables}
    assert keys == CONNECTED_TABLES[example]
    for t in tables:
        tested = {c["name"] for c in t["columns"] if c.get("data_tests")}
        assert set(keys[t["name"]]) <= tested, t["name"]

    committed = EXAMPLES / f"dbt_{example}" / "models" / "sources.yml"
    copy = tmp_path / "sources.yml"
    shutil.copy(committed, copy)
    again = srt([*args, "-o", str(copy)], srt_env, cwd=ROOT)
    assert again.returncode == 0, again.stderr
    assert "unchanged" in again.stdout


def test_render_is_deterministic_and_freshness_is_read_from_the_sink_ledger():
    job = dbt_sources.JobTables(
        "j-1",
        2.0,
        (
            dbt_sources.SinkTable(
                "t",
                "q",
                "duckdb",
                ("a", "b"),
                (
                    dbt_sources.SinkColumn("a", "string"),
                    dbt_sources.SinkColumn("b", "bigint"),
                    dbt_sources.SinkColumn("window_end", "timestamp_ntz"),
                ),
                watermark_delay_s=5.0,
                window_s=60.0,
            ),
        ),
    )
    one = dbt_sources.render(dbt_sources.sources(job, loaded_at="window_end"))
    assert one == dbt_sources.render(dbt_sources.sources(job, loaded_at="window_end"))
    assert "loaded_at_field: window_end" in one
    [table] = dbt_sources.sources(job)["sources"][0]["tables"]
    assert f'from "main".{LEDGER_TABLE} where job = ' in table["config"]["loaded_at_query"]
    assert dbt_sources.freshness(7.0)["warn_after"]["count"] == 1


MAPPED_JOB = """
from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import LogSource, StreamJob, WatermarkStrategy

DEFAULTS = {"source.log_dir": "log", "source.topic": "bids", "checkpoint.dir": "ck"}


def build(config):
    job = StreamJob.from_config("mapped", config)
    bids = job.from_source(
        LogSource.from_config(config, {"auction": int, "price": int, "ts_ms": int}),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1))
        .with_timestamp_field("ts_ms"), name="bids")
    (bids.map(lambda b: {"auction": b["auction"], "eur": b["price"] * 908 // 1000},
              output={"auction": int, "eur": int}, name="to-euro")
     .filter("eur > 0")
     .sink_to(DuckDBUpsertSink("w.duckdb", "euro_bids", key=("auction",)), name="euro"))
    return job
"""


def test_a_mapped_streams_table_has_the_maps_columns(tmp_path: Path):
    from stateful_runtime.runtime.catalog import sink_tables

    job_file = tmp_path / "mapped.py"
    job_file.write_text(MAPPED_JOB)
    [table] = sink_tables(job_file)["tables"]
    assert [(c["name"], c["type"]) for c in table["columns"]] == [
        ("auction", "bigint"),
        ("eur", "bigint"),
    ]
    assert {c["description"] for c in table["columns"]} == {"output field of map to-euro"}


def test_a_wide_sum_is_described_as_each_warehouse_creates_it():
    """An integral sum is decimal(38,0): dbt sources name the column type each sink creates
    (PostgreSQL's unconstrained numeric; ClickHouse's spelling as DESCRIBE prints it)."""
    assert dbt_sources.sql_type("decimal(38,0)", "duckdb") == "DECIMAL(38,0)"
    assert dbt_sources.sql_type("decimal(38,0)", "postgres") == "numeric"
    assert dbt_sources.sql_type("decimal(38,0)", "clickhouse") == "Decimal(38, 0)"
    assert dbt_sources.sql_type("decimal(22,2)", "clickhouse") == "Decimal(22, 2)"
