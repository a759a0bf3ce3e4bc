"""A Dagster Component for streaming jobs: declare them in ``defs.yaml``, no Python.

Next to :func:`dagster_defs.build_definitions`, for projects laid out with Dagster's ``dg``
(a ``defs/`` folder of components). One component holds the jobs of a code location (the
stop/savepoint/upgrade jobs and the health sensor are shared by them)::

    # defs/streaming/defs.yaml
    type: dagster_defs.component.StreamingJobsComponent
    attributes:
      warehouse: {kind: duckdb, path: srt-data/upi.duckdb}
      sensor_interval: 5s
      jobs:
        - name: upi-per-minute
          job_file: ../../examples/upi_per_minute.py     # relative to this defs.yaml
          config: {source.log_dir: srt-data/log, checkpoint.dir: srt-data/checkpoints/upi}
          config_from_resources: {"sink.*": warehouse.sink_config}
          sink_tables:
            - table: upi_counts
              query: upi-counts
              key: [merchant_id, window_start]
              not_null: [window_end, payments]
              min_values: {payments: 1}
              reconcile: {count_column: payments, window: 1m}
              expected_latency: 7s
          savepoint_policy: {cron: "0 * * * *", keep: 5, max_age: 7d}
          restart_policy: {max_restarts: 3, window: 30m}

Durations are ``90s``, ``5m``, ``12h``, ``7d`` or a number of seconds. Relative job files
resolve against the ``defs.yaml``'s folder; paths inside ``config`` stay relative to the
working directory of the jobs (the runtime resource's), as in ``build_definitions``.
"""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path
from typing import Any, overload

import dagster as dg
from pydantic import Field

from dagster_defs._factory import build_definitions
from dagster_defs._specs import (
    RestartPolicy,
    SavepointPolicy,
    SinkTableSpec,
    StreamingJobSpec,
    WindowReconciliation,
    config_error,
)

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, None: 1}

Duration = str | int | float


@overload
def duration(value: Duration, what: str) -> timedelta: ...
@overload
def duration(value: None, what: str) -> None: ...
def duration(value: Duration | None, what: str) -> timedelta | None:
    """``90s``/``5m``/``12h``/``7d``/``250ms`` or seconds as a number → timedelta."""
    if value is None:
        return None
    if isinstance(value, int | float):
        return timedelta(seconds=float(value))
    m = _DURATION.match(str(value))
    if not m:
        raise config_error(f"{what}: {value!r} is not a duration; write 90s, 5m, 12h or 7d")
    return timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])


class ReconcileModel(dg.Model):
    count_column: str = Field(description="Table column holding each window's event count.")
    window: Duration = Field(description="Tumbling window size, e.g. 1m.")
    source: str | None = Field(default=None, description="The job's source, if several.")
    window_start_column: str = Field(default="window_start", description="Window start column.")
    window_end_column: str = Field(default="window_end", description="Window end column.")


class SinkTableModel(dg.Model):
    table: str = Field(description="Table name in the warehouse.")
    query: str = Field(description="The job's query (sink_to name) that writes it.")
    key: list[str] = Field(description="The table's unique (upsert) key.")
    not_null: list[str] = Field(default_factory=list, description="More non-null columns.")
    min_values: dict[str, float] = Field(
        default_factory=dict, description="Inclusive lower bounds per column."
    )
    reconcile: ReconcileModel | None = Field(
        default=None, description="Closed-window reconciliation."
    )
    description: str | None = Field(default=None, description="Asset description.")
    expected_latency: Duration | None = Field(
        default=None,
        description="Checkpoint interval + watermark delay: gives the table a freshness check.",
    )


class SavepointPolicyModel(dg.Model):
    cron: str = Field(default="0 * * * *", description="When to take a savepoint.")
    keep: int | None = Field(default=5, description="Savepoints kept (null: no limit).")
    max_age: Duration | None = Field(default="7d", description="Dispose of older ones.")
    target: str | None = Field(default=None, description="Savepoint root (dir or s3://).")
    running: bool = Field(default=False, description="Schedule on without switching it on.")
    timezone: str = Field(default="UTC", description="The cron's time zone.")


class RestartPolicyModel(dg.Model):
    max_restarts: int = Field(default=3, description="Restarts allowed within window.")
    window: Duration = Field(default="30m", description="The failure-rate window.")
    initial_backoff: Duration = Field(default="30s", description="Delay before the 2nd restart.")
    max_backoff: Duration = Field(default="5m", description="Upper bound of the delay.")
    max_checkpoint_age: Duration = Field(default="5m", description="Stalled after this.")
    start_timeout: Duration = Field(default="5m", description="STARTING for longer: stalled.")
    stop_grace: Duration = Field(default="30s", description="SIGTERM to SIGKILL grace.")
    max_lag_records: int | None = Field(
        default=1_000_000, description="The lag check warns above this (null: no bound)."
    )
    max_dead_letter_ratio: float | None = Field(
        default=0.01, description="The dead_letters check warns above this share of input."
    )


