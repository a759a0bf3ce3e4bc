"""Savepoints from Dagster: a periodic-savepoint schedule per streaming job, and jobs that
trigger a savepoint, stop a job with one, and upgrade or rescale a job through one.

Everything goes through the ``streaming_runtime`` resource's ``srt`` processes (``srt savepoint
create|prune``, ``srt upgrade``), with the ``s3`` resource's endpoint and credentials in their
environment (savepoint roots may be ``s3://``). Runtime errors fail the Dagster run with the
runtime's own message.

=============================  ==========================================================
``<job>_savepoint_schedule``   per job, on its ``SavepointPolicy.cron``: a savepoint of the
                               running job, then the retention policy; skips a job that is
                               not running
``savepoint_streaming_job``    a savepoint now (running or stopped job: the last committed
                               batch); optionally applies the retention policy
``stop_with_savepoint``        stop the job cleanly, then a savepoint of its final batch
``upgrade_streaming_job``      ``srt upgrade``: check the (new) job file plans and takes the
                               state, stop with a savepoint, relaunch the job file from it,
                               wait for RUNNING and a committed batch
``rescale_streaming_job``      the same with ``--parallelism N``: the state is repartitioned
=============================  ==========================================================
"""

import shlex
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetObservation,
    DefaultScheduleStatus,
    Failure,
    Field,
    JobDefinition,
    MetadataValue,
    OpExecutionContext,
    RunRequest,
    ScheduleDefinition,
    ScheduleEvaluationContext,
    SkipReason,
    job,
    op,
    schedule,
)

from dagster_defs import _savepoint_list
from dagster_defs._launch import launch_config, push_env
from dagster_defs._savepoint_list import watermark_time
from dagster_defs._specs import StreamingJobSpec
from dagster_defs._translator import StreamingJobTranslator, identifier
from dagster_defs.resources import s3_env

if TYPE_CHECKING:
    from stateful_runtime.contract import JobStatus, SavepointSummary

SAVEPOINT_JOB = "savepoint_streaming_job"
STOP_WITH_SAVEPOINT_JOB = "stop_with_savepoint"
UPGRADE_JOB = "upgrade_streaming_job"
RESCALE_JOB = "rescale_streaming_job"


def job_name_field(specs: Sequence[StreamingJobSpec], what: str) -> Field:
    """The ``job`` config field of an op acting on one streaming job (a default when there is
    only one)."""
    names = ", ".join(s.name for s in specs) or "none"
    description = f"Name of the streaming job to {what} (one of: {names})."
    if len(specs) == 1:
        return Field(str, default_value=specs[0].name, description=description)
    return Field(str, description=description)


def _spec(specs: Sequence[StreamingJobSpec], name: str) -> StreamingJobSpec:
    for spec in specs:
        if spec.name == name:
            return spec
    known = ", ".join(s.name for s in specs) or "none"
    raise Failure(description=f"no streaming job named {name!r} in these definitions ({known})")


def runtime_keys(specs: Sequence[StreamingJobSpec]) -> set[str]:
    """The resources a savepoint op needs: the runtime, and ``s3`` only where a job keeps
    savepoints or checkpoints in S3 (else the launchpad would offer an S3 block nothing
    uses; an ``s3://`` target given at launch then uses boto3's own settings)."""

    def s3(value: Any) -> bool:
        return isinstance(value, str) and value.startswith(("s3://", "s3a://"))

    uses_s3 = any(
        s3(spec.savepoints.target) or any(s3(v) for v in spec.config.values()) for spec in specs
    )
    return {"streaming_runtime", "s3"} if uses_s3 else {"streaming_runtime"}


def _env(context: OpExecutionContext) -> dict[str, str]:
    return s3_env(getattr(context.resources, "s3", None))


def _location_value(location: str) -> Any:
    return MetadataValue.url(location) if "://" in location else MetadataValue.path(location)


def _state(status: "JobStatus | None") -> str | None:
    """The job's registered state, as metadata shows it."""
    state = None if status is None else status.entry_state
    return None if state is None else str(state)


def _savepoint_metadata(sp: "SavepointSummary") -> dict[str, Any]:
    return {
        "savepoint_id": sp.id,
        "savepoint_location": _location_value(sp.location),
        "savepoint_kind": sp.kind,
        "size_bytes": sp.size_bytes,
        "files": sp.files,
        "batches": MetadataValue.json(dict(sp.batches)),
        "watermark": MetadataValue.json(
            {q: watermark_time(ms) for q, ms in sp.watermark_ms.items()}
        ),
        "created_at": sp.created_at,
    }


