"""The real flow in the Dagster UI, driven like a user in headless Chromium (Playwright for
Python with Debian's /usr/bin/chromium):

1. `dagster dev -w workspace.yaml` on 127.0.0.1 (examples/definitions.py, sensors every few
   seconds) over a small UPI event log; the lineage graph shows job → sink table → dbt model;
2. **Materialize** on the job asset: the run succeeds and the job is RUNNING;
3. the sink table materialises by itself as the stream commits (the health sensor's runless
   materialisations), its checks run by automation and pass;
4. the dbt model builds by automation (the default automation condition sensor);
5. the job asset's plots (rates, lag, checkpoint age, records) have points;
6. the job asset's health checks pass, the dead letters counted by reason;
7. kill -9 of the job: its `running` check turns red (ERROR), the sensor restarts it, and
   `no_crash_restart` stays red with what it was restarted from; the daemon launches one run
   of `streaming_job_crashed`, which fails with the condition and the restart (the failed run
   that run-failure sensors alert on);
8. the `stop_streaming_job` job, launched from its launchpad, stops the job, and its
   `running` check warns (stopped on purpose, not failed); no second alert run;
9. a savepoint from `savepoint_streaming_job`'s launchpad and one by `srt savepoint create`:
   the job's savepoint list (partitions of `upi_per_minute_savepoints`) shows both with their
   watermark as a time, and the restore job's launchpad offers them as its partitions.

Each step saves a screenshot under tests/artifacts/ (gitignored). The UI is driven and
photographed; what each step must show is also checked through Dagster's GraphQL API (the
UI's own data), so a failure says what was missing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from upi_events import events

from stateful_runtime.runtime.session import JIT_ENV
from tests.helpers import ROOT, VENV_BIN, append_lines, require

pytestmark = pytest.mark.slow

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "tests" / "artifacts"
JOB_ASSET = "upi_per_minute"
SINK_ASSET = "upi_counts"
MODEL_ASSET = "merchant_day"
JOB = "upi-per-minute"
# dagster dev parses the dbt project at load in each of its processes: slow on a busy machine.
START_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 30.0
# Sensors every few seconds instead of 30 s; freshness evaluated as often.
SENSOR_INTERVAL_S = 3
# 40 events per second of event time: 4,000 events span 100 s, so the first one-minute
# windows close (the watermark trails the newest event by 5 s).
EVENTS = 4_000

# Without the background-networking flags Chromium waits for Google services on this closed
# network.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Instance settings: no telemetry, no "Join the Dagster community" dialog over the graph, and
# queued runs started within a second instead of five (the flow launches six runs).
DAGSTER_YAML = """\
telemetry:
  enabled: false
nux:
  enabled: false
run_coordinator:
  module: dagster
  class: QueuedRunCoordinator
  config:
    dequeue_interval_seconds: 1
"""

# Check execution statuses that are final (not IN_PROGRESS).
DONE = ("SUCCEEDED", "FAILED", "EXECUTION_FAILED", "SKIPPED")

ASSET_NODES_QUERY = "{ assetNodes { assetKey { path } } }"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _default_signals() -> None:
    # A process started with `cmd &` by a non-interactive shell inherits SIGINT as *ignored*, and
    # dagster copies SIGINT's disposition onto SIGTERM (setup_interrupt_handlers): such a
    # `dagster dev` ignores both and cannot be stopped. Give the child default dispositions.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def _group_members(pgid: int) -> list[str]:
    """Live (non-zombie) processes of a process group, as 'pid command' strings."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        # Fields after the ")" that closes the command name: state ppid pgrp ...
        state, _ppid, pgrp = stat.rsplit(")", 1)[1].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            members.append(f"{entry.name} {cmd[:120]}")
    return members


