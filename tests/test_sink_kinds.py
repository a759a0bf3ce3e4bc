"""The sink kinds' registry, the sink classes, the catalog and Dagster's warehouse resource
agree on every kind: its name, the keys it reads and the key that says where it writes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dagster_defs import Warehouse
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.runtime.catalog import sink_tables
from stateful_runtime.sink_kinds import SINK_KINDS, WAREHOUSE_KINDS, sink_class
from tests.helpers import EXAMPLES

# Where each kind writes, as its location key and as Dagster's Warehouse field.
WHERE = {
    "duckdb": ("path", "w.duckdb"),
    "postgres": ("dsn", "postgresql://srt@127.0.0.1:1/db"),
    "clickhouse": ("url", "clickhouse://default@127.0.0.1:1/db"),
    "delta": ("path", "delta-x"),
    "kafka": (None, "upi-counts-out"),
}


def test_every_kind_is_described():
    assert set(WHERE) == set(SINK_KINDS)
    assert WAREHOUSE_KINDS == ("duckdb", "postgres", "clickhouse", "delta")


@pytest.mark.parametrize("kind", sorted(SINK_KINDS))
def test_the_class_declares_what_the_registry_says(kind: str):
    described = SINK_KINDS[kind]
    cls = sink_class(kind)
    assert (cls.kind, cls.config_keys, cls.location_key) == (
        kind,
        described.config_keys,
        described.location_key,
    )
    assert described.location_key in described.config_keys


@pytest.mark.parametrize("kind", sorted(SINK_KINDS))
def test_the_catalog_reports_the_kind_the_sink_declares(kind: str, tmp_path: Path):
    location = WHERE[kind][1]
    overrides = {
        "sink.kind": kind,
        SINK_KINDS[kind].location_key: str(tmp_path / location) if kind == "delta" else location,
        "source.bootstrap_servers": "127.0.0.1:1",
    }
    tables = sink_tables(EXAMPLES / "upi_per_minute.py", overrides)["tables"]
    assert [(t["kind"], t["query"]) for t in tables] == (
        [(kind, "upi-counts")] if SINK_KINDS[kind].warehouse else []
    )


@pytest.mark.parametrize("kind", sorted(SINK_KINDS))
def test_dagster_sets_the_location_key_the_sink_reads(kind: str, tmp_path: Path):
    field, location = WHERE[kind]
    if not SINK_KINDS[kind].warehouse:
        with pytest.raises(ConfigError, match="use one of"):
            Warehouse(kind=kind).sink_config()
        return
    if field == "path":
        location = str(tmp_path / location)
    warehouse = Warehouse(kind=kind, **{field: location})
    config = warehouse.sink_config()
    assert set(config) == {"sink.kind", SINK_KINDS[kind].location_key}
    assert config["sink.kind"] == kind
    sink = sink_class(kind).from_config({**config, "sink.table": "t"}, key=("k",))
    assert sink.kind == kind
    if kind == "duckdb":
        assert sink.database == warehouse.location()  # type: ignore[attr-defined]
    else:
        assert sink.location == warehouse.location()  # type: ignore[attr-defined]


def test_dagster_passes_the_password_reference_to_kinds_that_read_one():
    for kind in WAREHOUSE_KINDS:
        field, location = WHERE[kind]
        config = Warehouse(kind=kind, password="env:PW", **{field: location}).sink_config()
        reads = "sink.password" in SINK_KINDS[kind].config_keys
        assert ("sink.password" in config) == reads, kind
    assert {k for k in WAREHOUSE_KINDS if "sink.password" in SINK_KINDS[k].config_keys} == {
        "postgres",
        "clickhouse",
    }