def _with_list(
    context: OpExecutionContext, spec: StreamingJobSpec, translator: StreamingJobTranslator
) -> dict[str, Any]:
    """The job's savepoints (after this op), for its observation; the savepoint list asset
    and its partitions (the restore job's picker) brought up to date at once. Nothing if
    they cannot be listed (the op's own work is done)."""
    from dagster_defs.errors import StatefulRuntimeError

    target = context.op_config.get("target") or spec.savepoints.target
    try:
        found = context.resources.streaming_runtime.savepoints(
            spec.name, target=target, env=_env(context)
        )
    except StatefulRuntimeError as exc:
        context.log.warning(f"cannot list the savepoints of {spec.name}: {exc}")
        return {}
    if target == spec.savepoints.target:  # the list the sensor keeps (not another root's)
        change = _savepoint_list.changes(context.instance, spec, translator, found)
        change.apply(context.instance)
        for event in change.events:
            context.log_event(event)
    return {"savepoints": _savepoint_list.savepoint_table(found)}


def _take_savepoint(
    context: OpExecutionContext, spec: StreamingJobSpec, *, stop: bool
) -> "SavepointSummary":
    """``srt savepoint create`` (``--stop``) for the op's job; the runtime's error fails the
    run."""
    from dagster_defs.errors import StatefulRuntimeError

    runtime = context.resources.streaming_runtime
    target = context.op_config.get("target") or spec.savepoints.target
    try:
        sp = runtime.savepoint(
            spec.name,
            target=target,
            stop=stop,
            timeout=context.op_config.get("timeout_s"),
            env=_env(context),
        )
    except StatefulRuntimeError as exc:
        from stateful_runtime.masking import mask_text

        raise Failure(description=mask_text(str(exc)), metadata={"error": _kind(exc)}) from exc
    context.log.info(
        f"savepoint {sp.id} of {spec.name} at {sp.location}: "
        f"{sp.size_bytes:,} bytes, batches {dict(sp.batches)}"
        + ("; the job is stopped" if stop else "")
    )
    return sp


def _kind(exc: Exception) -> str:
    """The runtime's name for an error (an srt command's error carries it as ``kind``)."""
    return str(getattr(exc, "kind", None) or type(exc).__name__)


def _observe(
    context: OpExecutionContext,
    translator: StreamingJobTranslator,
    spec: StreamingJobSpec,
    description: str,
    metadata: Mapping[str, Any],
) -> None:
    context.log_event(
        AssetObservation(
            asset_key=translator.get_job_asset_key(spec),
            description=description,
            metadata=dict(metadata),
        )
    )


_TARGET = Field(
    str,
    is_required=False,
    description="Savepoint root: a directory or s3://bucket/prefix (default: the spec's "
    "SavepointPolicy.target, else the job's savepoint.dir, else $SRT_HOME/savepoints).",
)
_TIMEOUT = Field(
    float,
    is_required=False,
    description="How long to wait for a clean stop (default: the runtime's stop_timeout_s).",
)


def savepoint_job(
    specs: Sequence[StreamingJobSpec], translator: StreamingJobTranslator
) -> JobDefinition:
    """Take a savepoint of a job now (of its last committed batch: the job may be running or
    stopped), optionally followed by the retention policy; the periodic schedules run it."""

    @op(
        name=f"{SAVEPOINT_JOB}_op",
        config_schema={
            "job": job_name_field(specs, "take a savepoint of"),
            "target": _TARGET,
            "apply_retention": Field(
                bool,
                default_value=False,
                description="Then dispose of the job's savepoints beyond the spec's "
                "SavepointPolicy (keep, max_age) under the same root.",
            ),
            "timeout_s": _TIMEOUT,
        },
        required_resource_keys=runtime_keys(specs),
    )
    def _savepoint(context: OpExecutionContext) -> None:
        from dagster_defs.errors import StatefulRuntimeError

        spec = _spec(specs, context.op_config["job"])
        runtime = context.resources.streaming_runtime
        status = runtime.status(spec.name)
        sp = _take_savepoint(context, spec, stop=False)
        metadata = {
            **_savepoint_metadata(sp),
            "job_state": _state(status),
            "action": "savepoint",
        }
        if context.op_config["apply_retention"]:
            policy = spec.savepoints
            try:
                disposed = runtime.prune_savepoints(
                    spec.name,
                    sp.root,
                    keep=policy.keep,
                    max_age_s=None if policy.max_age is None else policy.max_age.total_seconds(),
                    env=_env(context),
                )
            except StatefulRuntimeError as exc:
                raise Failure(
                    description=f"savepoint {sp.location} was taken, but the retention "
                    f"policy failed: {exc}"
                ) from exc
            for location in disposed:
                context.log.info(f"retention: disposed of {location}")
            metadata["disposed"] = MetadataValue.json(disposed)
            metadata["retention"] = f"keep {policy.keep}, max age {_age(policy.max_age)}"
        metadata.update(_with_list(context, spec, translator))
        _observe(context, translator, spec, f"savepoint {sp.id} at {sp.location}", metadata)

    @job(
        name=SAVEPOINT_JOB,
        description="Take a savepoint of a streaming job (`srt savepoint create JOB`), "
        "optionally then apply its retention policy.",
    )
    def _job() -> None:
        _savepoint()

    return _job