def _stop_group(proc: subprocess.Popen, timeout: float) -> list[str]:
    """Stop a process group led by ``proc``: SIGINT first (dagster dev shuts its webserver,
    daemon and code servers down), SIGKILL for whatever is left. Returns the survivors."""
    pgid = proc.pid
    if proc.poll() is None:
        os.killpg(pgid, signal.SIGINT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    deadline = time.monotonic() + timeout
    while _group_members(pgid) and time.monotonic() < deadline:
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            break
        time.sleep(0.1)  # poll: killed processes take a moment to exit
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=timeout)
    return _group_members(pgid)


@dataclass
class DagsterDev:
    url: str
    log: Path
    workdir: Path
    env: dict[str, str]

    def graphql(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.url}/graphql",
            data=json.dumps({"query": query, "variables": variables or {}}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            out = json.load(resp)
        if out.get("errors"):
            raise AssertionError(f"GraphQL errors: {out['errors']}")
        return out["data"]

    def log_tail(self, n: int = 6000) -> str:
        return self.log.read_text(errors="replace")[-n:]

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``cond`` (checks real state, so the interval is not synchronisation) until it
        returns something true."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            try:
                last = cond()
            except (OSError, urllib.error.URLError, AssertionError, KeyError) as exc:
                last = exc
            else:
                if last:
                    return last
            time.sleep(0.5)
        pytest.fail(
            f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})\n"
            f"dagster dev log:\n{self.log_tail()}"
        )


def _wait_until_serving(proc: subprocess.Popen, dev: DagsterDev) -> None:
    """Poll until the webserver answers GraphQL with the workspace's assets loaded."""
    deadline = time.monotonic() + START_TIMEOUT_S
    last = "no answer yet"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"dagster dev exited with {proc.returncode}:\n{dev.log_tail()}")
        try:
            nodes = dev.graphql(ASSET_NODES_QUERY)["assetNodes"]
            keys = {"/".join(n["assetKey"]["path"]) for n in nodes}
            if {JOB_ASSET, SINK_ASSET, MODEL_ASSET} <= keys:
                return
            last = f"assets so far: {sorted(keys)}"
        except (
            OSError,
            urllib.error.URLError,
            KeyError,
            TypeError,
            ValueError,
            AssertionError,
        ) as e:
            last = repr(e)
        time.sleep(0.5)  # polling interval, not synchronisation: the loop checks the server
    pytest.fail(
        f"dagster dev did not serve the assets in {START_TIMEOUT_S:.0f} s ({last}):\n"
        f"{dev.log_tail()}"
    )


@pytest.fixture
def dagster_dev(tmp_path: Path) -> Iterator[DagsterDev]:
    home = tmp_path / "dagster-home"
    home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    srt_home = tmp_path / "srt-home"
    srt_home.mkdir()
    # The example's relative paths (srt-data/...) resolve in dagster dev's working directory.
    from stateful_runtime.connectors.eventlog import EventLog

    log_dir = tmp_path / "srt-data" / "log"
    EventLog(log_dir).create_topic("upi-payments", 2)
    append_lines(
        log_dir,
        list(events(EVENTS, merchants=8, rate_per_s=40, disorder_ms=3_000, bad_every=499, seed=11)),
    )
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SRT_HOME": str(srt_home),
        "SRT_SENSOR_INTERVAL_S": str(SENSOR_INTERVAL_S),
        "FRESHNESS_DAEMON_INTERVAL_SECONDS": str(SENSOR_INTERVAL_S),
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": str(VENV_BIN / "python"),
        # The jobs Dagster launches run seconds on a few hundred events: C1 only, as srt_env's.
        JIT_ENV: os.environ.get(JIT_ENV, "quick"),
    }
    port = _free_port()
    log = tmp_path / "dagster-dev.log"
    dev = DagsterDev(f"http://127.0.0.1:{port}", log, tmp_path, env)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                str(VENV_BIN / "dagster"),
                "dev",
                "-w",
                str(ROOT / "workspace.yaml"),
                "-h",
                "127.0.0.1",
                "-p",
                str(port),
                "--log-level",
                "info",
            ],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, killed as a whole in teardown
            preexec_fn=_default_signals,
        )
    try:
        _wait_until_serving(proc, dev)
        yield dev
    finally:
        survivors = _stop_group(proc, STOP_TIMEOUT_S)
        _kill_job(srt_home)
        assert not survivors, f"dagster dev left processes behind: {survivors}"


