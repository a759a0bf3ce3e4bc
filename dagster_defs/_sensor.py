"""The health sensor: observe every streaming job, restart the dead and the stalled.

Each tick asks the runtime for each job's status (``srt status --json``: the registry and the
checkpoints, files only: no Spark, no network), emits
one AssetObservation per job with its health, and applies the job's :class:`RestartPolicy`.
The restart history lives in the sensor cursor, so backoff and the restart limit survive
daemon restarts. A job that was stopped (``STOPPED``) or finished is never restarted. A crash
(dead, failed, refused, launch-failed, stalled) also launches one run of
``streaming_job_crashed`` that fails with it (:mod:`dagster_defs._alerts`): what open-source
run-failure alerts fire on.

Conditions and what the sensor does::

    healthy        RUNNING, pid alive, nothing stalled              observe
    starting       STARTING, pid alive                              observe
    stopped        STOPPED / FINISHED                               observe
    dead           RUNNING in the registry but the pid is gone      relaunch
    failed         FAILED (a query failed; see the job's log)       relaunch
    refused        FAILED by a refusal that needs an operator (a    observe: the error
                   sink table that lost batches: SinkDataLostError) names the commands back
    launch-failed  STARTING but the pid is gone                     relaunch
    stalled        a micro-batch in flight (or lag with no commit)  kill, relaunch
                   for longer than max_checkpoint_age; or STARTING
                   for longer than start_timeout
"""

import json
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetMaterialization,
    AssetObservation,
    DefaultSensorStatus,
    MetadataValue,
    RunRequest,
    SensorDefinition,
    SensorEvaluationContext,
    SensorResult,
    SkipReason,
    sensor,
)

from dagster_defs import _health
from dagster_defs._alerts import crash_job, crash_run_request
from dagster_defs._health import Verdict, table_freshness
from dagster_defs._launch import launch_config, push_env
from dagster_defs._specs import RestartPolicy, StreamingJobSpec
from dagster_defs._stream_events import commit_events, plot_metadata, pushed_batches
from dagster_defs._translator import StreamingJobTranslator
from stateful_runtime.contract import ErrorKind

if TYPE_CHECKING:
    from stateful_runtime.contract import JobStatus, QueryHealth, QueryStatus

CURSOR_VERSION = 1
# Fields of a query's last batch (contract.BatchHealth) copied into each observation.
HEALTH_FIELDS = (
    "last_batch",
    "batch_duration_ms",
    "input_rows",
    "input_rows_per_s",
    "processed_rows_per_s",
    "recent_input_rows_per_s",
    "recent_processed_rows_per_s",
    "lag_records",
    "watermark",
    "watermark_held_by",
    "state_rows",
    "state_bytes",
    "late_rows_dropped",
    "late_rows_dropped_this_run",
    "updated_at",
)


class Condition(StrEnum):
    HEALTHY = "healthy"
    STARTING = "starting"
    STOPPED = "stopped"
    DEAD = "dead"
    FAILED = "failed"
    LAUNCH_FAILED = "launch-failed"
    STALLED = "stalled"
    REFUSED = "refused"
    UNKNOWN = "unknown"


RESTARTABLE = frozenset(
    {Condition.DEAD, Condition.FAILED, Condition.LAUNCH_FAILED, Condition.STALLED}
)
# Crashes: kept as incidents (the no_crash_restart check) and alerted on as a failed run.
ALERTED = RESTARTABLE | {Condition.REFUSED, Condition.UNKNOWN}


class Action(StrEnum):
    NONE = "none"
    RESTART = "restart"
    BACKOFF = "backoff"
    GIVE_UP = "give-up"


@dataclass(frozen=True)
class Assessment:
    condition: Condition
    reason: str


@dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    retry_at: float | None = None


def _seconds(td: timedelta) -> float:
    return td.total_seconds()


def query_health(query: "QueryStatus", health: "QueryHealth") -> dict[str, Any]:
    """One query's health: the job process's last report plus what its checkpoint said when
    the status was taken (the report goes stale when the process hangs; the checkpoint does
    not lie)."""
    from stateful_runtime.contract import CheckpointFacts

    facts = query.checkpoint or CheckpointFacts()
    out: dict[str, Any] = {
        "last_committed_batch": facts.last_committed_batch,
        "checkpoint_age_s": facts.checkpoint_age_s,
        "inflight_batch_age_s": facts.inflight_batch_age_s,
    }
    batch = health.batch
    out.update({k: None if batch is None else getattr(batch, k) for k in HEALTH_FIELDS})
    return out


