"""The health sensor's judgement (condition) and restart policy (backoff, limit): pure logic."""

from __future__ import annotations

import subprocess
from datetime import timedelta

import pytest

from dagster_defs import Action, Condition, RestartPolicy, assess, decide
from dagster_defs._sensor import Cursor

POLICY = RestartPolicy(
    max_restarts=3,
    window=timedelta(minutes=10),
    initial_backoff=timedelta(seconds=30),
    max_backoff=timedelta(seconds=50),
    max_checkpoint_age=timedelta(seconds=60),
    start_timeout=timedelta(seconds=120),
)
NOW = 1_000_000.0


def _assess(state, alive=True, started_age_s=5.0, **query):
    q = {"inflight_batch_age_s": None, "checkpoint_age_s": 1.0, "lag_records": 0, **query}
    return assess(
        {"state": state, "pid": 42},
        alive=alive,
        queries={"upi-counts": q},
        now=NOW,
        started_age_s=started_age_s,
        policy=POLICY,
    ).condition


@pytest.mark.parametrize(
    ("args", "kwargs", "condition"),
    [
        (("RUNNING",), {}, Condition.HEALTHY),
        # Idle: no commit for an hour but nothing to do is healthy, not stalled.
        (("RUNNING",), {"checkpoint_age_s": 3600.0}, Condition.HEALTHY),
        (("RUNNING",), {"inflight_batch_age_s": 61.0}, Condition.STALLED),
        (("RUNNING",), {"checkpoint_age_s": 61.0, "lag_records": 10}, Condition.STALLED),
        (("RUNNING", False), {}, Condition.DEAD),
        (("STARTING",), {}, Condition.STARTING),
        (("STARTING",), {"started_age_s": 121.0}, Condition.STALLED),
        (("STARTING", False), {}, Condition.LAUNCH_FAILED),
        (("FAILED", False), {}, Condition.FAILED),
        (("STOPPED", False), {}, Condition.STOPPED),
        (("FINISHED", False), {}, Condition.STOPPED),
    ],
)
def test_conditions(args, kwargs, condition):
    assert _assess(*args, **kwargs) is condition


@pytest.mark.parametrize("by", ["SIGINT", "SIGTERM", "endpoint"])
def test_a_job_stopped_by_a_signal_is_stopped_not_crashed(by):
    seen = assess(
        {"state": "STOPPED", "pid": 42, "stopped_by": by},
        alive=False,
        queries={},
        now=NOW,
        started_age_s=None,
        policy=POLICY,
    )
    assert seen.condition is Condition.STOPPED
    assert f"by {by}" in seen.reason
    assert decide(seen.condition, [], now=NOW, policy=POLICY).action is Action.NONE


def test_healthy_and_stopped_jobs_are_left_alone():
    for condition in (Condition.HEALTHY, Condition.STARTING, Condition.STOPPED):
        assert decide(condition, [], now=NOW, policy=POLICY).action is Action.NONE


def test_first_restart_is_immediate_then_backoff_doubles_up_to_its_cap():
    assert decide(Condition.DEAD, [], now=NOW, policy=POLICY).action is Action.RESTART
    one = [NOW - 10]
    d = decide(Condition.DEAD, one, now=NOW, policy=POLICY)
    assert d.action is Action.BACKOFF and d.retry_at == NOW + 20  # 30 s after the restart
    assert decide(Condition.DEAD, [NOW - 31], now=NOW, policy=POLICY).action is Action.RESTART
    two = [NOW - 100, NOW - 45]
    d = decide(Condition.DEAD, two, now=NOW, policy=POLICY)
    assert d.action is Action.BACKOFF and d.retry_at == NOW + 5  # 60 s, capped at 50 s


def test_restart_limit_within_the_window_then_history_ages_out():
    three = [NOW - 500, NOW - 300, NOW - 100]
    assert decide(Condition.FAILED, three, now=NOW, policy=POLICY).action is Action.GIVE_UP
    later = NOW + 200  # the oldest restart left the 10-minute window
    assert decide(Condition.FAILED, three, now=later, policy=POLICY).action is Action.RESTART


def test_cursor_round_trips_and_prunes_old_restarts():
    cursor = Cursor({"upi-per-minute": [NOW - 700, NOW - 10]})
    again = Cursor.load(cursor.dump())
    assert again.prune("upi-per-minute", now=NOW, window=POLICY.window) == [NOW - 10]
    assert Cursor.load('{"version": 0, "restarts": {"x": [1]}}').restarts == {}
    assert Cursor.load("not json").restarts == {}


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_giving_up_sticks_until_the_job_is_started_again(srt_home):
    from dagster import build_sensor_context

    from dagster_defs import StreamingJobSpec, StreamingRuntime
    from dagster_defs._sensor import check_job
    from stateful_runtime.runtime import registry

    spec = StreamingJobSpec("policy-test", "unused.py", restart_policy=POLICY)
    context = build_sensor_context(
        resources={"streaming_runtime": StreamingRuntime(home=str(srt_home))}
    )
    failed = _dead_pid()
    registry.write(spec.name, {"job": spec.name, "state": "FAILED", "pid": failed})
    cursor = Cursor({spec.name: [NOW - 30, NOW - 20, NOW - 10]})

    md = check_job(context, spec, cursor, NOW)
    assert (md["condition"], md["action"]) == ("failed", "give-up")
    assert cursor.gave_up == {spec.name: failed}
    # An hour later the restarts left the window, but a given-up job stays given up ...
    md = check_job(context, spec, Cursor.load(cursor.dump()), NOW + 3600)
    assert md["action"] == "give-up"
    # ... until something starts it again: then its restart budget is fresh.
    registry.write(spec.name, {"job": spec.name, "state": "STOPPED", "pid": _dead_pid()})
    md = check_job(context, spec, cursor, NOW + 3600)
    assert (md["action"], md["restarts_in_window"]) == ("none", 0)
    assert cursor.gave_up == {} and cursor.restarts[spec.name] == []


def test_a_job_refused_for_a_lost_sink_table_is_not_restarted():
    seen = assess(
        {
            "state": "FAILED",
            "pid": 42,
            "error": {"type": "SinkDataLostError", "message": "sink out ... Ways back: ..."},
        },
        alive=False,
        queries={},
        now=NOW,
        started_age_s=5.0,
        policy=POLICY,
    )
    assert seen.condition is Condition.REFUSED and "Ways back" in seen.reason
    assert decide(seen.condition, [], now=NOW, policy=POLICY).action is Action.NONE
