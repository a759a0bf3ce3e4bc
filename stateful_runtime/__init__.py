"""Flink-style stateful stream processing on Spark Structured Streaming.

The public API is imported lazily (PEP 562), so that light modules such as
``stateful_runtime.runtime.registry`` can be used (by Dagster, at definition load) without
importing PySpark.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "Aggregate": "aggregates",
    "Avg": "aggregates",
    "Count": "aggregates",
    "Max": "aggregates",
    "Min": "aggregates",
    "Sum": "aggregates",
    "StatefulRuntimeError": "exceptions",
    "Context": "functions",
    "KeyedProcessFunction": "functions",
    "KeyedCoProcessFunction": "functions",
    "KeyedBroadcastProcessFunction": "functions",
    "OutputTag": "functions",
    "ProcessJoinFunction": "joins",
    "JoinFunction": "joins",
    "TemporalJoinFunction": "joins",
    "JoinContext": "joins",
    "ProcessWindowFunction": "functions",
    "TimeWindow": "functions",
    "RuntimeContext": "functions",
    "RetryPolicy": "calls",
    "worker_resource": "calls",
    "TimerService": "functions",
    "CheckpointConfig": "job",
    "StreamJob": "job",
    "DataStream": "streams",
    "Sink": "connectors.base",
    "LogSink": "connectors.eventlog.sink",
    "KafkaSink": "connectors.kafka.sink",
    "source_from_config": "connectors.config",
    "sinks_from_config": "connectors.config",
    "Source": "connectors.base",
    "LogSource": "connectors.eventlog.source",
    "KafkaSource": "connectors.kafka.source",
    "key_partition": "checkpoints.keyed",
    "AggregateFunction": "state",
    "AggregatingStateDescriptor": "state",
    "ListStateDescriptor": "state",
    "MapStateDescriptor": "state",
    "ReducingStateDescriptor": "state",
    "StateTtlConfig": "state",
    "TimeDomain": "state",
    "UpdateType": "state",
    "ValueStateDescriptor": "state",
    "WatermarkStrategy": "watermarks",
    "EventTimePolicy": "watermarks",
    "CountTrigger": "windows",
    "EarlyFiring": "windows",
    "EventTimeSessionWindows": "windows",
    "GlobalWindows": "windows",
    "SlidingEventTimeWindows": "windows",
    "TumblingEventTimeWindows": "windows",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'stateful_runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"stateful_runtime.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from stateful_runtime.aggregates import Aggregate, Avg, Count, Max, Min, Sum
    from stateful_runtime.calls import RetryPolicy, worker_resource
    from stateful_runtime.checkpoints.keyed import key_partition
    from stateful_runtime.connectors.base import Sink, Source
    from stateful_runtime.connectors.config import sinks_from_config, source_from_config
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.connectors.eventlog.source import LogSource
    from stateful_runtime.connectors.kafka.sink import KafkaSink
    from stateful_runtime.connectors.kafka.source import KafkaSource
    from stateful_runtime.exceptions import StatefulRuntimeError
    from stateful_runtime.functions import (
        Context,
        KeyedBroadcastProcessFunction,
        KeyedCoProcessFunction,
        KeyedProcessFunction,
        OutputTag,
        ProcessWindowFunction,
        RuntimeContext,
        TimerService,
        TimeWindow,
    )
    from stateful_runtime.job import CheckpointConfig, StreamJob
    from stateful_runtime.joins import (
        JoinContext,
        JoinFunction,
        ProcessJoinFunction,
        TemporalJoinFunction,
    )
    from stateful_runtime.state import (
        AggregateFunction,
        AggregatingStateDescriptor,
        ListStateDescriptor,
        MapStateDescriptor,
        ReducingStateDescriptor,
        StateTtlConfig,
        TimeDomain,
        UpdateType,
        ValueStateDescriptor,
    )
    from stateful_runtime.watermarks import EventTimePolicy, WatermarkStrategy
    from stateful_runtime.windows import (
        CountTrigger,
        EarlyFiring,
        EventTimeSessionWindows,
        GlobalWindows,
        SlidingEventTimeWindows,
        TumblingEventTimeWindows,
    )
