"""Event time: where a record's timestamp comes from, how far the watermark trails it, and which
event times are plausible at all."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from stateful_runtime.exceptions import ConfigError

_UNITS = ("ms", "s", "timestamp")
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A producer's clock may run ahead of the job's by minutes (NTP steps, a laptop waking up); an
# hour more than covers it, and bounds how far one bad record can drag the watermark ahead.
DEFAULT_MAX_AHEAD = timedelta(hours=1)
# A record an hour ahead of both the watermark and the records that follow it in its partition
# is a mistyped timestamp, not the stream: in a replay of history (where the batch's processing
# time says nothing) it would move the watermark that far and turn the records after it late.
DEFAULT_MAX_AHEAD_OF_STREAM = timedelta(hours=1)
_UNSET: Any = object()


def _instant(name: str, value: Any) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ConfigError(
            f"{name} takes a datetime (e.g. datetime(2020, 1, 1, tzinfo=UTC)) or None (off), "
            f"got {value!r}"
        )
    return value if value.tzinfo else value.replace(tzinfo=UTC)  # naive: UTC, as the decoder


def _bound(name: str, value: Any) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta) or value < timedelta(0):
        raise ConfigError(
            f"{name} takes a non-negative datetime.timedelta or None (off), got {value!r}"
        )
    return value


@dataclass(frozen=True)
class EventTimePolicy:
    """Which event times a source accepts. A record outside is a dead letter, with the bound it
    broke in its reason, and never reaches the watermark (Flink leaves this to the user's
    ``TimestampAssigner``; one record from the year 2100 would otherwise move the watermark
    decades ahead and every later record would be dropped as late, after restarts too).

    Attributes:
        floor: the earliest event time accepted (default the Unix epoch, so a negative epoch
            timestamp is refused); None: only the representable range (years 1-9999).
        max_ahead_of_processing_time: how far an event time may lie ahead of its batch's
            processing time (Spark's ``batchTimestampMs``, logged with the batch's offsets, so a
            replayed batch judges its records exactly as the first run did); default 1 hour.
        max_ahead_of_watermark: how far an event time may lie ahead of the source's watermark
            at the start of its batch; None (the default) is off. A batch whose watermark is not
            set yet (the first of a query) is not bounded by it. Set it when processing time says
            little (a replay of history) but event time advances steadily.
        max_ahead_of_stream: how far an event time may lie ahead of both the source's watermark
            at the start of its batch and the records that follow it in its partition (the
            median of the next 8 in the batch; a partition's last record of a batch is not
            judged): an outlier, not the stream moving on. Records that move forward together
            (a stream resuming after days of silence, a backfill's batch) are not refused.
            Judged within the batch's logged offsets, so a replay refuses the same records.
            Default 1 hour; None: off.
    """

    floor: datetime | None = EPOCH
    max_ahead_of_processing_time: timedelta | None = DEFAULT_MAX_AHEAD
    max_ahead_of_watermark: timedelta | None = None
    max_ahead_of_stream: timedelta | None = DEFAULT_MAX_AHEAD_OF_STREAM

    def __post_init__(self) -> None:
        object.__setattr__(self, "floor", _instant("floor", self.floor))
        for name in (
            "max_ahead_of_processing_time",
            "max_ahead_of_watermark",
            "max_ahead_of_stream",
        ):
            object.__setattr__(self, name, _bound(name, getattr(self, name)))
        if self.max_ahead_of_stream is not None and self.max_ahead_of_stream <= timedelta(0):
            raise ConfigError(
                "max_ahead_of_stream takes a positive datetime.timedelta or None (off), "
                f"got {self.max_ahead_of_stream!r}"
            )

    def describe(self) -> str:
        floor = "none" if self.floor is None else _iso(self.floor)
        ahead = self.max_ahead_of_processing_time
        wm = self.max_ahead_of_watermark
        stream = self.max_ahead_of_stream
        return (
            f"event times accepted from {floor}, at most "
            f"{'(off)' if ahead is None else ahead} ahead of the batch's processing time, "
            f"{'(off)' if wm is None else wm} ahead of the watermark and "
            f"{'(off)' if stream is None else stream} ahead of the watermark and the stream "
            f"at once; others are dead letters"
        )


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


@dataclass(frozen=True)
class WatermarkStrategy:
    """Flink's ``WatermarkStrategy``: bounded out-of-orderness plus a timestamp field.

    The watermark is ``max event time seen - max_out_of_orderness``; a window fires once the
    watermark passes its end. Build one with :meth:`for_bounded_out_of_orderness` (or
    :meth:`for_monotonous_timestamps`) and then :meth:`with_timestamp_field`; which event times
    are plausible is :attr:`event_time_policy` (:meth:`with_event_time_policy`).
    """

    max_out_of_orderness: timedelta = timedelta(0)
    timestamp_field: str | None = None
    timestamp_unit: str = "ms"
    idleness: timedelta | None = None
    event_time_policy: EventTimePolicy = field(default_factory=EventTimePolicy)

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

    def with_event_time_policy(
        self,
        *,
        floor: datetime | None = _UNSET,
        max_ahead_of_processing_time: timedelta | None = _UNSET,
        max_ahead_of_watermark: timedelta | None = _UNSET,
        max_ahead_of_stream: timedelta | None = _UNSET,
    ) -> WatermarkStrategy:
        """Which event times this source accepts (:class:`EventTimePolicy`); a setting not
        given keeps its value, None switches a bound off. E.g. a replay of 2019's records with
        no record from before 2019 and none more than a day ahead of the stream::

            strategy.with_event_time_policy(
                floor=datetime(2019, 1, 1, tzinfo=UTC),
                max_ahead_of_watermark=timedelta(days=1),
            )
        """
        given: dict[str, Any] = {
            k: v
            for k, v in (
                ("floor", floor),
                ("max_ahead_of_processing_time", max_ahead_of_processing_time),
                ("max_ahead_of_watermark", max_ahead_of_watermark),
                ("max_ahead_of_stream", max_ahead_of_stream),
            )
            if v is not _UNSET
        }
        return replace(self, event_time_policy=replace(self.event_time_policy, **given))

    def describe(self) -> str:
        return (
            f"event time {self.timestamp_field} ({self.timestamp_unit}), "
            f"bounded out-of-orderness {self.max_out_of_orderness}"
        )
