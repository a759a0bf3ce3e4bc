"""User functions over keyed streams: Flink's KeyedProcessFunction and its contexts.

Contract of :class:`KeyedProcessFunction` (the same on Spark and in the test harness):

* ``open(ctx)`` is called once per task before any element: register state there with
  ``ctx.get_state(ValueStateDescriptor(...))`` (and list/map/reducing/aggregating).
* ``process_element(value, ctx)`` is called for every element, ``value`` being a ``dict`` of the
  record's fields. Yield output records (dicts matching ``output_schema``); send records to a
  side output with ``ctx.output(tag, record)``.
* ``on_timer(timestamp, ctx)`` is called once for each timer when it fires: event-time timers
  when the watermark reaches them, processing-time timers when the wall clock does.
* State and timers belong to the current key and are checkpointed with the source offsets, so
  after a restart a function sees exactly the state of the last committed micro-batch, the
  uncommitted batch is replayed, and every timer fires exactly once.

Elements of one key in one micro-batch are processed in arrival order. Timers due by a batch's
watermark fire before that key's elements of the batch (Flink's order: an element sees the
effects of every timer due before it); the timers of keys without elements in the batch fire
after the batch's elements, with the same watermark.

The function object is pickled to Spark's Python workers: keep heavy clients out of
``__init__`` (open them in ``open``).

The contexts here are interfaces: the engine (:mod:`stateful_runtime.operators.keyed`)
implements them, on Spark and in the test harness alike.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from pyspark.sql.types import StructType

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.state import (
    AggregatingState,
    AggregatingStateDescriptor,
    BroadcastState,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReadOnlyBroadcastState,
    ReducingState,
    ReducingStateDescriptor,
    StateDescriptor,
    TimeDomain,
    ValueState,
    ValueStateDescriptor,
    cell_of,
)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_datetime(ms: int) -> datetime:
    return EPOCH + _MS * ms


def to_ms(when: datetime | int) -> int:
    """Milliseconds since the epoch of an aware datetime (ints pass through)."""
    if isinstance(when, int):
        return when
    if not isinstance(when, datetime) or when.tzinfo is None:
        raise ConfigError(f"expected a timezone-aware datetime, got {when!r}")
    return (when - EPOCH) // _MS


@dataclass(frozen=True)
class OutputTag:
    """Names a side output and declares its record schema (``{field: type}`` or StructType)."""

    name: str
    schema: Mapping[str, Any] | StructType

    def __post_init__(self) -> None:
        if not self.name or not self.name.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"output tag name must be letters, digits, '-' or '_': {self.name!r}")

    def __hash__(self) -> int:
        return hash(self.name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OutputTag) and other.name == self.name


class TimerService(ABC):
    """Register and delete timers for the current key (implemented by the engine)."""

    @abstractmethod
    def current_watermark(self) -> datetime:
        """The event-time watermark of the current micro-batch."""

    @abstractmethod
    def current_processing_time(self) -> datetime:
        """The wall-clock time the current micro-batch started."""

    @abstractmethod
    def register_event_time_timer(self, when: datetime) -> None:
        """Call ``on_timer`` for the current key once the watermark passes ``when``."""

    @abstractmethod
    def delete_event_time_timer(self, when: datetime) -> None:
        """Forget an event-time timer of the current key (no-op if there is none)."""

    @abstractmethod
    def register_processing_time_timer(self, when: datetime) -> None:
        """Call ``on_timer`` for the current key once the wall clock passes ``when``."""

    @abstractmethod
    def delete_processing_time_timer(self, when: datetime) -> None:
        """Forget a processing-time timer of the current key (no-op if there is none)."""


class RuntimeContext(ABC):
    """Given to ``open()``: declares state (implemented by the engine)."""

    @abstractmethod
    def get_state(self, descriptor: ValueStateDescriptor) -> ValueState:
        """A single value per key."""

    @abstractmethod
    def get_list_state(self, descriptor: ListStateDescriptor) -> ListState:
        """A list per key."""

    @abstractmethod
    def get_map_state(self, descriptor: MapStateDescriptor) -> MapState:
        """A map per key."""

    @abstractmethod
    def get_reducing_state(self, descriptor: ReducingStateDescriptor) -> ReducingState:
        """A value per key folded with the descriptor's reduce function."""

    @abstractmethod
    def get_aggregating_state(self, descriptor: AggregatingStateDescriptor) -> AggregatingState:
        """An accumulator per key driven by the descriptor's AggregateFunction."""


