"""What a sensor or trigger waits for, decided from one ``srt status`` document (pure).

Each function returns a :class:`Verdict`: met, not yet (poll again), or never (the job ended
or failed, so waiting longer cannot help: the task fails with the reason).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from stateful_runtime.contract import JobStatus, SavepointSummary

# A micro-batch in flight longer than this is a stalled job (the Dagster sensor's default).
DEFAULT_MAX_BATCH_AGE_S = 300.0


class Outcome(StrEnum):
    MET = "met"
    WAIT = "wait"
    NEVER = "never"


@dataclass(frozen=True)
class Verdict:
    """Whether a condition holds now, and why (shown in the task's log)."""

    outcome: Outcome
    reason: str


def parse_time(value: str | datetime) -> datetime:
    """An event time as an aware UTC datetime: ISO 8601 text (``Z`` or an offset; naive means
    UTC, as the runtime's watermarks are) or a datetime."""
    if isinstance(value, datetime):
        t = value
    else:
        text = str(value).strip()
        try:
            t = datetime.fromisoformat(text.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(
                f"watermark {value!r} is not an ISO 8601 time; give e.g. 2026-05-01T12:00:00Z"
            ) from None
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


def _ended(status: JobStatus | None, job: str) -> Verdict | None:
    """NEVER for a job that is not running (never ran, stopped, finished, failed, dead)."""
    if status is None:
        return Verdict(Outcome.NEVER, f"job {job!r} never ran in this registry")
    if not status.live:
        state = status.state or status.entry_state
        return Verdict(
            Outcome.NEVER,
            f"job {job!r} is not running ({state}); launch it (SrtLaunchJobOperator) and see "
            f"its log {status.log_path or ''}".rstrip(),
        )
    return None


def healthy(
    status: JobStatus | None, job: str, *, max_batch_age_s: float = DEFAULT_MAX_BATCH_AGE_S
) -> Verdict:
    """RUNNING, its process alive, and no query with a micro-batch in flight (or records
    waiting with no commit) for longer than ``max_batch_age_s``."""
    if (ended := _ended(status, job)) is not None:
        return ended
    assert status is not None
    if status.entry_state != "RUNNING":
        return Verdict(Outcome.WAIT, f"{job} is {status.entry_state} (pid {status.pid})")
    for name, q in sorted(status.queries.items()):
        facts = q.checkpoint
        if facts is None:
            continue
        inflight, age = facts.inflight_batch_age_s, facts.checkpoint_age_s
        if inflight is not None and inflight > max_batch_age_s:
            return Verdict(
                Outcome.WAIT,
                f"query {name}: the batch after {facts.last_committed_batch} has been in "
                f"flight for {inflight:.0f} s (limit {max_batch_age_s:.0f} s)",
            )
        batch = status.query_health(name).batch
        lag = None if batch is None else batch.lag_records
        if lag and age is not None and age > max_batch_age_s:
            return Verdict(
                Outcome.WAIT,
                f"query {name}: {lag} records waiting and no commit for {age:.0f} s",
            )
    return Verdict(Outcome.MET, f"{job} is RUNNING as pid {status.pid}, nothing stalled")


def committed_past(
    status: JobStatus | None,
    job: str,
    *,
    query: str | None = None,
    batch: int | None = None,
    watermark: str | datetime | None = None,
) -> Verdict:
    """The query (``None``: every query of the job) has committed batch ``batch`` or a later
    one, and its watermark reached ``watermark``. A job that stopped short never will."""
    if batch is None and watermark is None:
        raise ValueError("give batch or watermark (or both)")
    floor = None if watermark is None else parse_time(watermark)
    if status is None:
        return Verdict(Outcome.NEVER, f"job {job!r} never ran in this registry")
    names = [query] if query else sorted(status.queries)
    if query and query not in status.queries:
        known = ", ".join(sorted(status.queries)) or "none yet"
        if status.queries:
            return Verdict(Outcome.NEVER, f"job {job!r} has no query {query!r} (known: {known})")
    if not names:
        return _ended(status, job) or Verdict(Outcome.WAIT, f"{job} has no query yet")
    missing = []
    for name in names:
        q = status.queries.get(name)
        last = None if q is None else q.last_committed_batch
        if batch is not None and (last is None or last < batch):
            missing.append(f"{name} at batch {last} (waiting for {batch})")
            continue
        if floor is not None:
            health = status.query_health(name).batch
            mark = None if health is None else health.watermark
            if mark is None or parse_time(mark) < floor:
                missing.append(f"{name} watermark {mark} (waiting for {floor.isoformat()})")
    if not missing:
        return Verdict(Outcome.MET, f"{job}: {', '.join(names)} committed past the mark")
    return _ended(status, job) or Verdict(Outcome.WAIT, "; ".join(missing))


def savepoint_since(
    savepoints: list[SavepointSummary], job: str, since: datetime
) -> tuple[Verdict, SavepointSummary | None]:
    """The newest complete savepoint of ``job`` created at or after ``since``."""
    fresh = [
        sp for sp in savepoints if sp.job == job and parse_time(sp.created_at) >= parse_time(since)
    ]
    if not fresh:
        return Verdict(Outcome.WAIT, f"no savepoint of {job} since {since.isoformat()}"), None
    newest = max(fresh, key=lambda sp: parse_time(sp.created_at))
    return Verdict(Outcome.MET, f"savepoint {newest.id} at {newest.location}"), newest


def new_commits(
    status: JobStatus | None, query: str, after: int | None
) -> tuple[int | None, tuple[int, int] | None, bool]:
    """What a sink-commit event reports on one look: ``(cursor, (first, last), restored)``.

    ``after`` is the last batch reported (None: nothing yet). The span is the query's batches
    committed since (None: nothing new). A checkpoint that went back, a restore from an older
    savepoint, moves the cursor back to it (``restored``): the batches after it run again,
    with the sinks' ledgers rewound, and are reported again.
    """
    q = None if status is None else status.queries.get(query)
    last = None if q is None else q.last_committed_batch
    if last is None:
        return after, None, False
    if after is not None and last < after:
        return last, None, True
    if after is not None and last == after:
        return after, None, False
    return last, (0 if after is None else after + 1, last), False
