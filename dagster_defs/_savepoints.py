"""Savepoints from Dagster: a periodic-savepoint schedule per streaming job, and jobs that
trigger a savepoint, stop a job with one, and upgrade or rescale a job through one.

Everything goes through ``srt`` processes (``srt savepoint create|prune``, and the detached
``srt run --from-savepoint`` launch), in the ``streaming_runtime`` resource's registry and with
the ``s3`` resource's endpoint and credentials in their environment (savepoint roots may be
``s3://``). Runtime errors fail the Dagster run with the runtime's own message.

=============================  ==========================================================
``<job>_savepoint_schedule``   per job, on its ``SavepointPolicy.cron``: a savepoint of the
                               running job, then the retention policy; skips a job that is
                               not running
``savepoint_streaming_job``    a savepoint now (running or stopped job: the last committed
                               batch); optionally applies the retention policy
``stop_with_savepoint``        stop the job cleanly, then a savepoint of its final batch
``upgrade_streaming_job``      check the (new) job file plans, stop with a savepoint, relaunch
                               the job file from it, wait for RUNNING and a committed batch
``rescale_streaming_job``      the same with ``--parallelism N``: the state is repartitioned
=============================  ==========================================================
"""

import shlex
from collections.abc import Mapping, Sequence
from typing import Any

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

from dagster_defs._launch import check_plan_job, launch_config
from dagster_defs._specs import StreamingJobSpec
from dagster_defs._translator import StreamingJobTranslator, identifier
from dagster_defs.resources import s3_env

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


def _env(context: OpExecutionContext) -> dict[str, str]:
    return s3_env(getattr(context.resources, "s3", None))


def _location_value(location: str) -> Any:
    return MetadataValue.url(location) if "://" in location else MetadataValue.path(location)


def _savepoint_metadata(summary: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "savepoint_id": summary["id"],
        "savepoint_location": _location_value(summary["location"]),
        "savepoint_kind": summary.get("kind"),
        "size_bytes": summary["size_bytes"],
        "files": summary["files"],
        "batches": MetadataValue.json(summary["batches"]),
        "watermark_ms": MetadataValue.json(summary["watermark_ms"]),
        "created_at": summary["created_at"],
    }


def _root(location: str) -> str:
    """The savepoint root a savepoint's location lies in (``<root>/<id>``)."""
    return location.rstrip("/").rpartition("/")[0]


def _take_savepoint(
    context: OpExecutionContext, spec: StreamingJobSpec, *, stop: bool
) -> dict[str, Any]:
    """``srt savepoint create`` (``--stop``) for the op's job; the runtime's error fails the
    run."""
    from stateful_runtime.exceptions import StatefulRuntimeError

    runtime = context.resources.streaming_runtime
    target = context.op_config.get("target") or spec.savepoints.target
    try:
        summary = runtime.savepoint(
            spec.name,
            target=target,
            stop=stop,
            timeout=context.op_config.get("timeout_s"),
            env=_env(context),
        )
    except StatefulRuntimeError as exc:
        raise Failure(description=str(exc), metadata={"error": type(exc).__name__}) from exc
    context.log.info(
        f"savepoint {summary['id']} of {spec.name} at {summary['location']}: "
        f"{summary['size_bytes']:,} bytes, batches {summary['batches']}"
        + ("; the job is stopped" if stop else "")
    )
    return summary


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
        required_resource_keys={"streaming_runtime", "s3"},
    )
    def _savepoint(context: OpExecutionContext) -> None:
        from stateful_runtime.exceptions import StatefulRuntimeError

        spec = _spec(specs, context.op_config["job"])
        runtime = context.resources.streaming_runtime
        state = (runtime.entry(spec.name) or {}).get("state")
        summary = _take_savepoint(context, spec, stop=False)
        metadata = {**_savepoint_metadata(summary), "job_state": state, "action": "savepoint"}
        if context.op_config["apply_retention"]:
            policy = spec.savepoints
            try:
                disposed = runtime.prune_savepoints(
                    spec.name,
                    _root(summary["location"]),
                    keep=policy.keep,
                    max_age_s=None if policy.max_age is None else policy.max_age.total_seconds(),
                    env=_env(context),
                )
            except StatefulRuntimeError as exc:
                raise Failure(
                    description=f"savepoint {summary['location']} was taken, but the retention "
                    f"policy failed: {exc}"
                ) from exc
            for location in disposed:
                context.log.info(f"retention: disposed of {location}")
            metadata["disposed"] = MetadataValue.json(disposed)
            metadata["retention"] = f"keep {policy.keep}, max age {policy.max_age}"
        _observe(
            context,
            translator,
            spec,
            f"savepoint {summary['id']} at {summary['location']}",
            metadata,
        )

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
        required_resource_keys={"streaming_runtime", "s3"},
    )
    def _stop(context: OpExecutionContext) -> None:
        spec = _spec(specs, context.op_config["job"])
        summary = _take_savepoint(context, spec, stop=True)
        after = context.resources.streaming_runtime.entry(spec.name) or {}
        _observe(
            context,
            translator,
            spec,
            f"stopped with savepoint {summary['id']} at {summary['location']}",
            {**_savepoint_metadata(summary), "job_state": after.get("state"), "action": "stop"},
        )

    @job(
        name=STOP_WITH_SAVEPOINT_JOB,
        description="Stop a streaming job with a savepoint (`srt savepoint create JOB --stop`).",
    )
    def _job() -> None:
        _stop()

    return _job


