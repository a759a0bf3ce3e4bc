"""Watermark strategies."""

from __future__ import annotations

import pytest

from stateful_runtime import WatermarkStrategy
from stateful_runtime.exceptions import ConfigError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: WatermarkStrategy.for_bounded_out_of_orderness(5), "timedelta"),
        (
            lambda: WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("t", "ns"),
            "unit",
        ),
    ],
)
def test_invalid_watermark_strategies_are_rejected_at_construction(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
