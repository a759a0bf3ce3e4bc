"""The job runner."""

from __future__ import annotations

import pytest

from stateful_runtime import CheckpointConfig, LogSource, StreamJob, WatermarkStrategy
from stateful_runtime.exceptions import ConfigError


def test_processing_time_functions_refuse_available_now(tmp_path):
    from stateful_runtime import KeyedProcessFunction, TimeDomain
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.runtime.loader import JobFile
    from stateful_runtime.runtime.runner import JobRunner

    class Clocked(KeyedProcessFunction):
        output_schema = {"k": str}
        time_domain = TimeDomain.PROCESSING_TIME

    EventLog(tmp_path).create_topic("in", 1)
    job = StreamJob("p", CheckpointConfig(str(tmp_path / "ck")))
    (
        job.from_source(
            LogSource(str(tmp_path), "in", {"k": str, "ts": int}),
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts"),
            name="s",
        )
        .key_by("k")
        .process(Clocked(), name="clocked")
        .sink_to(LogSink(str(tmp_path), "o"))
    )
    with pytest.raises(ConfigError, match="never lets --available-now finish"):
        JobRunner(JobFile(tmp_path, {}, {}, job), available_now=True)
