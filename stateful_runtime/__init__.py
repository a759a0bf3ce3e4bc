"""Flink-style stateful stream processing on Spark Structured Streaming."""

from stateful_runtime.aggregates import Aggregate, Avg, Count, Max, Min, Sum
from stateful_runtime.exceptions import StatefulRuntimeError
from stateful_runtime.functions import (
    Context,
    KeyedProcessFunction,
    OutputTag,
    RuntimeContext,
    TimerService,
)
from stateful_runtime.job import CheckpointConfig, StreamJob
from stateful_runtime.sinks.base import Sink
from stateful_runtime.sinks.log import LogSink
from stateful_runtime.sources.base import Source
from stateful_runtime.sources.log import LogSource
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
from stateful_runtime.watermarks import WatermarkStrategy
from stateful_runtime.windows import TumblingEventTimeWindows

__all__ = [
    "Aggregate",
    "AggregateFunction",
    "AggregatingStateDescriptor",
    "Context",
    "KeyedProcessFunction",
    "ListStateDescriptor",
    "MapStateDescriptor",
    "OutputTag",
    "ReducingStateDescriptor",
    "RuntimeContext",
    "StateTtlConfig",
    "TimeDomain",
    "TimerService",
    "UpdateType",
    "ValueStateDescriptor",
    "Avg",
    "CheckpointConfig",
    "Count",
    "LogSink",
    "LogSource",
    "Max",
    "Min",
    "Sink",
    "Source",
    "StatefulRuntimeError",
    "StreamJob",
    "Sum",
    "TumblingEventTimeWindows",
    "WatermarkStrategy",
]