def assess(
    entry: Mapping[str, Any],
    *,
    alive: bool,
    queries: Mapping[str, Mapping[str, Any]],
    now: float,
    started_age_s: float | None,
    policy: RestartPolicy,
) -> Assessment:
    """The job's condition from its registry entry, liveness and query health (pure)."""
    state, pid = entry.get("state"), entry.get("pid")
    if state == "RUNNING":
        if not alive:
            return Assessment(Condition.DEAD, f"registry says RUNNING but pid {pid} is gone")
        limit = _seconds(policy.max_checkpoint_age)
        for name, q in sorted(queries.items()):
            inflight, age, lag = (
                q.get("inflight_batch_age_s"),
                q.get("checkpoint_age_s"),
                q.get("lag_records"),
            )
            if inflight is not None and inflight > limit:
                return Assessment(
                    Condition.STALLED,
                    (
                        f"query {name}: the batch after {q.get('last_committed_batch')} has been "
                        f"in flight for {inflight:.0f} s (limit {limit:.0f} s)"
                    ),
                )
            if lag and age is not None and age > limit:
                return Assessment(
                    Condition.STALLED,
                    (
                        f"query {name}: {lag} records waiting and no commit for {age:.0f} s "
                        f"(limit {limit:.0f} s)"
                    ),
                )
        return Assessment(Condition.HEALTHY, f"RUNNING as pid {pid}")
    if state == "STARTING":
        if not alive:
            return Assessment(
                Condition.LAUNCH_FAILED, f"pid {pid} exited while STARTING (see the job's log)"
            )
        if started_age_s is not None and started_age_s > _seconds(policy.start_timeout):
            return Assessment(Condition.STALLED, f"still STARTING after {started_age_s:.0f} s")
        return Assessment(Condition.STARTING, f"STARTING as pid {pid}")
    if state == "FAILED":
        error = entry.get("error") or {}
        if error.get("type") == ErrorKind.SINK_DATA_LOST_ERROR:
            # A restart would be refused the same way: the operator chooses a way back.
            return Assessment(Condition.REFUSED, str(error.get("message")))
        return Assessment(Condition.FAILED, "the job process failed (see the job's log)")
    if state in ("STOPPED", "FINISHED"):
        # A stop by SIGINT/SIGTERM (timeout, systemd, Kubernetes, Ctrl-C) is a stop like
        # `srt stop`: the job process stopped its queries and recorded it; not a crash.
        by = f" by {entry['stopped_by']}" if entry.get("stopped_by") else ""
        return Assessment(Condition.STOPPED, f"{state}{by}: stopped on purpose, not restarted")
    return Assessment(Condition.UNKNOWN, f"registry state {state!r}")


def decide(
    condition: Condition, restarts: Sequence[float], *, now: float, policy: RestartPolicy
) -> Decision:
    """Restart now, wait (backoff), give up (limit reached), or do nothing (pure)."""
    if condition not in RESTARTABLE:
        return Decision(Action.NONE, "")
    window = _seconds(policy.window)
    recent = sorted(t for t in restarts if now - t < window)
    if len(recent) >= policy.max_restarts:
        return Decision(
            Action.GIVE_UP,
            (
                f"restart limit reached: {len(recent)} restarts in the last {window:.0f} s; "
                f"fix the job and materialise its asset to start it again"
            ),
        )
    if recent:
        delay = min(
            _seconds(policy.initial_backoff) * 2 ** (len(recent) - 1), _seconds(policy.max_backoff)
        )
        retry_at = recent[-1] + delay
        if now < retry_at:
            return Decision(
                Action.BACKOFF, f"next restart in {retry_at - now:.0f} s (backoff)", retry_at
            )
    return Decision(
        Action.RESTART, f"restart {len(recent) + 1} of {policy.max_restarts} within {window:.0f} s"
    )


