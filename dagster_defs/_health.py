"""A streaming job's health as asset checks on its asset: Dagster's status model, not metadata.

Four checks, as the flink-kubernetes-operator and Flink's web UI show a job (its state, its
checkpoints, its backlog, its restarts):

* ``running`` (ERROR) — the job process runs: RUNNING or STARTING as a live pid. A crash (the
  pid gone, a failed query, a start that died, a stall) fails it with the reason, the failure
  the process recorded and the last lines of its log. A job stopped on purpose (``srt stop``,
  SIGTERM, the stop job) or finished fails it with severity WARN: stopped, neither failed nor
  green-running.
* ``checkpoint_age`` (ERROR) — no micro-batch in flight, nor records waiting without a commit,
  for longer than the restart policy's ``max_checkpoint_age``; an idle job passes.
* ``lag`` (WARN) — records in the source not yet read are within ``max_lag_records``.
* ``no_crash_restart`` (ERROR) — no crash and no restart within the restart policy's window:
  each restart the health sensor made stays red for that long, with what it restarted from.
* ``dead_letters`` (WARN) — the share of this run's input rejected to the dead-letter topic is
  within ``max_dead_letter_ratio``; its result counts them per reason and shows the newest.

The health sensor reports all four every tick (runless evaluations: the asset's checks always
say what the job does now, and Dagster+ alert policies on failed checks fire on a crash); a
materialisation of the job asset reports them for the process it launched or reused.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dagster import (
    AssetCheckEvaluation,
    AssetCheckResult,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    MetadataValue,
)

from dagster_defs._specs import StreamingJobSpec

if TYPE_CHECKING:
    from stateful_runtime.contract import JobStatus

RUNNING = "running"
CHECKPOINT_AGE = "checkpoint_age"
LAG = "lag"
NO_CRASH_RESTART = "no_crash_restart"
DEAD_LETTERS = "dead_letters"
HEALTH_CHECKS = (RUNNING, CHECKPOINT_AGE, LAG, NO_CRASH_RESTART, DEAD_LETTERS)

# Conditions (the sensor's Condition values) that are a crash: the process ended, or hangs,
# without anyone asking it to.
# A refusal (a sink's table lost batches) is not restarted, but it is a failure: red.
CRASHES = frozenset({"dead", "failed", "launch-failed", "stalled", "refused", "unknown"})
STOPPED = "stopped"
# Log lines an incident keeps in the sensor cursor (the status carries 40).
INCIDENT_LOG_LINES = 20


def health_check_specs(key: AssetKey, spec: StreamingJobSpec) -> list[AssetCheckSpec]:
    """The job asset's health checks; each description says what a failure means and what
    to do."""
    policy = spec.restart_policy
    limit = policy.max_checkpoint_age.total_seconds()
    return [
        AssetCheckSpec(
            RUNNING,
            asset=key,
            description=(
                "The job process runs (RUNNING or STARTING, its pid alive). Red (ERROR): it "
                "crashed, failed, died while starting or stalled: the result has the reason, "
                "the exception and the end of its log; the health sensor restarts it per its "
                "restart policy. Yellow (WARN): stopped on purpose (srt stop, a signal, the "
                "stop job) or finished: materialise the asset to start it again."
            ),
        ),
        AssetCheckSpec(
            CHECKPOINT_AGE,
            asset=key,
            description=(
                f"No micro-batch in flight, and no records waiting without a commit, for more "
                f"than {limit:.0f} s (restart_policy.max_checkpoint_age). An idle job (nothing "
                f"to read) passes. If it fails: the job is stuck (a slow sink, a lost executor, "
                f"a full disk: see its log); the health sensor kills and relaunches it."
            ),
        ),
        AssetCheckSpec(
            LAG,
            asset=key,
            description=(
                f"Records in the source not yet read are at most "
                f"{_bound(policy.max_lag_records)} (restart_policy.max_lag_records). If it "
                f"fails (WARN): input arrives faster than the job reads it; raise "
                f"source.max_records_per_batch or parallelism (rescale_streaming_job), or "
                f"look at the batch duration plot for a slow sink."
            ),
        ),
        AssetCheckSpec(
            NO_CRASH_RESTART,
            asset=key,
            description=(
                f"No crash and no restart by the health sensor in the last "
                f"{policy.window.total_seconds() / 60:g} min (restart_policy.window). If it "
                f"fails: the result has what the job crashed with (exception, log excerpt) "
                f"and the pid it was restarted as; it passes again once the window holds no "
                f"restart. A crash loop ends with the sensor giving up (the running check)."
            ),
        ),
        AssetCheckSpec(
            DEAD_LETTERS,
            asset=key,
            description=(
                f"At most {_share(policy.max_dead_letter_ratio)} of this run's input records "
                f"were rejected to the dead-letter topic (restart_policy.max_dead_letter_ratio)."
                f" The result counts them per reason and shows the newest with their source "
                f"partition and offset. If it fails (WARN): the input changed shape (a new "
                f"producer, a schema change): read the topic (`srt log read <topic>-dlq`), fix "
                f"the producer or the job's schema; rejected records are kept, not lost."
            ),
        ),
    ]


def _share(ratio: float | None) -> str:
    return "any share" if ratio is None else f"{ratio:.2%}"


def _bound(n: int | None) -> str:
    return "unbounded" if n is None else f"{n:,}"


@dataclass(frozen=True)
class Verdict:
    """One check's outcome, for a run (:meth:`result`) or a sensor (:meth:`evaluation`)."""

    name: str
    passed: bool
    description: str
    severity: AssetCheckSeverity = AssetCheckSeverity.ERROR
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def result(self, key: AssetKey) -> AssetCheckResult:
        return AssetCheckResult(
            asset_key=key,
            check_name=self.name,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=dict(self.metadata),
        )

    def evaluation(self, key: AssetKey) -> AssetCheckEvaluation:
        return AssetCheckEvaluation(
            asset_key=key,
            check_name=self.name,
            passed=self.passed,
            severity=self.severity,
            description=self.description,
            metadata=dict(self.metadata),
        )


