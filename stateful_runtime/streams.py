"""The job graph a user builds: DataStream → KeyedStream → WindowedStream → sink.

Each method returns a new node; nothing runs until the planner turns the graph into Spark
queries. Stateful operators and sinks carry required, stable names: savepoints and checkpoint
directories are keyed by them, never by derived ids.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import StructField, StructType, TimestampNTZType

from stateful_runtime.aggregates import Aggregate, Count
from stateful_runtime.calls import AsyncCall, AsyncLookup, RetryPolicy
from stateful_runtime.connectors.base import Sink, Source
from stateful_runtime.connectors.formats.json import to_struct
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import (
    CO_INPUT,
    BroadcastProcess,
    CoInput,
    CoProcess,
    KeyedBroadcastProcessFunction,
    KeyedCoProcessFunction,
    KeyedProcessFunction,
    OutputTag,
    ProcessWindowFunction,
    function_name,
)
from stateful_runtime.joins import (
    IntervalJoinOperator,
    JoinFunction,
    ProcessJoinFunction,
    TemporalJoinFunction,
    TemporalJoinOperator,
    WindowJoinOperator,
)
from stateful_runtime.names import check_name
from stateful_runtime.state import AggregateFunction, MapStateDescriptor
from stateful_runtime.watermarks import WatermarkStrategy
from stateful_runtime.windows import (
    CountTrigger,
    GlobalWindows,
    SlidingEventTimeWindows,
    Trigger,
    TumblingEventTimeWindows,
    WindowAssigner,
)

if TYPE_CHECKING:
    from stateful_runtime.job import StreamJob


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
class MapNode:
    """A stateless Python function over every record (``map``: one record out per record in;
    ``flat_map``: any number; with ``call``, an ``async def`` called concurrently:
    ``map_async``). Each output record keeps its input's event time."""

    parent: Node
    function: Callable[[dict[str, Any]], Any]
    output_schema: StructType
    flat: bool
    name: str
    call: AsyncCall | None = None

    @property
    def kind(self) -> str:
        """The method that made the step, as plans and messages name it."""
        return _map_kind(self.flat, self.call is not None)


def _is_async(function: Callable) -> bool:
    """Whether calling ``function`` gives a coroutine (an ``async def``, or an object whose
    ``__call__`` is one)."""
    import inspect

    call = type(function).__call__ if not inspect.isroutine(function) else None
    return inspect.iscoroutinefunction(function) or inspect.iscoroutinefunction(call)


def _map_kind(flat: bool, calls: bool = False) -> str:
    return ("flat_map" if flat else "map") + ("_async" if calls else "")


@dataclass(frozen=True)
class KeyByNode:
    parent: Node
    keys: tuple[str, ...]


@dataclass(frozen=True)
class WindowNode:
    """A keyed window and what it computes; the planner decides how it runs (Spark's native
    window aggregation or the runtime's window operator), never the API."""

    parent: KeyByNode
    assigner: WindowAssigner
    contents: Mapping[str, Aggregate] | AggregateFunction | ProcessWindowFunction
    output_schema: StructType
    name: str
    lateness: timedelta = timedelta(0)
    late_tag: OutputTag | None = None
    trigger: Trigger | None = None

    @property
    def side_outputs(self) -> tuple[OutputTag, ...]:
        return (self.late_tag,) if self.late_tag is not None else ()


@dataclass(frozen=True)
class ProcessNode:
    parent: KeyByNode
    function: KeyedProcessFunction
    name: str


@dataclass(frozen=True)
class SideOutputNode:
    parent: ProcessNode | WindowNode
    tag: OutputTag


@dataclass(frozen=True)
class UnionNode:
    """Flink's ``union``: the records of every input stream, one schema; each input keeps its
    source's watermark strategy, and the union's watermark is the minimum of theirs."""

    inputs: tuple[Node, ...]

    @property
    def parent(self) -> Node:
        """The first input: what walks up a chain for the records' schema sees (every input
        has the same)."""
        return self.inputs[0]


@dataclass(frozen=True)
class CoInputNode:
    """One input of connected streams (``KeyedStream.connect``) on its way into their union:
    its records in the connected stream's columns (the fields of both inputs, the other's
    null), tagged with the input (:data:`~stateful_runtime.functions.CO_INPUT`: 1 or 2).

    Attributes:
        parent: the input's stream (one source's, before the union).
        input: 1 or 2.
        output_schema: the connected stream's columns (without the tag).
        columns: per output column, this input's field it takes (None: null); the second
            input's key fields fill the first's key columns, which the key is read from.
        broadcast: the inputs are a keyed stream's (1) and a broadcast stream's (2).
    """

    parent: Node
    input: int
    output_schema: StructType
    columns: tuple[tuple[str, str | None], ...]
    broadcast: bool = False

    @property
    def call(self) -> str:
        """The function's method its records go to."""
        if self.broadcast:
            return "process_broadcast_element" if self.input == 2 else "process_element"
        return f"process_element{self.input}"


@dataclass(frozen=True)
class SinkNode:
    parent: Node
    sink: Sink
    name: str


