"""The DataStream API."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stateful_runtime import Count, TumblingEventTimeWindows
from stateful_runtime.exceptions import ConfigError
from tests.helpers import windowed_job


def test_stateful_operators_need_names_and_outputs_must_not_clash(tmp_path):
    job = windowed_job(tmp_path)
    windowed = job.sources[0]
    from stateful_runtime.streams import DataStream

    keyed = (
        DataStream(job, windowed)
        .key_by("k")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=1)))
    )
    with pytest.raises(ConfigError, match="operator name"):
        keyed.aggregate({"n": Count()}, name="")
    with pytest.raises(ConfigError, match="clash"):
        keyed.aggregate({"k": Count()}, name="x")
