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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar

from pyspark.sql.types import StructType

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.state import (
    AggregatingState,
    AggregatingStateDescriptor,
    ListState,
    ListStateDescriptor,
    MapState,
    MapStateDescriptor,
    ReducingState,
    ReducingStateDescriptor,
    TimeDomain,
    ValueState,
    ValueStateDescriptor,
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
