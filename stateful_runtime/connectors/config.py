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


def sink_kinds(config: Mapping[str, Any]) -> list[str]:
    """``sink.kind`` as a list: one kind, or several comma-separated (the same results written
    to each, e.g. ``postgres,clickhouse``); ``both`` is ``duckdb,kafka``."""
    raw = str(config.get("sink.kind") or "duckdb")
    kinds: list[str] = []
    for kind in (k.strip() for k in raw.split(",")):
        if kind not in SINK_KINDS:
            raise ConfigError(f"sink.kind={raw!r}: {kind!r} is not one of {SINK_KINDS}")
        for k in ("duckdb", "kafka") if kind == "both" else (kind,):
            if k not in kinds:
                kinds.append(k)
    return kinds


def sink_names(config: Mapping[str, Any], base: str) -> list[str]:
    """Stable names for the sinks :func:`sinks_from_config` returns, in its order: ``base``
    for the first, ``<base>-<kind>`` for the others (each names a query and its checkpoint)."""
    return [base if i == 0 else f"{base}-{k}" for i, k in enumerate(sink_kinds(config))]


def sinks_from_config(
    config: Mapping[str, Any], warehouse: Sink | Sequence[Sink], *, key: Sequence[str] = ()
) -> list[Sink]:
    """The sinks ``sink.kind`` names, in its order: each warehouse kind takes the next of
    ``warehouse`` (one sink, or one per warehouse kind named, e.g. from
    ``dbt_sink.config.warehouses_from_config``); ``kafka`` is a
    :class:`~stateful_runtime.connectors.kafka.sink.KafkaSink` on ``sink.kafka_topic``."""
    kinds = sink_kinds(config)
    named = [k for k in kinds if k in WAREHOUSE_KINDS]
    given = [warehouse] if isinstance(warehouse, Sink) else list(warehouse)
    if isinstance(warehouse, Sink) and not named:
        given = []  # sink.kind=kafka: the job file's default warehouse is not used
    if len(given) != len(named):
        raise ConfigError(
            f"sink.kind={config.get('sink.kind')!r} names {len(named)} "
            f"warehouse(s) {named} but the job file built {len(given)}"
        )
    out: list[Sink] = []
    warehouses = iter(given)
    for kind in kinds:
        if kind == "kafka":
            from stateful_runtime.connectors.kafka.sink import KafkaSink

            out.append(KafkaSink.from_config(config, key=key))
        else:
            out.append(next(warehouses))
    return out