def _relaunch_op(
    specs: Sequence[StreamingJobSpec],
    translator: StreamingJobTranslator,
    name: str,
    *,
    rescale: bool,
):
    resource_keys = {"streaming_runtime", "s3"}.union(*(s.resource_keys for s in specs))
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
        from stateful_runtime.checkpoints import layout
        from stateful_runtime.exceptions import StatefulRuntimeError
        from stateful_runtime.runtime import launcher
        from stateful_runtime.runtime.launcher import set_args

        spec = _spec(specs, context.op_config["job"])
        runtime = context.resources.streaming_runtime
        entry = runtime.entry(spec.name) or {}
        # An upgrade keeps the job's current parallelism (a rescale may have changed it);
        # without one on record, the job file's own applies.
        n = context.op_config.get("parallelism") or entry.get("parallelism")
        if n is not None and n < 1:
            raise Failure(description=f"parallelism must be >= 1, got {n}")
        action = "rescale" if rescale else "upgrade"
        try:
            # The job file as it is now (the new code) must plan before the old job stops.
            config = launch_config(spec, context.resources)
            check_plan_job(runtime.explain(spec.job_file, config), spec)
        except StatefulRuntimeError as exc:
            raise Failure(
                description=f"{spec.job_file} does not plan; the running job was left alone: {exc}"
            ) from exc

        running = launcher.live(entry)
        source = context.op_config.get("from_savepoint")
        if source and running:
            raise Failure(
                description=f"{spec.name} is running (pid {entry.get('pid')}); leave "
                f"from_savepoint unset to stop it with a savepoint and {action} from that"
            )
        # The new code must take the state (the running job's checkpoint, or the savepoint
        # given) before anything is stopped or started: the runtime lists the differences.
        check = runtime.srt(
            ["savepoint", "check", str(runtime.resolve(spec.job_file)),
             *([source] if source else []), *set_args(config)],
            timeout=120, env=_env(context),
        )
        if check.returncode != 0:
            left = "the running job was left alone" if running else "nothing was started"
            raise Failure(
                description=f"{spec.job_file} cannot take {spec.name}'s state; {left}:\n"
                f"{check.stderr.strip()[-3000:]}"
            )
        summary: dict[str, Any] | None = None
        if not source:
            if not running:
                last = (entry.get("last_savepoint") or {}).get("location")
                hint = f" (its last savepoint: {last})" if last else ""
                raise Failure(
                    description=f"{spec.name} is not running "
                    f"({entry.get('state', 'never started')}): there is nothing to stop with a "
                    f"savepoint; set from_savepoint to start it from a savepoint{hint}"
                )
            summary = _take_savepoint(context, spec, stop=True)
            source = summary["location"]

        try:
            launch = runtime.ensure_running(
                spec.name,
                spec.job_file,
                config,
                from_savepoint=source,
                parallelism=n,
                env=_env(context),
            )
            if not launch.launched:
                raise Failure(
                    description=f"{spec.name} was started by someone else (pid {launch.pid}) "
                    f"after it stopped; it did not restore {source}"
                )
            context.log.info(
                f"relaunched {spec.name} from {source} as pid {launch.pid}: "
                f"{shlex.join(launch.command or [])}"
            )
            entry = launcher.wait_running(spec.name, launch.pid, timeout=runtime.launch_timeout_s)
            committed = _wait_committed_after_restore(entry, runtime.commit_timeout_s)
        except StatefulRuntimeError as exc:
            raise Failure(
                description=f"{exc}\n\n{spec.name} is not running; its state is in savepoint "
                f"{source}. Fix the job and run {name} with from_savepoint: {source} (or run "
                f"the previous code from it).",
                metadata={"error": type(exc).__name__, "savepoint_location": source},
            ) from exc
        if committed is None:
            context.log.warning(
                f"{spec.name} is RUNNING but committed no micro-batch within "
                f"{runtime.commit_timeout_s:.0f} s: is there input in its source?"
            )
        entry = runtime.entry(spec.name) or entry
        partitions = {}
        for q, info in (entry.get("queries") or {}).items():
            batch = layout.last_committed(info["checkpoint_dir"])
            partitions[q] = (
                None
                if batch is None
                else layout.state_partitions(info["checkpoint_dir"], batch)
            )
        metadata: dict[str, Any] = {
            "action": action,
            "restored_from": _location_value(source),
            "pid": launch.pid,
            "job_file": spec.job_file,
            "parallelism": entry.get("parallelism"),
            "state_partitions": MetadataValue.json(partitions),
            "last_committed_batch": MetadataValue.json(committed or {}),
            "command": shlex.join(launch.command or []),
            "log_path": MetadataValue.path(str(launch.log_path)),
        }
        if summary is not None:
            metadata.update(_savepoint_metadata(summary))
        _observe(
            context,
            translator,
            spec,
            f"{action}: restarted from {source} as pid {launch.pid}",
            metadata,
        )

    return _relaunch