Node = (
    SourceNode
    | FilterNode
    | MapNode
    | UnionNode
    | CoInputNode
    | KeyByNode
    | WindowNode
    | ProcessNode
    | SideOutputNode
)


@dataclass(frozen=True)
class DataStream:
    """A stream of records (Flink's ``DataStream``)."""

    job: StreamJob = field(repr=False)
    node: Node

    def filter(self, condition: str) -> DataStream:
        """Keep records matching a Spark SQL boolean expression, e.g. ``"amount_paise > 0"``."""
        return DataStream(self.job, FilterNode(self.node, condition))

    def map(
        self,
        function: Callable[[dict[str, Any]], Mapping[str, Any]],
        *,
        output: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> DataStream:
        """Flink's ``map``: ``function(record) -> record`` on every record, in Python.

        ``record`` is a ``dict`` of the stream's fields; the returned mapping must hold the
        columns of ``output`` (``{column: type}``; default: the stream's own schema) — a column
        it leaves out is null. The output keeps the input's event time, so windows and the
        watermark after a map behave as without it. The function is stateless (it is pickled
        to Spark's Python workers and may run on any of them); it runs on whole Arrow batches
        of the micro-batch, so its cost is the function's own plus ~1 µs per field.
        """
        return self._map(function, output, name, flat=False)

    def flat_map(
        self,
        function: Callable[[dict[str, Any]], Iterable[Mapping[str, Any]]],
        *,
        output: Mapping[str, Any] | None = None,
        name: str | None = None,
    ) -> DataStream:
        """Flink's ``flatMap``: ``function(record)`` returns (or yields) any number of output
        records, each with ``output``'s columns and its input's event time. See :meth:`map`."""
        return self._map(function, output, name, flat=True)

    def map_async(
        self,
        function: Callable[[dict[str, Any]], Any],
        *,
        output: Mapping[str, Any] | None = None,
        capacity: int = 100,
        timeout: timedelta | float = timedelta(seconds=10),
        retry: RetryPolicy | None = None,
        ordered: bool = True,
        rate_per_s: float | None = None,
        name: str | None = None,
    ) -> DataStream:
        """Flink's Async I/O: ``async def function(record) -> record``, a call to a service per
        record (a model's score over HTTP, a lookup in a database), up to ``capacity`` calls in
        flight per parallel instance on an event loop of its Python worker, over whole Arrow
        batches. A call that raises or runs past ``timeout`` is retried by ``retry``
        (:class:`~stateful_runtime.functions.RetryPolicy`: 3 attempts, backoff from 100 ms);
        one that still fails is dead-lettered with the step, the attempts and the last
        exception, and the batch commits, unless the step's error bounds trip (a service down
        for every call stops the job: ``errors.max_fraction``). ``ordered=False`` emits in
        completion order within the batch; ``rate_per_s`` caps the calls started a second per
        instance. Every call of a batch ends before the batch commits, so nothing is in flight
        across a checkpoint; a batch replayed after a crash calls again (pass an idempotency
        key, e.g. the record's id, to a service that must not see a call twice). Clients (an
        ``aiohttp.ClientSession``, a connection pool) are made once per worker with
        :func:`~stateful_runtime.functions.worker_resource`; the worker's event loop lives as
        long as the worker. Otherwise as :meth:`map`."""
        call = AsyncCall.of(capacity, timeout, retry, ordered, rate_per_s)
        return self._map(function, output, name, flat=False, call=call)

    def flat_map_async(
        self,
        function: Callable[[dict[str, Any]], Any],
        *,
        output: Mapping[str, Any] | None = None,
        capacity: int = 100,
        timeout: timedelta | float = timedelta(seconds=10),
        retry: RetryPolicy | None = None,
        ordered: bool = True,
        rate_per_s: float | None = None,
        name: str | None = None,
    ) -> DataStream:
        """:meth:`map_async` whose function returns any number of output records (a list)."""
        call = AsyncCall.of(capacity, timeout, retry, ordered, rate_per_s)
        return self._map(function, output, name, flat=True, call=call)

    def _map(
        self,
        function: Callable,
        output: Mapping[str, Any] | None,
        name: str | None,
        *,
        flat: bool,
        call: AsyncCall | None = None,
    ) -> DataStream:
        kind = _map_kind(flat, call is not None)
        if not callable(function):
            raise ConfigError(f"{kind} takes a function of one record (a dict), got {function!r}")
        if (call is not None) != _is_async(function):
            raise ConfigError(
                f"{kind} takes "
                + ("an async def function" if call is not None else "a plain (not async) function")
                + f" of one record, got {function!r}"
                + ("" if call is not None else "; use map_async for an async def")
            )
        if isinstance(self.node, ProcessNode | WindowNode | SideOutputNode):
            raise ConfigError(
                f"{kind} applies before a window or process function in this "
                f"version; sink the stream, read it back and {kind} it there"
            )
        schema = record_schema(self.node) if output is None else to_struct(output)
        if not schema.fields:
            raise ConfigError(f"{kind} needs output={{column: type}} with at least one column")
        # Stateless: no state is keyed by the name, it only labels the step in plans and errors.
        label = (
            check_name("operator", name)
            if name is not None
            else getattr(function, "__name__", None) or type(function).__name__
        )
        node = MapNode(self.node, function, schema, flat, label, call)
        return DataStream(self.job, node)

    def union(self, *others: DataStream) -> DataStream:
        """Flink's ``union``: one stream of this stream's records and every other's, in no
        particular order. The streams must have the same schema (field names, types and
        order) and come from different sources of the same job (filters and maps may come
        before the union; windows and process functions after it). Each input keeps its own
        watermark strategy and event-time policy; the union's watermark is the minimum of the
        inputs' watermarks, so a stream that lags holds it back (see docs/api.md on idle
        inputs). Every input's records are accounted apart (per source)."""
        if not others:
            raise ConfigError("union takes at least one other DataStream")
        inputs = [self, *others]
        for other in inputs:
            if not isinstance(other, DataStream):
                raise ConfigError(f"union takes DataStreams, got {type(other).__name__}")
            if other.job is not self.job:
                raise ConfigError("union takes streams of the same StreamJob")
            if isinstance(other.node, ProcessNode | WindowNode | SideOutputNode | KeyByNode):
                raise ConfigError(
                    "union applies to streams before any window or process function in this "
                    "version (filters and maps may come first); sink the stream, read it back "
                    "and union it there"
                )
        flat: list[Node] = []
        for other in inputs:
            flat.extend(other.node.inputs if isinstance(other.node, UnionNode) else [other.node])
        _distinct_sources(flat, "union", "inputs of the union")
        first = record_schema(flat[0])
        for i, node in enumerate(flat[1:], start=2):
            diff = schema_difference(first, record_schema(node))
            if diff:
                raise ConfigError(
                    f"union: input {i} (source {_union_source(node).name!r}) has another "
                    f"schema than input 1 (source {_union_source(flat[0]).name!r}): {diff}; "
                    f"map one of them to the other's fields and types first"
                )
        return DataStream(self.job, UnionNode(tuple(flat)))

    def broadcast(self, *descriptors: MapStateDescriptor) -> BroadcastStream:
        """Flink's ``broadcast``: every element of this stream reaches every parallel instance
        of the keyed operator it is connected to (``keyed.connect(broadcast_stream)``), which
        keeps it in the broadcast states ``descriptors`` declare (map states, by name: the same
        on every instance, in checkpoints and savepoints). Rules and settings that change
        while the job runs, not a firehose: each element is processed once per state
        partition."""
        if not descriptors:
            raise ConfigError("broadcast takes at least one MapStateDescriptor")
        for d in descriptors:
            if not isinstance(d, MapStateDescriptor):
                raise ConfigError(f"broadcast takes MapStateDescriptors, got {d!r}")
            if d.ttl is not None:
                raise ConfigError(f"broadcast state {d.name!r}: a broadcast state has no TTL")
        names = [d.name for d in descriptors]
        if len(set(names)) != len(names):
            raise ConfigError(f"broadcast: state names repeat: {names}")
        if isinstance(self.node, ProcessNode | WindowNode | SideOutputNode | KeyByNode):
            raise ConfigError(
                "broadcast applies to a stream before any window or process function in this "
                "version; sink the stream, read it back and broadcast it there"
            )
        return BroadcastStream(self.job, self.node, tuple(descriptors))

    def join(self, other: DataStream) -> JoinedStreams:
        """Flink's window join: ``.where(*fields).equal_to(*fields).window(assigner)
        .apply(JoinFunction, name=...)`` joins every pair of this stream's and ``other``'s
        records with equal keys in one window (tumbling or sliding, event time). The two are
        connected streams (see :meth:`KeyedStream.connect`)."""
        if not isinstance(other, DataStream):
            raise ConfigError(f"join takes a DataStream, got {type(other).__name__}")
        if other.job is not self.job:
            raise ConfigError("join takes streams of the same StreamJob")
        return JoinedStreams(self.job, self, other)

    def key_by(self, *fields: str) -> KeyedStream:
        """Partition the stream by one or more record fields; state is kept per key."""
        if not fields:
            raise ConfigError("key_by needs at least one field")
        return KeyedStream(self.job, KeyByNode(self.node, tuple(fields)))

    def get_side_output(self, tag: OutputTag) -> DataStream:
        """The records the process function sent to ``ctx.output(tag, ...)``, or a window's
        late records (``side_output_late_data(tag)``)."""
        if isinstance(self.node, ProcessNode):
            declared, who = self.node.function.side_outputs, function_name(self.node.function)
        elif isinstance(self.node, WindowNode):
            declared, who = self.node.side_outputs, f"window {self.node.name!r}"
        else:
            raise ConfigError(
                "get_side_output applies to the stream returned by process() or "
                "by a window's aggregate/process"
            )
        if tag not in declared:
            raise ConfigError(f"{who} does not declare side output {tag.name!r}")
        return DataStream(self.job, SideOutputNode(self.node, tag))

    def sink_to(self, sink: Sink, name: str | None = None) -> DataStream:
        """Write this stream to ``sink``; ``name`` is the stable id of the sink's query."""
        if not isinstance(sink, Sink):
            raise ConfigError(f"sink_to takes a stateful_runtime Sink, got {type(sink).__name__}")
        name = check_name("sink", name or sink.default_name())
        self.job._add_sink(SinkNode(self.node, sink, name))
        return self


@dataclass(frozen=True)
class KeyedStream:
    job: StreamJob = field(repr=False)
    node: KeyByNode

    def process(self, function: KeyedProcessFunction, *, name: str) -> DataStream:
        """Run a keyed process function (state, timers, side outputs) on every element."""
        if not isinstance(function, KeyedProcessFunction):
            raise ConfigError(
                f"process takes a KeyedProcessFunction, got {type(function).__name__}"
            )
        if not function.output_schema:
            raise ConfigError(f"{type(function).__name__} must declare output_schema")
        return DataStream(self.job, ProcessNode(self.node, function, check_name("operator", name)))

    def enrich_async(
        self,
        lookup: Callable[[Any], Any],
        *,
        output: Mapping[str, Any],
        ttl: timedelta = timedelta(hours=1),
        capacity: int = 100,
        timeout: timedelta | float = timedelta(seconds=10),
        retry: RetryPolicy | None = None,
        rate_per_s: float | None = None,
        name: str,
    ) -> DataStream:
        """Each record with the fields ``await lookup(key)`` answers for its key (a dict; the
        fields of ``output``, ``{field: type}``, added to the record's), the answer kept in
        keyed state for ``ttl`` of event time: a key is looked up once per ``ttl``, not per
        record (a customer's tier fetched once an hour; a replay looks up as the live run
        did). A batch's keys without a fresh
        answer are looked up at once before its records, as :meth:`DataStream.map_async`
        calls (``capacity``, ``timeout``, ``retry``, ``rate_per_s``); a key whose lookup keeps
        failing fails each of its records (a dead letter with the reason). The cache is the
        operator's keyed state (``lookup``), checkpointed and savepointed with the job."""
        if not _is_async(lookup):
            raise ConfigError(f"enrich_async takes an async def lookup of the key, got {lookup!r}")
        call = AsyncCall.of(capacity, timeout, retry, True, rate_per_s)
        if not isinstance(ttl, timedelta) or ttl <= timedelta(0):
            raise ConfigError(f"enrich_async(ttl={ttl!r}): give a positive timedelta")
        added = to_struct(output)
        record = record_schema(self.node)
        clash = [f for f in added.fieldNames() if f in record.fieldNames()]
        if not added.fields or clash:
            raise ConfigError(
                f"enrich_async(output=...) names the lookup's fields, none of the record's "
                f"({clash or 'none given'})"
            )
        schema = StructType([*record.fields, *added.fields])
        function = AsyncLookup(lookup, schema, added.fieldNames(), ttl, call)
        return self.process(function, name=name)

    def connect(self, other: KeyedStream | BroadcastStream) -> Any:
        """Flink's ``connect``: this keyed stream and ``other`` as the two inputs of one
        :class:`~stateful_runtime.functions.KeyedCoProcessFunction` (``other`` keyed: finish
        with :meth:`ConnectedStreams.process`) or of one
        :class:`~stateful_runtime.functions.KeyedBroadcastProcessFunction` (``other`` from
        ``DataStream.broadcast``: :meth:`BroadcastConnectedStream.process`). The two may have
        different fields; keyed, their keys must have as many fields, of the same types; each
        input reads a source of its own (filters, maps and unions may come before)."""
        if not isinstance(other, KeyedStream | BroadcastStream):
            raise ConfigError(
                f"connect takes a KeyedStream (a stream after key_by) or a BroadcastStream "
                f"(after broadcast), got {type(other).__name__}"
            )
        if other.job is not self.job:
            raise ConfigError("connect takes streams of the same StreamJob")
        if isinstance(other, BroadcastStream):
            return BroadcastConnectedStream(self.job, self.node, other)
        return ConnectedStreams(self.job, self.node, other.node)

    def interval_join(self, other: KeyedStream) -> IntervalJoin:
        """Flink's interval join of this keyed stream (left) with ``other`` (right), in event
        time: finish with ``.between(lower, upper).process(ProcessJoinFunction, name=...)``.
        The two are connected streams (see :meth:`connect` for what they may be)."""
        return IntervalJoin(self.job, self.node, _keyed(other, self.job, "interval_join"))

    def temporal_join(self, versions: KeyedStream) -> TemporalJoin:
        """An event-time temporal join: each record of this keyed stream with the record of
        ``versions`` (a changelog of upserts, keyed alike) valid at its event time; finish with
        ``.process(TemporalJoinFunction, name=...)``. The two are connected streams (see
        :meth:`connect`)."""
        return TemporalJoin(self.job, self.node, _keyed(versions, self.job, "temporal_join"))

    def window(self, assigner: WindowAssigner) -> WindowedStream:
        if not isinstance(assigner, WindowAssigner):
            raise ConfigError(f"window takes a WindowAssigner, got {type(assigner).__name__}")
        return WindowedStream(self.job, self.node, assigner)


@dataclass(frozen=True)
class ConnectedStreams:
    """Two keyed streams connected (``KeyedStream.connect``): one keyed state and one set of
    timers over the elements of both, finished with :meth:`process`."""

    job: StreamJob = field(repr=False)
    first: KeyByNode
    second: KeyByNode

    def process(self, function: KeyedCoProcessFunction, *, name: str) -> DataStream:
        """Run ``function.process_element1`` on every element of the first stream and
        ``process_element2`` on every element of the second, over the state and timers of the
        element's key. Planned as one query reading both inputs' sources, whose watermark is
        the minimum of theirs (as a union's)."""
        _check_function(function, KeyedCoProcessFunction, "connect(...).process")
        inputs, specs = _connect(self.first, self.second.parent, self.second.keys)
        adapter = CoProcess(function, specs)
        keyed = KeyByNode(UnionNode(inputs), self.first.keys)
        return DataStream(self.job, ProcessNode(keyed, adapter, check_name("operator", name)))


def _keyed(other: object, job: StreamJob, method: str) -> KeyByNode:
    if not isinstance(other, KeyedStream):
        raise ConfigError(
            f"{method} takes a KeyedStream (a stream after key_by), got {type(other).__name__}"
        )
    if other.job is not job:
        raise ConfigError(f"{method} takes streams of the same StreamJob")
    return other.node


@dataclass(frozen=True)
class IntervalJoin:
    """``left.interval_join(right)``: say the interval with :meth:`between`."""

    job: StreamJob = field(repr=False)
    left: KeyByNode
    right: KeyByNode

    def between(self, lower: timedelta, upper: timedelta) -> IntervalJoined:
        """Join each left record ``l`` with each right record ``r`` of its key where
        ``l.ts + lower <= r.ts <= l.ts + upper`` (both bounds included; negative bounds reach
        back in time)."""
        for bound in (lower, upper):
            if not isinstance(bound, timedelta):
                raise ConfigError(f"between takes two timedeltas, got {bound!r}")
        if lower > upper:
            raise ConfigError(
                f"between: the lower bound ({lower}) is after the upper bound ({upper})"
            )
        return IntervalJoined(self.job, self.left, self.right, lower, upper)


@dataclass(frozen=True)
class IntervalJoined:
    """An interval join with its bounds, finished with :meth:`process`."""

    job: StreamJob = field(repr=False)
    left: KeyByNode
    right: KeyByNode
    lower: timedelta
    upper: timedelta
    left_late: OutputTag | None = None
    right_late: OutputTag | None = None

    def side_output_left_late_data(self, tag: OutputTag) -> IntervalJoined:
        """Send left records late on arrival to side output ``tag`` (else dropped, counted)."""
        return replace(self, left_late=_tag(tag))

    def side_output_right_late_data(self, tag: OutputTag) -> IntervalJoined:
        """Send right records late on arrival to side output ``tag`` (else dropped, counted)."""
        return replace(self, right_late=_tag(tag))

    def process(self, function: ProcessJoinFunction, *, name: str) -> DataStream:
        """Call ``function.process_element(left, right, ctx)`` for every matching pair (see
        :mod:`stateful_runtime.joins`); ``name`` names the operator and its state."""
        _check_function(function, ProcessJoinFunction, "interval_join(...).between(...).process")
        join = IntervalJoinOperator(
            function, self.lower, self.upper, self.left_late, self.right_late
        )
        return ConnectedStreams(self.job, self.left, self.right).process(join, name=name)


@dataclass(frozen=True)
class TemporalJoin:
    """``stream.temporal_join(versions)``, finished with :meth:`process`."""

    job: StreamJob = field(repr=False)
    left: KeyByNode
    versions: KeyByNode
    late: OutputTag | None = None

    def side_output_late_data(self, tag: OutputTag) -> TemporalJoin:
        """Send records of the first input late on arrival to side output ``tag`` (else
        dropped, counted). A late version is dropped and counted."""
        return replace(self, late=_tag(tag))

    def process(self, function: TemporalJoinFunction, *, name: str) -> DataStream:
        """Call ``function.process_element(value, version, ctx)`` for every record of the
        first input once the watermark passes it (see :mod:`stateful_runtime.joins`)."""
        _check_function(function, TemporalJoinFunction, "temporal_join(...).process")
        join = TemporalJoinOperator(function, self.late)
        return ConnectedStreams(self.job, self.left, self.versions).process(join, name=name)


@dataclass(frozen=True)
class JoinedStreams:
    """``first.join(second)``: say the keys with ``where(...).equal_to(...)``, then the
    window and the function."""

    job: StreamJob = field(repr=False)
    first: DataStream
    second: DataStream
    first_keys: tuple[str, ...] = ()
    second_keys: tuple[str, ...] = ()
    assigner: WindowAssigner | None = None

    def where(self, *fields: str) -> JoinedStreams:
        """The first stream's key field(s)."""
        if not fields:
            raise ConfigError("where needs at least one field")
        return replace(self, first_keys=fields)

    def equal_to(self, *fields: str) -> JoinedStreams:
        """The second stream's key field(s), as many as ``where``'s, of the same types."""
        if not self.first_keys:
            raise ConfigError("join(...).where(...) comes before equal_to(...)")
        if not fields:
            raise ConfigError("equal_to needs at least one field")
        return replace(self, second_keys=fields)

    def window(self, assigner: WindowAssigner) -> JoinedStreams:
        """Tumbling or sliding event-time windows (a session window join is not supported)."""
        if not self.second_keys:
            raise ConfigError("join(...).where(...).equal_to(...) comes before window(...)")
        if not isinstance(assigner, TumblingEventTimeWindows | SlidingEventTimeWindows):
            raise ConfigError(
                f"a window join takes TumblingEventTimeWindows or SlidingEventTimeWindows, got "
                f"{type(assigner).__name__}; for records near each other in time use "
                f"interval_join"
            )
        return replace(self, assigner=assigner)

    def apply(self, function: JoinFunction, *, name: str) -> DataStream:
        """Call ``function.join(first, second)`` for every pair of one key in one window when
        the watermark passes the window's end."""
        if self.assigner is None:
            raise ConfigError("join(...).where(...).equal_to(...).window(...) comes first")
        _check_function(function, JoinFunction, "join(...).window(...).apply")
        assert isinstance(self.assigner, TumblingEventTimeWindows | SlidingEventTimeWindows)
        join = WindowJoinOperator(function, self.assigner)
        first = self.first.key_by(*self.first_keys).node
        second = self.second.key_by(*self.second_keys).node
        return ConnectedStreams(self.job, first, second).process(join, name=name)


def _tag(tag: object) -> OutputTag:
    if not isinstance(tag, OutputTag):
        raise ConfigError(f"a late side output takes an OutputTag, got {tag!r}")
    return tag


@dataclass(frozen=True)
class BroadcastStream:
    """A stream whose every element reaches every parallel instance of the operator it is
    connected to (``DataStream.broadcast``), with the broadcast states it declares."""

    job: StreamJob = field(repr=False)
    node: Node
    descriptors: tuple[MapStateDescriptor, ...]


@dataclass(frozen=True)
class BroadcastConnectedStream:
    """A keyed stream connected with a broadcast stream, finished with :meth:`process`."""

    job: StreamJob = field(repr=False)
    keyed: KeyByNode
    broadcast: BroadcastStream

    def process(self, function: KeyedBroadcastProcessFunction, *, name: str) -> DataStream:
        """Run ``function.process_broadcast_element`` for every broadcast element on every
        parallel instance and ``process_element`` for every keyed element (see
        :class:`~stateful_runtime.functions.KeyedBroadcastProcessFunction`)."""
        _check_function(function, KeyedBroadcastProcessFunction, "connect(broadcast).process")
        inputs, specs = _connect(self.keyed, self.broadcast.node, None)
        adapter = BroadcastProcess(function, specs, self.broadcast.descriptors)
        keyed = KeyByNode(UnionNode(inputs), self.keyed.keys)
        return DataStream(self.job, ProcessNode(keyed, adapter, check_name("operator", name)))


def _check_function(function: object, kind: type, method: str) -> None:
    if not isinstance(function, kind):
        raise ConfigError(f"{method} takes a {kind.__name__}, got {type(function).__name__}")
    if not function.output_schema:  # type: ignore[attr-defined]
        raise ConfigError(f"{type(function).__name__} must declare output_schema")


def _connect(
    first: KeyByNode, second: Node, keys2: tuple[str, ...] | None
) -> tuple[tuple[Node, ...], tuple[CoInput, CoInput]]:
    """The inputs of connected streams: the first keyed stream's and the second's (keyed by
    ``keys2``, or None for a broadcast stream), each input in the columns of both and tagged
    (:class:`CoInputNode`), and what the function's adapter needs to know of each."""
    flats: list[list[Node]] = []
    for node in (first.parent, second):
        flat = list(node.inputs) if isinstance(node, UnionNode) else [node]
        if any(isinstance(n, ProcessNode | WindowNode | SideOutputNode | KeyByNode) for n in flat):
            raise ConfigError(
                "connect applies to streams before any window or process function in this "
                "version (filters, maps and unions may come first); sink the stream, read "
                "it back and connect it there"
            )
        flats.append(flat)
    _distinct_sources([*flats[0], *flats[1]], "connect", "inputs of the connected streams")
    schemas = [record_schema(first), record_schema(second)]
    keys1 = first.keys
    types = [{f.name: f.dataType for f in schema.fields} for schema in schemas]
    for keys, t in ((keys1, types[0]), (keys2 or (), types[1])):
        missing = [k for k in keys if k not in t]
        if missing:
            raise ConfigError(f"connect: key_by field(s) {missing} are not in its stream")
    if keys2 is not None and (
        len(keys1) != len(keys2)
        or any(types[0][a] != types[1][b] for a, b in zip(keys1, keys2, strict=False))
    ):
        raise ConfigError(
            f"connect: the two streams' keys must have as many fields, of the same types: "
            f"{_typed(keys1, types[0])} vs {_typed(keys2, types[1])}"
        )
    clash = [
        f"{n} is {t.simpleString()} vs {types[1][n].simpleString()}"
        for n, t in types[0].items()
        if n in types[1] and types[1][n] != t
    ]
    if clash:
        raise ConfigError(
            f"connect: a field of both streams has two types ({', '.join(clash)}); the "
            f"connected stream carries one column per name: map one stream to rename it"
        )
    to_first = dict(zip(keys1, keys2, strict=True)) if keys2 is not None else {}
    taken = [a for a, b in to_first.items() if a != b and a in types[1]]
    if taken:
        raise ConfigError(
            f"connect: the second stream has field(s) {taken}, which are key fields of "
            f"the first stream but not its own key; map the second stream to rename them"
        )
    fields = StructType(
        [*schemas[0].fields, *[f for f in schemas[1].fields if f.name not in types[0]]]
    )
    if CO_INPUT in fields.fieldNames():
        raise ConfigError(f"connect: field {CO_INPUT!r} is reserved by the runtime; rename it")
    inputs: list[Node] = []
    specs = []
    for i, (flat, schema) in enumerate(zip(flats, schemas, strict=True), start=1):
        own = schema.fieldNames()
        columns = tuple(
            (c, to_first[c] if i == 2 and c in to_first else c if c in own else None)
            for c in fields.fieldNames()
        )
        inputs += [CoInputNode(n, i, fields, columns, keys2 is None) for n in flat]
        integers = frozenset(
            f.name
            for f in schema.fields
            if f.dataType.typeName() in ("byte", "short", "integer", "long")
        )
        source = "+".join(_union_source(n).name for n in flat)
        specs.append(CoInput(source, tuple(own), integers))
    return tuple(inputs), (specs[0], specs[1])


def _typed(keys: tuple[str, ...], types: Mapping[str, Any]) -> str:
    return "(" + ", ".join(f"{k} {types[k].simpleString()}" for k in keys) + ")"


@dataclass(frozen=True)
class WindowedStream:
    """A keyed stream cut into windows; finish with ``aggregate``, ``count``, ``reduce`` or
    ``process``. The planner picks how the window runs (``explain`` says which and why).
    """

    job: StreamJob = field(repr=False)
    keyed: KeyByNode
    assigner: WindowAssigner
    lateness: timedelta = timedelta(0)
    late_tag: OutputTag | None = None
    trigger_: Trigger | None = None

    def allowed_lateness(self, lateness: timedelta) -> WindowedStream:
        """Keep windows this long after they fire; late elements update (re-fire) the result."""
        if not isinstance(lateness, timedelta) or lateness < timedelta(0):
            raise ConfigError(f"allowed_lateness takes a timedelta >= 0, got {lateness!r}")
        return replace(self, lateness=lateness)

    def side_output_late_data(self, tag: OutputTag) -> WindowedStream:
        """Send elements later than the allowed lateness to side output ``tag`` (else counted)."""
        return replace(self, late_tag=tag)

    def trigger(self, trigger: Trigger) -> WindowedStream:
        if isinstance(trigger, CountTrigger) != isinstance(self.assigner, GlobalWindows):
            raise ConfigError(
                "CountTrigger is the trigger of GlobalWindows (and GlobalWindows "
                "needs a CountTrigger); use EarlyFiring for time windows"
            )
        return replace(self, trigger_=trigger)

    def aggregate(
        self,
        aggregates: Mapping[str, Aggregate] | AggregateFunction,
        *,
        name: str,
        output: Mapping[str, Any] | None = None,
    ) -> DataStream:
        """One output row per key and window: the key fields, ``window_start``, ``window_end``
        and one column per entry of ``aggregates`` (output name → built-in aggregate).

        Or pass an :class:`AggregateFunction` whose ``get_result`` returns a dict of the columns
        declared in ``output`` (``{column: type}``); it runs on the runtime's window operator.
        """
        if isinstance(aggregates, AggregateFunction):
            if not output:
                raise ConfigError("aggregate(AggregateFunction) needs output={column: type}")
            schema = window_output_schema(self.keyed, {})
            for f in to_struct(output).fields:
                schema = schema.add(f.name, f.dataType)
            return self._window(aggregates, schema, name)
        if not aggregates:
            raise ConfigError("aggregate needs at least one output column")
        for out, agg in aggregates.items():
            if not isinstance(agg, Aggregate):
                raise ConfigError(f"aggregate {out!r}: expected an Aggregate, got {agg!r}")
        clash = set(aggregates) & {*self.keyed.keys, "window_start", "window_end"}
        if clash:
            raise ConfigError(f"aggregate output names clash with key/window columns: {clash}")
        if isinstance(self.assigner, GlobalWindows) and self.trigger_ is None:
            raise ConfigError(
                "GlobalWindows never fire by themselves: add .trigger(CountTrigger.of(n))"
            )
        return self._window(dict(aggregates), window_output_schema(self.keyed, aggregates), name)

    def process(self, function: ProcessWindowFunction, *, name: str) -> DataStream:
        """Call ``function.process(key, window, elements)`` whenever a window fires."""
        if not isinstance(function, ProcessWindowFunction):
            raise ConfigError(f"process takes a ProcessWindowFunction, got {function!r}")
        if not function.output_schema:
            raise ConfigError(f"{type(function).__name__} must declare output_schema")
        if isinstance(self.assigner, GlobalWindows) and self.trigger_ is None:
            raise ConfigError(
                "GlobalWindows never fire by themselves: add .trigger(CountTrigger.of(n))"
            )
        return self._window(function, to_struct(function.output_schema), name)

    def _window(self, contents: Any, schema: StructType, name: str) -> DataStream:
        node = WindowNode(
            self.keyed,
            self.assigner,
            contents,
            schema,
            check_name("operator", name),
            self.lateness,
            self.late_tag,
            self.trigger_,
        )
        return DataStream(self.job, node)

    def count(self, *, name: str, column: str = "count") -> DataStream:
        return self.aggregate({column: Count()}, name=name)

    def reduce(
        self, function: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]], *, name: str
    ) -> DataStream:
        """Flink's reduce: fold a window's records pairwise with ``function(a, b)`` (both
        records of the source schema; return one). One output row per key and window: the key
        fields, ``window_start``, ``window_end`` and the reduced record's other fields. Runs on
        the runtime's window operator (a Python function)."""
        if not callable(function):
            raise ConfigError(f"reduce takes a function (a, b) -> record, got {function!r}")
        fields = {
            f.name: f.dataType
            for f in record_schema(self.keyed).fields
            if f.name not in self.keyed.keys
        }
        return self.aggregate(_Reduce(function, tuple(fields)), name=name, output=fields)


