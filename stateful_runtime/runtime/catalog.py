"""What a job file writes: each warehouse sink table with its columns, key and latency.

``srt dbt sources JOB_FILE`` renders this as dbt sources (:mod:`stateful_runtime.dbt_sources`);
this side only loads the job file and reads its graph (no Spark), so the description is plain
JSON-able data: the rendering needs neither the planner nor the job's API. A table's ``kind``
is the one its sink declares (:mod:`stateful_runtime.sink_kinds`).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

from stateful_runtime.functions import function_name
from stateful_runtime.streams import (
    MapNode,
    Node,
    ProcessNode,
    SideOutputNode,
    SourceNode,
    UnionNode,
    WindowNode,
    record_schema,
)


def _sources(node: Node) -> list[SourceNode]:
    """The sources whose records reach ``node`` (a union's: each input's)."""
    while not isinstance(node, SourceNode | UnionNode):
        node = node.parent  # type: ignore[union-attr]
    if isinstance(node, UnionNode):
        return [s for i in node.inputs for s in _sources(i)]
    return [node]


def _source_names(node: Node) -> str:
    return ", ".join(s.name for s in _sources(node))


def _window(node: Node) -> WindowNode | None:
    """The window whose results a sink writes (a side output's parent is not its rows)."""
    return node if isinstance(node, WindowNode) else None


def _span(td: timedelta) -> str:
    """``1-minute``, ``5-second``, ``2-hour``: a window size as an adjective."""
    seconds = td.total_seconds()
    for unit, n in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= n and seconds % n == 0:
            return f"{int(seconds // n)}-{unit}"
    return f"{seconds:g}-second"


def _type_name(data_type: Any) -> str:
    """Spark's simple type name (``string``, ``bigint``, ``timestamp_ntz``, ``decimal(10,2)``)."""
    return str(data_type.simpleString())


def _columns(node: Node) -> list[dict[str, str]]:
    """Output columns of the stream a sink writes, each with a description."""
    from stateful_runtime.connectors.formats.json import to_struct

    src = _source_names(node)
    if isinstance(node, WindowNode):
        keys = node.parent.keys
        described: dict[str, str] = {k: f"key_by field {k} of source {src}" for k in keys}
        size = getattr(node.assigner, "size", None)
        span = f"{_span(size)} " if size is not None else ""
        described["window_start"] = (
            f"start of the {span}event-time window (UTC, inclusive) of operator {node.name}"
        )
        described["window_end"] = (
            f"end of the {span}event-time window (UTC, exclusive); the row "
            f"is final once the job's watermark passes it"
        )
        if isinstance(node.contents, Mapping):
            for col, agg in node.contents.items():
                described[col] = f"{agg.describe()} over the window's records"
        schema = node.output_schema
        return [
            {
                "name": f.name,
                "type": _type_name(f.dataType),
                "description": described.get(f.name, f"output of window {node.name}"),
            }
            for f in schema.fields
        ]
    if isinstance(node, ProcessNode):
        fn = function_name(node.function)
        return [
            {
                "name": f.name,
                "type": _type_name(f.dataType),
                "description": f"output field of {fn} (operator {node.name})",
            }
            for f in to_struct(node.function.output_schema).fields
        ]
    if isinstance(node, SideOutputNode):
        return [
            {
                "name": f.name,
                "type": _type_name(f.dataType),
                "description": f"field of side output {node.tag.name}",
            }
            for f in to_struct(node.tag.schema).fields
        ]
    # Records as a source or the last map before this node made them (filters keep them).
    made_by: Node = node
    while not isinstance(made_by, SourceNode | MapNode):
        made_by = made_by.parent  # type: ignore[union-attr]
    what = (
        f"output field of {made_by.kind} {made_by.name}"
        if isinstance(made_by, MapNode)
        else f"field of source {src}"
    )
    return [
        {"name": f.name, "type": _type_name(f.dataType), "description": what}
        for f in record_schema(node).fields
    ]


def _seconds(td: timedelta | None) -> float | None:
    return None if td is None else td.total_seconds()


def sink_tables(job_file: str | Path, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The job file's warehouse sink tables (sinks with a table and a unique key; Kafka and
    other sinks are skipped), as JSON-able data::

        {"job": ..., "checkpoint_interval_s": ..., "tables": [{"table", "query", "kind",
         "key", "columns": [{"name", "type", "description"}], "watermark_delay_s",
         "window_s", "source", "topic"}]}
    """
    from stateful_runtime.runtime.loader import load_job_file

    job = load_job_file(job_file, overrides).job
    tables = []
    for sink_node in job.sinks:
        sink = sink_node.sink
        table = getattr(sink, "table", None)
        key = tuple(getattr(sink, "key_columns", ()) or ())
        if not isinstance(table, str) or not key:
            continue
        node = sink_node.parent
        # A union's watermark is its inputs' smallest: the largest bound decides the delay.
        srcs = _sources(node)
        delays = [getattr(s.watermark, "max_out_of_orderness", None) for s in srcs]
        window = _window(node)
        tables.append(
            {
                "table": table,
                "query": sink_node.name,
                "kind": sink.kind,
                "key": list(key),
                "columns": _columns(node),
                "source": ", ".join(s.name for s in srcs),
                "watermark_delay_s": _seconds(
                    max((d for d in delays if d is not None), default=None)
                ),
                "window_s": _seconds(getattr(window.assigner, "size", None)) if window else None,
            }
        )
    return {
        "job": job.name,
        "checkpoint_interval_s": job.checkpoint.interval.total_seconds(),
        "tables": tables,
    }
