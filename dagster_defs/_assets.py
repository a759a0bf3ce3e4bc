"""Asset factories: a streaming job (materialising it makes it run) and its sink tables."""

import json
import shlex
import time
from collections.abc import Mapping
from typing import Any

from dagster import (
    AssetExecutionContext,
    AssetsDefinition,
    Failure,
    MaterializeResult,
    MetadataValue,
    TableColumn,
    TableSchema,
    multi_asset,
)

from dagster_defs._health import health_check_specs
from dagster_defs._launch import launch_config, push_env
from dagster_defs._specs import SinkTableSpec, StreamingJobSpec
from dagster_defs._stream_events import control_endpoint
from dagster_defs._translator import StreamingJobTranslator, identifier


def _code(text: str) -> MetadataValue:
    return MetadataValue.md(f"```\n{text}\n```")


def _failure(exc: Exception, log_path: Any = None) -> Failure:
    from stateful_runtime.masking import mask_text

    metadata: dict[str, Any] = {"error": type(exc).__name__}
    if log_path is not None:
        metadata["log_path"] = MetadataValue.path(str(log_path))
    return Failure(description=mask_text(str(exc)), metadata=metadata)


def job_asset(spec: StreamingJobSpec, translator: StreamingJobTranslator) -> AssetsDefinition:
    """The asset of one streaming job: materialising it launches the job detached (or reuses
    the live process), waits until it is RUNNING and has committed a micro-batch, and records
    pid, Spark application id, checkpoint, plan and log as metadata."""

    key = translator.get_job_asset_key(spec)

    @multi_asset(
        name=f"{identifier(spec.name)}_run",
        specs=[translator.get_job_asset_spec(spec)],
        check_specs=health_check_specs(key, spec),
        required_resource_keys={"streaming_runtime", *spec.resource_keys},
    )
    def _run(context: AssetExecutionContext) -> MaterializeResult:
        from dagster_defs._sensor import health_checks
        from dagster_defs.errors import StatefulRuntimeError
        from stateful_runtime.masking import mask_config, mask_text

        runtime = context.resources.streaming_runtime
        log_path = None
        try:
            config = launch_config(spec, context.resources)
            since = time.time()
            # Plans the job file (it must build the job the spec names) and resumes the job's
            # checkpoint; starting from a savepoint is the upgrade and rescale jobs' business.
            launch = runtime.launch(
                spec.name, spec.job_file, config, env=push_env(spec, translator, runtime)
            )
            log_path = launch.log_path
            committed: Mapping[str, int | None] | None
            if launch.launched:
                context.log.info(
                    f"launched {spec.name} as pid {launch.pid}: "
                    f"{mask_text(shlex.join(launch.command or ()))}; log {log_path}"
                )
                runtime.wait_running(spec.name, launch.pid)
                context.log.info(f"{spec.name} is RUNNING; waiting for a committed batch")
                waited = runtime.wait_committed(spec.name, launch.pid, since=since)
                committed = waited.last_committed if waited.reached else None
                if committed is None:
                    context.log.warning(
                        f"{spec.name} committed no micro-batch within "
                        f"{runtime.commit_timeout_s:.0f} s of RUNNING: is there input in its "
                        f"source? The health sensor keeps watching it."
                    )
                status = waited.status
            else:
                status = launch.status
                context.log.info(
                    f"{spec.name} is already {status.entry_state} as pid {launch.pid}; reusing it"
                )
                if launch.config_drift:
                    context.log.warning(
                        f"the live {spec.name} runs with different "
                        f"{', '.join(launch.config_drift)} than the spec; stop it "
                        f"(stop_streaming_job) and materialise again to apply"
                    )
                if status.entry_state == "STARTING":
                    status = runtime.wait_running(spec.name, launch.pid)
                committed = status.last_committed
        except StatefulRuntimeError as exc:
            raise _failure(exc, log_path) from exc

        # What the launch was; what the process is now (state, last commit) the health
        # checks say, re-judged by the health sensor every tick, so nothing here goes stale.
        metadata: dict[str, Any] = {
            "pid": MetadataValue.text(str(launch.pid)),
            "launched": launch.launched,
            "run_id": status.run_id,
            "spark_app_id": status.spark_app_id,
            "spark_master": status.master,
            "checkpoint_dir": MetadataValue.path(str(status.checkpoint_dir)),
            "log_path": MetadataValue.path(str(launch.log_path)),
            # What the process restored from (a savepoint, by the upgrade or rescale job).
            "restored_from": status.restored_from,
            "started_at": status.started_at,
            "committed_at_launch": MetadataValue.json(dict(committed or {})),
            # Config, command and plan as shown anywhere: every secret masked.
            "config": MetadataValue.json(json.loads(json.dumps(mask_config(config), default=str))),
            "plan": _code(mask_text(launch.plan)),
        }
        if launch.command:
            metadata["command"] = mask_text(shlex.join(launch.command))
        endpoint = control_endpoint(status)
        if endpoint is not None:  # the job process's health (it wants its bearer token)
            metadata["control endpoint"] = endpoint
        if launch.config_drift:
            metadata["config_drift"] = list(launch.config_drift)
        try:
            now_status = runtime.status(spec.name) or status
        except StatefulRuntimeError:
            now_status = status
        checks = health_checks(spec, now_status, time.time())
        return MaterializeResult(metadata=metadata, check_results=[c.result(key) for c in checks])

    return _run


def sink_asset(
    spec: StreamingJobSpec, table: SinkTableSpec, translator: StreamingJobTranslator
) -> AssetsDefinition:
    """The asset of one sink table. The job writes it; materialising records a snapshot
    (rows, schema, the last micro-batch the sink committed) so checks and lineage have a
    version to attach to."""

    @multi_asset(
        name=f"{identifier(spec.name)}_{identifier(table.table)}_snapshot",
        specs=[translator.get_sink_asset_spec(spec, table)],
        required_resource_keys={"warehouse"},
    )
    def _snapshot(context: AssetExecutionContext) -> MaterializeResult:
        warehouse = context.resources.warehouse
        try:
            read = warehouse.read(table.table, spec.name, table.query)
        except LookupError as exc:
            job_key = translator.get_job_asset_key(spec).to_user_string()
            raise Failure(
                description=(
                    f"table {table.table} is not in {warehouse.location()} yet: materialise "
                    f"the job asset {job_key} and let it commit a micro-batch with input ({exc})"
                )
            ) from exc
        except FileNotFoundError as exc:
            raise Failure(description=str(exc)) from exc
        schema = TableSchema(
            columns=[TableColumn(name, str(tp), constraints=None) for name, tp in read.columns]
        )
        last = read.last
        return MaterializeResult(
            metadata={
                "dagster/row_count": len(read.frame),
                "dagster/column_schema": schema,
                "warehouse": warehouse.kind,
                "database": MetadataValue.path(read.location)
                if warehouse.kind == "duckdb"
                else read.location,
                "last_sink_batch": last.batch_id if last else None,
                "last_sink_commit": str(last.committed_at) if last else None,
            }
        )

    return _snapshot
