"""The job API, job files and the planner (no Spark needed)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    CheckpointConfig,
    Count,
    LogSource,
    StreamJob,
    Sum,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from stateful_runtime.checkpoints.layout import claim
from stateful_runtime.exceptions import CheckpointOwnershipError, ConfigError
from stateful_runtime.planner import plan
from stateful_runtime.runtime.loader import load_job_file
from tests.helpers import EXAMPLES, srt

UPI = EXAMPLES / "upi_per_minute.py"


def _job(tmp_path, sink_upsert: bool = True) -> StreamJob:
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.sink import LogSink

    EventLog(tmp_path / "log").create_topic("in", 2, exist_ok=True)
    job = StreamJob("j", CheckpointConfig(str(tmp_path / "ck")), parallelism=3)
    stream = job.from_source(
        LogSource(str(tmp_path / "log"), "in", {"k": str, "v": int, "ts": int}),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2)).with_timestamp_field(
            "ts"
        ),
        name="src",
    )
    sink = (
        DuckDBUpsertSink(str(tmp_path / "db"), "t", key=("k", "window_start"))
        if sink_upsert
        else LogSink(str(tmp_path / "log"), "out")
    )
    (
        stream.filter("v > 0")
        .key_by("k")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
        .aggregate({"n": Count(), "total": Sum("v")}, name="agg")
        .sink_to(sink, name="out")
    )
    return job


def test_plan_chooses_native_path_and_explains_why(tmp_path):
    p = plan(_job(tmp_path))
    assert [q.name for q in p.queries] == ["out"]
    assert p.queries[0].dead_letters.sink.topic == "in-dlq"
    main = p.queries[0]
    assert main.path == "native" and main.output_mode == "update"
    assert main.stateful_operators == ["agg"]
    text = p.explain()
    assert "path: native" in text and "groupBy(window)" in text
    assert "filter v > 0" in text and "bounded out-of-orderness 0:00:02" in text


def test_append_only_sink_gets_window_close_emission(tmp_path):
    q = plan(_job(tmp_path, sink_upsert=False)).queries[0]
    assert q.output_mode == "append"
    assert "when the watermark passes its end" in "\n".join(q.steps)


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TumblingEventTimeWindows.of(timedelta(0)), "positive"),
        (lambda: TumblingEventTimeWindows.of(60), "timedelta"),
        (lambda: WatermarkStrategy.for_bounded_out_of_orderness(5), "timedelta"),
        (
            lambda: WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("t", "ns"),
            "unit",
        ),
        (lambda: StreamJob("bad name", CheckpointConfig("x")), "job name"),
        (lambda: StreamJob("j", CheckpointConfig("x"), parallelism=0), "parallelism"),
        (lambda: LogSource("d", "t", {"a": str}, starting_offsets="middle"), "starting_offsets"),
    ],
)
def test_invalid_configuration_is_rejected_at_construction(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_stateful_operators_need_names_and_outputs_must_not_clash(tmp_path):
    job = _job(tmp_path)
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


def test_checkpoint_dir_is_bound_to_its_job(tmp_path):
    claim(tmp_path, "job-a", ["q"])
    claim(tmp_path, "job-a", ["q"])  # the same job may come back
    with pytest.raises(CheckpointOwnershipError, match="belongs to job 'job-a'"):
        claim(tmp_path, "job-b", ["q"])


def test_cli_config_mistakes_exit_non_zero_with_a_message(tmp_path, srt_env):
    bad_key = srt(["run", str(UPI), "--set", "sink.tabel=x"], srt_env)
    assert bad_key.returncode == 2 and "unknown config key(s) sink.tabel" in bad_key.stderr
    missing = srt(["run", str(tmp_path / "missing.py")], srt_env)
    assert missing.returncode == 2 and "not found" in missing.stderr
    claim(tmp_path / "ck", "someone-else", ["q"])
    owned = srt(["run", str(UPI), "--set", f"checkpoint.dir={tmp_path / 'ck'}"], srt_env)
    assert owned.returncode == 2 and "belongs to job 'someone-else'" in owned.stderr
    no_topic = srt(
        [
            "run",
            str(UPI),
            "--set",
            f"source.log_dir={tmp_path / 'nolog'}",
            "--set",
            f"checkpoint.dir={tmp_path / 'ck2'}",
            "--available-now",
        ],
        srt_env,
    )
    assert no_topic.returncode == 2 and "srt log create upi-payments" in no_topic.stderr


def test_explain_cli_without_spark(tmp_path, srt_env):
    from stateful_runtime.connectors.eventlog import EventLog

    EventLog(tmp_path / "log").create_topic("upi-payments", 2)
    out = srt(
        ["explain", str(UPI), "--no-spark", "--set", f"source.log_dir={tmp_path / 'log'}"], srt_env
    )
    assert out.returncode == 0, out.stderr
    assert "query upi-counts  [path: native; output mode: update]" in out.stdout
    assert "published to the dead-letter topic 'upi-payments-dlq'" in out.stdout


def test_reduce_runs_on_the_window_operator_with_the_source_fields(tmp_path):
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.testing import window_harness

    EventLog(tmp_path / "log").create_topic("in", 1)
    job = StreamJob("r", CheckpointConfig(str(tmp_path / "ck")))
    stream = job.from_source(
        LogSource(str(tmp_path / "log"), "in", {"k": str, "v": int, "ts": int}),
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts"),
        name="src",
    )
    out = (
        stream.key_by("k")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
        .reduce(lambda a, b: {**a, "v": a["v"] + b["v"]}, name="sum-v")
    )
    out.sink_to(LogSink(str(tmp_path / "log"), "out"))
    q = plan(job).queries[0]
    assert q.path == "window" and "reduce" in q.reason
    node = out.node
    h = window_harness(node.assigner, node.parent.keys, node.contents, timestamp_field="ts")
    for ts in (1, 2, 3, 11_000):
        h.process_element({"k": "a", "v": 10, "ts": ts})
    h.process_watermark(20_000)
    assert [(r["v"], r["window_start"].second) for r in h.output] == [(30, 0), (10, 10)]


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
