"""What the sensors and triggers wait for, decided from ``srt status`` documents (pure: no
Airflow in this process)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srt_airflow._conditions import (
    Outcome,
    committed_past,
    healthy,
    new_commits,
    parse_time,
    savepoint_since,
)
from stateful_runtime.contract import JobStatus, SavepointSummary

JOB = "j"


def status(
    state: str = "RUNNING",
    *,
    live: bool = True,
    last: int | None = 3,
    inflight: float | None = None,
    watermark: str | None = "2026-01-01T00:01:00Z",
    queries: tuple[str, ...] = ("q",),
) -> JobStatus:
    doc: dict[str, Any] = {
        "job": JOB,
        "state": state if live or state != "RUNNING" else "DEAD",
        "registered_state": state,
        "pid": 42,
        "live": live,
        "alive": live,
        "checked_at": 1.0,
        "control": {"url": "http://127.0.0.1:1", "port": 1, "token_file": "t"},
        "log_path": "/srt/jobs/j.log",
        "queries": {
            q: {
                "checkpoint_dir": f"/c/{q}",
                "last_committed_batch": last,
                "last_commit_time": 1_767_225_600.0,
                "checkpoint_age_s": 1.0,
                "inflight_batch_age_s": inflight,
            }
            for q in queries
        },
        "health": {q: {"last_batch": last, "watermark": watermark} for q in queries},
    }
    return JobStatus.from_json(doc)


def test_healthy_is_running_alive_and_nothing_in_flight_too_long():
    assert healthy(status(), JOB).outcome is Outcome.MET
    stalled = healthy(status(inflight=400.0), JOB, max_batch_age_s=300)
    assert stalled.outcome is Outcome.WAIT and "in flight for 400 s" in stalled.reason
    assert healthy(status("STARTING"), JOB).outcome is Outcome.WAIT


@pytest.mark.parametrize(
    ("state", "live", "shown"),
    [("STOPPED", False, "STOPPED"), ("FAILED", False, "FAILED"), ("RUNNING", False, "DEAD")],
)
def test_a_job_that_is_not_running_is_never_healthy_and_the_reason_says_what_to_do(
    state: str, live: bool, shown: str
):
    verdict = healthy(status(state, live=live), JOB)
    assert verdict.outcome is Outcome.NEVER
    assert f"is not running ({shown})" in verdict.reason
    assert "SrtLaunchJobOperator" in verdict.reason and "/srt/jobs/j.log" in verdict.reason
    assert healthy(None, JOB).outcome is Outcome.NEVER


def test_committed_past_a_batch_waits_while_running_and_gives_up_once_stopped():
    assert committed_past(status(last=3), JOB, query="q", batch=3).outcome is Outcome.MET
    assert committed_past(status(last=2), JOB, query="q", batch=3).outcome is Outcome.WAIT
    assert committed_past(status(last=None), JOB, batch=0).outcome is Outcome.WAIT
    stopped = committed_past(status("STOPPED", live=False, last=2), JOB, batch=3)
    assert stopped.outcome is Outcome.NEVER and "not running (STOPPED)" in stopped.reason
    # What a stopped job committed before it stopped still counts.
    assert committed_past(status("STOPPED", live=False, last=5), JOB, batch=3).outcome is (
        Outcome.MET
    )
    # Every query of the job, unless one is named.
    both = status(queries=("a", "b"), last=4)
    assert committed_past(both, JOB, batch=4).outcome is Outcome.MET
    unknown = committed_past(both, JOB, query="c", batch=1)
    assert unknown.outcome is Outcome.NEVER and "known: a, b" in unknown.reason
    with pytest.raises(ValueError, match="batch or watermark"):
        committed_past(both, JOB)


_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_offsets = st.sampled_from(
    [UTC, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8))]
)


@given(mark=_times, wanted=_times, tz=_offsets, naive=st.booleans())
def test_a_watermark_is_past_a_time_whatever_zone_the_time_is_written_in(
    mark: datetime, wanted: datetime, tz: timezone, naive: bool
):
    """A naive time means UTC (as the runtime's watermarks are); an offset is honoured."""
    reported = mark.isoformat().replace("+00:00", "Z")
    local = wanted.astimezone(tz)
    given_as = wanted.replace(tzinfo=None).isoformat() if naive else local.isoformat()
    verdict = committed_past(status(watermark=reported), JOB, watermark=given_as)
    assert (verdict.outcome is Outcome.MET) == (mark >= wanted)
    assert parse_time(given_as) == wanted


def test_a_time_that_is_not_iso_8601_is_refused_with_an_example():
    with pytest.raises(ValueError, match="2026-05-01T12:00:00Z"):
        parse_time("yesterday")


def _summary(sp_id: str, job: str, created: str) -> SavepointSummary:
    return SavepointSummary(sp_id, job, f"/sp/{sp_id}", {"q": 1}, {"q": None}, 1, 1, created)


def test_a_savepoint_since_a_time_is_the_newest_of_that_job_at_or_after_it():
    since = datetime(2026, 1, 1, 12, tzinfo=UTC)
    found = [
        _summary("old", JOB, "2026-01-01T11:59:59Z"),
        _summary("other", "k", "2026-01-01T13:00:00Z"),
        _summary("a", JOB, "2026-01-01T12:00:00Z"),
        _summary("b", JOB, "2026-01-01T12:30:00+00:00"),
    ]
    verdict, newest = savepoint_since(found, JOB, since)
    assert verdict.outcome is Outcome.MET and newest is not None and newest.id == "b"
    assert savepoint_since(found[:2], JOB, since)[0].outcome is Outcome.WAIT


@given(
    st.lists(
        st.one_of(st.none(), st.tuples(st.booleans(), st.integers(0, 5))), min_size=1, max_size=40
    )
)
def test_sink_commit_events_report_every_batch_once_and_again_after_a_restore(steps):
    """Each look sees the query's last committed batch advance (or not), go back (a restore
    from an older savepoint), or no status at all. The events cover every batch up to the
    last one seen, each once since the last restore, in order, without gaps."""
    last: int | None = None
    after: int | None = None
    reported: list[int] = []
    for step in steps:
        if step is not None:
            back, n = step
            if last is None:
                last = n
            elif back and n > 0:
                last = max(0, last - n)  # a restore
                reported = [b for b in reported if b <= last]
            else:
                last += n
        seen = None if step is None or last is None else status(last=last)
        after, span, restored = new_commits(seen, "q", after)
        if span is not None:
            first, final = span
            assert first == (reported[-1] + 1 if reported else 0)
            reported += range(first, final + 1)
        if restored:
            assert after == last
    if last is not None and steps[-1] is not None:
        assert reported == list(range(last + 1))
