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
