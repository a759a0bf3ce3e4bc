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


def test_state_backend_names_the_one_engine_and_explains_the_removed_one():
    base = {"checkpoint.dir": "ck"}
    for value in ("", "rocksdb_local"):  # the one engine, named or not
        StreamJob.from_config("j", {**base, "state.backend": value})
    with pytest.raises(ConfigError, match=r"state.backend=spark was removed.*moved into the"):
        StreamJob.from_config("j", {**base, "state.backend": "spark"})
    with pytest.raises(ConfigError, match=r"state.backend='hashmap'.*drop the setting"):
        StreamJob.from_config("j", {**base, "state.backend": "hashmap"})
