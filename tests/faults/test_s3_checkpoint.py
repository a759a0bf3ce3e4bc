"""A job whose checkpoint lives on S3 (``checkpoint.dir=s3://...``), on the standalone cluster,
its driver killed (kill -9 of its process group: the machine's crash) and started again.

Nothing of the checkpoint is on a disk: Spark's offset and commit logs and its state store (the
native path) go through Hadoop's S3A filesystem, the keyed state files (the keyed process
function, ``upi_keyed_job.py``) from the executor's Python workers through boto3, and the
runtime's own files (the marker, the lock's lease, input watermarks, the sinks' record) from the
driver. The executor keeps its RocksDB copies in its own directory; the second run's executor
is a new one, so each partition's state comes back from S3. The run ends exact: the table equals
the oracle and each bad record is one dead letter.
"""

from __future__ import annotations

import os
import signal

import pytest
from upi_events import events

from stateful_runtime.checkpoints.layout import QueryLayout
from tests.faults.harness import QUERY, record_run
from tests.faults.killtrials import KEYED_JOB
from tests.helpers import Cluster, S3Endpoint, append_lines, srt_background, wait_for_commit

pytestmark = [pytest.mark.faults, pytest.mark.cluster]

FAULT = "driver killed (kill -9 of its process group) with the checkpoint on S3, on the cluster"
INPUT = "UPI events from the event log (1 bad record in 997), 15k, batches of 3,000"


@pytest.mark.parametrize("keyed", [False, True], ids=["native", "keyed"])
def test_checkpoint_on_s3_killed_and_resumed_on_the_cluster_equals_oracle(
    cluster: Cluster, s3: S3Endpoint, upi, job_env, trials, keyed
):
    lines = list(
        events(15_000, merchants=40, rate_per_s=500, disorder_ms=4_500, bad_every=997, seed=43)
    )
    append_lines(upi.log_dir, lines)
    prefix = f"s3-checkpoint-{'keyed' if keyed else 'native'}"
    location = f"s3://{s3.bucket}/{prefix}"
    upi.extra.update(
        {
            "checkpoint.dir": location,
            "source.max_records_per_batch": "3000",
            "parallelism": "2",
        }
    )
    if keyed:
        upi.job = KEYED_JOB
    qdir = f"{location}/{QUERY}"
    args = upi.run_args("--available-now", "--master", cluster.master_url)

    log = upi.root / "run.log"
    first = srt_background(args, job_env, log)
    try:
        wait_for_commit(qdir, None, first, log, timeout=300)  # type: ignore[arg-type]
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    killed_after = QueryLayout(qdir).last_committed()
    assert killed_after is not None and killed_after < 4, killed_after  # mid-stream

    second = srt_background(args, job_env, log)
    code = second.wait(timeout=600)
    why = record_run(
        trials,
        f"{FAULT} ({'keyed process function' if keyed else 'native window'})",
        INPUT,
        upi,
        lines,
        code,
        f"killed after batch {killed_after}; resumed to batch {QueryLayout(qdir).last_committed()}",
    )
    assert not why, why
    # The second run went on from the checkpoint: no batch of the first ran again.
    said = log.read_text()
    assert f"{QUERY} batch {killed_after + 1} |" in said, said[-3000:]
    assert not any(f"{QUERY} batch {b} |" in said for b in range(killed_after + 1)), said[-3000:]

    # Everything of the checkpoint is on S3, none of it on the driver's disk.
    keys = s3.keys(f"{prefix}/")
    assert f"{prefix}/_job.json" in keys
    assert f"{prefix}/{QUERY}/commits/{QueryLayout(qdir).last_committed()}" in keys
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