def stop_with_savepoint_job(
    specs: Sequence[StreamingJobSpec], translator: StreamingJobTranslator
) -> JobDefinition:
    """Stop a running job cleanly, then take a savepoint of its final committed batch."""

    @op(
        name=f"{STOP_WITH_SAVEPOINT_JOB}_op",
        config_schema={
            "job": job_name_field(specs, "stop with a savepoint"),
            "target": _TARGET,
            "timeout_s": _TIMEOUT,
        },
        required_resource_keys=runtime_keys(specs),
    )
    def _stop(context: OpExecutionContext) -> None:
        spec = _spec(specs, context.op_config["job"])
        sp = _take_savepoint(context, spec, stop=True)
        after = context.resources.streaming_runtime.status(spec.name)
        _observe(
            context,
            translator,
            spec,
            f"stopped with savepoint {sp.id} at {sp.location}",
            {
                **_savepoint_metadata(sp),
                "job_state": _state(after),
                "action": "stop",
                **_with_list(context, spec, translator),
            },
        )

    @job(
        name=STOP_WITH_SAVEPOINT_JOB,
        description="Stop a streaming job with a savepoint (`srt savepoint create JOB --stop`).",
    )
    def _job() -> None:
        _stop()

    return _job


def _upgrade(
    context: OpExecutionContext,
    spec: StreamingJobSpec,
    translator: StreamingJobTranslator,
    name: str,
    *,
    action: str,
    from_savepoint: str | None,
) -> None:
    """``srt upgrade`` of ``spec``'s job file from its running state or ``from_savepoint``;
    the runtime's error fails the run with what to do; the result observed on the job asset."""
    from dagster_defs.errors import StatefulRuntimeError
    from stateful_runtime.masking import mask_text

    runtime = context.resources.streaming_runtime
    # Without a parallelism the runtime keeps the job's current one (a rescale sticks).
    n = context.op_config.get("parallelism")
    if n is not None and n < 1:
        raise Failure(description=f"parallelism must be >= 1, got {n}")
    try:
        config = launch_config(spec, context.resources)
        # One runtime command: check the job file plans and takes the state, stop with a
        # savepoint, relaunch from it, wait for RUNNING and a batch of its own.
        done = runtime.upgrade(
            spec.name,
            spec.job_file,
            config,
            parallelism=n,
            from_savepoint=from_savepoint,
            target=context.op_config.get("target") or spec.savepoints.target,
            stop_timeout=context.op_config.get("timeout_s"),
            env={**_env(context), **push_env(spec, translator, runtime)},
        )
    except StatefulRuntimeError as exc:
        details = getattr(exc, "details", {})
        metadata: dict[str, Any] = {"error": _kind(exc)}
        if details.get("stage"):
            metadata["stage"] = details["stage"]
        if details.get("savepoint_location"):
            metadata["savepoint_location"] = details["savepoint_location"]
        if details.get("stage") == "relaunch":
            description = f"{exc}\n\nRun {name} with from_savepoint set to that savepoint."
        else:
            description = str(exc)
        raise Failure(description=mask_text(description), metadata=metadata) from exc
    context.log.info(
        f"{action}: {spec.name} restarted from {done.restored_from} as pid {done.pid}: "
        f"{mask_text(shlex.join(done.command))}"
    )
    if done.committed is False:
        context.log.warning(
            f"{spec.name} is RUNNING but committed no micro-batch within "
            f"{runtime.commit_timeout_s:.0f} s: is there input in its source?"
        )
    metadata = {
        "action": action,
        "restored_from": _location_value(done.restored_from),
        "pid": done.pid,
        "job_file": spec.job_file,
        "parallelism": done.parallelism,
        "state_partitions": MetadataValue.json(dict(done.state_partitions)),
        "last_committed_batch": MetadataValue.json(dict(done.last_committed)),
        "command": mask_text(shlex.join(done.command)),
        "log_path": MetadataValue.path(done.log_path),
    }
    if done.savepoint is not None:
        metadata.update(_savepoint_metadata(done.savepoint))
        metadata.update(_with_list(context, spec, translator))
    _observe(
        context,
        translator,
        spec,
        f"{action}: restarted from {done.restored_from} as pid {done.pid}",
        metadata,
    )


