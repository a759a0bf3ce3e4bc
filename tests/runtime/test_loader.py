"""Job files: loading, typed overrides, unknown keys."""

from __future__ import annotations

import math
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.job import StreamJob
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


_NUMBER_TEXT = st.one_of(
    st.sampled_from(["nan", "NaN", "inf", "-inf", "Infinity", "-1", "-0.5", "1e400", "1e30", "0"]),
    st.floats().map(repr),
    st.integers(min_value=-(10**20), max_value=10**20).map(str),
)


@settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(
        [
            "checkpoint.interval_s",
            "source.idle_timeout_s",
            "parallelism",
            "sink.partitions",
            "source.max_records_per_batch",
        ]
    ),
    raw=_NUMBER_TEXT,
)
def test_numeric_keys_load_finite_and_in_range_or_say_why_in_their_units(key, raw, tmp_path):
    overrides = {key: raw, "checkpoint.dir": str(tmp_path)}
    try:
        jf = load_job_file(UPI, overrides)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith(f"--set {key}=") or key == "parallelism", message
        assert "timedelta" not in message
        if key.endswith("_s") and "expected a" not in message:
            assert "seconds" in message, message
        return
    value = jf.config[key]
    assert math.isfinite(value) and value >= 0 if key != "parallelism" else value >= 1
    if key == "checkpoint.interval_s":
        assert jf.job.checkpoint.interval.total_seconds() == pytest.approx(value, abs=1e-6)


def test_the_issues_intervals_are_refused_in_seconds(tmp_path):
    for raw in ("nan", "inf", "-1"):
        with pytest.raises(ConfigError) as caught:
            load_job_file(UPI, {"checkpoint.interval_s": raw, "checkpoint.dir": str(tmp_path)})
        message = str(caught.value)
        assert f"checkpoint.interval_s={float(raw)!r}" in message and "seconds" in message
        assert "timedelta" not in message
    # The job file's own DEFAULTS are held to the same rules, and so is a job built in Python.
    with pytest.raises(ConfigError, match="checkpoint.interval_s.*seconds"):
        StreamJob.from_config("j", {"checkpoint.dir": str(tmp_path), "checkpoint.interval_s": -1})
    with pytest.raises(ConfigError, match="savepoint.roots.*not absolute"):
        load_job_file(UPI, {"savepoint.roots": "rel/dir", "checkpoint.dir": str(tmp_path)})


def test_event_time_keys_set_every_sources_policy_or_one_sources(tmp_path):
    from datetime import UTC, datetime

    base = {"checkpoint.dir": str(tmp_path)}
    [node] = load_job_file(UPI, base).job.sources
    policy = node.watermark.event_time_policy
    assert policy.floor == datetime(1970, 1, 1, tzinfo=UTC)
    assert policy.max_ahead_of_processing_time == timedelta(hours=1)
    assert policy.max_ahead_of_watermark is None

    [node] = load_job_file(
        UPI,
        {
            **base,
            "event_time.max_ahead_s": "60",
            "event_time.floor": "off",
            f"event_time.{node.name}.floor": "2020-01-01",
            "event_time.max_ahead_of_watermark_s": "3600",
        },
    ).job.sources
    policy = node.watermark.event_time_policy
    assert policy.floor == datetime(2020, 1, 1, tzinfo=UTC)  # the source's key wins
    assert policy.max_ahead_of_processing_time == timedelta(seconds=60)
    assert policy.max_ahead_of_watermark == timedelta(hours=1)

    [node] = load_job_file(UPI, {**base, "event_time.max_ahead_s": "off"}).job.sources
    assert node.watermark.event_time_policy.max_ahead_of_processing_time is None
    with pytest.raises(ConfigError, match="has no source 'nope'"):
        load_job_file(UPI, {**base, "event_time.nope.floor": "2020-01-01"})
    with pytest.raises(ConfigError, match="ISO-8601 instant"):
        load_job_file(UPI, {**base, "event_time.floor": "yesterday"})
    for bad in ("-1", "nan", "soon"):
        with pytest.raises(ConfigError, match="event_time.max_ahead_s"):
            load_job_file(UPI, {**base, "event_time.max_ahead_s": bad})
    with pytest.raises(ConfigError, match="unknown config key"):
        load_job_file(UPI, {**base, "event_time.upi-source.max_behind_s": "1"})