def _when(epoch: float | None) -> str | None:
    if epoch is None:
        return None
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _code(text: str) -> MetadataValue:
    return MetadataValue.md(f"```\n{text}\n```")


def process_metadata(status: JobStatus) -> dict[str, Any]:
    """The current process as the Overview should show it: pid, run id, state, last commit."""
    out: dict[str, Any] = {
        "state": None if status.state is None else str(status.state),
        "pid": MetadataValue.text(str(status.pid)) if status.pid is not None else None,
        "alive": bool(status.alive),
        "run_id": status.run_id,
        "started_at": status.started_at,
        "spark_app_id": status.spark_app_id,
        "last_committed_batch": MetadataValue.json(dict(status.last_committed)),
    }
    if status.ended_at:
        out["ended_at"] = status.ended_at
    if status.stopped_by:
        out["stopped_by"] = str(status.stopped_by)
    if status.log_path:
        out["log_path"] = MetadataValue.path(status.log_path)
    return {k: v for k, v in out.items() if v is not None}


def incident(
    condition: str, reason: str, status: JobStatus, now: float, **more: Any
) -> dict[str, Any]:
    """A crash as the sensor cursor keeps it (JSON), for the ``no_crash_restart`` check."""
    excerpt = status.log_excerpt or ""
    return {
        "at": now,
        "condition": condition,
        "reason": reason,
        "pid": status.pid,
        "failure": status.failure,
        "log_excerpt": "\n".join(excerpt.splitlines()[-INCIDENT_LOG_LINES:]) or None,
        **more,
    }


def _crash_details(failure: str | None, excerpt: str | None) -> tuple[str, dict[str, Any]]:
    text, metadata = "", {}
    if failure:
        text += f" It failed with: {failure.splitlines()[0][:500]}"
        metadata["failure"] = _code(failure)
    if excerpt:
        metadata["log_excerpt"] = _code(excerpt)
    return text, metadata


