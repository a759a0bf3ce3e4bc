"""The sink kinds a job file's ``sink.kind`` names, as plain data: the one registry of them.

Each kind's sink class declares what it is (``kind``, ``config_keys``, ``location_key``) and
builds itself from a job file's config (``from_config``). This table names that class by
module, so a kind's packages (pyarrow, DuckDB, psycopg...) are imported only when a job builds
it, and repeats the facts Dagster needs without importing any sink: which kinds are
warehouses, and which key says where each writes (``dagster_defs``' ``Warehouse`` resource
sets it). ``tests/test_sink_kinds.py`` keeps the table, the classes, the catalog and Dagster
in agreement.

``sink.kind`` is one kind, several comma-separated (the same results written to each, e.g.
``postgres,clickhouse``), or ``both`` (``duckdb,kafka``): :func:`configured_kinds`.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stateful_runtime.exceptions import ConfigError

if TYPE_CHECKING:
    from stateful_runtime.connectors.base import Sink


@dataclass(frozen=True)
class SinkKind:
    """A sink kind, as known without importing its sink.

    Attributes:
        name: what ``sink.kind`` says.
        sink: the sink class, ``module:Class``.
        config_keys: the job-file keys its ``from_config`` reads.
        location_key: the one of them that says where it writes (what Dagster's ``Warehouse``
            resource sets and shows).
        warehouse: it upserts a table by key (dbt sources, Dagster's sink-table assets and
            ``Warehouse`` resource); else it writes a stream.
    """

    name: str
    sink: str
    config_keys: tuple[str, ...]
    location_key: str
    warehouse: bool = True


SINK_KINDS: Mapping[str, SinkKind] = {
    k.name: k
    for k in (
        SinkKind(
            "duckdb",
            "dbt_sink.duckdb:DuckDBUpsertSink",
            ("sink.database", "sink.table"),
            "sink.database",
        ),
        SinkKind(
            "postgres",
            "dbt_sink.postgres:PostgresUpsertSink",
            ("sink.dsn", "sink.table", "sink.password", "sink.partitions"),
            "sink.dsn",
        ),
        SinkKind(
            "clickhouse",
            "dbt_sink.clickhouse:ClickHouseUpsertSink",
            ("sink.url", "sink.table", "sink.password", "sink.partitions"),
            "sink.url",
        ),
        SinkKind(
            "delta", "dbt_sink.delta:DeltaUpsertSink", ("sink.path", "sink.table"), "sink.path"
        ),
        SinkKind(
            "kafka",
            "stateful_runtime.connectors.kafka.sink:KafkaSink",
            ("sink.kafka_topic", "sink.bootstrap_servers", "sink.delivery"),
            "sink.kafka_topic",
            warehouse=False,
        ),
    )
}
WAREHOUSE_KINDS = tuple(name for name, k in SINK_KINDS.items() if k.warehouse)
# Names that stand for several kinds: ``both`` is the default warehouse and Kafka.
GROUPS = {"both": ("duckdb", "kafka")}
DEFAULT_KIND = "duckdb"


def configured_kinds(config: Mapping[str, Any]) -> list[str]:
    """``sink.kind`` as a list of kinds, in its order, each once (default ``duckdb``)."""
    raw = str(config.get("sink.kind") or DEFAULT_KIND)
    names = (*SINK_KINDS, *GROUPS)
    kinds: list[str] = []
    for kind in (k.strip() for k in raw.split(",")):
        if kind not in names:
            raise ConfigError(f"sink.kind={raw!r}: {kind!r} is not one of {names}")
        for k in GROUPS.get(kind, (kind,)):
            if k not in kinds:
                kinds.append(k)
    return kinds


def sink_class(kind: str) -> type[Sink]:
    """The sink class of ``kind`` (its module imported now)."""
    if kind not in SINK_KINDS:
        raise ConfigError(f"sink kind {kind!r}: use one of {tuple(SINK_KINDS)}")
    module, _, name = SINK_KINDS[kind].sink.partition(":")
    cls: type[Sink] = getattr(importlib.import_module(module), name)
    return cls
