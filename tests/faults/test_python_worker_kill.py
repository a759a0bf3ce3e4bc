"""A Python worker killed (kill -9) in the middle of a keyed task, state in its RocksDB.

The UPI counts run as a keyed process function (``upi_keyed_job.py``). The worker that meets
one chosen payment of the third batch stops there, in the middle of its task, with part of the
batch's keys already changed in its RocksDB and its warm values, and is killed. Spark runs the
task again (a local master retries a task as a cluster does, ``runtime/session.py``), on a
worker that must start from the batch's state version, not from the killed worker's
half-written one: the run goes on to its end with the table equal to the oracle and each dead
letter once.
"""

from __future__ import annotations

import json
import os

import pytest
from upi_events import events

from tests.faults.harness import record_run
from tests.faults.killtrials import KEYED_JOB
from tests.faults.upi_keyed_job import PAUSE_ENV
from tests.helpers import append_lines, poll, srt_background, wait_for

pytestmark = pytest.mark.faults

FAULT = "Python worker killed (kill -9) mid-task, keyed process function"
INPUT = "UPI events from the event log (1 bad record in 997), 8k, batches of 2,000"


def test_python_worker_killed_mid_task_retried_from_the_batch_version(upi, job_env, trials):
    lines = list(
        events(8_000, merchants=300, rate_per_s=300, disorder_ms=4_000, bad_every=997, seed=43)
    )
    append_lines(upi.log_dir, lines)
    upi.job = KEYED_JOB
    upi.extra.update(
        {
            "parallelism": "2",
            "source.max_records_per_batch": "2000",
        }
    )
    txn = json.loads(lines[4_500])["txn_id"]  # in the third batch: state versions behind it
    env = {**job_env, PAUSE_ENV: f"{upi.root}:{txn}"}
    log = upi.root / "run.log"
    proc = srt_background(upi.run_args("--available-now"), env, log)
    marker = upi.root / "paused"
    try:
        wait_for(marker.exists, proc, log, "the worker paused mid-task", timeout=300)
        pid = int(poll(lambda: marker.read_text().strip(), 10, "the worker's pid"))
        os.kill(pid, 9)
        code = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    passed = f"killed worker {pid} at payment {txn}; the task ran again"
    why = record_run(trials, FAULT, INPUT, upi, lines, code, passed)
    assert not why, why
