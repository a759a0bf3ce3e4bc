"""The disk holding the checkpoint fills up while the UPI job runs.

The checkpoint (and the dead-letter staging inside it) lives on a small tmpfs the test mounts
(root with CAP_SYS_ADMIN; skipped with the reason otherwise). After two committed batches the
test fills the tmpfs to the last byte. Expected: the job fails or stalls with a message naming
the full disk; what it committed is intact (the sink equals the oracle of what its ledger
claims, the checkpoint restarts); after the space is freed, a restart drains the log and the
table equals the oracle of everything fed, each dead letter published once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from upi_events import bad_lines, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.verify import verify
from tests.faults.harness import (
    QUERY,
    Feeder,
    batch_offsets,
    compare,
    dead_letters,
    duckdb_counts,
    log_lines,
    sink_batch,
)
from tests.helpers import kill_group, small_tmpfs, srt, srt_background, wait_for_commit

pytestmark = pytest.mark.faults

FAULT = "disk holding the checkpoint full"
INPUT = "UPI events appended while the job runs (1 bad record in 997)"
NO_SPACE = "No space left on device"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 32 MB tmpfs at a fresh directory (far more than the checkpoint needs: the test fills
    it on purpose)."""
    with small_tmpfs(tmp_path / "disk", "32m") as mnt:
        yield mnt


def _fill(mnt: Path) -> int:
    """Write until the disk is full; returns the bytes written."""
    written = 0
    with (mnt / "filler").open("wb", buffering=0) as f:
        block = b"\0" * (1 << 16)
        try:
            while True:
                written += f.write(block)
        except OSError:
            pass
        try:  # the last partial block
            while f.write(b"\0" * 512):
                written += 512
        except OSError:
            pass
    return written


def test_checkpoint_disk_full_fails_clearly_loses_nothing_restart_equals_oracle(
    upi, job_env, small_disk, trials
):
    upi.extra.update(
        {
            "checkpoint.dir": str(small_disk / "ckpt"),
            "checkpoint.interval_s": "0.5",
            "parallelism": "2",
            "source.max_records_per_batch": "2000",
        }
    )
    qdir = small_disk / "ckpt" / QUERY
    feeder = Feeder(upi.log_dir, seed=23, chunk=100)
    log = upi.root / "run.log"
    proc = srt_background(upi.run_args(), job_env, log)
    try:
        wait_for_commit(qdir, None, proc, log, timeout=300)
        wait_for_commit(qdir, QueryLayout(qdir).last_committed(), proc, log, timeout=300)
        filled = _fill(small_disk)
        t0 = time.monotonic()
        committed_at_fill = QueryLayout(qdir).last_committed()

        def reacted() -> bool:
            return proc.poll() is not None or NO_SPACE in log.read_text()

        deadline = time.monotonic() + 300
        while not reacted() and time.monotonic() < deadline:
            time.sleep(0.2)
        exited = proc.poll()
        if exited is None:  # a stall (or a retry loop): give it a moment to fail, else stop it
            end = time.monotonic() + 30
            while proc.poll() is None and time.monotonic() < end:
                time.sleep(0.2)
            exited = proc.poll()
        reaction_s = round(time.monotonic() - t0, 1)
    finally:
        kill_group(proc)
    out = log.read_text()
    # One line from srt naming the full disk (Spark's own error buries it in a stack trace).
    said = [
        line.strip()[:300]
        for line in out.splitlines()
        if line.startswith("[") and "disk holding checkpoint" in line and "is full" in line
    ]

    # Nothing committed is lost: the sink equals the oracle of what its ledger claims, and
    # the checkpoint restarts (perhaps one batch back).
    b = sink_batch(upi.database)
    at_failure = compare(
        duckdb_counts(upi.database), oracle(log_lines(upi.log_dir, batch_offsets(qdir, b)))
    )
    problems = [str(p) for p in verify(qdir)]
    fed = feeder.stop()
    (small_disk / "filler").unlink()
    restart = srt(
        upi.run_args("--available-now", "--set", "source.max_records_per_batch=1000000"),
        job_env,
        timeout=900,
    )
    final = compare(upi.table(), oracle(fed))
    dead = dead_letters(upi.log_dir)
    recovered = [line for line in restart.stdout.splitlines() if "is damaged" in line]

    why = []
    if not said:
        why.append("no message naming the full disk")
    if not at_failure.exact:
        why.append(f"at the failure: {at_failure}")
    if restart.returncode != 0:
        why.append(f"restart exited {restart.returncode}: {restart.stderr[-800:]}")
    if not final.exact:
        why.append(f"after the restart: {final}")
    if dead != bad_lines(fed):
        why.append(f"{len(dead)} dead letters for {len(bad_lines(fed))} bad records")
    trials.record(
        fault=FAULT,
        input=INPUT,
        result="FAIL" if why else "pass",
        detail="; ".join(why)
        or (
            f"filled {filled:,} bytes after batch {committed_at_fill}; the job "
            f"{'exited ' + str(exited) if exited is not None else 'stalled'} after {reaction_s} s "
            f"saying: {said[0] if said else '-'}; checkpoint problems after: "
            f"{problems or 'none'}; restart: {recovered or 'no fallback needed'}"
        ),
        lost=final.lost,
        duplicated=final.duplicated,
    )
    assert not why, (why, out[-3000:])