def _wait_committed_after_restore(
    entry: Mapping[str, Any], timeout: float
) -> dict[str, int | None] | None:
    """Wait until the restored job commits a micro-batch of its own: past the savepoint's
    batch and, when it rescaled, past the batch Spark's state repartition wrote before the
    queries started. Returns the last committed batches, None if none came in ``timeout``."""
    from stateful_runtime.checkpoints import layout
    from stateful_runtime.runtime import launcher

    restore = entry.get("restore") or {}
    batches = restore.get("batches") or {}
    partitions = restore.get("state_partitions") or {}
    queries = entry.get("queries") or {}
    after = {
        q: batches.get(q, -1)
        + (1 if partitions.get(q) not in (None, entry.get("parallelism")) else 0)
        for q in queries
    }

    def fresh(current: dict[str, Any]) -> bool:
        if any(
            (layout.last_committed(info["checkpoint_dir"]) or -1) > after[q]
            for q, info in queries.items()
        ):
            return True
        # No input, nothing to commit: the new process reported every query caught up.
        health = current.get("health") or {}
        return bool(queries) and all((health.get(q) or {}).get("lag_records") == 0 for q in queries)

    done = launcher.wait_until(
        entry["job"],
        entry["pid"],
        fresh,
        timeout=timeout,
        what="committing a micro-batch",
        raise_on_timeout=False,
    )
    return None if done is None else launcher.last_committed(done)


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
        f"keeping {policy.keep or 'any number'} no older than {policy.max_age or 'any age'}; "
        f"skips while the job is not running.",
    )
    # As with the sensor: resources come as keyword arguments when called directly.
    def _tick(context: ScheduleEvaluationContext, **_: Any) -> RunRequest | SkipReason:
        runtime = context.resources.streaming_runtime
        entry = runtime.entry(spec.name)
        if entry is None:
            return SkipReason(f"{spec.name} has never run here; nothing to save")
        state = entry.get("state")
        if state != "RUNNING" or not runtime.pid_alive(entry.get("pid")):
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
