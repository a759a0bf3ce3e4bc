"""The sink-table asset, its Great Expectations checks and the closed-window reconciliation on
every warehouse kind: one UPI run writes PostgreSQL, ClickHouse and Delta at once
(``sink.kind=postgres,clickhouse,delta``); a ``Warehouse`` resource per kind reads each."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
from dagster import AssetCheckSeverity, AssetKey, materialize

from dagster_defs import StreamingRuntime, Warehouse, build_definitions
from dagster_defs._launch import launch_config
from tests.dagster_defs.helpers import UPI_JOB, example_definitions, feed
from tests.helpers import ROOT, srt

pytestmark = pytest.mark.slow

TABLE_KEY = AssetKey(["upi_counts"])
QUERIES = {
    "postgres": "upi-counts",
    "clickhouse": "upi-counts-clickhouse",
    "delta": "upi-counts-delta",
}


@pytest.fixture(scope="module")
def written(tmp_path_factory, srt_env, postgres, clickhouse):
    """One `srt run --available-now` of the UPI example into all three warehouses."""
    from stateful_runtime.connectors.eventlog import EventLog
    from tests.helpers import UpiWorkspace

    ws = UpiWorkspace(tmp_path_factory.mktemp("warehouses"), partitions=2)
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    feed(ws, 6_000, seed=3)
    where = {
        "postgres": postgres.database("dagster_wh"),
        "clickhouse": clickhouse.database("dagster_wh"),
        "delta": str(ws.root / "delta" / "upi_counts"),
    }
    ws.extra.update(
        {
            "sink.kind": "postgres,clickhouse,delta",
            "sink.dsn": where["postgres"],
            "sink.url": where["clickhouse"],
            "sink.path": where["delta"],
            "parallelism": "2",
        }
    )
    done = srt(ws.run_args("--available-now"), srt_env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return ws, where


def _warehouse(kind: str, where: dict[str, str]) -> Warehouse:
    field = {"postgres": "dsn", "clickhouse": "url", "delta": "path"}[kind]
    return Warehouse(kind=kind, **{field: where[kind]})


@pytest.mark.parametrize("kind", sorted(QUERIES))
def test_sink_asset_and_checks_on_every_warehouse(kind, written, srt_home):
    ws, where = written
    table = replace(example_definitions().UPI_COUNTS, query=QUERIES[kind])
    spec = replace(
        UPI_JOB,
        sink_tables=[table],
        config_from_resources={"sink.*": "warehouse.sink_config"},
        config={"source.log_dir": str(ws.log_dir), "checkpoint.dir": str(ws.checkpoint_dir)},
    )
    resources = {
        "streaming_runtime": StreamingRuntime(home=str(srt_home), working_directory=str(ROOT)),
        "warehouse": _warehouse(kind, where),
    }
    # The resource chooses where the job writes: sink.kind and the kind's location.
    config = launch_config(spec, SimpleNamespace(**resources))
    assert config["sink.kind"] == kind
    if kind == "clickhouse":
        # A raw copy of an older version of one row: FINAL still reads one row per key.
        from dbt_sink.clickhouse import ClickHouseUpsertSink

        c = ClickHouseUpsertSink(where[kind], "upi_counts", ("merchant_id",))._client()
        c.command("INSERT INTO upi_counts SELECT * FROM upi_counts LIMIT 1")
        c.close()
    defs = build_definitions([spec], resources=resources)
    result = materialize(
        [*defs.assets, *defs.asset_checks], selection=[TABLE_KEY], resources=resources
    )
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == TABLE_KEY]
    md = {k: v.value for k, v in event.materialization.metadata.items()}
    assert md["warehouse"] == kind and md["dagster/row_count"] > 0
    assert md["last_sink_batch"] is not None
    checks = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert set(checks) == {
        "unique_key",
        "not_null",
        "value_ranges",
        "closed_windows_reconcile",
        "freshness",
    }
    # The job ran --available-now to its end: the table cannot get fresher until it runs
    # again, which freshness says as a warning (not the red of a stuck job).
    fresh = checks.pop("freshness")
    assert not fresh.passed and fresh.severity == AssetCheckSeverity.WARN
    assert "no new batches reach the table" in (fresh.description or "")
    assert all(c.passed for c in checks.values()), {
        n: c.metadata for n, c in checks.items() if not c.passed
    }
    rec = {k: v.value for k, v in checks["closed_windows_reconcile"].metadata.items()}
    assert rec["closed_windows"] >= 2 and rec["difference"] == 0
