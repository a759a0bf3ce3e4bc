"""An executor of the Spark standalone cluster is killed (kill -9) in the middle of a batch.

The UPI job runs on the one-worker cluster (platform/spark-cluster.sh, as in
tests/runtime/test_cluster.py): the driver is the `srt` process, the tasks run in an executor JVM
the worker launched. Once a batch is in flight, the test kills that executor; the master has
the worker launch another, Spark retries the lost tasks there (spark.task.maxFailures, 4 on a
cluster), and the run ends with the table equal to the oracle and each dead letter once. On the
local RocksDB backend (the counts kept by a keyed process function, ``upi_keyed_job.py``) the
lost executor's stores are gone with it: the new executor rebuilds each partition's state from
the checkpoint's keyed files.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from upi_events import events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from tests.faults.harness import QUERY, bad_lines, compare, dead_letters, duckdb_counts
from tests.faults.killtrials import KEYED_JOB
from tests.helpers import Cluster, append_lines, srt_background, wait_for, wait_for_commit

pytestmark = [pytest.mark.faults, pytest.mark.cluster]

FAULT = "executor killed (kill -9) mid-batch on the standalone cluster"
INPUT = "UPI events from the event log (1 bad record in 997), 60k, batches of 3,000"


def _executors(worker_dir: Path) -> list[int]:
    """pids of the executor JVMs this cluster's worker started: an executor runs in its
    directory under the worker's work dir (``<work>/<app>/<executor id>``)."""
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"CoarseGrainedExecutorBackend" in (proc / "cmdline").read_bytes() and (
                proc / "cwd"
            ).resolve().is_relative_to(worker_dir.resolve()):
                out.append(int(proc.name))
        except OSError:
            continue
    return out


@pytest.mark.parametrize("backend", [None, "rocksdb_local"], ids=["native", "rocksdb_local"])
def test_executor_killed_mid_batch_task_retried_result_equals_oracle(
    cluster: Cluster,
    upi,
    job_env,
    trials,
    backend,
):
    lines = list(
        events(60_000, merchants=40, rate_per_s=500, disorder_ms=4_500, bad_every=997, seed=41)
    )
    append_lines(upi.log_dir, lines)
    upi.extra.update({"source.max_records_per_batch": "3000", "parallelism": "2"})
    if backend is not None:
        upi.job = KEYED_JOB
        upi.extra["state.backend"] = backend
    qdir = upi.checkpoint_dir / QUERY
    log = upi.root / "run.log"
    proc = srt_background(
        upi.run_args("--available-now", "--master", cluster.master_url), job_env, log
    )
    try:
        wait_for_commit(qdir, None, proc, log, timeout=300)
        # A batch in flight: planned (offsets/N) and not committed.
        wait_for(
            lambda: (
                (QueryLayout(qdir).last_planned() or -1)
                > (QueryLayout(qdir).last_committed() or -1)
                and bool(_executors(cluster.worker_dir))
            ),
            proc,
            log,
            "a batch in flight",
            timeout=300,
        )
        victims = _executors(cluster.worker_dir)
        batch = QueryLayout(qdir).last_planned()
        subprocess.run(["kill", "-9", *map(str, victims)], check=True)
        t0 = time.monotonic()
        wait_for(
            lambda: bool(set(_executors(cluster.worker_dir)) - set(victims)),
            proc,
            log,
            "a new executor",
            timeout=300,
        )
        replaced_s = round(time.monotonic() - t0, 1)
        code = proc.wait(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    cmp = compare(duckdb_counts(upi.database), oracle(lines))
    dead = dead_letters(upi.log_dir)
    why = []
    if code != 0:
        why.append(f"the job exited {code}: {out[-800:]}")
    if not cmp.exact:
        why.append(str(cmp))
    if dead != bad_lines(lines):
        why.append(f"{len(dead)} dead letters for {len(bad_lines(lines))} bad records")
    trials.record(
        fault=FAULT if backend is None else f"{FAULT} (keyed process function, {backend})",
        input=INPUT,
        result="FAIL" if why else "pass",
        detail="; ".join(why)
        or f"killed executor pid(s) {victims} during batch "
        f"{batch}; a new executor after {replaced_s} s; batches committed "
        f"{QueryLayout(qdir).last_committed() + 1}",
        lost=cmp.lost,
        duplicated=cmp.duplicated,
    )
    assert not why, why