@dataclass
class Cursor:
    """Per job: epoch seconds of each restart the sensor made, the pid it gave up on, and the
    crashes it saw within the restart window (:func:`dagster_defs._health.incident`); per sink
    table (``job/table``): the last batch reported as a materialisation, and the watermark
    then."""

    restarts: dict[str, list[float]] = field(default_factory=dict)
    gave_up: dict[str, int | None] = field(default_factory=dict)
    reported: dict[str, dict[str, Any]] = field(default_factory=dict)
    incidents: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    @classmethod
    def load(cls, raw: str | None) -> "Cursor":
        if not raw:
            return cls()
        try:
            data = json.loads(raw)
        except ValueError:
            return cls()
        if data.get("version") != CURSOR_VERSION:
            return cls()  # an older sensor's history: start afresh rather than misread it
        return cls(
            {k: [float(t) for t in v] for k, v in (data.get("restarts") or {}).items()},
            dict(data.get("gave_up") or {}),
            {k: dict(v) for k, v in (data.get("reported") or {}).items()},
            {k: [dict(i) for i in v] for k, v in (data.get("incidents") or {}).items()},
        )

    def dump(self) -> str:
        return json.dumps(
            {
                "version": CURSOR_VERSION,
                "restarts": self.restarts,
                "gave_up": self.gave_up,
                "reported": self.reported,
                "incidents": self.incidents,
            },
            sort_keys=True,
        )

    def prune(self, job: str, *, now: float, window: timedelta) -> list[float]:
        kept = [t for t in self.restarts.get(job, []) if now - t < _seconds(window)]
        self.restarts[job] = kept
        if job in self.incidents:
            self.incidents[job] = [
                i for i in self.incidents[job] if now - float(i.get("at") or 0) < _seconds(window)
            ]
        return kept

    def record(self, job: str, crash: dict[str, Any]) -> bool:
        """Keep a crash once: a crash of the same pid and condition seen again (backoff, gave
        up) is the same crash. True if it is new."""
        kept = self.incidents.setdefault(job, [])
        if kept and (kept[-1].get("pid"), kept[-1].get("condition")) == (
            crash.get("pid"),
            crash.get("condition"),
        ):
            kept[-1].update({k: v for k, v in crash.items() if k != "at" and v is not None})
            return False
        kept.append(crash)
        return True


