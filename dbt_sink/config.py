"""``sink.kind`` → the warehouse sink, from a job file's ``sink.*`` keys.

* ``duckdb``: ``sink.database``, ``sink.table`` → ``DuckDBUpsertSink``
* ``postgres``: ``sink.dsn``, ``sink.table``, ``sink.password`` (``env:NAME``) →
  ``PostgresUpsertSink``
* ``clickhouse``: ``sink.url``, ``sink.table``, ``sink.password`` (``env:NAME``) →
  ``ClickHouseUpsertSink``
* ``delta``: ``sink.path`` (a directory or ``s3://bucket/prefix``), ``sink.table`` →
  ``DeltaUpsertSink``

Several kinds, comma-separated (``postgres,clickhouse,delta``), write the same results to each
(:func:`warehouses_from_config`). ``sink.partitions`` (PostgreSQL, ClickHouse) sets the output
partitions each batch is written in (default: the job's parallelism). ``kafka`` and ``both``
(DuckDB + Kafka) are assembled by ``stateful_runtime.connectors.config.sinks_from_config``,
which takes these warehouses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stateful_runtime.connectors.base import Sink
from stateful_runtime.exceptions import ConfigError

WAREHOUSE_KINDS = ("duckdb", "postgres", "clickhouse", "delta")


def warehouse_from_config(
    config: Mapping[str, Any], key: Sequence[str], *, summary_sql: str | None = None
) -> Sink:
    """The warehouse sink ``sink.kind`` names (``kafka``/``both``: DuckDB, the warehouse that
    ``both`` pairs with Kafka)."""
    kind = config.get("sink.kind", "duckdb")
    if kind in ("duckdb", "kafka", "both"):
        from dbt_sink.duckdb import DuckDBUpsertSink

        return DuckDBUpsertSink(
            config["sink.database"], config["sink.table"], key=key, summary_sql=summary_sql
        )
    if kind == "postgres":
        from dbt_sink.postgres import PostgresUpsertSink

        return PostgresUpsertSink.from_config(config, key, summary_sql=summary_sql)
    if kind == "clickhouse":
        from dbt_sink.clickhouse import ClickHouseUpsertSink

        return ClickHouseUpsertSink.from_config(config, key, summary_sql=summary_sql)
    if kind == "delta":
        from dbt_sink.delta import DeltaUpsertSink

        return DeltaUpsertSink.from_config(config, key, summary_sql=summary_sql)
    raise ConfigError(f"sink.kind={kind!r}: use one of {(*WAREHOUSE_KINDS, 'kafka', 'both')}")


def warehouses_from_config(
    config: Mapping[str, Any], key: Sequence[str], *, summary_sql: str | None = None
) -> list[Sink]:
    """One warehouse sink per warehouse kind in ``sink.kind`` (comma-separated; ``both`` is
    DuckDB and Kafka), in its order: what ``sinks_from_config`` takes."""
    out: list[Sink] = []
    for kind in (k.strip() for k in str(config.get("sink.kind") or "duckdb").split(",")):
        kind = "duckdb" if kind == "both" else kind
        if kind == "kafka":
            continue
        if kind not in WAREHOUSE_KINDS:
            raise ConfigError(
                f"sink.kind: {kind!r} is not one of {(*WAREHOUSE_KINDS, 'kafka', 'both')}"
            )
        out.append(
            warehouse_from_config({**config, "sink.kind": kind}, key, summary_sql=summary_sql)
        )
    return out
