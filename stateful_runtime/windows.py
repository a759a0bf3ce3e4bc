"""Window assigners: which windows an element belongs to."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from stateful_runtime.exceptions import ConfigError


def _positive(name: str, value: timedelta) -> timedelta:
    if not isinstance(value, timedelta) or value <= timedelta(0):
        raise ConfigError(f"{name} must be a positive datetime.timedelta, got {value!r}")
    if value % timedelta(milliseconds=1):
        raise ConfigError(f"{name} must be a whole number of milliseconds, got {value!r}")
    return value


def spark_interval(value: timedelta) -> str:
    """A timedelta as a Spark interval string (milliseconds: Spark's finest window unit here)."""
    return f"{int(value / timedelta(milliseconds=1))} milliseconds"


@dataclass(frozen=True)
class WindowAssigner:
    """Base of all window assigners."""

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class TumblingEventTimeWindows(WindowAssigner):
    """Fixed-size, non-overlapping event-time windows aligned to the epoch (UTC)."""

    size: timedelta

    @staticmethod
    def of(size: timedelta) -> TumblingEventTimeWindows:
        return TumblingEventTimeWindows(_positive("window size", size))

    def describe(self) -> str:
        return f"tumbling event-time windows of {self.size}"


@dataclass(frozen=True)
class SlidingEventTimeWindows(WindowAssigner):
    """Windows of ``size`` starting every ``slide`` (an element is in ``size / slide`` windows)."""

    size: timedelta
    slide: timedelta

    @staticmethod
    def of(size: timedelta, slide: timedelta) -> SlidingEventTimeWindows:
        _positive("window size", size)
        _positive("window slide", slide)
        if size % slide:
            raise ConfigError(f"window size {size} must be a multiple of the slide {slide}")
        return SlidingEventTimeWindows(size, slide)

    def describe(self) -> str:
        return f"sliding event-time windows of {self.size} every {self.slide}"


@dataclass(frozen=True)
class EventTimeSessionWindows(WindowAssigner):
    """Per-key sessions that close after ``gap`` without elements (windows merge)."""

    gap: timedelta

    @staticmethod
    def with_gap(gap: timedelta) -> EventTimeSessionWindows:
        return EventTimeSessionWindows(_positive("session gap", gap))

    def describe(self) -> str:
        return f"event-time session windows with gap {self.gap}"


@dataclass(frozen=True)
class GlobalWindows(WindowAssigner):
    """One window per key that never ends; needs a trigger (e.g. ``CountTrigger.of(100)``)."""

    @staticmethod
    def create() -> GlobalWindows:
        return GlobalWindows()

    def describe(self) -> str:
        return "the global window"


@dataclass(frozen=True)
class Trigger:
    """When a window emits besides the watermark passing its end."""

    def describe(self) -> str:
        raise NotImplementedError


@dataclass(frozen=True)
class CountTrigger(Trigger):
    """Fire (and purge) the window every ``count`` elements: for the global window."""

    count: int

    @staticmethod
    def of(count: int) -> CountTrigger:
        if count < 1:
            raise ConfigError(f"CountTrigger needs a count >= 1, got {count}")
        return CountTrigger(count)

    def describe(self) -> str:
        return f"fire and purge every {self.count} elements"


@dataclass(frozen=True)
class EarlyFiring(Trigger):
    """Emit a window's partial result before it closes, every ``count`` elements and/or when
    ``interval`` of processing time has passed since its last emission (checked as elements
    arrive); the final result still comes when the watermark passes the window's end."""

    count: int | None = None
    interval: timedelta | None = None

    @staticmethod
    def every(count: int | None = None, interval: timedelta | None = None) -> EarlyFiring:
        if count is None and interval is None:
            raise ConfigError("EarlyFiring.every needs count= and/or interval=")
        if count is not None and count < 1:
            raise ConfigError(f"early firing count must be >= 1, got {count}")
        if interval is not None:
            _positive("early firing interval", interval)
        return EarlyFiring(count, interval)

    def describe(self) -> str:
        parts = ([f"every {self.count} elements"] if self.count else []) + (
            [f"every {self.interval} of processing time"] if self.interval else []
        )
        return "early firing " + " and ".join(parts)
