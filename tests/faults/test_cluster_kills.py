"""The UPI job on the Spark standalone cluster with its checkpoint on S3: an executor killed
in the middle of a batch, then the driver, and the job started again.

The driver is the `srt` process; the tasks run in an executor JVM the one-worker cluster
(platform/spark-cluster.sh) launched. Nothing of the checkpoint is on a disk: Spark's offset and
commit logs and its state store (the native path) go through Hadoop's S3A filesystem, the keyed
state files (the keyed process function, ``upi_keyed_job.py``) from the executors' Python
workers through boto3, and the runtime's own files (the marker, the lock's lease, input
watermarks, the sinks' record) from the driver.

1. Once a batch is in flight, its executor is killed (kill -9): the master has the worker
   launch another, and Spark retries the lost tasks there (``spark.task.maxFailures``, 4 on a
   cluster). The keyed stores were in the lost executor's directory, so the new one rebuilds
   each partition's state from the files on S3.
2. Once that batch is committed, the driver's whole process group is killed (the machine's
   crash), and the job is started again: the second run goes on from the checkpoint, with
   another new executor, and ends exact. The table equals the oracle, each bad record is one
   dead letter, and no batch of the first run ran again.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from upi_events import events

from stateful_runtime.checkpoints.layout import QueryLayout
from tests.faults.harness import QUERY, record_run
from tests.faults.killtrials import KEYED_JOB
from tests.helpers import (
    Cluster,
    S3Endpoint,
    append_lines,
    srt_background,
    wait_for,
    wait_for_commit,
)

pytestmark = [pytest.mark.faults, pytest.mark.cluster]

FAULT = (
    "executor killed (kill -9) mid-batch, then the driver (kill -9 of its process group), "
    "checkpoint on S3, on the standalone cluster"
)
INPUT = "UPI events from the event log (1 bad record in 997), 18k, batches of 3,000"
BATCHES = 6


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
def test_executor_then_driver_killed_on_the_cluster_checkpoint_on_s3_equals_oracle(
    cluster: Cluster, s3: S3Endpoint, upi, job_env, trials, keyed
):
    lines = list(
        events(
            BATCHES * 3_000, merchants=40, rate_per_s=500, disorder_ms=4_500, bad_every=997, seed=41
        )
    )
    append_lines(upi.log_dir, lines)
    prefix = f"cluster-kills-{'keyed' if keyed else 'native'}"
    location = f"s3://{s3.bucket}/{prefix}"
    upi.extra.update(
        {"checkpoint.dir": location, "source.max_records_per_batch": "3000", "parallelism": "2"}
    )
    if keyed:
        upi.job = KEYED_JOB
    qdir = f"{location}/{QUERY}"
    layout = QueryLayout(qdir)  # type: ignore[arg-type]
    args = upi.run_args("--available-now", "--master", cluster.master_url)

    first_log = upi.root / "first.log"
    first = srt_background(args, job_env, first_log)
    try:
        wait_for_commit(qdir, None, first, first_log, timeout=300)  # type: ignore[arg-type]
        # A batch in flight: planned (offsets/N) and not committed, its executor up.
        wait_for(
            lambda: (
                (layout.last_planned() or -1) > (layout.last_committed() or -1)
                and bool(_executors(cluster.worker_dir))
            ),
            first,
            first_log,
            "a batch in flight",
            timeout=300,
        )
        victims = _executors(cluster.worker_dir)
        batch = layout.last_planned()
        assert batch is not None
        subprocess.run(["kill", "-9", *map(str, victims)], check=True)
        t0 = time.monotonic()
        wait_for(
            lambda: bool(set(_executors(cluster.worker_dir)) - set(victims)),
            first,
            first_log,
            "a new executor",
            timeout=300,
        )
        replaced_s = round(time.monotonic() - t0, 1)
        # The batch the executor died in, retried on the new one, commits; then the driver goes.
        wait_for_commit(qdir, batch - 1, first, first_log, timeout=300)  # type: ignore[arg-type]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    killed_after = layout.last_committed()
    assert killed_after is not None and killed_after < BATCHES - 1, killed_after  # mid-stream

    log = upi.root / "run.log"  # record_run quotes it when the run fails
    second = srt_background(args, job_env, log)
    code = second.wait(timeout=600)
    why = record_run(
        trials,
        f"{FAULT} ({'keyed process function' if keyed else 'native window'})",
        INPUT,
        upi,
        lines,
        code,
        f"executor pid(s) {victims} killed during batch {batch}, a new one after {replaced_s} "
        f"s; driver killed after batch {killed_after}; resumed to batch {layout.last_committed()}",
    )
    assert not why, why
    # The second run went on from the checkpoint: no batch of the first ran again.
    said = log.read_text()
    assert f"{QUERY} batch {killed_after + 1} |" in said, said[-3000:]
    assert not any(f"{QUERY} batch {b} |" in said for b in range(killed_after + 1)), said[-3000:]

    # Everything of the checkpoint is on S3, none of it on the driver's disk.
    keys = s3.keys(f"{prefix}/")
    assert f"{prefix}/_job.json" in keys
    assert f"{prefix}/{QUERY}/commits/{layout.last_committed()}" in keys
    assert any(k.startswith(f"{prefix}/{QUERY}/input-watermarks/") for k in keys)
    stored = [k for k in keys if f"/{QUERY}/keyed/" in k or f"/{QUERY}/state/" in k]
    if keyed:
        assert any(k.endswith(".delta") for k in stored), keys
        assert any(k.endswith(".commit") for k in stored), keys
    else:
        assert any(k.endswith(".changelog") for k in stored), keys
    assert f"{prefix}/_lock" not in keys  # the lease ended with the run
    assert not upi.checkpoint_dir.exists()
    assert not any(p.name.startswith("s3:") for p in upi.root.iterdir())
