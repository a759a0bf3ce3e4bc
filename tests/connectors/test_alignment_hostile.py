"""Plan-time event-time alignment reads single records in the driver: a hostile record there
must read as "no event time", not fail the query (and fail it again at every restart)."""

from __future__ import annotations

import pytest

from stateful_runtime.connectors import alignment


@pytest.mark.parametrize(
    "value",
    [
        b'{"ts_ms": 1, "z": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        b'{"ts_ms": NaN}',
        b'{"ts_ms": 1e400}',
    ],
)
def test_record_time_of_a_hostile_record_is_none(value):
    assert alignment.record_time(value, "ts_ms", "ms") is None
