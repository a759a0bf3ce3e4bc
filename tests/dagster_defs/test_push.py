"""Commits pushed to Dagster by the job process: a real ``srt run`` launched through Dagster
with a webserver to report to (a real ``dagster-webserver``), each batch reported once (by the
job, or by the health sensor for what the job could not), and a webserver that goes away
never holding up a batch."""

from __future__ import annotations

import time
from datetime import UTC
from pathlib import Path

import pytest
from dagster import AssetKey, AssetMaterialization, DagsterInstance, build_sensor_context
from upi_events import START_MS

from dagster_defs import _stream_events
from stateful_runtime.runtime import dagster_push, registry
from tests.dagster_defs.helpers import JOB, JOB_KEY, Webserver, feed, live_job
from tests.helpers import poll

pytestmark = pytest.mark.slow

TABLE_KEY = AssetKey(["upi_counts"])
# The health sensor's grace (30 s) shortened for this test, which waits it out once: still
# longer than the job's own tries at a batch (its push window and one request's timeout), so
# a batch the job may yet report is never the sensor's.
GRACE_S = dagster_push.PUSH_WINDOW_S + dagster_push.REQUEST_TIMEOUT_S + 2


def _pushed(instance: DagsterInstance) -> list[dict]:
    """The table's materialisations the job reported, oldest first (metadata values)."""
    records = instance.fetch_materializations(TABLE_KEY, limit=200).records
    out = []
    for r in reversed(records):
        mat = r.asset_materialization
        assert mat is not None
        md = {k: v.value for k, v in mat.metadata.items()}
        if md.get("reported by") == "job process":
            out.append({**md, "stored_at": r.timestamp})
    return out


def test_commits_are_pushed_once_each_and_dagster_down_holds_up_nothing(
    tmp_path: Path, srt_env: dict[str, str], webserver: Webserver, monkeypatch
):
    assert GRACE_S < _stream_events.PUSH_GRACE_S
    monkeypatch.setattr(_stream_events, "PUSH_GRACE_S", GRACE_S)
    with live_job(tmp_path, dagster_url=webserver.url) as live:
        live.materialize(JOB_KEY)  # launched with SRT_DAGSTER_URL and its tables' keys
        live.pids.append(int(registry.read(JOB)["pid"]))
        instance = DagsterInstance.from_config(str(webserver.home))
        warehouse = live.resources["warehouse"]

        def ledger() -> dict[int, int]:
            return {e.batch_id: e.rows for e in warehouse.committed_batches(JOB, "upi-counts")}

        # Every committed batch with rows reaches Dagster as a materialisation of the table,
        # reported by the job process: once each, with the rows the ledger says.
        def all_pushed() -> list[dict] | None:
            pushed, committed = _pushed(instance), ledger()
            covered = [b for p in pushed for b in range(p["first batch"], p["last batch"] + 1)]
            return pushed if committed and set(covered) >= set(committed) else None

        pushed = poll(all_pushed, 240, "the job to report every committed batch")
        covered = [b for p in pushed for b in range(p["first batch"], p["last batch"] + 1)]
        assert len(covered) == len(set(covered)), covered  # no batch twice
        committed = ledger()
        assert sum(p["rows written"] for p in pushed) == sum(
            committed[b] for b in covered if b in committed
        )
        assert all(p["query"] == "upi-counts" for p in pushed)
        # A watermark once there is one (batch 0 reports none: Spark's 1970 is left out).
        assert all(p["watermark"].startswith("20") for p in pushed if "watermark" in p)

        # Dagster goes away: the job commits on, says so once in its log, and the sensor
        # reports what the job could not, once the grace has passed, and leaves alone what
        # the job reported (its grace passes in the same wait).
        webserver.stop()
        pushed = _pushed(instance)  # final: nothing reaches the instance any more
        reported = max(p["last batch"] for p in pushed)
        newest = max(p["stored_at"] for p in pushed)
        before = max(ledger())
        feed(live.ws, 800, seed=9, start_ms=START_MS + 150_000)
        poll(lambda: max(ledger()) > before, 240, "a commit while Dagster is down")
        feed(live.ws, 400, seed=10, start_ms=START_MS + 170_000)
        poll(lambda: max(ledger()) > before + 1, 240, "a second commit while Dagster is down")
        log = (registry.home() / "jobs" / f"{JOB}.log").read_text()
        assert log.count("could not report a commit to Dagster") == 1, log[-3000:]
        assert registry.pid_alive(live.pids[0])
        down = {b: r for b, r in ledger().items() if b > reported}
        poll(
            lambda: (
                time.time() - newest > GRACE_S
                and all(
                    time.time() - e.committed_at.replace(tzinfo=UTC).timestamp() > GRACE_S
                    for e in warehouse.committed_batches(JOB, "upi-counts")
                    if e.batch_id in down and e.committed_at is not None
                )
            ),
            120,
            "the push grace of every batch",
        )
        sensor = live.defs.resolve_sensor_def("streaming_job_health")
        tick = sensor(build_sensor_context(resources=live.resources, instance=instance))
        # One report, from the first batch the job did not report: none is reported twice.
        [fallback] = [
            e
            for e in tick.asset_events
            if isinstance(e, AssetMaterialization) and e.asset_key == TABLE_KEY
        ]
        md = {k: v.value for k, v in fallback.metadata.items()}
        assert md["first batch"] == reported + 1 and md["last batch"] >= max(down)
        assert "reported by" not in md  # the sensor's own report
        assert md["rows written"] == sum(
            r for b, r in ledger().items() if reported < b <= md["last batch"]
        )
        # And a second tick reports none of them again.
        again = sensor(
            build_sensor_context(resources=live.resources, instance=instance, cursor=tick.cursor)
        )
        assert not [
            e
            for e in again.asset_events
            if isinstance(e, AssetMaterialization)
            and e.asset_key == TABLE_KEY
            and e.metadata["first batch"].value <= md["last batch"]
        ]
