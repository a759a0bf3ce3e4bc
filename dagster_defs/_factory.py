"""``build_definitions``: streaming job specs → Dagster Definitions."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import Any

from dagster import (
    AssetSelection,
    AssetSpec,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
    Definitions,
)

from dagster_defs._alerts import crash_job
from dagster_defs._assets import job_asset, sink_asset
from dagster_defs._checks import sink_checks
from dagster_defs._savepoint_list import savepoints_asset, savepoints_sensor
from dagster_defs._savepoints import (
    rescale_job,
    restore_job,
    runtime_keys,
    savepoint_job,
    savepoint_schedule,
    stop_with_savepoint_job,
    upgrade_job,
)
from dagster_defs._sensor import health_sensor
from dagster_defs._specs import StreamingJobSpec, config_error
from dagster_defs._stop import stop_job
from dagster_defs._translator import StreamingJobTranslator


def default_resources() -> dict[str, Any]:
    """Resources for local use: registry in $SRT_HOME (~/.srt), DuckDB under ./srt-data,
    Kafka on 127.0.0.1:9092, S3 from the usual AWS settings (nothing connects at load)."""
    import os

    from dagster_aws.s3 import S3Resource

    from dagster_defs.resources import DuckDBWarehouse, KafkaResource, StreamingRuntime

    return {
        "streaming_runtime": StreamingRuntime(),
        "warehouse": DuckDBWarehouse(path="srt-data/warehouse.duckdb"),
        "kafka": KafkaResource(),
        # An S3-compatible endpoint (moto, SeaweedFS, MinIO) for checkpoint mirrors and
        # savepoints; unset means AWS itself.
        "s3": S3Resource(endpoint_url=os.environ.get("SRT_S3_ENDPOINT_URL")),
    }


def build_definitions(
    specs: Sequence[StreamingJobSpec],
    *,
    translator: StreamingJobTranslator | None = None,
    resources: Mapping[str, Any] | None = None,
    sensor_interval: timedelta = timedelta(seconds=5),
    sensor_default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    automation_interval: timedelta | None = timedelta(seconds=5),
) -> Definitions:
    """Definitions for streaming jobs: per job an asset (materialising it runs the job) and a
    periodic-savepoint schedule, its savepoint list (an asset partitioned by savepoint) and a
    job restoring it from one picked from that list (``<job>_from_savepoint``), per sink table
    a downstream asset with checks, the health and savepoint-list sensors, and the jobs
    ``stop_streaming_job``, ``savepoint_streaming_job``, ``stop_with_savepoint``,
    ``upgrade_streaming_job``, ``rescale_streaming_job`` and ``streaming_job_crashed``
    (launched by the health sensor on a crash, for run-failure alerts).

    Args:
        specs: the jobs.
        translator: maps jobs and tables to asset keys, groups and descriptions.
        resources: resources by key, over :func:`default_resources` (``streaming_runtime``,
            ``warehouse``, ``kafka``, ``s3``).
        sensor_interval: minimum interval between health sensor ticks: how soon a crash
            reaches Dagster as a failed check and an alert run, and a commit as a sink-table
            materialisation when jobs do not push their commits themselves
            (``StreamingRuntime.dagster_url``) (5 s: a tick is one ``srt status`` process,
            ~0.2 s of CPU, and reads the ledger).
        sensor_default_status: whether the health sensor runs without being switched on.
        automation_interval: evaluation interval of the automation sensor these definitions
            bring, ``default_automation_condition_sensor``, on by default: it runs the sink
            tables' checks when the stream's commits materialise them, and downstream assets
            with automation conditions (dbt models from :mod:`dagster_defs.dbt`) in the same
            code location (5 s: models start within seconds of the commit's materialisation).
            None: no such sensor (bring your own
            ``AutomationConditionSensorDefinition``; Dagster's implicit one starts stopped).
    """
    translator = translator or StreamingJobTranslator()
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise config_error(f"job names repeat: {names}")
    all_resources = {**default_resources(), **(resources or {})}
    for spec in specs:
        missing = sorted(spec.resource_keys - set(all_resources))
        if missing:
            raise config_error(
                f"job {spec.name!r} takes config from resource(s) {missing}, "
                f"which are not in resources {sorted(all_resources)}"
            )
    if not timedelta(seconds=1) <= sensor_interval <= timedelta(hours=1):
        raise config_error(f"sensor_interval must be between 1 s and 1 h, got {sensor_interval}")
    if automation_interval is not None and not (
        timedelta(seconds=1) <= automation_interval <= timedelta(hours=1)
    ):
        raise config_error(
            f"automation_interval must be between 1 s and 1 h, got {automation_interval}"
        )

    assets: list[Any] = []
    checks: list[Any] = []
    for spec in specs:
        assets.append(job_asset(spec, translator))
        assets.append(savepoints_asset(spec, translator))
        for table in spec.sink_tables:
            assets.append(sink_asset(spec, table, translator))
            checks.append(sink_checks(spec, table, translator))
    keys = [k for a in assets for k in ([a.key] if isinstance(a, AssetSpec) else a.keys)]
    if len(set(keys)) != len(keys):
        raise config_error(
            f"asset keys repeat: {[k.to_user_string() for k in keys]}; override "
            f"the translator's get_*_asset_key to tell them apart"
        )
    jobs = (
        [
            stop_job(specs, translator),
            savepoint_job(specs, translator),
            stop_with_savepoint_job(specs, translator),
            upgrade_job(specs, translator),
            rescale_job(specs, translator),
            crash_job,
            *(restore_job(spec, translator) for spec in specs),
        ]
        if specs
        else []
    )
    sensors: list[Any] = (
        [
            health_sensor(
                specs,
                translator,
                minimum_interval=sensor_interval,
                default_status=sensor_default_status,
            ),
            savepoints_sensor(
                specs,
                translator,
                minimum_interval=sensor_interval,
                default_status=sensor_default_status,
                resource_keys=frozenset(runtime_keys(specs)),
            ),
        ]
        if specs
        else []
    )
    if specs and automation_interval is not None:
        sensors.append(automation_sensor(automation_interval))
    return Definitions(
        assets=assets,
        asset_checks=checks,
        sensors=sensors,
        jobs=jobs,
        schedules=[savepoint_schedule(spec, jobs[1]) for spec in specs],
        resources=all_resources,
    )


AUTOMATION_SENSOR = "default_automation_condition_sensor"


def automation_sensor(interval: timedelta) -> AutomationConditionSensorDefinition:
    """Dagster's default automation sensor, but running from the start: every asset and check
    of the code location with an automation condition (Dagster makes one implicitly only for
    conditions no sensor targets, and it starts stopped)."""
    return AutomationConditionSensorDefinition(
        AUTOMATION_SENSOR,
        target=AssetSelection.all() | AssetSelection.all_asset_checks(),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=int(interval.total_seconds()),
        description=(
            "Runs assets and checks whose automation conditions are met: a sink table's "
            "checks after the stream's commits materialise it, dbt models after their "
            "sources (the sink tables) update."
        ),
    )
