"""Job files: loading, typed overrides, unknown keys."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.runtime.loader import load_job_file
from tests.helpers import EXAMPLES

UPI = EXAMPLES / "upi_per_minute.py"


def test_job_file_overrides_are_typed_and_unknown_keys_rejected(tmp_path):
    jf = load_job_file(
        UPI, {"parallelism": "2", "checkpoint.interval_s": "0.5", "checkpoint.dir": str(tmp_path)}
    )
    assert jf.job.parallelism == 2
    assert jf.job.checkpoint.interval == timedelta(seconds=0.5)
    with pytest.raises(ConfigError, match="unknown config key.*sink.tabel.*known keys"):
        load_job_file(UPI, {"sink.tabel": "x"})
    with pytest.raises(ConfigError, match="expected a int"):
        load_job_file(UPI, {"parallelism": "many"})
    with pytest.raises(ConfigError, match="not found"):
        load_job_file(tmp_path / "nope.py")