def _relaunch_op(
    specs: Sequence[StreamingJobSpec],
    translator: StreamingJobTranslator,
    name: str,
    *,
    rescale: bool,
):
    resource_keys = runtime_keys(specs).union(*(s.resource_keys for s in specs))
    parallelism = Field(
        int,
        is_required=rescale,
        description="State partitions of the relaunched job (--parallelism); "
        + ("required." if rescale else "default: the job's current parallelism."),
    )

    @op(
        name=f"{name}_op",
        config_schema={
            "job": job_name_field(specs, "rescale" if rescale else "upgrade"),
            "parallelism": parallelism,
            "from_savepoint": Field(
                str,
                is_required=False,
                description="Start from this savepoint (id, directory or s3:// URL) instead of "
                "stopping the job with a new one; only for a job that is not running (e.g. "
                "after a failed upgrade).",
            ),
            "target": _TARGET,
            "timeout_s": _TIMEOUT,
        },
        required_resource_keys=resource_keys,
    )
    def _relaunch(context: OpExecutionContext) -> None:
        spec = _spec(specs, context.op_config["job"])
        _upgrade(
            context,
            spec,
            translator,
            name,
            action="rescale" if rescale else "upgrade",
            from_savepoint=context.op_config.get("from_savepoint"),
        )

    return _relaunch


def upgrade_job(
    specs: Sequence[StreamingJobSpec], translator: StreamingJobTranslator
) -> JobDefinition:
    """Stop with a savepoint and start the job file, as it is now, from it (Flink's stateful
    upgrade). New code that cannot take the job's state fails the run with the runtime's list
    of differences (`srt savepoint check`) before anything is stopped."""
    relaunch = _relaunch_op(specs, translator, UPGRADE_JOB, rescale=False)

    @job(
        name=UPGRADE_JOB,
        description="Upgrade a streaming job: stop it with a savepoint, then run its job file "
        "(the new code) from that savepoint (`srt run JOB_FILE --from-savepoint ID`).",
    )
    def _job() -> None:
        relaunch()

    return _job


def rescale_job(
    specs: Sequence[StreamingJobSpec], translator: StreamingJobTranslator
) -> JobDefinition:
    """Stop with a savepoint and relaunch with a new parallelism (state partition count)."""
    relaunch = _relaunch_op(specs, translator, RESCALE_JOB, rescale=True)

    @job(
        name=RESCALE_JOB,
        description="Rescale a streaming job: stop it with a savepoint, then relaunch it from "
        "that savepoint with `--parallelism N` (its state is repartitioned).",
    )
    def _job() -> None:
        relaunch()

    return _job


def restore_job(spec: StreamingJobSpec, translator: StreamingJobTranslator) -> JobDefinition:
    """Run ``spec``'s job file (as deployed now: an upgrade if it changed) from a savepoint
    picked from the job's savepoint list: the job's partitions are its savepoints
    (:mod:`dagster_defs._savepoint_list`), so the launchpad's partition picker is the list.
    The job must not be running; a savepoint not in its list (another job's, or gone) is
    refused with the ones there are."""
    name = _savepoint_list.restore_job_name(spec)

    @op(
        name=f"{name}_op",
        config_schema={
            "parallelism": Field(
                int,
                is_required=False,
                description="State partitions (--parallelism; default: the job's current "
                "parallelism): the savepoint's state is repartitioned.",
            ),
            "timeout_s": _TIMEOUT,
        },
        required_resource_keys=runtime_keys([spec]) | set(spec.resource_keys),
    )
    def _restore(context: OpExecutionContext) -> None:
        from dagster_defs.errors import StatefulRuntimeError

        picked = context.partition_key
        runtime = context.resources.streaming_runtime
        try:
            ours = runtime.savepoints(spec.name, target=spec.savepoints.target, env=_env(context))
        except StatefulRuntimeError as exc:
            raise Failure(description=f"cannot list the savepoints of {spec.name}: {exc}") from exc
        sp = next((s for s in ours if s.id == picked), None)
        if sp is None:
            raise Failure(description=_not_ours(context, spec, picked, ours))
        status = runtime.status(spec.name)
        if status is not None and status.entry_state == "RUNNING" and status.alive:
            raise Failure(
                description=f"{spec.name} is running (pid {status.pid}): starting it from "
                f"savepoint {picked} (batch {_savepoint_list.row(sp)['batch']}) would rewind "
                f"it. Stop it first (stop_with_savepoint keeps its current state as a savepoint "
                f"too; stop_streaming_job keeps it in the checkpoint), then launch this again."
            )
        context.log.info(f"restoring {spec.name} from {sp.id} ({sp.kind}) at {sp.location}")
        _upgrade(context, spec, translator, name, action="restore", from_savepoint=sp.location)

    @job(
        name=name,
        partitions_def=_savepoint_list.partitions(spec),
        description=f"Start `{spec.name}` from a savepoint picked from its list (the "
        f"partition: `{_savepoint_list.asset_key(spec, translator).to_user_string()}`): its "
        f"job file as deployed now (an upgrade if the code changed; `srt upgrade "
        f"{spec.name} JOB_FILE --from-savepoint ID`). The job must be stopped.",
        tags={"streaming_job": spec.name},
    )
    def _job() -> None:
        _restore()

    return _job


