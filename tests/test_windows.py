"""Window assigners and triggers."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stateful_runtime import TumblingEventTimeWindows
from stateful_runtime.exceptions import ConfigError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TumblingEventTimeWindows.of(timedelta(0)), "positive"),
        (lambda: TumblingEventTimeWindows.of(60), "timedelta"),
    ],
)
def test_invalid_windows_are_rejected_at_construction(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
