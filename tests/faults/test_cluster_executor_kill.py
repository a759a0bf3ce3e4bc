"""An executor of the Spark standalone cluster is killed (kill -9) in the middle of a batch.

The UPI job runs on the one-worker cluster (platform/spark-cluster.sh, as in
tests/runtime/test_cluster.py): the driver is the `srt` process, the tasks run in an executor JVM
the worker launched. Once a batch is in flight, the test kills that executor; the master has
the worker launch another, Spark retries the lost tasks there (spark.task.maxFailures, 4 on a
cluster), and the run ends with the table equal to the oracle and each dead letter once. With
keyed state (the counts kept by a keyed process function, ``upi_keyed_job.py``) the lost
executor's stores are gone with it: the new executor rebuilds each partition's state from
the checkpoint's keyed files.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from upi_events import events

from stateful_runtime.checkpoints.layout import QueryLayout
from tests.faults.harness import QUERY, record_run
from tests.faults.killtrials import KEYED_JOB
from tests.helpers import Cluster, append_lines, srt_background, wait_for, wait_for_commit

pytestmark = [pytest.mark.faults, pytest.mark.cluster]

FAULT = "executor killed (kill -9) mid-batch on the standalone cluster"
INPUT = "UPI events from the event log (1 bad record in 997), 18k, batches of 3,000"


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


@pytest.mark.parametrize("keyed", [False, True], ids=["native", "keyed"])
def test_executor_killed_mid_batch_task_retried_result_equals_oracle(
    cluster: Cluster,
    upi,
    job_env,
    trials,
    keyed,
):
    # Six batches: the kill comes in one planned after the first commit (the second, as a
    # rule), and the batches after it run on the new executor, its stores rebuilt from the
    # checkpoint.
    lines = list(
        events(18_000, merchants=40, rate_per_s=500, disorder_ms=4_500, bad_every=997, seed=41)
    )
    append_lines(upi.log_dir, lines)
    upi.extra.update({"source.max_records_per_batch": "3000", "parallelism": "2"})
    if keyed:
        upi.job = KEYED_JOB
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
    why = record_run(
        trials,
        f"{FAULT} (keyed process function, state in the worker's RocksDB)" if keyed else FAULT,
        INPUT,
        upi,
        lines,
        code,
        f"killed executor pid(s) {victims} during batch {batch}; a new executor after "
        f"{replaced_s} s; batches committed {QueryLayout(qdir).last_committed() + 1}",
    )
    assert not why, why
