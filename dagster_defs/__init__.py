"""Dagster plugin for the stateful runtime: streaming jobs as assets.

Load it with ``dagster dev -w workspace.yaml``, or build your own definitions::

    from dagster_defs import SinkTableSpec, StreamingJobSpec, build_definitions

    defs = build_definitions([StreamingJobSpec("upi-per-minute", "examples/upi_per_minute.py",
                                               sink_tables=[SinkTableSpec(...)])])

Materialising a job's asset runs the job (a detached ``srt run``); sink tables are downstream
assets with Great Expectations checks; a sensor observes health and restarts failed jobs; a
schedule per job takes periodic savepoints, and jobs stop, upgrade and rescale through them.
All of it reaches the runtime through one door, the :class:`StreamingRuntime` resource: typed
results of ``srt ... --json`` processes (errors in :mod:`dagster_defs.errors`).
"""

from dagster_defs._factory import build_definitions, default_resources
from dagster_defs._sensor import Action, Condition, assess, decide
from dagster_defs._specs import (
    RestartPolicy,
    SavepointPolicy,
    SinkTableSpec,
    StreamingJobSpec,
    WindowReconciliation,
)
from dagster_defs._translator import StreamingJobTranslator
from dagster_defs.resources import (
    DuckDBWarehouse,
    KafkaResource,
    StreamingRuntime,
    TableRead,
    Warehouse,
)

__all__ = [
    "Action",
    "Condition",
    "DuckDBWarehouse",
    "KafkaResource",
    "RestartPolicy",
    "SavepointPolicy",
    "SinkTableSpec",
    "StreamingJobSpec",
    "StreamingJobTranslator",
    "StreamingRuntime",
    "TableRead",
    "Warehouse",
    "WindowReconciliation",
    "assess",
    "build_definitions",
    "decide",
    "default_resources",
]