def _kill_job(srt_home: Path) -> None:
    """The detached job outlives dagster dev by design; end it if the test did not."""
    entry = srt_home / "jobs" / f"{JOB}.json"
    try:
        pid = int(json.loads(entry.read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# ----------------------------------------------------------------------------- GraphQL


def _asset(dev: DagsterDev, key: str) -> dict[str, Any]:
    query = """
    query($key: AssetKeyInput!) {
      assetOrError(assetKey: $key) {
        ... on Asset {
          assetMaterializations(limit: 5) {
            runId timestamp
            metadataEntries { label ... on IntMetadataEntry { intValue }
                              ... on TextMetadataEntry { text } }
          }
          assetObservations(limit: 5) {
            timestamp
            metadataEntries { label ... on TextMetadataEntry { text }
                              ... on FloatMetadataEntry { floatValue }
                              ... on IntMetadataEntry { intValue } }
          }
        }
      }
      assetNodeOrError(assetKey: $key) {
        ... on AssetNode {
          assetChecksOrError {
            ... on AssetChecks {
              checks { name executionForLatestMaterialization { status } }
            }
          }
        }
      }
    }"""
    return dev.graphql(query, {"key": {"path": [key]}})


def _materializations(dev: DagsterDev, key: str) -> list[dict[str, Any]]:
    return _asset(dev, key)["assetOrError"].get("assetMaterializations") or []


def _checks(dev: DagsterDev, key: str) -> dict[str, str | None]:
    node = _asset(dev, key)["assetNodeOrError"]
    checks = node["assetChecksOrError"].get("checks") or []
    return {c["name"]: (c["executionForLatestMaterialization"] or {}).get("status") for c in checks}


HEALTH_CHECKS = ("running", "checkpoint_age", "lag", "no_crash_restart", "dead_letters")


def _evaluations(
    dev: DagsterDev, check: str, limit: int = 20, asset: str = JOB_ASSET
) -> list[dict[str, Any]]:
    """A check's evaluations, newest first: by default the job asset's health check's (the
    sensor's are runless)."""
    query = """
    query($key: AssetKeyInput!, $name: String!, $limit: Int!) {
      assetCheckExecutions(assetKey: $key, checkName: $name, limit: $limit) {
        timestamp status evaluation { success severity description }
      }
    }"""
    variables = {"key": {"path": [asset]}, "name": check, "limit": limit}
    found = dev.graphql(query, variables)["assetCheckExecutions"]
    return [e for e in found if e.get("evaluation")]


def _health(dev: DagsterDev) -> dict[str, dict[str, Any]]:
    """Each health check's latest evaluation."""
    return {c: e[0]["evaluation"] for c in HEALTH_CHECKS if (e := _evaluations(dev, c, 1))}


def _runs(dev: DagsterDev) -> list[dict[str, Any]]:
    query = """{ runsOrError(limit: 50) { ... on Runs { results {
        runId status jobName tags { key value } assetSelection { path } } } } }"""
    return dev.graphql(query)["runsOrError"]["results"]


CRASH_JOB = "streaming_job_crashed"


def _crash_runs(dev: DagsterDev) -> list[dict[str, Any]]:
    """The alert runs (``streaming_job_crashed``), newest first, with their step failures'
    messages (what a run-failure sensor reads)."""
    query = """
    query($job: String!) {
      runsOrError(filter: {pipelineName: $job}) { ... on Runs { results {
        runId status tags { key value }
        eventConnection { events { __typename
          ... on ExecutionStepFailureEvent { error { message } } } }
      } } }
    }"""
    runs = dev.graphql(query, {"job": CRASH_JOB})["runsOrError"]["results"]
    for run in runs:
        run["failures"] = [
            e["error"]["message"]
            for e in run.pop("eventConnection")["events"]
            if e["__typename"] == "ExecutionStepFailureEvent"
        ]
    return runs


SAVEPOINTS_ASSET = "upi_per_minute_savepoints"


def _savepoint_partitions(dev: DagsterDev) -> list[str]:
    """The savepoint list's partitions (savepoint ids) as the UI reads them."""
    query = """
    query($key: AssetKeyInput!) {
      assetNodeOrError(assetKey: $key) {
        ... on AssetNode { partitionKeysByDimension { partitionKeys } }
      }
    }"""
    node = dev.graphql(query, {"key": {"path": [SAVEPOINTS_ASSET]}})["assetNodeOrError"]
    return [k for d in node.get("partitionKeysByDimension") or [] for k in d["partitionKeys"]]


def _sp_materializations(dev: DagsterDev) -> list[dict[str, Any]]:
    query = """
    query($key: AssetKeyInput!) {
      assetOrError(assetKey: $key) {
        ... on Asset { assetMaterializations(limit: 20) {
          partition metadataEntries { label ... on TextMetadataEntry { text } } } }
      }
    }"""
    found = dev.graphql(query, {"key": {"path": [SAVEPOINTS_ASSET]}})["assetOrError"]
    return found.get("assetMaterializations") or []


def _label(event: dict[str, Any], label: str) -> Any:
    return next((e.get("text") for e in event["metadataEntries"] if e["label"] == label), None)


LOADING = re.compile(r"^Loading|fetching statuses")


def _srt_state(dev: DagsterDev) -> str | None:
    return (_srt_status(dev) or {}).get("state")


def _srt_status(dev: DagsterDev) -> dict[str, Any] | None:
    out = subprocess.run(
        [str(VENV_BIN / "srt"), "status", JOB, "--json"],
        env=dev.env,
        cwd=dev.workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    entries = json.loads(out.stdout or "[]")
    return entries[0] if entries else None


# ----------------------------------------------------------------------------- the flow


def settle(page: Any) -> None:
    """Wait for an asset page's side panel to load (its code location shows), then give
    charts and layout a moment: screenshots of half-loaded pages show grey skeletons."""
    from playwright.sync_api import expect

    expect(page.get_by_text("Code location").first).to_be_visible()
    quiet(page)


def away(page: Any) -> None:
    """Park the browser on a blank page while the test polls Dagster's own state: an open
    page of the UI polls and renders all the while (a run's page streams its logs), and the
    browser took ~50 CPU-s of the flow. Each step opens its page again to check and photograph
    what the wait established."""
    page.goto("about:blank")


def quiet(page: Any) -> None:
    """Before a photograph: poll until the page has made no request for 500 ms (Playwright's
    networkidle: charts and lists have their data), for at most 10 s (the UI polls some
    queries on a timer). What a step must show is checked apart, not by the picture."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import expect

    try:
        page.wait_for_load_state("networkidle", timeout=10_000)
        # Asset nodes and tables fill in after their own queries.
        expect(page.get_by_text(LOADING)).to_have_count(0, timeout=10_000)
    except (PlaywrightTimeout, AssertionError):
        pass


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_user_flow_in_the_dagster_ui(dagster_dev: DagsterDev) -> None:
    from playwright.sync_api import expect, sync_playwright

    require(CHROMIUM.exists(), str(CHROMIUM), "platform/install-services.sh installs it")
    dev = dagster_dev
    ARTIFACTS.mkdir(exist_ok=True)
    for old in ARTIFACTS.glob("ui-*.png"):
        old.unlink()
    timings: list[str] = []
    t0 = time.monotonic()

    def shot(page: Any, name: str) -> None:
        path = ARTIFACTS / f"ui-{name}.png"
        page.screenshot(path=str(path), full_page=False)
        timings.append(f"{time.monotonic() - t0:6.1f} s  {path.name}")

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 950})
        page.set_default_timeout(90_000)
        expect.set_options(timeout=90_000)  # a busy machine renders slowly

        # 1. The lineage graph: job → sink table → dbt model, one graph (the model's upstream
        #    lineage: the global graph collapses the two asset groups).
        lineage = (
            f"{dev.url}/assets/{MODEL_ASSET}?view=lineage&lineageScope=upstream&lineageDepth=5"
        )
        page.goto(f"{dev.url}/asset-groups")  # the global lineage: the default view
        for group in ("streaming", "analytics"):
            expect(page.get_by_text(group).first).to_be_visible()
        quiet(page)
        shot(page, "00-global-lineage")
        page.goto(lineage)
        for name in (JOB_ASSET, SINK_ASSET, MODEL_ASSET):
            expect(page.get_by_text(name).first).to_be_visible()
        quiet(page)
        shot(page, "01-lineage")

        # 2. Materialize the job asset: the run launches `srt run` and succeeds once it commits.
        def run_status(run_id: str) -> str:
            return next(r for r in _runs(dev) if r["runId"] == run_id)["status"]

        def materialize_job() -> str:
            seen = {r["runId"] for r in _runs(dev)}
            page.goto(f"{dev.url}/assets/{JOB_ASSET}")
            page.get_by_role("button", name=re.compile(r"^(materialization )?Materialize$")).click()
            expect(page.get_by_text("Launched run").first).to_be_visible()
            run = dev.wait(
                lambda: next(
                    (
                        r
                        for r in _runs(dev)
                        if r["runId"] not in seen
                        and r["assetSelection"]
                        and [JOB_ASSET] in [a["path"] for a in r["assetSelection"]]
                    ),
                    None,
                ),
                60,
                "the materialisation run",
            )
            away(page)
            dev.wait(
                lambda: run_status(run["runId"]) in ("SUCCESS", "FAILURE", "CANCELED"),
                600,
                "the job asset's run to finish",
            )
            page.goto(f"{dev.url}/runs/{run['runId']}")
            return run["runId"]

        run_id = materialize_job()
        status = run_status(run_id)
        assert status == "SUCCESS", f"run {run_id} ended {status}:\n{dev.log_tail()}"
        expect(page.get_by_text("Success").first).to_be_visible()
        quiet(page)
        shot(page, "02-run-success")
        assert _srt_state(dev) == "RUNNING"
        # The health sensor's observation: state and the control endpoint's link.
        page.goto(f"{dev.url}/assets/{JOB_ASSET}")
        expect(page.get_by_text("RUNNING").first).to_be_visible()
        expect(page.get_by_text("control endpoint").first).to_be_visible()
        settle(page)
        shot(page, "03-job-running")

        # 3. The sink table materialises by itself (no run: the health sensor reports the
        #    stream's commits), and its checks run by automation and pass.
        away(page)
        runless = dev.wait(
            lambda: [m for m in _materializations(dev, SINK_ASSET) if not m["runId"]],
            240,
            "a runless materialisation of the sink table",
        )
        labels = {e["label"] for e in runless[0]["metadataEntries"]}
        assert {"batches", "rows written", "last batch", "batches committed"} <= labels, labels
        expected_checks = {"unique_key", "not_null", "value_ranges", "closed_windows_reconcile"}
        checks = dev.wait(
            lambda: (
                (c := _checks(dev, SINK_ASSET))
                and all(c.get(n) in DONE for n in expected_checks)
                and c
            ),
            420,
            "the sink table's checks to run by automation",
        )
        assert all(checks[n] == "SUCCEEDED" for n in expected_checks), checks
        # Once the watermark moved, the stream's materialisations carry it.
        dev.wait(
            lambda: any(
                e["label"] == "watermark"
                for m in _materializations(dev, SINK_ASSET)
                for e in m["metadataEntries"]
            ),
            120,
            "a watermark reported",
        )
        page.goto(f"{dev.url}/assets/{SINK_ASSET}")
        expect(page.get_by_text("rows written").first).to_be_visible()
        settle(page)
        shot(page, "04-sink-materialised-by-the-stream")
        page.goto(f"{dev.url}/assets/{SINK_ASSET}?view=checks")
        expect(page.get_by_text("Dead letters are counted apart").first).to_be_visible()
        # Freshness is a check the sensor reports every tick: fresh while the job keeps up,
        # however quiet the source.
        expect(page.get_by_text("freshness").first).to_be_visible()
        shot(page, "05-sink-checks")

        # 4. The dbt model builds by automation after the table it reads.
        away(page)
        model = dev.wait(
            lambda: _materializations(dev, MODEL_ASSET),
            420,
            "the dbt model to be materialised by automation",
        )
        auto_runs = [r for r in _runs(dev) if r["runId"] == model[0]["runId"]]
        tags = {t["key"]: t["value"] for t in auto_runs[0]["tags"]} if auto_runs else {}
        assert tags.get("dagster/sensor_name") == "default_automation_condition_sensor", tags
        model_checks = dev.wait(
            lambda: (c := _checks(dev, MODEL_ASSET)) and all(s in DONE for s in c.values()) and c,
            180,
            "the dbt tests (asset checks of the model)",
        )
        assert all(s == "SUCCEEDED" for s in model_checks.values()), model_checks
        # dbt's tests of its source are the table's checks, reported as such by the dbt run.
        # Their latest evaluation: the stream goes on materialising the table, and its newest
        # materialisation may have no execution of the check yet.
        source_test = _evaluations(dev, "upi_counts_unique_key", 1, SINK_ASSET)
        assert source_test and source_test[0]["status"] == "SUCCEEDED", source_test
        assert "instead of an `AssetCheckResult`" not in dev.log.read_text(errors="replace")
        page.goto(f"{dev.url}/assets/{MODEL_ASSET}?view=checks")
        expect(page.get_by_text("merchant_day_unique_key").first).to_be_visible()
        expect(page.get_by_text("Succeeded").first).to_be_visible()
        quiet(page)
        shot(page, "06-dbt-model-tests-by-automation")
        page.goto(lineage)
        expect(page.get_by_text(MODEL_ASSET).first).to_be_visible()
        quiet(page)
        shot(page, "07-lineage-materialised")

        # 5. The job asset's plots: health observations over time, with units in the labels.
        page.goto(f"{dev.url}/assets/{JOB_ASSET}")
        page.get_by_role("button", name=re.compile(r"Plots$")).first.click()
        expect(page.get_by_text("lag (records)").first).to_be_visible()
        quiet(page)
        shot(page, "08-job-plots")

        # 6. The job's health is its asset checks, re-judged every sensor tick: all pass, and
        #    the dead letters (every 499th event is malformed) are counted by reason.
        away(page)
        health = dev.wait(
            lambda: (
                (h := _health(dev))
                and all(h.get(c, {}).get("success") for c in HEALTH_CHECKS)
                and h
            ),
            180,
            "the job asset's health checks to pass",
        )
        assert "rejected" in health["dead_letters"]["description"], health
        page.goto(f"{dev.url}/assets/{JOB_ASSET}?view=checks")
        expect(page.get_by_text("no_crash_restart").first).to_be_visible()
        page.get_by_text("dead_letters").first.click()
        expect(page.get_by_text("malformed JSON").first).to_be_visible()
        quiet(page)
        shot(page, "08a-job-health-dead-letters")

        # 7. kill -9: the running check turns red with the log excerpt; the sensor restarts
        #    the job and no_crash_restart stays red with what it was restarted from.
        old = int((_srt_status(dev) or {})["pid"])
        killed_at = time.time()
        os.killpg(old, signal.SIGKILL)
        away(page)
        red = dev.wait(
            lambda: next(
                (
                    e
                    for e in _evaluations(dev, "running")
                    if e["timestamp"] >= killed_at
                    and not e["evaluation"]["success"]
                    and e["evaluation"]["severity"] == "ERROR"
                ),
                None,
            ),
            120,
            "the running check to turn red",
        )
        assert red["evaluation"]["description"].startswith("DEAD"), red
        page.goto(f"{dev.url}/assets/{JOB_ASSET}?view=checks")
        page.get_by_text("no_crash_restart").first.click()
        expect(page.get_by_text("restarted as pid").first).to_be_visible()
        quiet(page)
        shot(page, "08b-job-killed-restarted")
        away(page)
        dev.wait(
            lambda: (
                (st := _srt_status(dev)) and st.get("pid") != old and st.get("state") == "RUNNING"
            ),
            300,
            "the relaunched job to be RUNNING",
        )
        restarted = dev.wait(
            lambda: (h := _health(dev)) and h.get("running", {}).get("success") and h,
            120,
            "the running check to pass again",
        )
        assert not restarted["no_crash_restart"]["success"], restarted
        page.goto(f"{dev.url}/assets/{JOB_ASSET}")
        settle(page)
        shot(page, "08c-job-overview-after-restart")
        # The alert: the daemon launched one run of streaming_job_crashed for this crash, and
        # it failed with the condition and the restart (what run-failure sensors fire on).
        away(page)
        alert = dev.wait(
            lambda: next(
                (r for r in _crash_runs(dev) if r["status"] == "FAILURE" and r["failures"]),
                None,
            ),
            240,
            "a failed streaming_job_crashed run",
        )
        tags = {t["key"]: t["value"] for t in alert["tags"]}
        assert tags.get("srt/job") == JOB and tags.get("srt/pid") == str(old), tags
        assert tags.get("dagster/sensor_name") == "streaming_job_health", tags
        [failure] = alert["failures"]
        new_pid = (_srt_status(dev) or {})["pid"]
        assert "is DEAD: " in failure, failure
        assert f"restarted it as pid {new_pid}." in failure, failure
        assert len(_crash_runs(dev)) == 1, _crash_runs(dev)
        page.goto(f"{dev.url}/runs?q[]=job:{CRASH_JOB}")
        expect(page.get_by_text("Failure").first).to_be_visible()
        quiet(page)
        shot(page, "08d-alert-run-failed")
        page.goto(f"{dev.url}/runs/{alert['runId']}")
        expect(page.get_by_text(f"restarted it as pid {new_pid}").first).to_be_visible()
        expect(page.get_by_text("is DEAD").first).to_be_visible()
        quiet(page)
        shot(page, "08e-alert-run-failure-message")
        # The whole text (condition, restart, the end of the job's log) in the row's dialog.
        page.get_by_role("button", name="View full message").last.click()
        dialog = page.get_by_role("dialog")
        expect(dialog).to_contain_text(f"restarted it as pid {new_pid}")
        expect(dialog).to_contain_text("The end of its log")
        # Poll until the dialog's fade-in is over (Blueprint's overlay transition classes).
        fading = "[class*='overlay-enter-active'], [class*='overlay-appear-active']"
        expect(page.locator(fading)).to_have_count(0)
        quiet(page)
        shot(page, "08f-alert-run-full-message")
        page.keyboard.press("Escape")

        # 8. Stop the job from its Dagster job's launchpad.
        page.goto(f"{dev.url}/locations/definitions.py/jobs/stop_streaming_job/playground")
        page.get_by_role("button", name="Launch run").click()
        stop_run = dev.wait(
            lambda: next((r for r in _runs(dev) if r["jobName"] == "stop_streaming_job"), None),
            60,
            "the stop run to start",
        )
        away(page)
        dev.wait(lambda: run_status(stop_run["runId"]) == "SUCCESS", 300, "the stop run to succeed")
        page.goto(f"{dev.url}/runs/{stop_run['runId']}")
        expect(page.get_by_text("Success").first).to_be_visible()
        quiet(page)
        shot(page, "09-stop-run")
        assert _srt_state(dev) == "STOPPED"
        # The asset's events list the stop op's observation (state STOPPED; srt agrees above).
        page.goto(f"{dev.url}/assets/{JOB_ASSET}?view=events")
        expect(page.get_by_text("Observed").first).to_be_visible()
        page.wait_for_load_state("networkidle")
        quiet(page)
        shot(page, "10-job-stopped")
        # Stopped on purpose: the running check warns (yellow), neither failed nor green.
        away(page)
        warned = dev.wait(
            lambda: (
                (e := _health(dev).get("running"))
                and not e["success"]
                and e["severity"] == "WARN"
                and e
            ),
            120,
            "the running check to say stopped",
        )
        assert "STOPPED" in warned["description"], warned
        # A stop on purpose is no crash: the tick that judged it launched no alert run.
        assert [r["runId"] for r in _crash_runs(dev)] == [alert["runId"]], _crash_runs(dev)
        page.goto(f"{dev.url}/assets/{JOB_ASSET}?view=checks")
        page.get_by_text("running", exact=True).first.click()
        expect(page.get_by_text("stopped on purpose").first).to_be_visible()
        quiet(page)
        shot(page, "11-job-stopped-warns")

        # 9. Savepoints: one from savepoint_streaming_job's launchpad (no S3 block: nothing
        #    here uses S3), one by `srt savepoint create` outside Dagster; the savepoint list
        #    shows both with their watermark as a time, and the restore job offers them.
        page.goto(f"{dev.url}/locations/definitions.py/jobs/savepoint_streaming_job/playground")
        # The config editor's pre-filled YAML names no `s3` resource (the schema panel beside
        # it lists every resource of the code location, s3 among them).
        editor = page.locator(".CodeMirror, .cm-editor").first
        expect(editor).to_contain_text("streaming_runtime")
        assert "s3:" not in editor.inner_text(), editor.inner_text()
        shot(page, "12-savepoint-launchpad")
        page.get_by_role("button", name="Launch run").click()
        sp_run = dev.wait(
            lambda: next(
                (r for r in _runs(dev) if r["jobName"] == "savepoint_streaming_job"), None
            ),
            60,
            "the savepoint run to start",
        )
        away(page)
        dev.wait(
            lambda: run_status(sp_run["runId"]) == "SUCCESS", 300, "the savepoint run to succeed"
        )
        outside = subprocess.run(
            [str(VENV_BIN / "srt"), "savepoint", "create", JOB, "--json"],
            env=dev.env,
            cwd=dev.workdir,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        ids = {json.loads(outside.stdout)["id"]}
        listed = dev.wait(
            lambda: (p := _savepoint_partitions(dev)) and len(p) == 2 and ids <= set(p) and p,
            120,
            "both savepoints in the savepoint list",
        )
        marks = dev.wait(
            lambda: (
                (w := {m["partition"]: _label(m, "watermark") for m in _sp_materializations(dev)})
                and set(listed) <= set(w)
                and w
            ),
            60,
            "each savepoint's materialisation",
        )
        assert all(str(marks[i]).startswith("20") for i in listed), marks  # a time, not epoch
        # The list's page: each id is in it (a middle-truncated label: its full text sits in
        # a hidden measuring element).
        page.goto(f"{dev.url}/assets/{SAVEPOINTS_ASSET}?view=partitions")
        for sid in listed:
            expect(page.get_by_text(sid).first).to_be_attached()
        quiet(page)
        shot(page, "13-savepoint-list")
        page.goto(f"{dev.url}/assets/{SAVEPOINTS_ASSET}?view=events")
        expect(page.get_by_text(listed[-1]).first).to_be_attached()
        quiet(page)
        shot(page, "14-savepoint-events")
        # The restore job's launchpad: its partitions are the savepoints.
        page.goto(
            f"{dev.url}/locations/definitions.py/jobs/upi_per_minute_from_savepoint/playground"
        )
        expect(page.get_by_text(re.compile(r"partition", re.I)).first).to_be_attached()
        quiet(page)
        shot(page, "15-restore-picker")
        browser.close()
    # Many ticks of the sensor over the stopped job later: still the one alert run.
    assert [r["runId"] for r in _crash_runs(dev)] == [alert["runId"]], _crash_runs(dev)
    print("\n" + "\n".join(timings))
