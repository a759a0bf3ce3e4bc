"""Job-file config keys shared by the examples: which source and which sinks, by configuration.

``source.kind`` picks the source (``log``: the embedded event log, ``kafka``); ``sink.kind``
picks where results go: a warehouse (``duckdb``, ``postgres``, ``clickhouse``, ``delta``),
``kafka``, ``both`` (DuckDB and Kafka) or several comma-separated (the kinds:
:mod:`stateful_runtime.sink_kinds`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql.types import StructType

from stateful_runtime.connectors.base import Sink, Source
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.sink_kinds import configured_kinds, sink_class

SOURCE_KINDS = ("log", "kafka")


def source_from_config(config: Mapping[str, Any], schema: StructType | Mapping[str, Any]) -> Source:
    """The source ``source.kind`` names (default ``log``), from its ``source.*`` keys."""
    kind = config.get("source.kind", "log")
    if kind == "log":
        from stateful_runtime.connectors.eventlog.source import LogSource

        return LogSource.from_config(config, schema)
    if kind == "kafka":
        from stateful_runtime.connectors.kafka.source import KafkaSource

        return KafkaSource.from_config(config, schema)
    raise ConfigError(f"source.kind={kind!r}: use one of {SOURCE_KINDS}")


def sinks_from_config(
    config: Mapping[str, Any],
    *,
    name: str,
    key: Sequence[str] = (),
    summary_sql: str | None = None,
) -> list[tuple[str, Sink]]:
    """The sinks ``sink.kind`` names, in its order, each with a stable name for its query:
    ``name`` for the first, ``<name>-<kind>`` for the others (each names a query and its
    checkpoint). Each sink reads its own ``sink.*`` keys (its ``from_config``).

    Args:
        config: the job's config.
        name: the first sink's query name.
        key: the output columns that key a row (a warehouse's upsert key, a Kafka record's
            key).
        summary_sql: what a warehouse prints at the end of a run (``{table}``: its table).
    """
    return [
        (
            name if i == 0 else f"{name}-{kind}",
            sink_class(kind).from_config(config, key=key, summary_sql=summary_sql),
        )
        for i, kind in enumerate(configured_kinds(config))
    ]
