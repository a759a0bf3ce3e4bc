"""A crash is a failed run that Dagster's run-failure alerting picks up; a stop is not. The
health sensor over a real registry (``srt status`` processes), its run executed on a real
Dagster instance, and a ``run_failure_sensor`` evaluated on that run (the crash of a real Spark
job, kill -9, is in test_streaming_job.py)."""

from __future__ import annotations

import subprocess
import time
from datetime import timedelta

from dagster import (
    DagsterInstance,
    DagsterRunStatus,
    RunFailureSensorContext,
    build_run_status_sensor_context,
    build_sensor_context,
    run_failure_sensor,
)

from dagster_defs import RestartPolicy, StreamingJobSpec, StreamingRuntime, build_definitions
from dagster_defs._alerts import CRASH_JOB
from dagster_defs._sensor import Cursor
from stateful_runtime.runtime import launcher, registry

POLICY = RestartPolicy(max_restarts=1, window=timedelta(minutes=10))
SPEC = StreamingJobSpec("alert-test", "unused.py", restart_policy=POLICY)
FAILURE = "query counts failed: ZeroDivisionError: division by zero in step enrich"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _tick(defs, resources, cursor: str | None):
    sensor = defs.resolve_sensor_def("streaming_job_health")
    return sensor(build_sensor_context(resources=resources, cursor=cursor))


def test_a_crash_launches_one_failing_run_that_run_failure_sensors_see_and_a_stop_none(
    srt_home, tmp_path
):
    resources = {"streaming_runtime": StreamingRuntime(home=str(srt_home))}
    defs = build_definitions([SPEC], resources=resources)
    pid = _dead_pid()
    log = launcher.log_path(SPEC.name)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("batch 7 | rows 1,000\nTraceback (most recent call last):\nZeroDivisionError\n")
    registry.write(
        SPEC.name,
        {
            "job": SPEC.name,
            "state": "FAILED",
            "pid": pid,
            "started_at": "2026-01-01T00:00:00Z",
            "failure": FAILURE,
        },
    )
    # The restart budget is spent: the sensor gives up (no launch), and says so in the alert.
    cursor = Cursor({SPEC.name: [time.time() - 5]})
    tick = _tick(defs, resources, cursor.dump())
    [request] = tick.run_requests
    assert request.job_name == CRASH_JOB
    assert request.tags["srt/job"] == SPEC.name and request.tags["srt/condition"] == "failed"
    assert request.tags["srt/pid"] == str(pid)

    # The same crash seen again is not alerted twice (and Dagster would drop the same run key).
    again = _tick(defs, resources, tick.cursor)
    assert again.run_requests == []

    instance = DagsterInstance.ephemeral()
    result = defs.resolve_job_def(CRASH_JOB).execute_in_process(
        run_config=request.run_config,
        instance=instance,
        tags=request.tags,
        raise_on_error=False,
    )
    assert not result.success
    run = instance.get_run_by_id(result.run_id)
    assert run is not None and run.status is DagsterRunStatus.FAILURE
    [step] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    text = step.step_failure_data.error.message
    assert "alert-test is FAILED" in text and FAILURE in text
    assert "ZeroDivisionError" in text.split("The end of its log:")[1]  # the log excerpt
    assert "restart limit" in text  # what the sensor did: gave up

    # What a run-failure alert (Slack, e-mail, PagerDuty...) is built on sees it.
    seen: list[str] = []

    @run_failure_sensor(name="page_on_crash")
    def page(context: RunFailureSensorContext) -> None:
        [failed] = context.get_step_failure_events()
        seen.append(failed.step_failure_data.error.message)
        seen.append(context.dagster_run.tags["srt/job"])

    [run_failure] = [e for e in result.all_events if e.event_type_value == "PIPELINE_FAILURE"]
    page(
        build_run_status_sensor_context(
            sensor_name="page_on_crash",
            dagster_instance=instance,
            dagster_run=run,
            dagster_event=run_failure,
        ).for_run_failure()
    )
    assert seen == [text, SPEC.name]

    # A stop on purpose alerts no one.
    registry.write(
        SPEC.name,
        {"job": SPEC.name, "state": "STOPPED", "pid": _dead_pid(), "stopped_by": "endpoint"},
    )
    assert _tick(defs, resources, again.cursor).run_requests == []
