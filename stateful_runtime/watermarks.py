"""Event time: where a record's timestamp comes from and how far the watermark trails it."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import timedelta

from stateful_runtime.exceptions import ConfigError

_UNITS = ("ms", "s", "timestamp")


@dataclass(frozen=True)
class WatermarkStrategy:
    """Flink's ``WatermarkStrategy``: bounded out-of-orderness plus a timestamp field.

    The watermark is ``max event time seen - max_out_of_orderness``; a window fires once the
    watermark passes its end. Build one with :meth:`for_bounded_out_of_orderness` (or
    :meth:`for_monotonous_timestamps`) and then :meth:`with_timestamp_field`.
    """

    max_out_of_orderness: timedelta = timedelta(0)
    timestamp_field: str | None = None
    timestamp_unit: str = "ms"
    idleness: timedelta | None = None

    @staticmethod
    def for_bounded_out_of_orderness(max_out_of_orderness: timedelta) -> WatermarkStrategy:
        if not isinstance(max_out_of_orderness, timedelta) or max_out_of_orderness < timedelta(0):
            raise ConfigError(
                "for_bounded_out_of_orderness takes a non-negative datetime.timedelta, "
                f"got {max_out_of_orderness!r}"
            )
        return WatermarkStrategy(max_out_of_orderness)

    @staticmethod
    def for_monotonous_timestamps() -> WatermarkStrategy:
        return WatermarkStrategy(timedelta(0))

    def with_timestamp_field(self, field: str, unit: str = "ms") -> WatermarkStrategy:
        """Take event time from ``field``: epoch ``"ms"``, epoch ``"s"`` or a ``"timestamp"``."""
        if unit not in _UNITS:
            raise ConfigError(f"timestamp unit must be one of {_UNITS}, got {unit!r}")
        return replace(self, timestamp_field=field, timestamp_unit=unit)

    def with_idleness(self, timeout: timedelta) -> WatermarkStrategy:
        """A partition silent for ``timeout`` stops holding the watermark back."""
        return replace(self, idleness=timeout)

    def describe(self) -> str:
        return (
            f"event time {self.timestamp_field} ({self.timestamp_unit}), "
            f"bounded out-of-orderness {self.max_out_of_orderness}"
        )