ISOLATION = Path(__file__).parents[1] / "operators" / "isolation_job.py"


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    policy=st.sampled_from(["", "dead_letter", "fail", "ignore", "FAIL"]),
    consecutive=st.one_of(st.just(""), _NUMBER_TEXT),
    fraction=st.one_of(st.just(""), _NUMBER_TEXT),
)
def test_the_errors_keys_apply_to_every_job_file_or_say_what_to_give(
    policy, consecutive, fraction, tmp_path
):
    """errors.* is accepted by every job file (built with from_config or not) and checked:
    a policy of the two, a whole count of 1 or more, a share from 0 to 1."""
    overrides = {
        "checkpoint.dir": str(tmp_path),
        "errors.policy": policy,
        "errors.max_consecutive": consecutive,
        "errors.max_fraction": fraction,
    }
    for job_file in (UPI, ISOLATION):
        try:
            errors = load_job_file(job_file, overrides).job.errors
        except ConfigError as exc:
            assert str(exc).startswith("errors."), str(exc)
            assert "give" in str(exc)
            continue
        assert errors.policy == (policy or "dead_letter")
        assert errors.max_consecutive >= 1
        assert 0 <= errors.max_fraction <= 1
        if consecutive:
            assert errors.max_consecutive == int(consecutive)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    cache=st.one_of(st.just(""), _NUMBER_TEXT, st.sampled_from(["64", "1", "2.5", "lots"])),
    buffer=st.one_of(st.just(""), _NUMBER_TEXT, st.sampled_from(["16", "1"])),
    count=st.one_of(st.just(""), _NUMBER_TEXT, st.sampled_from(["2", "1", "4"])),
)
def test_the_rocksdb_memory_keys_apply_to_every_job_file_or_say_what_to_give(
    cache, buffer, count, tmp_path
):
    """state.rocksdb.* is accepted by every job file (built with from_config or not) and
    checked in MiB: whole numbers, a memtable count of 2 or more, within the machine; what is
    not set keeps the machine-sized default."""
    from stateful_runtime.job import RocksDBMemory

    default = RocksDBMemory.default()
    overrides = {
        "checkpoint.dir": str(tmp_path),
        "state.rocksdb.block_cache_mb": cache,
        "state.rocksdb.write_buffer_mb": buffer,
        "state.rocksdb.write_buffers": count,
    }
    for job_file in (UPI, ISOLATION):
        try:
            memory = load_job_file(job_file, overrides).job.rocksdb
        except ConfigError as exc:
            assert str(exc).startswith("state.rocksdb."), str(exc)
            assert "give" in str(exc)
            continue
        assert memory.block_cache_mb == (int(cache) if cache else default.block_cache_mb)
        assert memory.write_buffer_mb == (int(buffer) if buffer else default.write_buffer_mb)
        assert memory.write_buffers == (int(count) if count else default.write_buffers)
        assert memory.block_cache_mb >= 1 and memory.write_buffer_mb >= 1
        assert memory.write_buffers >= 2


def test_the_rocksdb_memory_refusals_speak_in_mib():
    from stateful_runtime.job import RocksDBMemory

    with pytest.raises(ConfigError, match=r"block_cache_mb=0: give a whole number of 1 or more"):
        RocksDBMemory(0)
    with pytest.raises(ConfigError, match=r"write_buffers=1: give a whole number of 2 or more"):
        RocksDBMemory(64, 16, 1)
    with pytest.raises(ConfigError, match=r"write_buffer_mb='2.5': give a whole number"):
        RocksDBMemory.from_config({"state.rocksdb.write_buffer_mb": "2.5"})
    with pytest.raises(ConfigError, match=r"MiB per Python worker, more than this machine's"):
        RocksDBMemory(10**9)
    assert RocksDBMemory(64, 16, 3).bound_mb == 64 + 16 * 3