def _started_age(entry: Mapping[str, Any], now: float) -> float | None:
    from datetime import datetime

    started = entry.get("started_at")
    if not started:
        return None
    try:
        return now - datetime.fromisoformat(str(started).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _health_json(queries: Mapping[str, Mapping[str, Any]]) -> MetadataValue:
    """Every query's health in one entry (the numbers Dagster plots are separate entries with
    units in their labels: :func:`dagster_defs._stream_events.plot_metadata`)."""
    return MetadataValue.json({q: dict(m) for q, m in sorted(queries.items())})


@dataclass(frozen=True)
class Report:
    """What one tick says of one job: its observation's metadata, its health checks, the
    process the sensor relaunched it as (None: it did not), and a crash first seen this tick,
    to alert on (:func:`dagster_defs._alerts.crash_run_request`)."""

    metadata: dict[str, Any]
    checks: list[Verdict]
    relaunched: dict[str, Any] | None = None
    alert: dict[str, Any] | None = None


def health_checks(spec: StreamingJobSpec, status: "JobStatus", now: float) -> list[Verdict]:
    """The job's health checks from a status alone (no restart history: a materialisation's
    view of the process it launched or reused)."""
    queries = {q: query_health(info, status.query_health(q)) for q, info in status.queries.items()}
    state = None if status.entry_state is None else str(status.entry_state)
    entry = {
        "state": state,
        "pid": status.pid,
        "started_at": status.started_at,
        "error": None if status.error is None else status.error.to_json()["error"],
    }
    if status.stopped_by:
        entry["stopped_by"] = str(status.stopped_by)
    verdict = assess(
        entry,
        alive=bool(status.alive),
        queries=queries,
        now=now,
        started_age_s=_started_age(entry, now),
        policy=spec.restart_policy,
    )
    return _health.verdicts(spec, status, verdict.condition.value, verdict.reason, queries, now=now)


def check_job(
    context: SensorEvaluationContext,
    spec: StreamingJobSpec,
    cursor: Cursor,
    now: float,
    status: "JobStatus | None" = None,
) -> dict[str, Any] | None:
    """Observe one job and apply its restart policy; the observation's metadata, or None if
    the job never ran here (:func:`observe` has the health checks too)."""
    report = observe(context, spec, cursor, now, status)
    return None if report is None else report.metadata


def observe(
    context: SensorEvaluationContext,
    spec: StreamingJobSpec,
    cursor: Cursor,
    now: float,
    status: "JobStatus | None" = None,
    launch_env: Mapping[str, str] | None = None,
) -> Report | None:
    """Observe one job, apply its restart policy and judge its health checks; None if the job
    never ran here. ``status``: the job's status if the caller has it; ``launch_env``: the
    environment of a relaunch (:func:`dagster_defs._launch.push_env`)."""
    runtime = context.resources.streaming_runtime
    status = status if status is not None else runtime.status(spec.name)
    if status is None:
        return None
    alive = bool(status.alive)
    state = None if status.entry_state is None else str(status.entry_state)
    entry = {
        "state": state,
        "pid": status.pid,
        "started_at": status.started_at,
        "error": None if status.error is None else status.error.to_json()["error"],
    }
    queries = {q: query_health(info, status.query_health(q)) for q, info in status.queries.items()}
    verdict = assess(
        entry,
        alive=alive,
        queries=queries,
        now=now,
        started_age_s=_started_age(entry, now),
        policy=spec.restart_policy,
    )
    pid = status.pid
    if spec.name in cursor.gave_up and (
        cursor.gave_up[spec.name] != pid or verdict.condition not in RESTARTABLE
    ):
        # Started again since the sensor gave up (a materialisation), or recovered: a fresh
        # restart budget.
        del cursor.gave_up[spec.name]
        cursor.restarts[spec.name] = []
    restarts = cursor.prune(spec.name, now=now, window=spec.restart_policy.window)
    if spec.name in cursor.gave_up:
        decision = Decision(
            Action.GIVE_UP,
            f"gave up on pid {pid} (restart limit); materialise the job asset to start it again",
        )
    else:
        decision = decide(verdict.condition, restarts, now=now, policy=spec.restart_policy)
    metadata: dict[str, Any] = {
        # What the job is now (DEAD for a RUNNING entry whose process is gone), not the
        # entry's word for it.
        "state": None if status.state is None else str(status.state),
        "condition": verdict.condition.value,
        "reason": verdict.reason,
        "pid": None if pid is None else MetadataValue.text(str(pid)),  # a name, not a plot
        "alive": alive,
        "action": decision.action.value,
        "restarts_in_window": len(restarts),
        "health": _health_json(queries),
        **plot_metadata(status),
        **_health.dead_letter_metadata(status),
    }
    if decision.reason:
        metadata["decision"] = decision.reason
    crash = (
        _health.incident(verdict.condition.value, verdict.reason, status, now)
        if verdict.condition in ALERTED
        else None
    )
    relaunched = None
    if decision.action is Action.GIVE_UP and spec.name not in cursor.gave_up:
        cursor.gave_up[spec.name] = pid
        context.log.error(f"{spec.name}: {verdict.reason}; {decision.reason}")
    elif decision.action is Action.RESTART:
        restarted = _restart(context, spec, entry, alive, verdict, launch_env)
        metadata.update(restarted)
        cursor.restarts[spec.name] = [*restarts, now]
        metadata["restarts_in_window"] = len(restarts) + 1
        if crash is not None and "restarted_pid" in restarted:
            crash["restarted_pid"] = restarted["restarted_pid"]
            relaunched = restarted
        elif crash is not None and "restart_error" in restarted:
            crash["restart_error"] = restarted["restart_error"]
    alert = None
    if crash is not None:
        if decision.reason:
            crash["decision"] = decision.reason
        if status.log_path:
            crash["log_path"] = str(status.log_path)
        if cursor.record(spec.name, crash):
            alert = crash
        context.log.error(
            f"{spec.name} is {verdict.condition.value}: {verdict.reason}"
            + (f"; failure: {status.failure}" if status.failure else "")
            + (f"; {decision.reason}" if decision.reason else "")
        )
    checks = _health.verdicts(
        spec,
        status,
        verdict.condition.value,
        verdict.reason,
        queries,
        decision=decision.reason or None,
        incidents=cursor.incidents.get(spec.name, []),
        now=now,
    )
    return Report(metadata, checks, relaunched, alert)


def _restart(
    context: SensorEvaluationContext,
    spec: StreamingJobSpec,
    entry: Mapping[str, Any],
    alive: bool,
    verdict: Assessment,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    from dagster_defs.errors import StatefulRuntimeError
    from stateful_runtime.masking import mask_text

    runtime = context.resources.streaming_runtime
    out: dict[str, Any] = {}
    try:
        # A live process gets SIGTERM, then SIGKILL after the grace period; of a dead driver
        # the JVM or Python workers may be left: its process group is killed.
        if entry.get("pid") is not None:
            ended = runtime.kill(
                spec.name, pid=int(entry["pid"]), grace=_seconds(spec.restart_policy.stop_grace)
            )
            if alive:
                out["killed_with"] = str(ended.signal)
        launch = runtime.launch(
            spec.name, spec.job_file, launch_config(spec, context.resources), env=env
        )
    except StatefulRuntimeError as exc:
        context.log.error(f"{spec.name}: relaunch failed: {mask_text(str(exc))}")
        out["restart_error"] = mask_text(str(exc))
        return out
    context.log.warning(
        f"{spec.name} was {verdict.condition.value} ({verdict.reason}); "
        f"relaunched as pid {launch.pid}, log {launch.log_path}"
    )
    out.update(
        {
            "restarted_pid": launch.pid,
            "previous_pid": entry.get("pid"),
            "log_path": str(launch.log_path),
            "command": mask_text(shlex.join(launch.command or ())),
        }
    )
    return out


def _relaunch_materialization(key: Any, report: Report) -> AssetMaterialization:
    relaunched = report.relaunched or {}
    return AssetMaterialization(
        asset_key=key,
        description=(
            f"relaunched by the health sensor as pid {relaunched.get('restarted_pid')} "
            f"({report.metadata['condition']}: {report.metadata['reason']})"
        ),
        metadata={
            "pid": MetadataValue.text(str(relaunched.get("restarted_pid"))),
            "launched": True,
            "launched_by": "streaming_job_health sensor",
            "previous_pid": MetadataValue.text(str(relaunched.get("previous_pid"))),
            "cause": f"{report.metadata['condition']}: {report.metadata['reason']}",
            "log_path": MetadataValue.path(str(relaunched.get("log_path"))),
            "command": relaunched.get("command") or "",
        },
    )


def health_sensor(
    specs: Sequence[StreamingJobSpec],
    translator: StreamingJobTranslator,
    *,
    minimum_interval: timedelta = timedelta(seconds=30),
    default_status: DefaultSensorStatus = DefaultSensorStatus.RUNNING,
    name: str = "streaming_job_health",
) -> SensorDefinition:
    """A sensor observing every job of ``specs`` and restarting it per its restart policy."""
    resource_keys = {"streaming_runtime"}.union(*(s.resource_keys for s in specs))
    if any(s.sink_tables for s in specs):
        resource_keys.add("warehouse")  # the sink ledger: tables materialise as jobs commit

    @sensor(
        name=name,
        minimum_interval_seconds=int(minimum_interval.total_seconds()),
        default_status=default_status,
        required_resource_keys=resource_keys,
        job=crash_job,
        description=(
            "Observes each streaming job's health (checkpoint age, batch duration, "
            "rates, lag, watermark, state size; plotted on the job asset), reports each "
            "sink table as materialised when its job has committed new micro-batches to it "
            "(runless materialisations: the table's checks and downstream dbt models run "
            "by automation), and relaunches dead or stalled jobs with backoff and a "
            "restart limit. A crash also launches one run of streaming_job_crashed, which "
            "fails with it (exception, log excerpt, restart) so that run-failure alerts fire."
        ),
    )
    # Dagster passes decorator-declared resources as keyword arguments when a sensor is
    # called directly (tests) but not from the daemon; both read context.resources here.
    def _health(context: SensorEvaluationContext, **_: Any) -> SensorResult | SkipReason:
        cursor = Cursor.load(context.cursor)
        now = time.time()
        events: list[AssetObservation | AssetMaterialization | AssetCheckEvaluation] = []
        alerts: list[RunRequest] = []
        for spec in specs:
            runtime = context.resources.streaming_runtime
            status = runtime.status(spec.name)
            report = observe(
                context,
                spec,
                cursor,
                now,
                status=status,
                launch_env=push_env(spec, translator, runtime),
            )
            if report is not None:
                key = translator.get_job_asset_key(spec)
                events.append(
                    AssetObservation(
                        asset_key=key,
                        metadata=report.metadata,
                        description=report.metadata["reason"],
                    )
                )
                events.extend(v.evaluation(key) for v in report.checks)
                if status is not None:
                    events.extend(
                        table_freshness(
                            t.expected_latency.total_seconds(), t.query, status, now
                        ).evaluation(translator.get_sink_asset_key(spec, t))
                        for t in spec.sink_tables
                        if t.expected_latency is not None
                    )
                if report.alert is not None:
                    alerts.append(
                        crash_run_request(
                            spec.name,
                            report.alert,
                            started_at=None if status is None else status.started_at,
                        )
                    )
                if report.relaunched is not None:
                    # The asset is the job's process: a relaunch is a new one (the Overview
                    # shows its pid, not the dead one's).
                    events.append(_relaunch_materialization(key, report))
            if status is not None and spec.sink_tables:
                # Jobs that push their commits (dagster_url) leave the sensor the batches
                # they could not report.
                pushed = (
                    pushed_batches(context.instance, spec, translator)
                    if runtime.dagster_url
                    else None
                )
                events.extend(
                    commit_events(
                        context.resources.warehouse,
                        spec,
                        status,
                        translator,
                        cursor.reported,
                        context.log,
                        pushed=pushed,
                        now=now,
                    )
                )
        if not events:
            return SensorResult(
                skip_reason="no streaming job has run here yet; materialise a "
                "job asset to start one",
                cursor=cursor.dump(),
            )
        return SensorResult(asset_events=events, run_requests=alerts, cursor=cursor.dump())

    return _health
