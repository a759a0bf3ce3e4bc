"""The ``stop_streaming_job`` Dagster job: ``srt stop JOB`` from Dagster."""

from collections.abc import Sequence

from dagster import AssetObservation, Field, JobDefinition, OpExecutionContext, job, op

from dagster_defs._specs import StreamingJobSpec
from dagster_defs._translator import StreamingJobTranslator


def stop_job(
    specs: Sequence[StreamingJobSpec],
    translator: StreamingJobTranslator,
    name: str = "stop_streaming_job",
) -> JobDefinition:
    """A job whose op stops one streaming job cleanly (SIGTERM: the queries stop, the registry
    says STOPPED, the health sensor leaves it alone; the next materialisation resumes it from
    its checkpoint). Stopping a job that is not running succeeds and says so."""
    by_name = {s.name: s for s in specs}
    names = ", ".join(by_name) or "none"
    description = f"Name of the streaming job to stop (one of: {names})."
    job_field = (
        Field(str, default_value=specs[0].name, description=description)
        if len(specs) == 1
        else Field(str, description=description)
    )

    @op(
        name=f"{name}_op",
        config_schema={
            "job": job_field,
            "timeout_s": Field(
                float,
                is_required=False,
                description=(
                    "How long to wait for a clean stop (default: the runtime's stop_timeout_s)."
                ),
            ),
        },
        required_resource_keys={"streaming_runtime"},
    )
    def _stop(context: OpExecutionContext) -> None:
        from dagster_defs.errors import JobError

        job_name = context.op_config["job"]
        spec = by_name.get(job_name)
        if spec is None:
            raise JobError(
                f"no streaming job named {job_name!r} in these definitions (known: {names})"
            )
        runtime = context.resources.streaming_runtime
        status = runtime.status(job_name)
        if status is None or not status.live:
            state = status.entry_state if status is not None else "never started"
            context.log.info(f"{job_name} is not running ({state}); nothing to stop")
            output = f"not running ({state})"
            after = status
        else:
            stopped = runtime.stop(job_name, timeout=context.op_config.get("timeout_s"))
            after = stopped.status
            output = f"stopped {job_name} (pid {stopped.pid}); state {after.entry_state}"
            context.log.info(output)
        context.log_event(
            AssetObservation(
                asset_key=translator.get_job_asset_key(spec),
                description=output,
                metadata={
                    "state": str(after.entry_state) if after and after.entry_state else None,
                    "pid": after.pid if after else None,
                    "ended_at": after.ended_at if after else None,
                    "action": "stop",
                },
            )
        )

    @job(name=name, description="Stop a streaming job cleanly (`srt stop JOB`).")
    def _job() -> None:
        _stop()

    return _job
