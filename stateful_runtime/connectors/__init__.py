"""Connectors: how records come in and results go out, one package per external system.

* :mod:`~stateful_runtime.connectors.base` — the contracts: ``Source``, ``Sink``,
  ``DeadLetterSink``, the metadata columns every source adds.
* :mod:`~stateful_runtime.connectors.formats` — record formats (JSON decoding to Arrow).
* :mod:`~stateful_runtime.connectors.ranges`, :mod:`~stateful_runtime.connectors.alignment` —
  offset-range planning and event-time alignment shared by offset-addressed sources.
* :mod:`~stateful_runtime.connectors.dead_letters` — staging and publishing rejected records.
* :mod:`~stateful_runtime.connectors.eventlog` — the embedded event log (store, ingest, source,
  sink, dead letters).
* :mod:`~stateful_runtime.connectors.kafka` — Kafka (client settings and commit markers,
  source, exactly-once sink, dead letters).
* :mod:`~stateful_runtime.connectors.config` — ``source.kind`` / ``sink.kind`` job-file keys.

Warehouse sinks (DuckDB, ...) live in the top-level ``dbt_sink`` package on the same contracts.
"""
