"""Job-file config keys shared by the examples: which source and which sink, by configuration.

``source.kind`` picks the source (``log``: the embedded event log, ``kafka``); ``sink.kind``
picks where results go: a warehouse (``duckdb``, ``postgres``, ``clickhouse``, ``delta``; the
job file builds it, e.g. with ``dbt_sink.config.warehouse_from_config``), ``kafka``, or
``both`` (the warehouse and Kafka).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql.types import StructType

from stateful_runtime.connectors.base import Sink, Source
from stateful_runtime.exceptions import ConfigError

SOURCE_KINDS = ("log", "kafka")
WAREHOUSE_KINDS = ("duckdb", "postgres", "clickhouse", "delta")
SINK_KINDS = (*WAREHOUSE_KINDS, "kafka", "both")


def source_from_config(config: Mapping[str, Any], schema: StructType | Mapping[str, Any]
                       ) -> Source:
    """The source ``source.kind`` names (default ``log``), from its ``source.*`` keys."""
    kind = config.get("source.kind", "log")
    if kind == "log":
        from stateful_runtime.connectors.eventlog.source import LogSource

        return LogSource.from_config(config, schema)
    if kind == "kafka":
        from stateful_runtime.connectors.kafka.source import KafkaSource

        return KafkaSource.from_config(config, schema)
    raise ConfigError(f"source.kind={kind!r}: use one of {SOURCE_KINDS}")


def sinks_from_config(config: Mapping[str, Any], warehouse: Sink, *,
                      key: Sequence[str] = ()) -> list[Sink]:
    """The sinks ``sink.kind`` names: a warehouse kind (``warehouse``), ``kafka`` (a
    :class:`~stateful_runtime.connectors.kafka.sink.KafkaSink` on ``sink.kafka_topic``), or
    ``both``."""
    kind = config.get("sink.kind", "duckdb")
    if kind not in SINK_KINDS:
        raise ConfigError(f"sink.kind={kind!r}: use one of {SINK_KINDS}")
    out: list[Sink] = []
    if kind in (*WAREHOUSE_KINDS, "both"):
        out.append(warehouse)
    if kind in ("kafka", "both"):
        from stateful_runtime.connectors.kafka.sink import KafkaSink

        out.append(KafkaSink.from_config(config, key=key))
    return out