class StreamingJobModel(dg.Model):
    name: str = Field(description="The job's name, as its job file builds it.")
    job_file: str = Field(description="Job file (DEFAULTS + build); relative to defs.yaml.")
    config: dict[str, Any] = Field(default_factory=dict, description="--set overrides.")
    config_from_resources: dict[str, str] = Field(
        default_factory=dict,
        description="Config keys from resources, e.g. {'sink.*': 'warehouse.sink_config'}.",
    )
    sink_tables: list[SinkTableModel] = Field(
        default_factory=list, description="Tables the job writes."
    )
    savepoint_policy: SavepointPolicyModel = Field(
        default_factory=SavepointPolicyModel, description="Periodic savepoints."
    )
    restart_policy: RestartPolicyModel = Field(
        default_factory=RestartPolicyModel, description="How the sensor restarts it."
    )
    description: str | None = Field(default=None, description="Asset description.")


class WarehouseModel(dg.Model):
    kind: str = Field(default="duckdb", description="duckdb, postgres, clickhouse or delta.")
    path: str | None = Field(default=None, description="duckdb file / delta location.")
    dsn: str | None = Field(default=None, description="postgres DSN (no password).")
    url: str | None = Field(default=None, description="clickhouse URL (no password).")
    password: str | None = Field(default=None, description="env:NAME holding the password.")


class StreamingJobsComponent(dg.Component, dg.Model, dg.Resolvable):
    """Streaming jobs of the stateful runtime as assets, checks, a health sensor, savepoint
    schedules and control jobs: what :func:`dagster_defs.build_definitions` makes, from YAML."""

    jobs: list[StreamingJobModel] = Field(description="The streaming jobs.")
    warehouse: WarehouseModel | None = Field(
        default=None,
        description="Where sink tables live (default: DuckDB srt-data/warehouse.duckdb).",
    )
    srt_home: str | None = Field(default=None, description="Job registry ($SRT_HOME).")
    sensor_interval: Duration = Field(default="5s", description="Health sensor interval.")
    automation_interval: Duration | None = Field(
        default="5s", description="Automation sensor interval (null: no automation sensor)."
    )

    def specs(self, base: Path) -> list[StreamingJobSpec]:
        """The jobs as :class:`StreamingJobSpec` s; relative job files against ``base``."""
        out = []
        for job in self.jobs:
            job_file = Path(job.job_file)
            if not job_file.is_absolute():
                job_file = (base / job_file).resolve()
            sp, rp = job.savepoint_policy, job.restart_policy
            out.append(
                StreamingJobSpec(
                    name=job.name,
                    job_file=str(job_file),
                    config=dict(job.config),
                    config_from_resources=dict(job.config_from_resources),
                    sink_tables=[self._table(t, job.name) for t in job.sink_tables],
                    savepoints=SavepointPolicy(
                        cron=sp.cron,
                        keep=sp.keep,
                        max_age=duration(sp.max_age, f"{job.name}: savepoint_policy.max_age"),
                        target=sp.target,
                        running=sp.running,
                        timezone=sp.timezone,
                    ),
                    restart_policy=RestartPolicy(
                        max_restarts=rp.max_restarts,
                        max_lag_records=rp.max_lag_records,
                        max_dead_letter_ratio=rp.max_dead_letter_ratio,
                        **{
                            f: duration(getattr(rp, f), f"{job.name}: restart_policy.{f}")
                            for f in (
                                "window",
                                "initial_backoff",
                                "max_backoff",
                                "max_checkpoint_age",
                                "start_timeout",
                                "stop_grace",
                            )
                        },
                    ),
                    description=job.description,
                )
            )
        return out

    @staticmethod
    def _table(t: SinkTableModel, job: str) -> SinkTableSpec:
        rec = None
        if t.reconcile is not None:
            window = duration(t.reconcile.window, f"{job}: {t.table}.reconcile.window")
            assert window is not None
            rec = WindowReconciliation(
                count_column=t.reconcile.count_column,
                window=window,
                source=t.reconcile.source,
                window_start_column=t.reconcile.window_start_column,
                window_end_column=t.reconcile.window_end_column,
            )
        return SinkTableSpec(
            table=t.table,
            query=t.query,
            key=tuple(t.key),
            not_null=tuple(t.not_null),
            min_values=dict(t.min_values),
            reconcile=rec,
            description=t.description,
            expected_latency=duration(t.expected_latency, f"{job}: {t.table}.expected_latency"),
        )

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from dagster_defs.resources import StreamingRuntime, Warehouse

        resources: dict[str, Any] = {}
        if self.warehouse is not None:
            resources["warehouse"] = Warehouse(**self.warehouse.model_dump())
        if self.srt_home is not None:
            resources["streaming_runtime"] = StreamingRuntime(home=self.srt_home)
        sensor = duration(self.sensor_interval, "sensor_interval")
        assert sensor is not None
        return build_definitions(
            self.specs(Path(context.path)),
            resources=resources,
            sensor_interval=sensor,
            automation_interval=duration(self.automation_interval, "automation_interval"),
        )
