"""The job and its checkpoint configuration."""

from __future__ import annotations

import pytest

from stateful_runtime import CheckpointConfig, StreamJob
from stateful_runtime.exceptions import ConfigError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: StreamJob("bad name", CheckpointConfig("x")), "job name"),
        (lambda: StreamJob("j", CheckpointConfig("x"), parallelism=0), "parallelism"),
    ],
)
def test_invalid_jobs_are_rejected_at_construction(build, message):
    with pytest.raises(ConfigError, match=message):
        build()
