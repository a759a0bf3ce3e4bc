"""A job's savepoints as a list Dagster keeps current, and the picker restore and upgrade use.

Per job, an asset ``<job>_savepoints`` partitioned by savepoint: one dynamic partition per
savepoint (its key the savepoint's id), reported as materialised with the savepoint's batch,
watermark (a UTC time), size, location and why it was taken; each change of the list also
observes the whole list as a table, newest first. The ``streaming_job_savepoints`` sensor
keeps it current from ``srt savepoint list JOB --json`` every tick (savepoints taken with
``srt`` show too; disposed ones leave), and every savepoint op refreshes it at once.

The same partitions are the partitions of the job's ``<job>_from_savepoint`` job: its
launchpad's partition picker is this list (:func:`dagster_defs._savepoints.restore_job`).
"""

from collections.abc import Iterable, Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dagster import AddDynamicPartitionsRequest as AddPartitions
from dagster import (
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    AssetSpec,
    DagsterInstance,
    DefaultSensorStatus,
    DeleteDynamicPartitionsRequest,
    DynamicPartitionsDefinition,
    MetadataValue,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    TableColumn,
    TableRecord,
    TableSchema,
    sensor,
)

from dagster_defs._specs import StreamingJobSpec
from dagster_defs._translator import StreamingJobTranslator, identifier
from dagster_defs.resources import s3_env

if TYPE_CHECKING:
    from stateful_runtime.contract import SavepointSummary

SENSOR = "streaming_job_savepoints"
COLUMNS = ("id", "taken", "why", "batch", "watermark", "size (bytes)", "location")


def partitions(spec: StreamingJobSpec) -> DynamicPartitionsDefinition:
    """The job's savepoints as Dagster's dynamic partitions (key: the savepoint id)."""
    return DynamicPartitionsDefinition(name=f"{identifier(spec.name)}_savepoints")


def asset_key(spec: StreamingJobSpec, translator: StreamingJobTranslator) -> AssetKey:
    """The savepoint list's asset: the job asset's key with ``_savepoints`` appended."""
    *prefix, last = translator.get_job_asset_key(spec).path
    return AssetKey([*prefix, f"{last}_savepoints"])


def savepoints_asset(spec: StreamingJobSpec, translator: StreamingJobTranslator) -> AssetSpec:
    """The list as an asset of its own (reported, never materialised by hand)."""
    return AssetSpec(
        key=asset_key(spec, translator),
        deps=[translator.get_job_asset_key(spec)],
        description=f"The savepoints of streaming job `{spec.name}`, one partition each (the "
        f"savepoint id): batch, watermark, size, location and why it was taken. Kept current "
        f"by the `{SENSOR}` sensor from `srt savepoint list {spec.name}` (savepoints taken "
        f"outside Dagster too) and by the savepoint jobs. Restore or upgrade the job from one: "
        f"`{restore_job_name(spec)}`, picking the savepoint as its partition.",
        group_name=translator.get_group_name(spec),
        partitions_def=partitions(spec),
        kinds={"savepoint"},
    )


def restore_job_name(spec: StreamingJobSpec) -> str:
    return f"{identifier(spec.name)}_from_savepoint"


def watermark_time(ms: int | None) -> str | None:
    """An event-time watermark (epoch ms) as a UTC time; None before any."""
    if ms is None or ms <= 0:
        return None
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")


def _one(per_query: Mapping[str, Any]) -> str:
    """A per-query value as one cell: the value for one query, ``q: v, ...`` for more."""
    if len(per_query) == 1:
        return str(next(iter(per_query.values())))
    return ", ".join(f"{q}: {v}" for q, v in per_query.items())


def row(sp: "SavepointSummary") -> dict[str, Any]:
    """One savepoint as the list shows it."""
    return {
        "id": sp.id,
        "taken": sp.created_at,
        "why": sp.kind,
        "batch": _one(sp.batches),
        "watermark": _one({q: watermark_time(ms) for q, ms in sp.watermark_ms.items()}),
        "size (bytes)": sp.size_bytes,
        "location": sp.location,
    }


def savepoint_table(savepoints: Iterable["SavepointSummary"]) -> MetadataValue:
    """The savepoints as a table, newest first: what to pick for a restore or upgrade."""
    ordered = sorted(savepoints, key=lambda s: (s.created_at, s.id), reverse=True)
    return MetadataValue.table(
        records=[TableRecord(row(sp)) for sp in ordered],
        schema=TableSchema(
            columns=[TableColumn(c, "int" if c == "size (bytes)" else "string") for c in COLUMNS]
        ),
    )


