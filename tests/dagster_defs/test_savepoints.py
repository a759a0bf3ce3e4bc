"""Savepoints from Dagster against a real ``srt run`` process: the periodic schedule takes a
savepoint and prunes older ones, rescale and upgrade relaunch the job from a stop-with-savepoint,
errors (not running, incompatible new code) fail the run with the runtime's message, and the
savepoint list (partitions of the savepoint asset, on a real Dagster instance) offers the
savepoints a restore starts from.

The tests share one job and run in file order (a Spark launch costs ~6 s idle, far more on a
busy machine): launch, periodic savepoints, rescale 2 -> 3, upgrade, stop, failed upgrades,
the list and a restore from it.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from dagster import (
    AddDynamicPartitionsRequest,
    AssetKey,
    AssetMaterialization,
    AssetObservation,
    DagsterInstance,
    build_schedule_context,
    build_sensor_context,
    instance_for_test,
)
from upi_events import START_MS

from dagster_defs import SavepointPolicy, StreamingJobTranslator, _savepoint_list, build_definitions
from dagster_defs._savepoints import (
    RESCALE_JOB,
    SAVEPOINT_JOB,
    STOP_WITH_SAVEPOINT_JOB,
    UPGRADE_JOB,
)
from stateful_runtime.checkpoints import savepoints
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.manifest import seal
from stateful_runtime.runtime import registry
from tests.dagster_defs.helpers import JOB, JOB_KEY, UPI_JOB, Live, feed, live_job, metadata
from tests.helpers import EXAMPLES, poll

pytestmark = pytest.mark.slow

SCHEDULE = "upi_per_minute_savepoint_schedule"
KEEP = 2


@pytest.fixture(scope="module")
def sp_live(tmp_path_factory: pytest.TempPathFactory, srt_env: dict[str, str]) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("upi-savepoints")
    with live_job(
        root,
        config={"savepoint.dir": str(root / "savepoints")},
        savepoints=SavepointPolicy(keep=KEEP, max_age=timedelta(days=1)),
    ) as state:
        yield state


def _root(live: Live) -> Path:
    return live.ws.root / "savepoints"


def _tick(live: Live):
    schedule = live.defs.resolve_schedule_def(SCHEDULE)
    return schedule.evaluate_tick(build_schedule_context(resources=live.resources))


def _run(live: Live, name: str, config: dict[str, Any] | None = None, defs=None, **kwargs):
    job = (defs or live.defs).resolve_job_def(name)
    run_config = kwargs.pop("run_config", None) or {"ops": {f"{name}_op": {"config": config or {}}}}
    return job.execute_in_process(
        run_config=run_config, resources=live.resources, raise_on_error=False, **kwargs
    )


def _observation(result) -> dict[str, Any]:
    """The job asset's observation (the savepoint list's own events aside)."""
    [obs] = [
        e.event_specific_data.asset_observation
        for e in result.all_events
        if e.event_type_value == "ASSET_OBSERVATION"
        and e.event_specific_data.asset_observation.asset_key == JOB_KEY
    ]
    return {k: v.value for k, v in obs.metadata.items()}


def _failure(result) -> str:
    assert not result.success
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    return failure.step_failure_data.error.message


def _ok(result) -> None:
    if not result.success:
        raise AssertionError(_failure(result))


def _last(live: Live) -> int:
    return QueryLayout(live.qdir).last_committed() or -1


def _commits_after(live: Live, batch: int, what: str) -> int:
    return poll(lambda: _last(live) > batch and _last(live), 240, what)


def _job_file(path: Path, old: str, new: str) -> Path:
    text = (EXAMPLES / "upi_per_minute.py").read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


def test_schedule_skips_a_job_that_is_not_running(sp_live: Live):
    schedule = sp_live.defs.resolve_schedule_def(SCHEDULE)
    assert schedule.cron_schedule == "0 * * * *"  # hourly by default
    assert schedule.default_status.value == "STOPPED"  # opt in, as periodic savepoints are
    entry = registry.read(JOB)
    # Another module's job, long gone: its fixture SIGKILLs the job, so the entry may still
    # say RUNNING with a dead pid (as after any kill -9); the schedule must see through that.
    assert not (entry and registry.running(entry))
    tick = _tick(sp_live)
    assert not tick.run_requests
    assert "not running" in tick.skip_message or "never run" in tick.skip_message


def test_schedule_produces_a_savepoint_and_retention_deletes_older_ones(sp_live: Live):
    md = metadata(sp_live.materialize(JOB_KEY), JOB_KEY)
    sp_live.pids.append(int(md["pid"]))

    taken = []
    for _ in range(KEEP + 1):
        tick = _tick(sp_live)
        [request] = tick.run_requests
        assert request.tags["savepoint"] == "periodic"
        result = _run(sp_live, SAVEPOINT_JOB, run_config=request.run_config, tags=request.tags)
        _ok(result)
        obs = _observation(result)
        location = Path(obs["savepoint_location"])
        assert location.parent == _root(sp_live)
        manifest = json.loads((location / "_manifest.json").read_text())
        assert manifest["job"] == JOB and manifest["kind"] == "savepoint"
        assert obs["batches"] == {"upi-counts": manifest["queries"]["upi-counts"]["batch"]}
        assert obs["size_bytes"] == sum(f["size"] for f in manifest["files"]) > 0
        assert obs["job_state"] == "RUNNING" and obs["action"] == "savepoint"
        taken.append((obs["savepoint_id"], str(location), obs["disposed"]))

    # Keep 2: the third tick disposed of the first savepoint, and only of it.
    (first, first_loc, _), (_, _, none), (_, _, disposed) = taken
    assert none == [] and disposed == [first_loc]
    assert not Path(first_loc).exists()
    left = [sp.id for sp in savepoints.list_savepoints(_root(sp_live), JOB)]
    assert left == [t[0] for t in taken[1:]]
    # The job asset's list of its savepoints, newest first, the watermark as a time.
    listed = _observation(result)["savepoints"].records
    assert [r.data["id"] for r in listed] == left[::-1]
    assert listed[0].data["why"] == "savepoint" and listed[0].data["size (bytes)"] > 0
    assert listed[0].data["location"] == taken[-1][1]
    assert listed[0].data["watermark"] is None or listed[0].data["watermark"].startswith("2026-")
    assert registry.read(JOB)["last_savepoint"]["id"] == taken[-1][0]


def test_rescale_relaunches_with_the_new_state_partition_count_and_keeps_committing(
    sp_live: Live,
):
    old_pid = registry.read(JOB)["pid"]
    assert QueryLayout(sp_live.qdir).state_partitions(_last(sp_live)) == 2
    result = _run(sp_live, RESCALE_JOB, {"parallelism": 3})
    _ok(result)
    obs = _observation(result)
    entry = registry.read(JOB)
    sp_live.pids.append(entry["pid"])
    assert entry["pid"] == obs["pid"] != old_pid and not registry.pid_alive(old_pid)
    assert entry["state"] == "RUNNING" and entry["parallelism"] == 3
    assert obs["savepoint_kind"] == "stop-with-savepoint"
    assert entry["restored_from"] == obs["restored_from"] == obs["savepoint_location"]
    assert "--parallelism 3" in obs["command"] and "--from-savepoint" in obs["command"]
    assert obs["state_partitions"] == {"upi-counts": 3}
    # The op returned once the new process committed a batch of its own or, as here with no
    # new input, reported itself caught up (the old job had committed everything).
    assert obs["last_committed_batch"]["upi-counts"] >= obs["batches"]["upi-counts"] + 1

    # It keeps committing new input, on 3 state partitions.
    batch = _last(sp_live)
    feed(sp_live.ws, 400, seed=6, start_ms=START_MS + 160_000)
    after = _commits_after(sp_live, batch, "a commit after the rescale")
    assert QueryLayout(sp_live.qdir).state_partitions(after) == 3
    assert registry.pid_alive(entry["pid"])


def test_upgrade_runs_the_changed_job_file_from_a_stop_with_savepoint(
    sp_live: Live, tmp_path: Path
):
    v2 = _job_file(tmp_path / "upi_per_minute_v2.py", "LIMIT 10", "LIMIT 5")
    defs = build_definitions([replace(sp_live.spec, job_file=str(v2))], resources=sp_live.resources)
    old_pid = registry.read(JOB)["pid"]

    result = _run(sp_live, UPGRADE_JOB, defs=defs)
    _ok(result)
    obs = _observation(result)
    entry = registry.read(JOB)
    sp_live.pids.append(entry["pid"])
    assert entry["pid"] != old_pid and not registry.pid_alive(old_pid)
    assert entry["job_file"] == str(v2) and entry["state"] == "RUNNING"
    assert entry["restored_from"] == obs["savepoint_location"]
    # An upgrade keeps the parallelism the rescale gave the job.
    assert entry["parallelism"] == 3 and obs["state_partitions"] == {"upi-counts": 3}
    assert obs["last_committed_batch"]["upi-counts"] >= obs["batches"]["upi-counts"]

    batch = _last(sp_live)
    feed(sp_live.ws, 400, seed=8, start_ms=START_MS + 180_000)
    _commits_after(sp_live, batch, "a commit after the upgrade")
    # The savepoint the running job came from survives retention.
    assert Path(obs["savepoint_location"], "_manifest.json").exists()


def test_stop_with_savepoint_then_failed_upgrades_say_why(sp_live: Live, tmp_path: Path):
    pid = registry.read(JOB)["pid"]
    # New code keyed differently cannot take the state: refused before the job is touched.
    bad = _job_file(
        tmp_path / "upi_rekeyed.py",
        'payments.key_by("merchant_id")',
        'payments.key_by("txn_id")',
    )
    bad_defs = build_definitions(
        [replace(sp_live.spec, job_file=str(bad))], resources=sp_live.resources
    )
    message = _failure(_run(sp_live, UPGRADE_JOB, defs=bad_defs))
    assert "the running job was left alone" in message
    assert "keyed by" in message and "txn_id" in message
    assert registry.pid_alive(pid) and registry.read(JOB)["state"] == "RUNNING"

    result = _run(sp_live, STOP_WITH_SAVEPOINT_JOB)
    _ok(result)
    obs = _observation(result)
    assert obs["job_state"] == "STOPPED" and obs["savepoint_kind"] == "stop-with-savepoint"
    assert not registry.pid_alive(pid)
    stopped_at = Path(obs["savepoint_location"])
    assert (stopped_at / "_manifest.json").exists()

    # Nothing to stop: the runtime's message fails the run.
    assert "is not running" in _failure(_run(sp_live, STOP_WITH_SAVEPOINT_JOB))
    # The periodic schedule leaves a stopped job alone.
    assert "not running (STOPPED)" in _tick(sp_live).skip_message

    # An upgrade of a stopped job needs a savepoint to start from, and names the last one.
    message = _failure(_run(sp_live, UPGRADE_JOB))
    assert "not running (STOPPED)" in message and str(stopped_at) in message

    # ... and from a savepoint: the runtime's differences, nothing started.
    result = _run(sp_live, UPGRADE_JOB, {"from_savepoint": str(stopped_at)}, defs=bad_defs)
    message = _failure(result)
    assert "cannot be restored into this job" in message and "nothing was started" in message
    assert "keyed by" in message and "txn_id" in message
    assert registry.read(JOB)["state"] == "STOPPED"


def _list_tick(live: Live, instance: DagsterInstance):
    """A tick of the savepoint-list sensor, its partition requests applied as the daemon does."""
    sensor = live.defs.resolve_sensor_def(_savepoint_list.SENSOR)
    result = sensor(build_sensor_context(instance=instance, resources=live.resources))
    for request in result.dynamic_partitions_requests or []:
        if isinstance(request, AddDynamicPartitionsRequest):
            instance.add_dynamic_partitions(request.partitions_def_name, request.partition_keys)
        else:
            for key in request.partition_keys:
                instance.delete_dynamic_partition(request.partitions_def_name, key)
    return result


def test_a_savepoint_the_list_sensor_added_meanwhile_does_not_fail_the_op(monkeypatch):
    """The savepoint op brings the savepoint list's partitions up to date while the list's
    sensor may add the same savepoint (the daemon ticks meanwhile): the instance's unique key
    refused the op's add and failed the savepoint run (seen in the UI walk). The interleaving
    made certain: the sensor's add lands between the op's look and its insert."""
    from sqlalchemy.exc import IntegrityError

    from stateful_runtime.contract import SavepointSummary

    spec = UPI_JOB
    sp = SavepointSummary(
        "upi-per-minute-20261202T000000-beef", JOB, "/sp", {"upi-counts": 3}, {}, 1, 1, "now"
    )
    with instance_for_test() as instance:
        change = _savepoint_list.changes(instance, spec, StreamingJobTranslator(), [sp])
        assert change.added == [sp.id]
        real = instance.add_dynamic_partitions

        def sensor_first(name: str, keys: list[str]) -> None:
            monkeypatch.setattr(instance, "add_dynamic_partitions", real)
            real(name, keys)  # the sensor's tick, just before the op's insert
            raise IntegrityError("INSERT INTO dynamic_partitions", {}, Exception("UNIQUE"))

        monkeypatch.setattr(instance, "add_dynamic_partitions", sensor_first)
        change.apply(instance)
        name = _savepoint_list.partitions(spec).name
        assert instance.get_dynamic_partitions(name) == [sp.id]


def test_savepoint_list_is_current_and_a_restore_starts_from_the_picked_one(sp_live: Live):
    """The job is stopped (the test above). Savepoints taken by srt itself and by Dagster's
    op are listed (partitions of the savepoint asset, each with its batch and watermark as a
    time); the restore job starts the job from the one picked as its partition."""
    runtime = sp_live.resources["streaming_runtime"]
    partitions = _savepoint_list.partitions(sp_live.spec).name
    list_key = _savepoint_list.asset_key(sp_live.spec, StreamingJobTranslator())
    restore = _savepoint_list.restore_job_name(sp_live.spec)
    with instance_for_test() as instance:
        stopped = registry.read(JOB)["last_savepoint"]
        first = _list_tick(sp_live, instance)
        listed = instance.get_dynamic_partitions(partitions)
        assert set(listed) == {sp.id for sp in runtime.savepoints(JOB)} and stopped["id"] in listed
        [table] = [e for e in first.asset_events if isinstance(e, AssetObservation)]
        rows = table.metadata["savepoints"].value.records
        assert [r.data["id"] for r in rows] == sorted(listed, reverse=True)
        assert all(r.data["watermark"].startswith("2026-") for r in rows), rows
        assert (
            _list_tick(sp_live, instance).skip_reason.skip_message
            == "the savepoint lists are current"
        )

        # Restore from the stop's savepoint, picked as the partition: RUNNING from its batch.
        result = sp_live.defs.resolve_job_def(restore).execute_in_process(
            partition_key=stopped["id"], resources=sp_live.resources, instance=instance
        )
        _ok(result)
        obs = _observation(result)
        entry = registry.read(JOB)
        sp_live.pids.append(entry["pid"])
        assert obs["action"] == "restore" and entry["state"] == "RUNNING"
        assert entry["restored_from"] == obs["restored_from"] == stopped["location"]
        at = json.loads(Path(stopped["location"], "_manifest.json").read_text())
        restored = at["queries"]["upi-counts"]["batch"]
        assert obs["last_committed_batch"]["upi-counts"] >= restored

        # Newer input, then a savepoint by srt (outside Dagster) of a later batch: the next
        # tick lists it with its own batch and watermark.
        feed(sp_live.ws, 400, seed=9, start_ms=START_MS + 200_000)
        later = _commits_after(sp_live, restored, "a commit after the restore")
        outside = runtime.savepoint(JOB)
        assert outside.batches["upi-counts"] >= later > restored
        second = _list_tick(sp_live, instance)
        [made] = [e for e in second.asset_events if isinstance(e, AssetMaterialization)]
        assert made.asset_key == list_key and made.partition == outside.id
        assert made.metadata["batch"].value == str(outside.batches["upi-counts"])
        assert made.metadata["watermark"].value.startswith("2026-")
        assert outside.id in instance.get_dynamic_partitions(partitions)

        # A running job is not rewound; another job's savepoint is refused by name.
        message = _failure(
            sp_live.defs.resolve_job_def(restore).execute_in_process(
                partition_key=stopped["id"],
                resources=sp_live.resources,
                instance=instance,
                raise_on_error=False,
            )
        )
        assert "is running" in message and "Stop it first" in message
        other = Path(stopped["location"]).with_name("other-job-20260101T000000-beef")
        shutil.copytree(stopped["location"], other)
        manifest = json.loads((other / "_manifest.json").read_text())
        # A savepoint of another job: the same files, its (sealed) manifest naming that job.
        (other / "_manifest.json").write_text(json.dumps(seal({**manifest, "job": "other-job"})))
        instance.add_dynamic_partitions(partitions, [other.name])  # as a user could by hand
        message = _failure(
            sp_live.defs.resolve_job_def(restore).execute_in_process(
                partition_key=other.name,
                resources=sp_live.resources,
                instance=instance,
                raise_on_error=False,
            )
        )
        assert "holds the state of job 'other-job', not 'upi-per-minute'" in message, message
        assert stopped["id"] in message  # the ones to pick from
        assert registry.pid_alive(entry["pid"]) and registry.read(JOB)["pid"] == entry["pid"]

        # The table the restored job went on writing matches the source (the oracle: good
        # events per closed window).
        checks = {
            e.check_name: e
            for e in sp_live.materialize(AssetKey(["upi_counts"])).get_asset_check_evaluations()
        }
        rec = {k: v.value for k, v in checks["closed_windows_reconcile"].metadata.items()}
        assert checks["closed_windows_reconcile"].passed and rec["difference"] == 0, rec