class Context(ABC):
    """Given to ``process_element`` and ``on_timer`` (implemented by the engine)."""

    @abstractmethod
    def timestamp(self) -> datetime:
        """Event time of the element (in ``on_timer``: the timer's time)."""

    @abstractmethod
    def get_current_key(self) -> Any:
        """The key: a scalar for one key field, a tuple for several."""

    @abstractmethod
    def timer_service(self) -> TimerService:
        """Timers of the current key."""

    @abstractmethod
    def current_watermark(self) -> datetime:
        """The event-time watermark of the current micro-batch."""

    @abstractmethod
    def output(self, tag: OutputTag, record: Mapping[str, Any]) -> None:
        """Send ``record`` to side output ``tag``."""

    @abstractmethod
    def time_domain(self) -> TimeDomain:
        """In ``on_timer``: the domain of the firing timer."""


class KeyedProcessFunction:
    """Flink's KeyedProcessFunction; see the module docstring for the contract.

    Class attributes:
        output_schema: schema of the records ``process_element``/``on_timer`` yield
            (``{field: python type}`` or a StructType).
        side_outputs: the :class:`OutputTag` s this function may write to.
        time_domain: ``TimeDomain.EVENT_TIME`` (default: event-time timers, event-time TTL) or
            ``TimeDomain.PROCESSING_TIME`` (processing-time timers, Spark's TTL). Spark runs a
            stateful operator in one time mode, so a function picks one.
    """

    output_schema: ClassVar[Mapping[str, Any] | StructType] = {}
    side_outputs: ClassVar[tuple[OutputTag, ...]] = ()
    time_domain: ClassVar[TimeDomain] = TimeDomain.EVENT_TIME

    def open(self, ctx: RuntimeContext) -> None:
        """Declare state; called once per task before any element."""

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def on_timer(self, timestamp: datetime, ctx: Context) -> Iterator[dict[str, Any]]:
        return iter(())

    def close(self) -> None:
        """Called when the task ends."""


