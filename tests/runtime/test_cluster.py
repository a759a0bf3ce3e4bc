"""The UPI job end to end on a Spark standalone cluster (master + worker from the pyspark wheel).

The same job and oracle as test_runner_available_now, but `srt run --master spark://...`: the
driver is the `srt` process, the tasks (Python DataSource reads, RocksDB state) run in an
executor the worker launched.
"""

from __future__ import annotations

import json
import signal

import pytest
from upi_events import events, oracle

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import Cluster, append_lines, srt

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_200k_events_on_standalone_cluster_equal_oracle(cluster: Cluster, upi, srt_env):
    state = cluster.state()
    assert state["status"] == "ALIVE" and state["aliveworkers"] == 1 and state["cores"] == 2

    lines = list(
        events(200_000, merchants=40, rate_per_s=500, disorder_ms=4_500, bad_every=20_011, seed=23)
    )
    append_lines(upi.log_dir, lines)

    result = srt(
        upi.run_args("--available-now", "--master", cluster.master_url), srt_env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert f"running 1 query on {cluster.master_url}" in result.stdout, result.stdout[-2000:]
    assert "upi-counts batch 0" in result.stdout

    assert upi.table() == oracle(lines)

    bad = [
        line
        for line in lines
        if line.startswith(b"{not") or b'"ten"' in line or b'"amount_paise"' not in line
    ]
    reader = EventLog(upi.log_dir).reader("upi-payments-dlq")
    dead = [r for p, end in reader.end_offsets().items() for r in reader.read(p, 0, end)]
    assert sorted(r.value for r in dead) == sorted(bad)

    # The run really was on the cluster: the registry names the master and a standalone app
    # id, the master lists that app as finished, and the worker launched an executor for it.
    status = json.loads(srt(["status", "upi-per-minute", "--json"], srt_env).stdout)[0]
    assert status["state"] == "FINISHED"
    assert status["master"] == cluster.master_url
    app_id = status["spark_app_id"]
    assert app_id.startswith("app-") and not app_id.startswith("local-"), app_id

    # The driver exiting unregisters the app; the master records that asynchronously.
    app = cluster.wait_for_completed_app(app_id)
    assert app["state"] == "FINISHED" and app["cores"] == 2, app
    executor_logs = list((cluster.worker_dir / app_id).glob("*/stderr"))
    assert executor_logs, f"no executor of {app_id} under {cluster.worker_dir}"


def test_warehouse_sinks_written_by_the_cluster_executors_equal_oracle(
    cluster: Cluster, upi, srt_env, pg_dsn, ch_url
):
    """PostgreSQL and ClickHouse written by the executor tasks (one per output partition),
    committed by the driver: each table equals the oracle."""
    from dbt_sink.clickhouse import ClickHouseUpsertSink
    from stateful_runtime.ledger import LEDGER_TABLE
    from tests.helpers import read_counts

    lines = list(events(100_000, merchants=40, rate_per_s=500, disorder_ms=4_500, seed=29))
    append_lines(upi.log_dir, lines)
    upi.extra.update({"sink.kind": "postgres,clickhouse", "sink.dsn": pg_dsn, "sink.url": ch_url})
    result = srt(
        upi.run_args("--available-now", "--master", cluster.master_url), srt_env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-4000:]
    expected = oracle(lines)
    assert read_counts("postgres", pg_dsn) == expected
    assert read_counts("clickhouse", ch_url) == expected
    # Every batch with rows was written as 4 partitions (the job's parallelism), each by a task.
    c = ClickHouseUpsertSink(ch_url, "upi_counts", ("merchant_id",))._client()
    try:
        parts = c.query(f"SELECT DISTINCT partitions FROM {LEDGER_TABLE} WHERE partition >= 0")
    finally:
        c.close()
    assert parts == [(4,)]
    status = json.loads(srt(["status", "upi-per-minute", "--json"], srt_env).stdout)[0]
    app_id = status["spark_app_id"]
    assert app_id.startswith("app-") and list((cluster.worker_dir / app_id).glob("*/stderr"))


def test_daemons_started_by_a_caller_ignoring_sigterm_still_stop_on_it(tmp_path, srt_env):
    """A caller that ignores SIGTERM passes that on (Dagster's interrupt handling maps SIGTERM
    onto an ignored SIGINT), and HotSpot keeps an inherited ignored SIGTERM ignored: `stop`
    waited out its timeout for each daemon, then killed it."""
    import subprocess

    from tests.helpers import CLUSTER_SCRIPT, cluster_cmd

    cluster_dir = tmp_path / "cluster"
    env = {**srt_env, "SRT_CLUSTER_DIR": str(cluster_dir), "SRT_CLUSTER_STOP_TIMEOUT": "120"}
    started = subprocess.run(
        ["bash", str(CLUSTER_SCRIPT), "start", str(cluster_dir)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_IGN),
    )
    try:
        assert started.returncode == 0, started.stderr[-3000:]
    finally:
        stopped = cluster_cmd("stop", cluster_dir, env)
    assert stopped.returncode == 0 and "did not exit" not in stopped.stderr, stopped.stderr
    for daemon in ("master", "worker"):
        assert "RECEIVED SIGNAL TERM" in (cluster_dir / f"{daemon}.log").read_text(), daemon
