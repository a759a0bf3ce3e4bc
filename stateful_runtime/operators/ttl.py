"""Event-time TTL, built from timers (Spark's own TTL exists only in processing time).

A value is stored with its expiry ``t + ttl`` where ``t`` is the event time of the write (or of
the read, with ``ON_READ_AND_WRITE``); reads at event time ``>= expiry`` see nothing. A cleanup
timer, rounded up to :data:`CLEANUP_GRANULARITY_FRACTION` of the TTL so that many writes share
one timer, removes expired values once the watermark passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from stateful_runtime.operators.backend import MapCell, ValueCell
from stateful_runtime.state import UpdateType

# Cleanup timers are rounded up to ttl/100: at most ~100 timers per key per TTL span, and
# expired values linger at most 1% of the TTL past expiry (never visible: reads check expiry).
CLEANUP_GRANULARITY_FRACTION = 100


class _Ttl:
    def __init__(self, operator: Any, ttl_ms: int, update_type: UpdateType) -> None:
        self.op = operator
        self.ttl = ttl_ms
        self.refresh_on_read = update_type is UpdateType.ON_READ_AND_WRITE
        self.granularity = max(1, ttl_ms // CLEANUP_GRANULARITY_FRACTION)

    def cleanup_at(self, expires: int) -> int:
        """The cleanup timer of a value expiring at ``expires``."""
        g = self.granularity
        return -(-expires // g) * g

    def stamp(self) -> int:
        expires = self.op.current_ms + self.ttl
        self.op.register_ttl_timer(self.cleanup_at(expires))
        return expires

    def live(self, expires: int) -> bool:
        return expires > self.op.current_ms


class EventTtlValueCell(ValueCell, _Ttl):
    """An event-time TTL value. When it is its function's only state and the function sets
    no timers of its own (``sole``, set by the operator), each key keeps one cleanup timer,
    at its value's expiry: a write moves it, a clear removes it, so the backend may clear the
    key at that timer without reading it (``StateBackend.sole_expiry``)."""

    sole = False

    def __init__(self, inner: ValueCell, operator: Any, ttl_ms: int, update: UpdateType) -> None:
        _Ttl.__init__(self, operator, ttl_ms, update)
        self.inner = inner

    def _unstamp(self, stored: Any) -> None:
        """Remove the cleanup timer of ``stored`` (a sole cell's, before it changes)."""
        if stored is not None:
            self.op.backend.delete_timer(self.cleanup_at(stored[1]))

    def get(self) -> Any:
        stored = self.inner.get()
        if stored is None or not self.live(stored[1]):
            return None
        if self.refresh_on_read:
            if self.sole:
                self._unstamp(stored)
            self.inner.put((stored[0], self.stamp()))
        return stored[0]

    def put(self, value: Any) -> None:
        if self.sole:
            self._unstamp(self.inner.get())
        self.inner.put((value, self.stamp()))

    def clear(self) -> None:
        if self.sole:
            self._unstamp(self.inner.get())
        self.inner.clear()

    def expire(self, upto: int) -> None:
        stored = self.inner.get()
        if stored is not None and stored[1] <= upto:
            self.inner.clear()


class EventTtlMapCell(MapCell, _Ttl):
    def __init__(self, inner: MapCell, operator: Any, ttl_ms: int, update: UpdateType) -> None:
        _Ttl.__init__(self, operator, ttl_ms, update)
        self.inner = inner

    def get_entry(self, key: Any) -> Any:
        stored = self.inner.get_entry(key)
        if stored is None or not self.live(stored[1]):
            return None
        if self.refresh_on_read:
            self.inner.put_entry(key, (stored[0], self.stamp()))
        return stored[0]

    def put_entry(self, key: Any, value: Any) -> None:
        self.inner.put_entry(key, (value, self.stamp()))

    def remove_entry(self, key: Any) -> None:
        self.inner.remove_entry(key)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        for key, (value, expires) in list(self.inner.entries()):
            if self.live(expires):
                yield key, value

    def clear(self) -> None:
        self.inner.clear()

    def expire(self, upto: int) -> None:
        for key, (_, expires) in list(self.inner.entries()):
            if expires <= upto:
                self.inner.remove_entry(key)