class KeyedCoProcessFunction:
    """Flink's KeyedCoProcessFunction: the elements of two connected keyed streams
    (``KeyedStream.connect(other).process(...)``) over one keyed state and one set of timers.

    ``process_element1(value, ctx)`` is called for each element of the first stream,
    ``process_element2(value, ctx)`` for each of the second, ``value`` being a ``dict`` of that
    stream's fields; both see the state and timers of the element's key (the same key of both
    streams shares them), and ``on_timer`` fires as a KeyedProcessFunction's. Everything else
    (``open``, ``close``, ``output_schema``, ``side_outputs``, ``time_domain``, the contexts,
    exactly once, isolation of an element a call raises on) is a KeyedProcessFunction's; see
    the module docstring.
    """

    output_schema: ClassVar[Mapping[str, Any] | StructType] = {}
    side_outputs: ClassVar[tuple[OutputTag, ...]] = ()
    time_domain: ClassVar[TimeDomain] = TimeDomain.EVENT_TIME

    def open(self, ctx: RuntimeContext) -> None:
        """Declare state; called once per task before any element."""

    def process_element1(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def process_element2(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def on_timer(self, timestamp: datetime, ctx: Context) -> Iterator[dict[str, Any]]:
        return iter(())

    def close(self) -> None:
        """Called when the task ends."""


# The column of a connected stream's records saying which input each came from (1 or 2). No
# leading underscore: Spark's pandas state API renames such columns.
CO_INPUT = "srt_co_input"
# The column of a union's records (a query of several sources) saying which source each came
# from (its place in the offset log), carried into the stateful operator so that each source's
# late records are counted apart.
UNION_INPUT = "srt_union_input"


@dataclass(frozen=True)
class CoInput:
    """One input of a connected stream as its co-process function sees it.

    Attributes:
        source: the name of the input's source (or sources, joined by ``+``), for messages
            ("" in the test harness).
        fields: the input's own fields (what ``process_element1``/``2`` get; None: every
            field of the record, as the test harness gives it).
        integers: those of its fields that hold integers (a connected stream's columns of
            the other input are null in this input's rows).
    """

    source: str
    fields: tuple[str, ...] | None
    integers: frozenset[str] = frozenset()


class CoProcess(KeyedProcessFunction):
    """A :class:`KeyedCoProcessFunction` as the keyed process function the engine runs: the
    two streams arrive as one, each record tagged with its input (:data:`CO_INPUT`) and
    carrying the columns of both; this hands each element to ``process_element1`` or ``2``
    with its own input's fields."""

    def __init__(
        self,
        fn: KeyedCoProcessFunction | KeyedBroadcastProcessFunction,
        inputs: tuple[CoInput, CoInput],
    ) -> None:
        self.connected: Any = fn
        self.inputs = inputs
        # The user's declarations, as the engine and the planner read them off the function.
        self.output_schema = fn.output_schema  # type: ignore[misc]
        self.side_outputs = fn.side_outputs  # type: ignore[misc]
        self.time_domain = fn.time_domain  # type: ignore[misc]
        # A runtime join that writes back what it reads (the engine may share its reads).
        self.writes_back_reads = getattr(fn, "writes_back_reads", False)
        self.current = 1

    @property
    def element_call(self) -> str:
        """The call of the element in progress, as a dead letter's reason names it."""
        source = self.inputs[self.current - 1].source
        at = f": {source}" if source else ""
        join = getattr(self.connected, "join_function", None)
        if join is not None:  # a join's: its function, and the side the element came on
            role = self.connected.calls[self.current - 1]
            return f"{type(join).__name__} on a {role} record (input {self.current}{at})"
        return f"process_element{self.current} (input {self.current}{at})"

    def open(self, ctx: RuntimeContext) -> None:
        self.connected.open(ctx)

    def _own_record(self, value: dict[str, Any]) -> int:
        """Make ``value`` its input's own record, in place (a dead letter holds what the
        call got); returns the input (1 or 2)."""
        side = int(value.pop(CO_INPUT))
        self.current = side
        spec = self.inputs[side - 1]
        if spec.fields is not None:
            for name in [n for n in value if n not in spec.fields]:
                del value[name]
        for name in spec.integers:
            v = value.get(name)
            if isinstance(v, float):
                value[name] = int(v)
        return side

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        side = self._own_record(value)
        fn = self.connected
        return (fn.process_element1 if side == 1 else fn.process_element2)(value, ctx)

    def on_timer(self, timestamp: datetime, ctx: Context) -> Iterator[dict[str, Any]]:
        return self.connected.on_timer(timestamp, ctx)

    def close(self) -> None:
        self.connected.close()


class ReadOnlyContext(Context):
    """Given to a KeyedBroadcastProcessFunction's ``process_element`` and ``on_timer``: a
    keyed context (the element's key, its state and timers) and the broadcast state,
    read-only."""

    @abstractmethod
    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        """The broadcast state ``descriptor`` names (one given to ``broadcast``)."""


class BroadcastContext(ABC):
    """Given to ``process_broadcast_element``: no key; the broadcast state, writable."""

    @abstractmethod
    def timestamp(self) -> datetime:
        """Event time of the broadcast element."""

    @abstractmethod
    def current_watermark(self) -> datetime:
        """The event-time watermark of the current micro-batch."""

    @abstractmethod
    def current_processing_time(self) -> datetime:
        """The wall-clock time the current micro-batch started."""

    @abstractmethod
    def output(self, tag: OutputTag, record: Mapping[str, Any]) -> None:
        """Send ``record`` to side output ``tag``."""

    @abstractmethod
    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        """The broadcast state ``descriptor`` names, to read and write."""

    @abstractmethod
    def apply_to_keyed_state(
        self, descriptor: StateDescriptor, function: Callable[[Any, Any], None]
    ) -> None:
        """Call ``function(key, state)`` for every key of this parallel instance that holds
        state ``descriptor`` (its handle, as ``open`` got it), once the broadcast element's
        call has returned; each key's call is atomic, as an element's."""


class KeyedBroadcastProcessFunction:
    """Flink's KeyedBroadcastProcessFunction: a keyed stream connected with a broadcast stream
    (``keyed.connect(stream.broadcast(descriptor, ...)).process(...)``).

    * ``process_broadcast_element(value, ctx)`` is called on every parallel instance for every
      element of the broadcast stream (a rule, a setting), with the broadcast state writable
      (``ctx.get_broadcast_state(descriptor)``): every instance makes the same change, so
      the update must depend on the element and the broadcast state only.
    * ``process_element(value, ctx)`` is called for each element of the keyed stream, with
      its key's state and timers and the broadcast state read-only.
    * ``on_timer`` fires as a KeyedProcessFunction's (``ctx`` as ``process_element``'s).

    A micro-batch's broadcast elements are processed before its keyed elements (in event-time
    order), so a rule applies to the keyed elements of the batch it came in and after.
    Everything else is a KeyedProcessFunction's (see the module docstring).
    """

    output_schema: ClassVar[Mapping[str, Any] | StructType] = {}
    side_outputs: ClassVar[tuple[OutputTag, ...]] = ()
    time_domain: ClassVar[TimeDomain] = TimeDomain.EVENT_TIME

    def open(self, ctx: RuntimeContext) -> None:
        """Declare keyed state; called once per task before any element."""

    def process_element(
        self, value: dict[str, Any], ctx: ReadOnlyContext
    ) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def process_broadcast_element(
        self, value: dict[str, Any], ctx: BroadcastContext
    ) -> Iterator[dict[str, Any]]:
        raise NotImplementedError

    def on_timer(self, timestamp: datetime, ctx: ReadOnlyContext) -> Iterator[dict[str, Any]]:
        return iter(())

    def close(self) -> None:
        """Called when the task ends."""


# The key a broadcast element is processed under: a tuple no keyed stream's key equals.
BROADCAST_KEY = ("\x00srt-broadcast",)


class _ReadOnly(ReadOnlyContext):
    """The engine's context with the broadcast state, read-only."""

    def __init__(self, ctx: Context, owner: BroadcastProcess) -> None:
        self._ctx, self._owner = ctx, owner

    def timestamp(self) -> datetime:
        return self._ctx.timestamp()

    def get_current_key(self) -> Any:
        return self._ctx.get_current_key()

    def timer_service(self) -> TimerService:
        return self._ctx.timer_service()

    def current_watermark(self) -> datetime:
        return self._ctx.current_watermark()

    def output(self, tag: OutputTag, record: Mapping[str, Any]) -> None:
        self._ctx.output(tag, record)

    def time_domain(self) -> TimeDomain:
        return self._ctx.time_domain()

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> ReadOnlyBroadcastState:
        return ReadOnlyBroadcastState(self._owner.entries(descriptor, self._owner.broadcast))


class _Broadcasting(BroadcastContext):
    """The context of one broadcast element: writes go to ``work`` (copies), kept when the
    call returns."""

    def __init__(self, ctx: Context, owner: BroadcastProcess, work: dict[str, dict]) -> None:
        self._ctx, self._owner, self.work = ctx, owner, work

    def timestamp(self) -> datetime:
        return self._ctx.timestamp()

    def current_watermark(self) -> datetime:
        return self._ctx.current_watermark()

    def current_processing_time(self) -> datetime:
        return self._ctx.timer_service().current_processing_time()

    def output(self, tag: OutputTag, record: Mapping[str, Any]) -> None:
        self._ctx.output(tag, record)

    def get_broadcast_state(self, descriptor: MapStateDescriptor) -> BroadcastState:
        return BroadcastState(self._owner.entries(descriptor, self.work))

    def apply_to_keyed_state(
        self, descriptor: StateDescriptor, function: Callable[[Any, Any], None]
    ) -> None:
        apply = getattr(self._ctx, "apply_to_keyed_state", None)
        if apply is None:
            raise ConfigError("apply_to_keyed_state needs the runtime's operator engine")
        apply(descriptor, function)


class BroadcastProcess(CoProcess):
    """A :class:`KeyedBroadcastProcessFunction` as the keyed process function the engine
    runs: the keyed stream's records tagged 1, the broadcast stream's tagged 2 (processed
    under :data:`BROADCAST_KEY`); the broadcast state is :attr:`broadcast` (state name →
    dict), the same on every instance. The runtime loads it before a task's elements and
    stores the states named in :attr:`changed` with the task's commit."""

    def __init__(
        self,
        fn: KeyedBroadcastProcessFunction,
        inputs: tuple[CoInput, CoInput],
        descriptors: tuple[MapStateDescriptor, ...],
    ) -> None:
        super().__init__(fn, inputs)
        self.descriptors = {d.name: d for d in descriptors}
        self.broadcast: dict[str, dict] = {d.name: {} for d in descriptors}
        self.changed: set[str] = set()
        self.applying: str | None = None

    @property
    def element_call(self) -> str:
        if self.applying is not None:
            return f"apply_to_keyed_state of state {self.applying!r}"
        source = self.inputs[self.current - 1].source
        at = f": {source}" if source else ""
        call = "process_element" if self.current == 1 else "process_broadcast_element"
        return f"{call} (input {self.current}{at})"

    def entries(self, descriptor: MapStateDescriptor, states: dict[str, dict]) -> dict:
        known = self.descriptors.get(getattr(descriptor, "name", None))  # type: ignore[arg-type]
        if known is None or known != descriptor:
            raise ConfigError(
                f"{function_name(self)} asked for broadcast state {descriptor!r}; the broadcast "
                f"stream declares {list(self.descriptors.values())} (pass it to broadcast())"
            )
        return states[known.name]

    def process_element(self, value: dict[str, Any], ctx: Context) -> Iterator[dict[str, Any]]:
        fn = self.connected
        if self._own_record(value) == 1:
            return fn.process_element(value, _ReadOnly(ctx, self))
        # A broadcast element: its writes go to copies, kept only when the call returns.
        work = {name: dict(entries) for name, entries in self.broadcast.items()}
        out = list(fn.process_broadcast_element(value, _Broadcasting(ctx, self, work)) or ())
        for name, entries in work.items():
            if entries != self.broadcast[name]:
                self.broadcast[name] = entries
                self.changed.add(name)
        return iter(out)

    def on_timer(self, timestamp: datetime, ctx: Context) -> Iterator[dict[str, Any]]:
        return self.connected.on_timer(timestamp, _ReadOnly(ctx, self))


def function_name(fn: object) -> str:
    """The user's function's class name (a co-process function's, not its adapter's; a
    join's function, not the join's)."""
    inner = fn.connected if isinstance(fn, CoProcess) else fn
    return type(getattr(inner, "join_function", inner)).__name__


def defines_on_timer(fn: object) -> bool:
    """Whether a timer of ``fn`` can emit or change anything: the user's class (a co-process
    function's, not its adapter's) defines ``on_timer``. A function that inherits the API's
    empty one has only the runtime's timers (event-time TTL's cleanup, whose reads check
    expiry), which may wait for the next batch."""
    inner: Any = fn.connected if isinstance(fn, CoProcess) else fn
    for api in (KeyedProcessFunction, KeyedCoProcessFunction, KeyedBroadcastProcessFunction):
        if isinstance(inner, api):
            return type(inner).on_timer is not api.on_timer
    return True


# Side-output tag of the marker row a dropped late record leaves (counted as late by the job's
# accounting, never written).
LATE_MARK = "_srt_late"


def reject_record(ctx: Context, record: dict[str, Any], exc: Exception, call: str) -> None:
    """A record a runtime operator's user call raised on, isolated alone (dead-lettered, or
    the job stopped by its error policy). ``ctx`` is the engine's context."""
    ctx.operator.reject_record(record, exc, call)  # type: ignore[attr-defined]


def live_entries(ctx: Context, state: MapState) -> dict[Any, Any] | None:
    """A runtime operator's map state of the current key as the store's own dict, when the
    engine runs its calls with reads shared (``KeyedOperator.share_reads``): changed in place
    and handed back with ``cell_of(state).replace_entries``, one store call per element. None
    otherwise: use the state's own methods."""
    if not ctx.operator.shared_reads:  # type: ignore[attr-defined]
        return None
    return cell_of(state).live_entries()


def drop_late(ctx: Context, tag: OutputTag | None, record: Mapping[str, Any]) -> None:
    """A late record of a runtime operator (a window's, a join's): to its late side output
    ``tag``, or dropped and counted (a mark row). In a query of several sources either names
    the record's input (:data:`UNION_INPUT`, a key the side output's sink does not read), so
    that each source's late records are counted apart. ``ctx`` is the engine's context."""
    op: Any = ctx.operator  # type: ignore[attr-defined]
    input = op.origin_input(record)
    named = {} if input is None else {UNION_INPUT: input}
    if tag is not None:
        ctx.output(tag, {**record, **named} if named else record)
    else:
        op.side.append((LATE_MARK, named))


def has_on_timer(fn: KeyedProcessFunction) -> bool:
    """Whether the user's function sets its own ``on_timer`` (a co-process or broadcast
    process function's)."""
    if isinstance(fn, BroadcastProcess):
        return type(fn.connected).on_timer is not KeyedBroadcastProcessFunction.on_timer
    if isinstance(fn, CoProcess):
        return type(fn.connected).on_timer is not KeyedCoProcessFunction.on_timer
    return type(fn).on_timer is not KeyedProcessFunction.on_timer


@dataclass(frozen=True)
class TimeWindow:
    """A window's bounds in UTC (both None for the global window); ``end`` is exclusive."""

    start: datetime | None
    end: datetime | None


class ProcessWindowFunction:
    """Flink's ProcessWindowFunction: sees all elements of a window when it fires.

    ``process(key, window, elements)`` is called each time the window fires (on time, on every
    late firing within the allowed lateness, and on early firings) and yields output records
    matching ``output_schema``. The window's elements are kept in state until it is purged, so
    prefer ``aggregate`` when an accumulator suffices.
    """

    output_schema: ClassVar[Mapping[str, Any] | StructType] = {}

    def process(
        self, key: Any, window: TimeWindow, elements: list[dict[str, Any]]
    ) -> Iterator[dict[str, Any]]:
        raise NotImplementedError