def verdicts(
    spec: StreamingJobSpec,
    status: JobStatus,
    condition: str,
    reason: str,
    queries: Mapping[str, Mapping[str, Any]],
    *,
    decision: str | None = None,
    incidents: Sequence[Mapping[str, Any]] = (),
    now: float | None = None,
) -> list[Verdict]:
    """The four health checks from the job's status and condition (the sensor's assessment),
    what the sensor decided, and the crashes it kept within the restart window (pure)."""
    now = time.time() if now is None else now
    policy = spec.restart_policy
    process = process_metadata(status)
    out: list[Verdict] = []

    # running
    crashed = condition in CRASHES
    if crashed:
        details, extra = _crash_details(status.failure, status.log_excerpt)
        log = f" Its log: {status.log_path}." if status.log_path else ""
        out.append(
            Verdict(
                RUNNING,
                False,
                f"{condition.upper()}: {reason}.{details}"
                + (f" Sensor: {decision}." if decision else "")
                + log,
                metadata={**process, "condition": condition, **extra},
            )
        )
    elif condition == STOPPED:
        out.append(
            Verdict(
                RUNNING,
                False,
                f"{reason}. Materialise the asset to start it again.",
                severity=AssetCheckSeverity.WARN,
                metadata={**process, "condition": condition},
            )
        )
    else:
        out.append(
            Verdict(
                RUNNING,
                True,
                f"{reason} (run {status.run_id})" if status.run_id else reason,
                metadata={**process, "condition": condition},
            )
        )

    # checkpoint_age and lag: of a live job; a crashed one does not advance at all.
    limit = policy.max_checkpoint_age.total_seconds()
    ages: dict[str, Any] = {}
    lags: dict[str, Any] = {}
    stuck: list[str] = []
    for name, q in sorted(queries.items()):
        inflight, age, lag = (
            q.get("inflight_batch_age_s"),
            q.get("checkpoint_age_s"),
            q.get("lag_records"),
        )
        ages[name] = {"checkpoint_age_s": age, "inflight_batch_age_s": inflight}
        lags[name] = lag
        if inflight is not None and inflight > limit:
            stuck.append(f"{name}: a batch in flight for {inflight:.0f} s")
        elif lag and age is not None and age > limit:
            stuck.append(f"{name}: {lag:,} records waiting and no commit for {age:.0f} s")
    if crashed:
        out.append(
            Verdict(
                CHECKPOINT_AGE,
                False,
                f"the job is {condition}: its checkpoints do not advance",
                metadata={"queries": MetadataValue.json(ages)},
            )
        )
    elif condition == STOPPED:
        out.append(Verdict(CHECKPOINT_AGE, True, "stopped on purpose: nothing to commit"))
    elif stuck:
        out.append(
            Verdict(
                CHECKPOINT_AGE,
                False,
                "; ".join(stuck) + f" (limit {limit:.0f} s): stuck; see its log",
                metadata={"queries": MetadataValue.json(ages)},
            )
        )
    else:
        idle = all(not lags.get(n) for n in queries)
        newest = min(
            (a["checkpoint_age_s"] for a in ages.values() if a["checkpoint_age_s"] is not None),
            default=None,
        )
        text = "idle: nothing to read" if idle else "committing"
        if newest is not None:
            text += f"; last commit {newest:.0f} s ago"
        out.append(
            Verdict(CHECKPOINT_AGE, True, text, metadata={"queries": MetadataValue.json(ages)})
        )

    bound = policy.max_lag_records
    total = sum(v for v in lags.values() if v)
    lag_md = {"lag (records)": total, "queries": MetadataValue.json(lags)}
    if condition == STOPPED or crashed:
        out.append(
            Verdict(
                LAG,
                True,
                f"not running ({condition}); {total:,} records in the "
                f"source unread at its last report",
                AssetCheckSeverity.WARN,
                lag_md,
            )
        )
    elif bound is not None and total > bound:
        out.append(
            Verdict(
                LAG,
                False,
                f"{total:,} records waiting (bound {bound:,}): input arrives faster than the "
                f"job reads it",
                AssetCheckSeverity.WARN,
                lag_md,
            )
        )
    else:
        out.append(
            Verdict(LAG, True, f"{total:,} records waiting", AssetCheckSeverity.WARN, lag_md)
        )

    # no_crash_restart
    window = policy.window.total_seconds()
    recent = sorted(
        (i for i in incidents if now - float(i.get("at") or 0) < window),
        key=lambda i: float(i["at"]),
    )
    if recent or crashed:
        last = recent[-1] if recent else {}
        details, extra = _crash_details(
            last.get("failure") or status.failure, last.get("log_excerpt") or status.log_excerpt
        )
        if last:
            what = (
                f"{len(recent)} crash(es) in the last {window / 60:g} min; the last at "
                f"{_when(float(last['at']))}: {last.get('condition', '').upper()} "
                f"({last.get('reason')})"
            )
            if last.get("restarted_pid"):
                what += f", restarted as pid {last['restarted_pid']}"
        else:
            what = f"{condition.upper()} now ({reason})"
        out.append(
            Verdict(
                NO_CRASH_RESTART,
                False,
                what + "." + details,
                metadata={
                    "crashes_in_window": len(recent) or 1,
                    "incidents": MetadataValue.json(
                        [
                            {k: v for k, v in i.items() if k not in ("log_excerpt", "failure")}
                            for i in recent
                        ]
                    ),
                    **extra,
                },
            )
        )
    else:
        out.append(
            Verdict(
                NO_CRASH_RESTART,
                True,
                f"no crash or restart in the last {window / 60:g} min",
                metadata={"crashes_in_window": 0},
            )
        )
    out.append(_dead_letters(status, policy.max_dead_letter_ratio))
    return out


