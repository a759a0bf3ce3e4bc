"""The job asset's health checks (running, checkpoint age, lag, no crash or restart), judged
from a status and the sensor's assessment: pure logic, every condition."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from dagster import AssetCheckSeverity, AssetKey
from hypothesis import given
from hypothesis import strategies as st

from dagster_defs import RestartPolicy, StreamingJobSpec
from dagster_defs._health import (
    CHECKPOINT_AGE,
    CRASHES,
    DEAD_LETTERS,
    HEALTH_CHECKS,
    LAG,
    NO_CRASH_RESTART,
    RUNNING,
    dead_letter_metadata,
    health_check_specs,
    incident,
    table_freshness,
    verdicts,
)
from stateful_runtime.contract import JobState, JobStatus

POLICY = RestartPolicy(
    window=timedelta(minutes=10), max_checkpoint_age=timedelta(seconds=60), max_lag_records=1000
)
SPEC = StreamingJobSpec("upi", "upi.py", restart_policy=POLICY)
NOW = 1_000_000.0
LIVE = JobStatus("upi", state=JobState.RUNNING, pid=42, run_id="r1", alive=True, live=True)
DEAD = replace(
    LIVE,
    state=JobState.DEAD,
    registered_state=JobState.RUNNING,
    alive=False,
    live=False,
    log_excerpt="[upi] upi-counts batch 7 | rows 10\nKilled",
)


def _q(**kw):
    return {
        "upi-counts": {
            "inflight_batch_age_s": None,
            "checkpoint_age_s": 2.0,
            "lag_records": 0,
            **kw,
        }
    }


def _by_name(status, condition, reason="r", queries=None, **kw):
    out = verdicts(SPEC, status, condition, reason, queries or _q(), now=NOW, **kw)
    assert [v.name for v in out] == list(HEALTH_CHECKS)
    return {v.name: v for v in out}


def test_every_check_has_a_spec_that_says_what_to_do():
    specs = health_check_specs(AssetKey("upi"), SPEC)
    assert [s.name for s in specs] == list(HEALTH_CHECKS)
    assert all("fail" in (s.description or "").lower() for s in specs)


def test_a_healthy_idle_job_is_green_and_says_idle():
    v = _by_name(LIVE, "healthy", "RUNNING as pid 42", _q(checkpoint_age_s=3600.0))
    assert all(c.passed for c in v.values())
    assert v[CHECKPOINT_AGE].description.startswith("idle")
    assert v[RUNNING].metadata["pid"].value == "42"


def test_a_stuck_job_fails_checkpoint_age_and_a_backlog_warns_on_lag():
    v = _by_name(LIVE, "stalled", "in flight", _q(inflight_batch_age_s=90.0, lag_records=5000))
    assert not v[CHECKPOINT_AGE].passed and not v[RUNNING].passed
    v = _by_name(LIVE, "healthy", "ok", _q(lag_records=5000))
    assert v[CHECKPOINT_AGE].passed and not v[LAG].passed
    assert v[LAG].severity is AssetCheckSeverity.WARN and "5,000" in v[LAG].description


def test_stopped_on_purpose_is_a_warning_not_a_failure_nor_green():
    stopped = replace(LIVE, state=JobState.STOPPED, alive=False, live=False, stopped_by="endpoint")
    v = _by_name(stopped, "stopped", "STOPPED by endpoint: stopped on purpose, not restarted")
    assert not v[RUNNING].passed and v[RUNNING].severity is AssetCheckSeverity.WARN
    assert "Materialise" in v[RUNNING].description
    assert v[NO_CRASH_RESTART].passed and v[CHECKPOINT_AGE].passed


def test_a_crash_is_red_with_its_failure_and_log_and_stays_red_for_the_window():
    failed = replace(DEAD, state=JobState.FAILED, failure="query upi-counts failed: boom")
    v = _by_name(failed, "failed", "the job process failed", decision="restart 1 of 3")
    running = v[RUNNING]
    assert not running.passed and running.severity is AssetCheckSeverity.ERROR
    assert "boom" in running.description and "restart 1 of 3" in running.description
    assert "Killed" in running.metadata["log_excerpt"].value
    assert not v[NO_CRASH_RESTART].passed

    crash = {**incident("failed", "the job process failed", failed, NOW), "restarted_pid": 43}
    restarted = replace(LIVE, pid=43)
    later = verdicts(
        SPEC, restarted, "healthy", "RUNNING as pid 43", _q(), incidents=[crash], now=NOW + 60
    )
    checks = {c.name: c for c in later}
    assert checks[RUNNING].passed
    no_crash = checks[NO_CRASH_RESTART]
    assert not no_crash.passed and "restarted as pid 43" in no_crash.description
    assert "boom" in no_crash.description and "Killed" in no_crash.metadata["log_excerpt"].value
    # Once the window (10 min) holds no crash, green again.
    aged = verdicts(SPEC, restarted, "healthy", "ok", _q(), incidents=[crash], now=NOW + 601)
    assert all(c.passed for c in aged)


@given(
    condition=st.sampled_from(
        ["healthy", "starting", "stopped", *sorted(CRASHES)],
    ),
    lag=st.one_of(st.none(), st.integers(0, 10_000)),
    age=st.one_of(st.none(), st.floats(0, 1e5)),
    inflight=st.one_of(st.none(), st.floats(0, 1e5)),
)
def test_red_exactly_when_crashed_or_stuck(condition, lag, age, inflight):
    status = DEAD if condition in CRASHES else LIVE
    q = _q(lag_records=lag, checkpoint_age_s=age, inflight_batch_age_s=inflight)
    v = _by_name(status, condition, "why", q)
    errors = {n for n, c in v.items() if not c.passed and c.severity is AssetCheckSeverity.ERROR}
    if condition in CRASHES:
        assert {RUNNING, NO_CRASH_RESTART} <= errors
    elif condition == "stopped":
        assert errors == set() and not v[RUNNING].passed
    else:
        stuck = (inflight or 0) > 60 or (bool(lag) and (age or 0) > 60)
        assert errors == ({CHECKPOINT_AGE} if stuck else set())
    assert v[LAG].severity is AssetCheckSeverity.WARN


def _table_status(lag, age, inflight=None, live=True):
    from stateful_runtime.contract import BatchHealth, CheckpointFacts, QueryHealth, QueryStatus

    facts = CheckpointFacts(5, checkpoint_age_s=age, inflight_batch_age_s=inflight)
    return replace(
        LIVE if live else DEAD,
        queries={"upi-counts": QueryStatus("/ck/upi-counts", checkpoint=facts)},
        health={"upi-counts": QueryHealth(batch=BatchHealth(5, lag_records=lag))},
    )


@given(
    lag=st.one_of(st.none(), st.integers(0, 10_000)),
    age=st.one_of(st.none(), st.floats(0, 1e5)),
    inflight=st.one_of(st.none(), st.floats(0, 1e5)),
)
def test_a_table_is_stale_only_when_records_wait_uncommitted(lag, age, inflight):
    # expected latency 7 s: warn after 60 s, fail after 120 s (the dbt source's minutes)
    v = table_freshness(7.0, "upi-counts", _table_status(lag, age, inflight), now=NOW)
    behind = max(inflight or 0, (age or 0) if lag else 0)
    assert v.passed == (behind < 60)
    if not v.passed:
        assert v.severity is (
            AssetCheckSeverity.ERROR if behind >= 120 else AssetCheckSeverity.WARN
        )
    if v.passed and not lag:
        assert v.description.startswith("idle")


def test_an_idle_table_hours_after_its_last_commit_is_fresh_and_a_stopped_job_warns():
    assert table_freshness(7.0, "upi-counts", _table_status(0, 7200.0)).passed
    stale = table_freshness(7.0, "upi-counts", _table_status(50, 7200.0))
    assert not stale.passed and "50 records waiting" in stale.description
    down = table_freshness(7.0, "upi-counts", _table_status(0, 10.0, live=False))
    assert not down.passed and down.severity is AssetCheckSeverity.WARN


def test_dead_letters_are_counted_by_reason_shown_and_warn_above_the_share():
    from stateful_runtime.contract import (
        DeadLetterSample,
        DeadLetterView,
        QueryHealth,
        QueryStatus,
        RecordCounts,
    )

    view = DeadLetterView(
        "upi-payments-dlq",
        30,
        {"malformed JSON": 20, "missing field 'amount_paise'": 10},
        (DeadLetterSample("malformed JSON: Expecting value", "1", 790, "{not json"),),
    )

    def status(dead: int) -> JobStatus:
        return replace(
            LIVE,
            queries={"upi-counts": QueryStatus("/ck")},
            health={
                "upi-counts": QueryHealth(
                    records=RecordCounts("src", 1000, 1000 - dead, dead, 0), dead_letters=view
                )
            },
        )

    ok = _by_name(status(5), "healthy")[DEAD_LETTERS]
    assert ok.passed and "5 of 1,000 records (0.50%)" in ok.description
    bad = _by_name(status(30), "healthy")[DEAD_LETTERS]
    assert not bad.passed and bad.severity is AssetCheckSeverity.WARN
    assert "malformed JSON: 20" in bad.description and "upi-payments-dlq" in bad.description
    md = dead_letter_metadata(status(30))
    assert md["dead letters (in topic)"].value == 30
    [row] = md["recent dead letters"].value.records
    assert row.data["source offset"] == 790 and row.data["record"] == "{not json"