def _materialization(key: AssetKey, sp: "SavepointSummary") -> AssetMaterialization:
    r = row(sp)
    location = sp.location
    return AssetMaterialization(
        asset_key=key,
        partition=sp.id,
        description=f"savepoint {sp.id} ({sp.kind}) of batch {r['batch']}, "
        f"watermark {r['watermark']}",
        metadata={
            "why": sp.kind,
            "batch": r["batch"],
            "watermark": r["watermark"] or "none yet",
            "taken": sp.created_at,
            "size (bytes)": sp.size_bytes,
            "files": sp.files,
            "location": MetadataValue.url(location)
            if "://" in location
            else MetadataValue.path(location),
        },
    )


class Changes:
    """What to tell Dagster to bring its list of ``spec``'s savepoints up to ``found``."""

    def __init__(
        self,
        spec: StreamingJobSpec,
        translator: StreamingJobTranslator,
        known: Sequence[str],
        found: Sequence["SavepointSummary"],
    ) -> None:
        self.name = partitions(spec).name or ""
        key = asset_key(spec, translator)
        ids = {sp.id for sp in found}
        self.added = [sp.id for sp in found if sp.id not in set(known)]
        self.removed = [k for k in known if k not in ids]
        self.events: list[AssetMaterialization | AssetObservation] = [
            _materialization(key, sp) for sp in found if sp.id in set(self.added)
        ]
        if self.added or self.removed:
            self.events.append(
                AssetObservation(
                    asset_key=key,
                    description=f"{len(found)} savepoint(s) of {spec.name}"
                    + (f"; new: {', '.join(self.added)}" if self.added else "")
                    + (f"; gone: {', '.join(self.removed)}" if self.removed else ""),
                    metadata={"savepoints": savepoint_table(found), "count": len(found)},
                )
            )

    def requests(self) -> list[AddPartitions | DeleteDynamicPartitionsRequest]:
        out: list[AddPartitions | DeleteDynamicPartitionsRequest] = []
        if self.added:
            out.append(AddPartitions(self.name, self.added))
        if self.removed:
            out.append(DeleteDynamicPartitionsRequest(self.name, self.removed))
        return out

    def apply(self, instance: DagsterInstance) -> None:
        """Change the instance's partitions now (an op; a sensor returns :meth:`requests`).

        The savepoint-list sensor may add the same savepoint between this op's look and its
        add (the daemon ticks while the op runs): the instance's unique key then refuses the
        second add, and what is still missing is added instead. A partition already deleted
        deletes as nothing."""
        from sqlalchemy.exc import IntegrityError

        if self.added:
            try:
                instance.add_dynamic_partitions(self.name, self.added)
            except IntegrityError:
                missing = [
                    k for k in self.added if not instance.has_dynamic_partition(self.name, k)
                ]
                if missing:
                    instance.add_dynamic_partitions(self.name, missing)
        for key in self.removed:
            instance.delete_dynamic_partition(self.name, key)


def changes(
    instance: DagsterInstance,
    spec: StreamingJobSpec,
    translator: StreamingJobTranslator,
    found: Sequence["SavepointSummary"],
) -> Changes:
    """The difference between the instance's list of ``spec``'s savepoints and ``found``."""
    known = instance.get_dynamic_partitions(partitions(spec).name or "")
    return Changes(spec, translator, known, found)


def savepoints_sensor(
    specs: Sequence[StreamingJobSpec],
    translator: StreamingJobTranslator,
    *,
    minimum_interval: timedelta,
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    resource_keys: frozenset[str] = frozenset({"streaming_runtime"}),
) -> SensorDefinition:
    """Keeps each job's savepoint list (partitions, materialisations, the table) current."""

    @sensor(
        name=SENSOR,
        minimum_interval_seconds=int(minimum_interval.total_seconds()),
        default_status=default_status,
        required_resource_keys=set(resource_keys),
        description="Keeps each streaming job's savepoint list current from `srt savepoint "
        "list JOB` (savepoints taken outside Dagster too): a partition of the job's "
        "`_savepoints` asset per savepoint, removed when the savepoint is disposed of.",
    )
    def _list(context: SensorEvaluationContext, **_: Any) -> SensorResult:
        from dagster_defs.errors import StatefulRuntimeError

        runtime = context.resources.streaming_runtime
        env = s3_env(getattr(context.resources, "s3", None))
        requests: list[AddPartitions | DeleteDynamicPartitionsRequest] = []
        events: list[AssetMaterialization | AssetObservation] = []
        for spec in specs:
            try:
                found = runtime.savepoints(spec.name, target=spec.savepoints.target, env=env)
            except StatefulRuntimeError as exc:
                context.log.warning(f"cannot list the savepoints of {spec.name}: {exc}")
                continue
            change = changes(context.instance, spec, translator, found)
            requests += change.requests()
            events += change.events
        if not requests:
            return SensorResult(skip_reason="the savepoint lists are current")
        return SensorResult(asset_events=events, dynamic_partitions_requests=requests)

    return _list
