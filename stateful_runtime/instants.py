"""Instants and durations in epoch milliseconds as reasons and notes show them (the decoder's
dead-letter reasons, the rewind of a poisoned watermark). Plain data: imports nothing of the
runtime."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def iso_ms(ms: float) -> str:
    """An epoch-ms instant as ISO-8601 UTC (``2100-01-01T00:00:00Z``; ms shown when not 0)."""
    t = EPOCH + timedelta(milliseconds=math.floor(ms))
    text = t.isoformat(timespec="milliseconds" if t.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def span(ms: float) -> str:
    """A duration in the unit a reader grasps: ``73.1 years``, ``12.5 days``, ``3:00:00.5``."""
    days = ms / 86_400_000
    if days >= 730:
        return f"{days / 365.25:.1f} years"
    if days >= 2:
        return f"{days:.1f} days"
    return str(timedelta(milliseconds=int(ms)))