def _not_ours(
    context: OpExecutionContext,
    spec: StreamingJobSpec,
    picked: str,
    ours: Sequence["SavepointSummary"],
) -> str:
    """Why ``picked`` is not a savepoint of ``spec``'s job: another job's (named), or gone."""
    from dagster_defs.errors import StatefulRuntimeError

    listed = ", ".join(s.id for s in reversed(ours)) or "none"
    pick = f"pick one of {spec.name}'s savepoints ({listed})"
    try:
        every = context.resources.streaming_runtime.savepoints(None, env=_env(context))
    except StatefulRuntimeError:
        every = []
    other = next((s for s in every if s.id == picked), None)
    if other is not None and other.job != spec.name:
        return (
            f"savepoint {picked} holds the state of job {other.job!r}, not {spec.name!r}: "
            f"a job starts only from its own savepoints; {pick}"
        )
    return (
        f"savepoint {picked} is not among {spec.name}'s savepoints (disposed of, or under "
        f"another savepoint root); {pick}"
    )


def savepoint_schedule(spec: StreamingJobSpec, target: JobDefinition) -> ScheduleDefinition:
    """Periodic savepoints of one job: on ``spec.savepoints.cron`` a run of ``target`` (the
    ``savepoint_streaming_job``) with retention, if the job is running; else a skip."""
    policy = spec.savepoints

    @schedule(
        name=f"{identifier(spec.name)}_savepoint_schedule",
        cron_schedule=policy.cron,
        execution_timezone=policy.timezone,
        job=target,
        default_status=DefaultScheduleStatus.RUNNING
        if policy.running
        else DefaultScheduleStatus.STOPPED,
        required_resource_keys={"streaming_runtime"},
        description=f"Periodic savepoints of `{spec.name}` ({policy.cron}, {policy.timezone}), "
        f"keeping {policy.keep or 'any number'} no older than {_age(policy.max_age)}; "
        f"skips while the job is not running.",
    )
    # As with the sensor: resources come as keyword arguments when called directly.
    def _tick(context: ScheduleEvaluationContext, **_: Any) -> RunRequest | SkipReason:
        runtime = context.resources.streaming_runtime
        status = runtime.status(spec.name)
        if status is None:
            return SkipReason(f"{spec.name} has never run here; nothing to save")
        state = status.entry_state
        if state != "RUNNING" or not status.alive:
            shown = state if state != "RUNNING" else "RUNNING in the registry, but its pid is gone"
            return SkipReason(
                f"{spec.name} is not running ({shown}): periodic savepoints are taken of running "
                f"jobs only; its checkpoint and last savepoint still hold its state"
            )
        return RunRequest(
            run_config={
                "ops": {
                    f"{SAVEPOINT_JOB}_op": {
                        "config": {"job": spec.name, "apply_retention": True}
                        | ({"target": policy.target} if policy.target else {})
                    }
                }
            },
            tags={"streaming_job": spec.name, "savepoint": "periodic"},
        )

    return _tick


def _age(age: timedelta | None) -> str:
    """A retention age as a person writes it ("7 d", "36 h", "90 min"), not "7 days, 0:00:00"."""
    if age is None:
        return "any age"
    seconds = age.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"
