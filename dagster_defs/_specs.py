"""What a user declares: streaming jobs, their sink tables, checks and restart policy.

Specs are frozen and validated here, at definition load, without importing Spark: the job file
itself is only imported by the processes that run or explain it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from types import MappingProxyType
from typing import Any

# stateful_runtime.names.Name's rule, checked here without importing the runtime at load.
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_RESOURCE_FIELD = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)$")


def config_error(message: str) -> Exception:
    """A ConfigError (:mod:`dagster_defs.errors`), imported only when there is an error to
    raise: definition load imports nothing of the runtime."""
    from dagster_defs.errors import ConfigError

    return ConfigError(message)


@dataclass(frozen=True)
class RestartPolicy:
    """How the health sensor restarts a job: exponential delay with a failure-rate limit
    (Flink's ``exponential-delay`` and ``failure-rate`` restart strategies together).

    The first restart in ``window`` happens at the first tick that sees the failure; the n-th
    waits ``initial_backoff * 2**(n-2)`` (at most ``max_backoff``) after the previous one. When
    the job fails again after ``max_restarts`` restarts within ``window``, the sensor gives up
    (Flink: the job fails terminally) and says so in its observations until something else
    starts the job (a materialisation); then the count starts afresh.

    Attributes:
        max_restarts: restarts allowed within ``window``.
        window: the failure-rate window.
        initial_backoff: delay before the second restart within the window.
        max_backoff: upper bound of the delay.
        max_checkpoint_age: a RUNNING job whose in-flight micro-batch (or whose last commit,
            while it reports lag) is older than this is stalled: it is killed and relaunched.
            An idle job, with nothing to process, is never stalled.
        start_timeout: a process still STARTING after this long is treated as stalled.
        stop_grace: how long a stalled job gets to stop on SIGTERM before SIGKILL.
        max_lag_records: the job asset's ``lag`` check warns when more records than this wait
            in the source (None: no bound). Never a reason to restart.
        max_dead_letter_ratio: the ``dead_letters`` check warns when a larger share of the
            run's input was rejected (None: no bound). Never a reason to restart.
    """

    max_restarts: int = 3
    window: timedelta = timedelta(minutes=30)
    initial_backoff: timedelta = timedelta(seconds=30)
    max_backoff: timedelta = timedelta(minutes=5)
    max_checkpoint_age: timedelta = timedelta(minutes=5)
    start_timeout: timedelta = timedelta(minutes=5)
    stop_grace: timedelta = timedelta(seconds=30)
    max_lag_records: int | None = 1_000_000
    max_dead_letter_ratio: float | None = 0.01

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise config_error(f"max_restarts must be >= 0, got {self.max_restarts}")
        if self.max_dead_letter_ratio is not None and not 0 <= self.max_dead_letter_ratio <= 1:
            raise config_error(
                f"max_dead_letter_ratio must be in [0, 1] or None, got {self.max_dead_letter_ratio}"
            )
        if self.max_lag_records is not None and self.max_lag_records < 0:
            raise config_error(f"max_lag_records must be >= 0 or None, got {self.max_lag_records}")
        for name in (
            "window",
            "initial_backoff",
            "max_backoff",
            "max_checkpoint_age",
            "start_timeout",
            "stop_grace",
        ):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value < timedelta(0):
                raise config_error(f"RestartPolicy.{name} must be a timedelta >= 0, got {value!r}")


@dataclass(frozen=True)
class SavepointPolicy:
    """Periodic savepoints of a job (the flink-kubernetes-operator's periodic savepoints and
    savepoint history cleanup) by a schedule, ``<job>_savepoint_schedule``.

    Each tick takes a savepoint of the running job and then disposes of the job's savepoints
    beyond ``keep`` or older than ``max_age`` under the same root; the newest savepoint and any
    a registered job was restored from are always kept. A job that is not running is skipped
    (its checkpoint does not change; the last savepoint still holds its state).

    Attributes:
        cron: when to take one (default hourly), in ``timezone``.
        keep: savepoints to keep (None: no count limit).
        max_age: dispose of savepoints older than this (None: no age limit).
        target: savepoint root, a directory or ``s3://bucket/prefix`` (default: the job's
            ``savepoint.dir`` config, else ``$SRT_HOME/savepoints``).
        running: whether the schedule runs without being switched on (default False:
            a savepoint copies the whole state, so the cost is opted into, as in the operator).
        timezone: the cron's time zone.
    """

    cron: str = "0 * * * *"
    keep: int | None = 5
    max_age: timedelta | None = timedelta(days=7)
    target: str | None = None
    running: bool = False
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if self.keep is not None and self.keep < 1:
            raise config_error(f"SavepointPolicy.keep must be >= 1 or None, got {self.keep}")
        if self.max_age is not None and (
            not isinstance(self.max_age, timedelta) or self.max_age <= timedelta(0)
        ):
            raise config_error(
                f"SavepointPolicy.max_age must be a timedelta > 0 or None, got {self.max_age!r}"
            )
        if len(self.cron.split()) != 5:
            raise config_error(
                f"SavepointPolicy.cron must be a 5-field cron string, got {self.cron!r}"
            )


@dataclass(frozen=True)
class WindowReconciliation:
    """Check that closed windows count every good source event exactly once.

    For the last micro-batch the sink wrote (the ledger's batch id B), the windows whose end is
    at or before B's watermark are final. The check sums ``count_column`` over those windows and
    compares it, window by window, with the number of records in the source topic, up to B's
    source offsets, that decode cleanly (dead letters are counted apart) and whose event time
    falls in those windows. A difference means lost, duplicated or late-dropped events.

    It assumes every good record of the source is counted (no filter between source and window)
    and tumbling windows aligned to the epoch, as ``TumblingEventTimeWindows`` makes them.

    Attributes:
        count_column: the table column holding each window's event count (a ``Count()``).
        window: the window size.
        source: name of the job's source (``from_source(..., name=)``); default: its only one.
        window_start_column: table column with the window start (UTC timestamp).
        window_end_column: table column with the window end (UTC timestamp).
    """

    count_column: str
    window: timedelta
    source: str | None = None
    window_start_column: str = "window_start"
    window_end_column: str = "window_end"

    def __post_init__(self) -> None:
        if not isinstance(self.window, timedelta) or self.window <= timedelta(0):
            raise config_error(
                f"reconciliation window must be a timedelta > 0, got {self.window!r}"
            )
        if self.window % timedelta(milliseconds=1):
            raise config_error(
                f"reconciliation window must be whole milliseconds, got {self.window!r}"
            )


@dataclass(frozen=True)
class SinkTableSpec:
    """A warehouse table a streaming job writes, as a downstream asset with checks.

    Attributes:
        table: table name in the warehouse (the DuckDB database of the ``warehouse`` resource).
        query: the job's query that writes it: the ``name`` given to ``sink_to``. Its ledger
            rows and checkpoint tie table contents to micro-batches.
        key: the table's unique key (checked unique and not null).
        not_null: more columns that must not be null (the key columns always are).
        min_values: inclusive lower bounds, e.g. ``{"payments": 1, "amount_paise": 0}``.
        reconcile: closed-window reconciliation against the source topic, if wanted.
        description: asset description (default: one naming the job).
        expected_latency: how far behind its stream the table may be when all is well: the
            job's checkpoint interval plus its watermark delay (``srt dbt sources`` prints it
            as ``meta.srt.expected_latency_s``). Gives the table a ``freshness`` check (warn
            and fail after a few times this, at least 1 and 2 minutes: the same windows as
            the generated dbt source freshness) that fails only when the source holds records
            the job has not committed for that long: a stuck stream turns the asset red, an
            idle one says idle. None: no freshness check.
    """

    table: str
    query: str
    key: tuple[str, ...]
    not_null: tuple[str, ...] = ()
    min_values: Mapping[str, float] = field(default_factory=dict)
    reconcile: WindowReconciliation | None = None
    description: str | None = None
    expected_latency: timedelta | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "not_null", tuple(self.not_null))
        object.__setattr__(self, "min_values", MappingProxyType(dict(self.min_values)))
        if not self.table or not self.query:
            raise config_error("SinkTableSpec needs the table name and the writing query's name")
        if not self.key:
            raise config_error(f"sink table {self.table!r}: key must name the unique key columns")
        if self.expected_latency is not None and (
            not isinstance(self.expected_latency, timedelta)
            or self.expected_latency <= timedelta(0)
        ):
            raise config_error(
                f"sink table {self.table!r}: expected_latency must be a timedelta > 0, got "
                f"{self.expected_latency!r}"
            )

    @property
    def not_null_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys((*self.key, *self.not_null)))


@dataclass(frozen=True)
class StreamingJobSpec:
    """A streaming job run by the runtime, as a Dagster asset (plus its sink tables).

    Attributes:
        name: the job's name as its job file builds it (``StreamJob(name, ...)``); the job
            registry, ``srt status`` and ``srt stop`` know it by this name.
        job_file: path of the job file (``DEFAULTS`` + ``build(config)``); relative paths
            resolve against the runtime resource's working directory.
        config: ``--set`` overrides of the job file's DEFAULTS.
        config_from_resources: job config keys whose values come from resources, as
            ``{"sink.database": "warehouse.path"}`` (resource key, dot, field), so that the
            job writes where the resource (and the checks) look; ``{"sink.*":
            "warehouse.sink_config"}`` takes every ``sink.*`` key the warehouse gives (its
            kind and location).
        sink_tables: tables the job writes, each a downstream asset with checks.
        restart_policy: how the health sensor restarts this job.
        savepoints: periodic savepoints and their retention.
        description: asset description (default: one naming the job file).
    """

    name: str
    job_file: str
    config: Mapping[str, Any] = field(default_factory=dict)
    config_from_resources: Mapping[str, str] = field(default_factory=dict)
    sink_tables: Sequence[SinkTableSpec] = ()
    restart_policy: RestartPolicy = field(default_factory=RestartPolicy)
    savepoints: SavepointPolicy = field(default_factory=SavepointPolicy)
    description: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        object.__setattr__(
            self, "config_from_resources", MappingProxyType(dict(self.config_from_resources))
        )
        object.__setattr__(self, "sink_tables", tuple(self.sink_tables))
        if not _JOB_NAME.fullmatch(self.name or ""):
            from stateful_runtime.names import check_name

            check_name("job", self.name)  # raises InvalidNameError (a ConfigError), says why
        if not self.job_file:
            raise config_error(f"job {self.name!r}: job_file must be the path of a job file")
        both = sorted(set(self.config) & set(self.config_from_resources))
        if both:
            raise config_error(
                f"job {self.name!r}: config key(s) {both} are set both in config "
                f"and config_from_resources; keep one"
            )
        for key, ref in self.config_from_resources.items():
            if not _RESOURCE_FIELD.match(ref):
                raise config_error(
                    f"job {self.name!r}: config_from_resources[{key!r}] = {ref!r}"
                    f" must be 'resource_key.field', e.g. 'warehouse.path'"
                )
        tables = [t.table for t in self.sink_tables]
        if len(set(tables)) != len(tables):
            raise config_error(f"job {self.name!r}: sink tables {tables} repeat a table")

    @property
    def resource_keys(self) -> frozenset[str]:
        """Resources the job's config is taken from."""
        return frozenset(ref.split(".", 1)[0] for ref in self.config_from_resources.values())
