"""kill -9 the running UPI job at random points while events arrive: the result is exact.

The test process is the topic's writer, appending throughout; the job reads through RocksDB
secondary instances. Each kill hits the whole process group (driver, JVM, Python workers), as a
machine crash would, at a random moment after at least one new committed batch: mid-batch,
mid-sink-transaction or between the sink's commit and Spark's commit marker.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from upi_events import events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.connectors.eventlog.ingest import _records
from tests.helpers import kill_group, srt, srt_background, wait_for_commit

pytestmark = pytest.mark.slow

KILLS = 5
QUERY = "upi-counts"


@pytest.mark.faults
def test_kill_dash_nine_five_times_result_equals_oracle(upi, srt_env):
    rng = random.Random(20261122)
    # An endless, lazily generated feed: the feeder runs until the last kill is done.
    feed_lines = events(
        10_000_000, merchants=30, rate_per_s=300, disorder_ms=4_000, bad_every=9_973, seed=5
    )
    fed: list[bytes] = []
    stop = threading.Event()

    def feed() -> None:
        # 500 events/s: every run finds new batches, and the drain's backlog stays small (at
        # 2,000/s the test generated and the job read ~170k events, the most of its time).
        with EventLog(upi.log_dir).writer("upi-payments") as writer:
            while not stop.is_set():
                chunk = [next(feed_lines) for _ in range(100)]
                writer.append(_records(chunk, "merchant_id"))
                fed.extend(chunk)
                stop.wait(0.2)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    qdir = upi.checkpoint_dir / QUERY
    upi.extra["checkpoint.interval_s"] = "0.5"
    upi.extra["source.max_records_per_batch"] = "100000"
    try:
        for kill in range(KILLS):
            before = QueryLayout(qdir).last_committed()
            log = upi.root / f"run-{kill}.log"
            proc = srt_background(upi.run_args(), srt_env, log)
            try:
                wait_for_commit(qdir, before, proc, log)
                time.sleep(rng.uniform(0, 1.5))  # the random point: not a synchronisation
            finally:
                kill_group(proc)
    finally:
        stop.set()
        feeder.join()

    final = srt(upi.run_args("--available-now"), srt_env)
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-3000:]
    assert len(fed) > 5_000
    assert upi.table() == oracle(fed)

    reader = EventLog(upi.log_dir).reader("upi-payments-dlq")
    dead = sorted(r.value for p, e in reader.end_offsets().items() for r in reader.read(p, 0, e))
    bad = sorted(
        line
        for line in fed
        if line.startswith(b"{not") or b'"ten"' in line or b'"amount_paise"' not in line
    )
    assert dead == bad  # each dead letter exactly once despite the kills
