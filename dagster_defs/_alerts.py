"""A crash as a failed run: what open-source Dagster alerts on.

Dagster alerts on failed runs (``run_failure_sensor``, ``make_slack_on_run_failure_sensor``,
``make_email_on_run_failure_sensor``, Dagster+ alert policies on run failure). The health
sensor's checks turn red on a crash, but a runless check evaluation is no run: nothing in open
source fires on it. So when the sensor sees a crash (a job dead, failed, refused, died while
starting or stalled) it also launches one run of ``streaming_job_crashed``, whose one op fails
with what the job crashed with: the condition and reason, the exception the job recorded, the
end of its log, and what the sensor did (restarted as pid N, backoff, gave up). One run per
crash (per process and condition: the run key), never for a stop on purpose.

A run-failure sensor reads it from the run's step failure::

    @run_failure_sensor(monitored_jobs=[...])   # or make_slack_on_run_failure_sensor(...)
    def page(context: RunFailureSensorContext):
        [step] = context.get_step_failure_events()
        text = step.step_failure_data.error.message   # condition, reason, exception, log
        job = context.dagster_run.tags["srt/job"]
"""

# No `from __future__ import annotations`: Dagster reads the op's config class from its
# annotation, and a string annotation is refused.
from collections.abc import Mapping
from typing import Any

from dagster import (
    Config,
    Failure,
    MetadataValue,
    OpExecutionContext,
    RunConfig,
    RunRequest,
    job,
    op,
)

CRASH_JOB = "streaming_job_crashed"
CRASH_OP = "report_streaming_job_crash"
# Run tags an alert can filter on.
JOB_TAG, CONDITION_TAG, PID_TAG = "srt/job", "srt/condition", "srt/pid"


class CrashReport(Config):
    """A crash as the health sensor saw it (one incident of its cursor)."""

    job: str
    condition: str
    reason: str
    pid: int | None = None
    failure: str | None = None
    log_excerpt: str | None = None
    decision: str | None = None
    restarted_pid: int | None = None
    restart_error: str | None = None
    log_path: str | None = None


def message(report: CrashReport) -> str:
    """The alert's text: what crashed, with what, and what the sensor did."""
    text = f"streaming job {report.job} is {report.condition.upper()}: {report.reason}."
    if report.failure:
        text += f"\nIt failed with: {report.failure}"
    if report.restarted_pid is not None:
        text += f"\nThe health sensor restarted it as pid {report.restarted_pid}."
    elif report.restart_error:
        text += f"\nThe health sensor's restart failed: {report.restart_error}"
    elif report.decision:
        text += f"\nHealth sensor: {report.decision}."
    if report.log_path:
        text += f"\nIts log: {report.log_path}"
    if report.log_excerpt:
        text += f"\nThe end of its log:\n{report.log_excerpt}"
    return text


@op(
    name=CRASH_OP,
    description="Fails with a streaming job's crash, so that run-failure alerts fire.",
)
def _report_crash(context: OpExecutionContext, config: CrashReport) -> None:
    text = message(config)
    context.log.error(text)
    metadata: dict[str, Any] = {
        "job": config.job,
        "condition": config.condition,
        "reason": config.reason,
    }
    if config.pid is not None:
        metadata["pid"] = MetadataValue.text(str(config.pid))
    if config.restarted_pid is not None:
        metadata["restarted_pid"] = MetadataValue.text(str(config.restarted_pid))
    if config.failure:
        metadata["failure"] = MetadataValue.md(f"```\n{config.failure}\n```")
    if config.log_excerpt:
        metadata["log_excerpt"] = MetadataValue.md(f"```\n{config.log_excerpt}\n```")
    raise Failure(description=text, metadata=metadata, allow_retries=False)


@job(
    name=CRASH_JOB,
    description=(
        "Launched by the streaming_job_health sensor when a streaming job crashes (dead, "
        "failed, refused, died while starting, stalled); it fails on purpose with the crash "
        "(condition, exception, end of the job's log, restart), so that run-failure sensors "
        "and alert policies fire. Never launched for a stop on purpose. Run tags: srt/job, "
        "srt/condition, srt/pid."
    ),
    tags={"srt/alert": "crash"},
)
def crash_job() -> None:
    _report_crash()


def crash_run_request(
    job_name: str, crash: Mapping[str, Any], *, started_at: str | None = None
) -> RunRequest:
    """The run that reports ``crash`` (a health sensor incident, with the sensor's decision):
    keyed by job, process and condition, so Dagster launches it once."""
    report = CrashReport(
        job=job_name,
        condition=str(crash.get("condition")),
        reason=str(crash.get("reason")),
        pid=crash.get("pid"),
        failure=crash.get("failure"),
        log_excerpt=crash.get("log_excerpt"),
        decision=crash.get("decision"),
        restarted_pid=crash.get("restarted_pid"),
        restart_error=crash.get("restart_error"),
        log_path=crash.get("log_path"),
    )
    return RunRequest(
        run_key=f"{job_name}:{crash.get('pid')}:{started_at}:{crash.get('condition')}",
        job_name=CRASH_JOB,
        run_config=RunConfig(ops={CRASH_OP: report}),
        tags={
            JOB_TAG: job_name,
            CONDITION_TAG: str(crash.get("condition")),
            PID_TAG: str(crash.get("pid")),
        },
    )