class _Reduce(AggregateFunction):
    """A reduce function as an AggregateFunction: the accumulator is the reduced record."""

    kind = "reduce function"

    def __init__(self, function: Callable[[dict, dict], dict], fields: tuple[str, ...]) -> None:
        self.function = function
        self.fields = fields

    def create_accumulator(self) -> dict | None:
        return None

    def add(self, value: dict, accumulator: dict | None) -> dict:
        return dict(value) if accumulator is None else self.function(accumulator, value)

    def merge(self, a: dict | None, b: dict | None) -> dict | None:
        return b if a is None else a if b is None else self.function(a, b)

    def get_result(self, accumulator: dict) -> dict:
        return {f: accumulator.get(f) for f in self.fields}


def _distinct_sources(flat: list[Node], what: str, inputs: str) -> None:
    """Each of ``flat`` (a union's or connected streams' inputs) reads a source of its own."""
    seen: dict[str, int] = {}
    for i, node in enumerate(flat):
        name = _union_source(node).name
        if name in seen:
            which = (
                f"a stream cannot be {what}ed with itself"
                if flat[seen[name]] is node
                else f"two {inputs} read source {name!r}"
            )
            raise ConfigError(
                f"{what}: {which} (inputs {seen[name] + 1} and {i + 1}); each input must come "
                f"from a source of its own — to read a source twice, filter it once "
                f"with an OR of both conditions instead"
            )
        seen[name] = i


