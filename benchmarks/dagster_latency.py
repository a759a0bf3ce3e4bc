"""Commit → Dagster latency: how long after a micro-batch commits its sink table is materialised
in Dagster, and the downstream dbt model's run starts, on a real ``dagster dev``.

Two modes in one run, each its own ``dagster dev`` (examples/definitions.py, sensor and
automation every 5 s) over the UPI job fed 400 events every ~8 s:

* ``push``   — ``SRT_DAGSTER_URL`` set: the job process reports each commit to the webserver;
* ``sensor`` — unset: the health sensor reports the ledger's new batches once a tick (peer).

Per materialisation of ``upi_counts``: its timestamp − the ledger's commit time of its last
batch; per run of the dbt model ``merchant_day``: its creation (the automation sensor requested it)
− the commit time of the batch whose materialisation preceded it.

    python benchmarks/dagster_latency.py [--rounds 10] [--modes push,sensor]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import UTC
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
VENV_BIN = Path(sys.executable).parent

from upi_events import START_MS, events  # noqa: E402

from stateful_runtime.connectors.eventlog import EventLog  # noqa: E402
from tests.helpers import append_lines, free_port  # noqa: E402

JOB = "upi-per-minute"
DAGSTER_YAML = "telemetry:\n  enabled: false\nnux:\n  enabled: false\n"


def graphql(url: str, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    req = urllib.request.Request(
        f"{url}/graphql",
        data=json.dumps({"query": query, "variables": variables or {}}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        out = json.load(resp)
    if out.get("errors"):
        raise RuntimeError(out["errors"])
    return out["data"]


def wait(cond: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except (OSError, urllib.error.URLError, RuntimeError, KeyError, TypeError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(1.0)
    raise TimeoutError(f"{what}: {last!r}")


MATERIALIZATIONS = """
query($key: AssetKeyInput!) { assetOrError(assetKey: $key) { ... on Asset {
  assetMaterializations(limit: 500) { runId timestamp
    metadataEntries { label ... on IntMetadataEntry { intValue } } } } } }"""
RUNS = """{ runsOrError(limit: 500) { ... on Runs { results {
  runId creationTime assetSelection { path } } } } }"""


def materializations(url: str, key: str) -> list[dict[str, Any]]:
    found = graphql(url, MATERIALIZATIONS, {"key": {"path": [key]}})["assetOrError"]
    return found.get("assetMaterializations") or []


def run_mode(mode: str, rounds: int, work: Path) -> dict[str, list[float]]:
    work.mkdir(parents=True)
    home, srt_home = work / "dagster-home", work / "srt-home"
    home.mkdir()
    srt_home.mkdir()
    (home / "dagster.yaml").write_text(DAGSTER_YAML)
    log_dir = work / "srt-data" / "log"
    EventLog(log_dir).create_topic("upi-payments", 2)
    append_lines(log_dir, list(events(2_000, merchants=8, rate_per_s=40, seed=1)))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "SRT_HOME": str(srt_home),
        "SRT_SENSOR_INTERVAL_S": "5",
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": str(VENV_BIN / "python"),
    }
    env.pop("SRT_DAGSTER_URL", None)
    if mode == "push":
        env["SRT_DAGSTER_URL"] = url
    out = (work / "dagster-dev.log").open("wb")
    proc = subprocess.Popen(
        [str(VENV_BIN / "dagster"), "dev", "-w", str(ROOT / "workspace.yaml")]
        + ["-h", "127.0.0.1", "-p", str(port)],
        cwd=work,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=lambda: [
            signal.signal(s, signal.SIG_DFL) for s in (signal.SIGINT, signal.SIGTERM)
        ],
    )
    srt = [str(VENV_BIN / "srt"), "--home", str(srt_home)]
    try:
        wait(
            lambda: any(
                n["assetKey"]["path"] == ["merchant_day"]
                for n in graphql(url, "{ assetNodes { assetKey { path } } }")["assetNodes"]
            ),
            600,
            "dagster dev to serve the assets",
        )
        from dagster_graphql import DagsterGraphQLClient

        client = DagsterGraphQLClient("127.0.0.1", port_number=port)
        client.submit_job_execution("__ASSET_JOB", asset_selection=[["upi_per_minute"]])

        def running() -> bool:
            st = subprocess.run([*srt, "status", JOB, "--json"], capture_output=True, text=True)
            found = json.loads(st.stdout or "[]")
            return bool(found) and found[0].get("state") == "RUNNING"

        wait(running, 900, "the job to run")
        wait(lambda: materializations(url, "upi_counts"), 600, "a first materialisation")
        for i in range(rounds):
            start = START_MS + 50_000 + i * 10_000
            append_lines(
                log_dir, list(events(400, merchants=8, rate_per_s=40, seed=10 + i, start_ms=start))
            )
            time.sleep(8)  # the pace of the input, not synchronisation
        time.sleep(45)  # the sensor's fallback window and the last dbt runs
        mats = materializations(url, "upi_counts")
        started = [
            float(r["creationTime"])
            for r in graphql(url, RUNS)["runsOrError"]["results"]
            if any(a["path"] == ["merchant_day"] for a in r["assetSelection"] or [])
        ]
        subprocess.run([*srt, "stop", JOB, "--json"], capture_output=True, timeout=300)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(proc.pid, signal.SIGKILL)
        subprocess.run([*srt, "stop", JOB, "--kill", "--json"], capture_output=True, timeout=120)

    import duckdb

    from stateful_runtime.ledger import BATCH_ID, COMMITTED_AT, LEDGER_TABLE, SINK
    from stateful_runtime.ledger import JOB as JOB_COL

    con = duckdb.connect(str(work / "srt-data" / "upi.duckdb"), read_only=True)
    committed = {
        int(b): at.replace(tzinfo=UTC).timestamp()
        for b, at in con.execute(
            f"SELECT {BATCH_ID}, {COMMITTED_AT} FROM {LEDGER_TABLE} "
            f"WHERE {JOB_COL} = ? AND {SINK} = ?",
            [JOB, "upi-counts"],
        ).fetchall()
    }
    con.close()
    table: list[tuple[float, float]] = []  # (materialised at, its last batch's commit)
    for m in mats:
        last = next(
            (e["intValue"] for e in m["metadataEntries"] if e["label"] == "last batch"), None
        )
        if last is not None and last in committed:
            table.append((float(m["timestamp"]) / 1000, committed[last]))
    table.sort()
    # A dbt run: its creation (automation requested it) − the commit whose materialisation
    # came last before it.
    model = []
    for start_s in sorted(started):
        before = [c for at, c in table if at <= start_s]
        if before:
            model.append(start_s - max(before))
    return {"table": [at - c for at, c in table], "model_run_created": model}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--modes", default="push,sensor")
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory(prefix="srt-dagster-latency-") as tmp:
        for mode in args.modes.split(","):
            results[mode] = run_mode(mode, args.rounds, Path(tmp) / mode)
    load = os.getloadavg()
    print(f"load average {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    for mode, r in results.items():
        for what, xs in r.items():
            if xs:
                print(
                    f"{mode:7s} {what:19s} n={len(xs):3d} median {statistics.median(xs):6.1f} s "
                    f"min {min(xs):6.1f} max {max(xs):6.1f}"
                )
    if all(results.get(m, {}).get("table") for m in ("push", "sensor")):
        ratio = statistics.median(results["sensor"]["table"]) / statistics.median(
            results["push"]["table"]
        )
        print(f"commit → table materialisation, sensor ÷ push (medians): {ratio:.1f}×")


if __name__ == "__main__":
    main()