def dead_letter_metadata(status: JobStatus) -> dict[str, Any]:
    """The job's dead letters for an observation: counts per reason and the newest records,
    as a table (``dead letters (in topic)`` is plotted)."""
    from dagster import TableColumn, TableRecord, TableSchema

    out: dict[str, Any] = {}
    for name in sorted(status.queries):
        view = status.query_health(name).dead_letters
        if view is None:
            continue
        prefix = f"{name}: " if len(status.queries) > 1 else ""
        out[f"{prefix}dead letters (in topic)"] = MetadataValue.int(view.in_topic)
        out[f"{prefix}dead letters by reason (this run)"] = MetadataValue.json(dict(view.by_reason))
        out[f"{prefix}recent dead letters"] = MetadataValue.table(
            records=[
                TableRecord(
                    {
                        "reason": d.reason,
                        "source partition": d.source_partition,
                        "source offset": d.source_offset,
                        "record": d.value,
                    }
                )
                for d in reversed(view.samples)
            ],
            schema=TableSchema(
                columns=[
                    TableColumn("reason", "string"),
                    TableColumn("source partition", "string"),
                    TableColumn("source offset", "int"),
                    TableColumn("record", "string"),
                ]
            ),
        )
        out[f"{prefix}dead-letter topic"] = view.topic
    return out


