"""The UPI job managed from a real Airflow 3, through the example DAGs: a DAG run launches it
and sees a commit (the wait deferred to a trigger), another takes a savepoint and applies the
retention policy, the AssetWatcher DAG is triggered by its commits (scheduler, triggerer and
DAG processor really running), and a last one stops it with a savepoint."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from upi_events import START_MS, events

from stateful_runtime.contract import JobStatus, SavepointSummary
from tests.helpers import append_lines, poll, srt
from tests.srt_airflow.helpers import TEST_DAGS, AirflowHome

pytestmark = [pytest.mark.slow, pytest.mark.airflow]

JOB = "upi-per-minute"
DOWNSTREAM = "upi_counts_downstream"
CHECKS = TEST_DAGS / "srt_checks.py"


def feed(log_dir: Path, count: int, seed: int, start_ms: int) -> None:
    append_lines(
        log_dir,
        list(
            events(
                count, merchants=8, rate_per_s=40, disorder_ms=3_000, seed=seed, start_ms=start_ms
            )
        ),
    )


def status(env: dict[str, str]) -> JobStatus | None:
    out = srt(["status", JOB, "--json"], env)
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    return JobStatus.from_json(found[0]) if found else None


def downstream_events(home: AirflowHome) -> list[dict]:
    """The asset events of the downstream DAG's runs, oldest first."""
    rows = home.query(
        "SELECT ae.extra FROM dag_run dr JOIN dagrun_asset_event dae ON dae.dag_run_id = dr.id "
        "JOIN asset_event ae ON ae.id = dae.event_id WHERE dr.dag_id = ? ORDER BY ae.id",
        DOWNSTREAM,
    )
    return [json.loads(extra or "{}").get("payload") or {} for (extra,) in rows]


@pytest.fixture(scope="module")
def work(airflow_home: AirflowHome, srt_env: dict[str, str]) -> Iterator[Path]:
    """The connection's working directory with the UPI topic and events in it; the job is
    killed at the end whatever happened."""
    from stateful_runtime.connectors.eventlog import EventLog

    log_dir = airflow_home.work / "srt-data" / "log"
    EventLog(log_dir).create_topic("upi-payments", 2)
    feed(log_dir, 2_000, seed=1, start_ms=START_MS)
    yield airflow_home.work
    airflow_home.stop_all()
    srt(
        ["stop", JOB, "--kill", "--timeout", "10"],
        {**srt_env, "SRT_HOME": str(airflow_home.srt_home)},
    )


def test_airflow_starts_the_upi_job_savepoints_it_runs_a_dag_on_its_commits_and_stops_it(
    airflow_home: AirflowHome, work: Path, srt_env: dict[str, str]
):
    env = {**srt_env, "SRT_HOME": str(airflow_home.srt_home)}

    # 1. Start: srt launch, then the trigger waits for RUNNING and a commit.
    out = airflow_home.airflow("dags", "test", "upi_per_minute_start")
    assert "running trigger in line" in out.stdout + out.stderr  # the wait was deferred
    started = status(env)
    assert started is not None and started.live and started.entry_state == "RUNNING"
    assert started.last_committed.get("upi-counts") is not None
    assert airflow_home.task_states("upi_per_minute_start") == {"launch": "success"}

    # 2. The hourly savepoint DAG: a savepoint, then the retention policy.
    airflow_home.airflow("dags", "test", "upi_per_minute_savepoints")
    out = srt(["savepoint", "list", JOB, "--json"], env)
    taken = [SavepointSummary.from_json(r) for r in json.loads(out.stdout)]
    assert len(taken) == 1 and taken[0].job == JOB
    assert airflow_home.task_states("upi_per_minute_savepoints") == {
        "savepoint": "success",
        "retention": "success",
    }

    # Every sensor on the running job, a savepoint awaited by a sensor, a rescale from it.
    airflow_home.airflow(
        "dags", "test", "srt_checks_running", "-f", str(airflow_home.dags / CHECKS.name)
    )
    states = airflow_home.task_states("srt_checks_running")
    assert set(states.values()) == {"success"}, states
    rescaled = status(env)
    assert rescaled is not None and rescaled.live and rescaled.parallelism == 3
    assert rescaled.restored_from is not None

    # 3. The downstream DAG runs on the sink table's asset events: the DAG processor registers
    # the AssetWatcher, the triggerer runs its event trigger, the scheduler creates the runs.
    airflow_home.start("dag-processor")
    airflow_home.start("triggerer")
    airflow_home.start("scheduler")
    try:
        first = poll(lambda: downstream_events(airflow_home), 240, "the first asset event")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{airflow_home.logs()}") from None
    assert first[0]["job"] == JOB and first[0]["table"] == "upi_counts"
    seen = first[-1]["last_batch"]
    # New input: the next commit triggers another run, for the batches after the last one.
    feed(work / "srt-data" / "log", 2_000, seed=2, start_ms=START_MS + 60_000)
    try:
        later = poll(
            lambda: [e for e in downstream_events(airflow_home) if e["last_batch"] > seen],
            240,
            "an asset event for a new commit",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{airflow_home.logs()}") from None
    assert later[0]["first_batch"] == seen + 1
    airflow_home.stop_all()

    # 4. Stop with a savepoint.
    airflow_home.airflow("dags", "test", "upi_per_minute_stop")
    stopped = status(env)
    assert stopped is not None and not stopped.live and stopped.entry_state == "STOPPED"
    assert stopped.last_savepoint is not None

    # Stopping a stopped job succeeds and says so; a sensor on a stopped job fails at once,
    # saying why (it would never commit batch 1000000); a launch under the wrong name is
    # refused with the runtime's reason.
    out = airflow_home.airflow(
        "dags",
        "test",
        "srt_checks_stopped",
        "-f",
        str(airflow_home.dags / CHECKS.name),
        check=False,
    )
    assert airflow_home.task_states("srt_checks_stopped") == {
        "stop_again": "success",
        "never": "failed",
        "wrong_job": "failed",
    }
    said = out.stdout + out.stderr
    assert "is not running (STOPPED)" in said
    assert "builds job 'upi-per-minute', not 'not-upi'" in said