def _union_source(node: Node) -> SourceNode:
    while not isinstance(node, SourceNode):
        node = node.parent  # type: ignore[union-attr]
    return node


def schema_difference(a: StructType, b: StructType) -> str:
    """How ``b`` differs from ``a`` (field names, types, order), said for people ("" if not)."""
    ta = {f.name: f.dataType.simpleString() for f in a.fields}
    tb = {f.name: f.dataType.simpleString() for f in b.fields}
    parts = []
    only_a = [f"{n} {t}" for n, t in ta.items() if n not in tb]
    only_b = [f"{n} {t}" for n, t in tb.items() if n not in ta]
    if only_a:
        parts.append(f"only input 1 has {', '.join(only_a)}")
    if only_b:
        parts.append(f"only the other has {', '.join(only_b)}")
    types = [f"{n} is {ta[n]} vs {tb[n]}" for n in ta if n in tb and ta[n] != tb[n]]
    if types:
        parts.append("types differ: " + ", ".join(types))
    if not parts and list(ta) != list(tb):
        parts.append(f"field order differs: {list(ta)} vs {list(tb)}")
    return "; ".join(parts)


def record_schema(node: Node) -> StructType:
    """The fields of the records at ``node`` before a window or process function: the
    source's, or the last map's output."""
    while not isinstance(node, SourceNode | MapNode | CoInputNode):
        node = node.parent  # type: ignore[union-attr]
    return node.source.schema if isinstance(node, SourceNode) else node.output_schema


def window_output_schema(keyed: KeyByNode, aggregates: Mapping[str, Aggregate]) -> StructType:
    """Key fields, window bounds (UTC, no zone: like the native path) and the aggregates."""
    schema = record_schema(keyed)
    types = {f.name: f.dataType for f in schema.fields}
    missing = [k for k in keyed.keys if k not in types]
    if missing:
        raise ConfigError(f"key_by field(s) {missing} are not in the source schema")
    fields = [StructField(k, types[k]) for k in keyed.keys]
    fields += [
        StructField("window_start", TimestampNTZType()),
        StructField("window_end", TimestampNTZType()),
    ]
    for out, agg in aggregates.items():
        if agg.field is not None and agg.field not in types:
            raise ConfigError(f"aggregate {out!r}: field {agg.field!r} is not in the source")
        fields.append(StructField(out, agg.output_type(types.get(agg.field or ""))))
    return StructType(fields)