def _dead_letters(status: JobStatus, bound: float | None) -> Verdict:
    dead = good = 0
    reasons: dict[str, int] = {}
    samples: list[dict[str, Any]] = []
    topics = []
    for name in sorted(status.queries):
        health = status.query_health(name)
        if health.records is not None:
            dead += health.records.dead_letters
            good += health.records.input
        if health.dead_letters is not None:
            topics.append(health.dead_letters.topic)
            for reason, n in health.dead_letters.by_reason.items():
                reasons[reason] = reasons.get(reason, 0) + n
            samples += [d.to_json() for d in health.dead_letters.samples[-5:]]
    share = dead / good if good else 0.0
    metadata: dict[str, Any] = {
        "dead letters (this run)": dead,
        "records input (this run)": good,
        "by reason": MetadataValue.json(reasons),
        "newest": MetadataValue.json(samples),
    }
    where = f" in {', '.join(topics)}" if topics else ""
    counts = "; ".join(f"{r}: {n:,}" for r, n in sorted(reasons.items(), key=lambda x: -x[1]))
    text = f"{dead:,} of {good:,} records ({share:.2%}) rejected{where}" + (
        f" ({counts})" if counts else ""
    )
    if bound is not None and share > bound:
        return Verdict(
            DEAD_LETTERS,
            False,
            f"{text}: above {bound:.2%}; read them with `srt log read` on the topic",
            AssetCheckSeverity.WARN,
            metadata,
        )
    return Verdict(DEAD_LETTERS, True, text, AssetCheckSeverity.WARN, metadata)


# ----------------------------------------------------------------------------- sink tables

FRESHNESS = "freshness"


def freshness_windows(latency_s: float) -> tuple[float, float]:
    """Warn and fail bounds (seconds) from a table's expected latency: the generated dbt
    source freshness's minutes (``stateful_runtime.dbt_sources.freshness``)."""
    from stateful_runtime.dbt_sources import freshness

    windows = freshness(latency_s)
    return windows["warn_after"]["count"] * 60.0, windows["error_after"]["count"] * 60.0


def freshness_spec(key: AssetKey, latency_s: float) -> AssetCheckSpec:
    warn, fail = freshness_windows(latency_s)
    return AssetCheckSpec(
        FRESHNESS,
        asset=key,
        description=(
            f"Fresh unless the job's source has records it has not committed to this table: "
            f"records waiting and no commit for {warn:.0f} s warns, {fail:.0f} s fails. An "
            f"idle source (nothing new) is fresh however old the last commit: it says idle. "
            f"If it fails: the job is stuck or behind; look at the job asset's health checks "
            f"(running, checkpoint_age, lag). A job not running warns: nothing reaches the "
            f"table until it runs again."
        ),
    )


def table_freshness(
    latency_s: float, query: str, status: JobStatus, now: float | None = None
) -> Verdict:
    """Whether a sink table is behind its stream: only records waiting in the source without
    a commit make it stale, never the quiet of an idle source (pure)."""
    warn, fail = freshness_windows(latency_s)
    health = status.query_health(query)
    info = status.queries.get(query)
    facts = None if info is None else info.checkpoint
    age = None if facts is None else facts.checkpoint_age_s
    inflight = None if facts is None else facts.inflight_batch_age_s
    lag = None if health.batch is None else health.batch.lag_records
    md: dict[str, Any] = {
        "last commit age (s)": age,
        "records waiting": lag,
        "batch in flight (s)": inflight,
        "warn after (s)": warn,
        "fail after (s)": fail,
    }
    md = {k: v for k, v in md.items() if v is not None}
    if not status.live:
        state = "not running" if status.state is None else str(status.state)
        return Verdict(
            FRESHNESS,
            False,
            f"the job is {state}: no new batches reach the table until it runs again",
            AssetCheckSeverity.WARN,
            md,
        )
    behind = max(
        inflight or 0.0,
        (age or 0.0) if lag else 0.0,
    )
    if behind >= warn:
        severity = AssetCheckSeverity.ERROR if behind >= fail else AssetCheckSeverity.WARN
        what = (
            f"a batch in flight for {inflight:.0f} s"
            if inflight is not None and inflight == behind
            else f"{lag:,} records waiting and no commit for {age:.0f} s"
        )
        return Verdict(FRESHNESS, False, f"stale: {what}", severity, md)
    if not lag:
        since = "" if age is None else f"; last commit {age:.0f} s ago"
        return Verdict(FRESHNESS, True, f"idle: the source has nothing new{since}", metadata=md)
    return Verdict(
        FRESHNESS,
        True,
        f"committing: {lag:,} records waiting, last commit {age or 0:.0f} s ago",
        metadata=md,
    )
