"""The event-log source."""

from __future__ import annotations

import pytest

from stateful_runtime import LogSource
from stateful_runtime.exceptions import ConfigError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LogSource("d", "t", {"a": str}, starting_offsets="middle"), "starting_offsets"),
    ],
)
def test_invalid_sources_are_rejected_at_construction(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
