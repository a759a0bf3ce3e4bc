"""The job graph a user builds: DataStream → KeyedStream → WindowedStream → sink.

Each method returns a new node; nothing runs until the planner turns the graph into Spark
queries. Stateful operators and sinks carry required, stable names: savepoints and checkpoint
directories are keyed by them, never by derived ids.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from stateful_runtime.aggregates import Aggregate, Count
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import KeyedProcessFunction, OutputTag
from stateful_runtime.sinks.base import Sink
from stateful_runtime.sources.base import Source
from stateful_runtime.watermarks import WatermarkStrategy
from stateful_runtime.windows import WindowAssigner

if TYPE_CHECKING:
    from stateful_runtime.job import StreamJob


def check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not name or not all(c.isalnum() or c in "-_." for c in name):
        raise ConfigError(
            f"{kind} name must be a non-empty string of letters, digits, '-', '_' or '.', "
            f"got {name!r}"
        )
    return name


@dataclass(frozen=True)
class SourceNode:
    source: Source
    watermark: WatermarkStrategy
    name: str


@dataclass(frozen=True)
class FilterNode:
    parent: Node
    condition: str


@dataclass(frozen=True)
class KeyByNode:
    parent: Node
    keys: tuple[str, ...]


@dataclass(frozen=True)
class WindowAggregateNode:
    parent: KeyByNode
    assigner: WindowAssigner
    aggregates: Mapping[str, Aggregate]
    name: str


@dataclass(frozen=True)
class ProcessNode:
    parent: KeyByNode
    function: KeyedProcessFunction
    name: str


@dataclass(frozen=True)
class SideOutputNode:
    parent: ProcessNode
    tag: OutputTag


@dataclass(frozen=True)
class SinkNode:
    parent: Node
    sink: Sink
    name: str


Node = SourceNode | FilterNode | KeyByNode | WindowAggregateNode | ProcessNode | SideOutputNode


@dataclass(frozen=True)
class DataStream:
    """A stream of records (Flink's ``DataStream``)."""

    job: StreamJob = field(repr=False)
    node: Node

    def filter(self, condition: str) -> DataStream:
        """Keep records matching a Spark SQL boolean expression, e.g. ``"amount_paise > 0"``."""
        return DataStream(self.job, FilterNode(self.node, condition))

    def key_by(self, *fields: str) -> KeyedStream:
        """Partition the stream by one or more record fields; state is kept per key."""
        if not fields:
            raise ConfigError("key_by needs at least one field")
        return KeyedStream(self.job, KeyByNode(self.node, tuple(fields)))

    def get_side_output(self, tag: OutputTag) -> DataStream:
        """The records the process function sent to ``ctx.output(tag, ...)``."""
        if not isinstance(self.node, ProcessNode):
            raise ConfigError("get_side_output applies to the stream returned by process()")
        if tag not in self.node.function.side_outputs:
            raise ConfigError(
                f"{type(self.node.function).__name__} does not declare side output {tag.name!r}"
            )
        return DataStream(self.job, SideOutputNode(self.node, tag))

    def sink_to(self, sink: Sink, name: str | None = None) -> DataStream:
        """Write this stream to ``sink``; ``name`` is the stable id of the sink's query."""
        if not isinstance(sink, Sink):
            raise ConfigError(f"sink_to takes a stateful_runtime Sink, got {type(sink).__name__}")
        self.job._add_sink(SinkNode(self.node, sink, check_name("sink", name or sink.default_name())))
        return self


@dataclass(frozen=True)
class KeyedStream:
    job: StreamJob = field(repr=False)
    node: KeyByNode

    def process(self, function: KeyedProcessFunction, *, name: str) -> DataStream:
        """Run a keyed process function (state, timers, side outputs) on every element."""
        if not isinstance(function, KeyedProcessFunction):
            raise ConfigError(
                f"process takes a KeyedProcessFunction, got {type(function).__name__}")
        if not function.output_schema:
            raise ConfigError(f"{type(function).__name__} must declare output_schema")
        return DataStream(self.job, ProcessNode(self.node, function, check_name("operator", name)))

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        if not isinstance(assigner, WindowAssigner):
            raise ConfigError(f"window takes a WindowAssigner, got {type(assigner).__name__}")
        return WindowedStream(self.job, self.node, assigner)


@dataclass(frozen=True)
class WindowedStream:
    job: StreamJob = field(repr=False)
    keyed: KeyByNode
    assigner: WindowAssigner

    def aggregate(self, aggregates: Mapping[str, Aggregate], *, name: str) -> DataStream:
        """One output row per key and window: the key fields, ``window_start``, ``window_end``
        and one column per entry of ``aggregates`` (output name → aggregate)."""
        if not aggregates:
            raise ConfigError("aggregate needs at least one output column")
        for out, agg in aggregates.items():
            if not isinstance(agg, Aggregate):
                raise ConfigError(f"aggregate {out!r}: expected an Aggregate, got {agg!r}")
        clash = set(aggregates) & {*self.keyed.keys, "window_start", "window_end"}
        if clash:
            raise ConfigError(f"aggregate output names clash with key/window columns: {clash}")
        node = WindowAggregateNode(
            self.keyed, self.assigner, dict(aggregates), check_name("operator", name)
        )
        return DataStream(self.job, node)

    def count(self, *, name: str, column: str = "count") -> DataStream:
        return self.aggregate({column: Count()}, name=name)
