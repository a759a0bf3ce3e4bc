"""The job runner."""

from __future__ import annotations

import pytest

from stateful_runtime import CheckpointConfig, LogSource, StreamJob, WatermarkStrategy
from stateful_runtime.exceptions import ConfigError, TopicNotFoundError


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


# -- one job, one process; nothing moved that the runtime does not own ------------------------

GATED_JOB = """
import os, sys, time
sys.path.insert(0, {examples!r})
from upi_per_minute import DEFAULTS, build as _build

def build(config):
    job = _build(config)
    for src in job.sources:
        check = src.source.check
        def held(check=check):  # holds the run in STARTING until the test opens the gate
            while not os.path.exists(os.environ["SRT_TEST_GATE"]):
                time.sleep(0.05)
            check()
        object.__setattr__(src.source, "check", held)
    return job
"""


def test_a_second_run_of_a_starting_job_is_refused_and_stop_reaches_the_first(
    upi, srt_env, tmp_path
):
    import json
    from pathlib import Path

    from tests.helpers import EXAMPLES, kill_group, poll, srt, srt_background

    job_file = tmp_path / "gated.py"
    job_file.write_text(GATED_JOB.format(examples=str(EXAMPLES)))
    env = {**srt_env, "SRT_TEST_GATE": str(tmp_path / "gate")}
    args = ["run", str(job_file), *upi.sets()]
    first = srt_background(args, env, tmp_path / "first.log")
    try:
        entry_path = Path(srt_env["SRT_HOME"]) / "jobs" / "upi-per-minute.json"

        def first_registered():
            try:
                entry = json.loads(entry_path.read_text())
            except (OSError, ValueError):
                return None
            return entry if entry.get("pid") == first.pid else None

        entry = poll(first_registered, 120, "the first run's registry entry")
        assert entry["state"] == "STARTING"
        second = srt(args, env, timeout=120)
        assert second.returncode != 0
        assert f"pid {first.pid}" in second.stderr and "already running" in second.stderr
        assert entry["run_id"] in second.stderr
        after = json.loads(entry_path.read_text())
        assert after["pid"] == first.pid and after["run_id"] == entry["run_id"]
        stopped = srt(["stop", "upi-per-minute"], env, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert first.wait(timeout=60) is not None
        assert not upi.checkpoint_dir.joinpath("upi-counts").exists()  # it never started
    finally:
        kill_group(first)


def test_the_working_directory_as_checkpoint_dir_is_refused_and_nothing_moves(upi, srt_env):
    from tests.helpers import EXAMPLES, srt

    upi.database.write_text("a DuckDB file")
    (upi.root / "notes.txt").write_text("unrelated")
    before = sorted(p.relative_to(upi.root) for p in upi.root.rglob("*"))
    upi.extra["checkpoint.dir"] = "."
    for more in (["--from-savepoint", "upi-per-minute-20260101T000000-abcd"], []):
        done = srt(
            ["run", str(EXAMPLES / "upi_per_minute.py"), *upi.sets(), *more],
            srt_env,
            cwd=upi.root,
            timeout=120,
        )
        assert done.returncode != 0
        assert "is the working directory" in done.stderr and "checkpoint.dir" in done.stderr
        assert sorted(p.relative_to(upi.root) for p in upi.root.rglob("*")) == before


@pytest.mark.faults  # kill -9 of a running job: the checkpoint's lock goes with it
def test_a_running_job_refuses_a_second_run_and_its_kill_frees_the_checkpoint(upi, srt_env):
    import json
    from pathlib import Path

    from tests.helpers import append_lines, kill_group, srt, srt_background, wait_for

    append_lines(
        upi.log_dir, [b'{"txn_id": "t1", "merchant_id": "M1", "amount_paise": 5, "ts_ms": 1}']
    )
    entry_path = Path(srt_env["SRT_HOME"]) / "jobs" / "upi-per-minute.json"
    log = upi.root / "first.log"
    first = srt_background(upi.run_args(), srt_env, log)
    try:

        def running() -> bool:
            try:
                entry = json.loads(entry_path.read_text())
            except (OSError, ValueError):
                return False
            return entry.get("pid") == first.pid and entry.get("state") == "RUNNING"

        wait_for(running, first, log, "the first run RUNNING")
        second = srt(upi.run_args("--available-now"), srt_env, timeout=120)
        assert second.returncode != 0 and f"pid {first.pid}" in second.stderr
        assert "state RUNNING" in second.stderr
        assert json.loads(entry_path.read_text())["pid"] == first.pid
    finally:
        kill_group(first)  # kill -9: the kernel drops the lock with the process
    third = srt(upi.run_args("--available-now"), srt_env, timeout=300)
    assert third.returncode == 0, third.stderr[-3000:]


# -- a query that fails is a failed run, whenever it fails ---------------------------------------


@pytest.mark.slow
def test_a_query_that_fails_right_after_the_monitor_looked_is_a_failed_run(tmp_path, capsys):
    """The monitor asks whether a query failed, then whether any is still active: a query that
    fails between the two questions is inactive at the second with its error set, and the run
    is a failed one (exit 1, naming the record and its ``--skip``), not a finished one (exit 0
    with the failed batch uncommitted: the next run met the record again). The interleaving is
    made certain: the monitor's first look answers as it would have a moment before the end."""
    import io
    import json
    from pathlib import Path

    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import JobRunner
    from tests.helpers import append_lines, poll

    log_dir = tmp_path / "log"
    EventLog(log_dir).create_topic("payments", 1)
    payments = [
        {"txn_id": f"t{i}", "merchant_id": "M1", "amount": 13 if i == 3 else 20, "ts_ms": i}
        for i in range(6)
    ]
    append_lines(log_dir, [json.dumps(p).encode() for p in payments], topic="payments")
    job_file = Path(__file__).parents[1] / "operators" / "isolation_job.py"
    values = {
        "source.log_dir": str(log_dir),
        "checkpoint.dir": str(tmp_path / "ck"),
        "errors.policy": "fail",
        "parallelism": "1",
    }

    class LookedJustBefore(JobRunner):
        looked = False

        def _failed(self) -> bool:
            if not self.looked:  # the first look, taken while the query still ran
                self.looked = True
                poll(
                    lambda: not any(r.query.isActive for r in self.runs),
                    300,
                    "the query to fail on amount 13",
                )
                return False
            return super()._failed()

    out = io.StringIO()
    runner = LookedJustBefore(load_job_file(job_file, values), available_now=True, out=out)
    assert runner.run() == 1, out.getvalue()
    assert f"srt run {job_file} --skip payments:0:3" in capsys.readouterr().err
    assert runner.layout.query(runner.plan.queries[0].name).last_committed() is None


# -- a --skip given once is kept -----------------------------------------------------------------


def test_a_skip_is_kept_by_a_refused_run_and_carried_into_a_fresh_checkpoint(tmp_path):
    """``--skip`` is recorded in the checkpoint as soon as the run owns it, before anything can
    fail the run: a run refused at its start keeps it, and ``--replay-sinks`` (a fresh
    checkpoint in this one's place) carries it over, so the record is never met again."""
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.runtime import registry, skips
    from stateful_runtime.runtime.loader import JobFile
    from stateful_runtime.runtime.runner import JobRunner

    ck = tmp_path / "ck"

    def runner(**options) -> JobRunner:
        job = StreamJob("skip-kept", CheckpointConfig(str(ck)))
        job.from_source(
            LogSource(str(tmp_path / "log"), "payments", {"k": str, "ts": int}),
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts"),
            name="payments",
        ).sink_to(LogSink(str(tmp_path / "log"), "out"))
        return JobRunner(JobFile(tmp_path, {}, {}, job), available_now=True, **options)

    # The source's topic does not exist yet: the start is refused after the skip was taken.
    with pytest.raises(TopicNotFoundError, match="payments"):
        runner(skip=["payments:0:7"]).prepare()
    assert registry.read("skip-kept")["state"] == "FAILED"
    assert skips.listed(skips.load(ck / "_dead_letters" / "skips.json")) == [("payments", 0, 7)]
    with pytest.raises(TopicNotFoundError, match="payments"):
        runner(skip=["payments:1:3"], replay_sinks=True).prepare()
    assert [p.name for p in tmp_path.glob("ck.before-replay-*")]  # the old one, moved aside
    assert skips.listed(skips.load(ck / "_dead_letters" / "skips.json")) == [
        ("payments", 0, 7),
        ("payments", 1, 3),
    ]


@pytest.mark.slow
def test_a_restore_from_a_savepoint_carries_the_skips_into_the_restored_checkpoint(tmp_path):
    """A savepoint holds no skips; the restore puts its checkpoint in this one's place and the
    skips recorded here go with the job into it (the restored batches replay the record)."""
    import io
    import json
    from pathlib import Path

    from stateful_runtime.checkpoints import savepoints
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.runtime import registry, skips
    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import JobRunner
    from tests.helpers import append_lines

    log_dir, ck = tmp_path / "log", tmp_path / "ck"
    EventLog(log_dir).create_topic("payments", 1)
    payments = [
        {"txn_id": f"t{i}", "merchant_id": "M1", "amount": 20, "ts_ms": i} for i in range(4)
    ]
    append_lines(log_dir, [json.dumps(p).encode() for p in payments], topic="payments")
    job_file = Path(__file__).parents[1] / "operators" / "isolation_job.py"
    values = {"source.log_dir": str(log_dir), "checkpoint.dir": str(ck), "parallelism": "1"}
    out = io.StringIO()
    first = JobRunner(
        load_job_file(job_file, values), available_now=True, out=out, skip=["payments:0:2"]
    )
    assert first.run() == 0, out.getvalue()
    sp = savepoints.create(ck, tmp_path / "savepoints")
    # The restored run is refused after it took the checkpoint: no source in its log directory.
    elsewhere = {**values, "source.log_dir": str(tmp_path / "empty")}
    restore = JobRunner(load_job_file(job_file, elsewhere), from_savepoint=sp.location, out=out)
    with pytest.raises(TopicNotFoundError):
        restore.prepare()
    assert registry.read("isolation")["state"] == "FAILED"
    assert restore.restored is not None and list(tmp_path.glob("ck.before-restore-*"))
    assert skips.listed(skips.load(ck / "_dead_letters" / "skips.json")) == [("payments", 0, 2)]
