"""One watermark per partition on Apache Kafka (issue 41, Flink's per-split watermarks).

A topic whose two partitions lie 10 minutes apart in event time, read live with a 5-second
bound: the source's alignment holds the faster partition within the bound of the slower one,
and the watermark is the slower partition's. With one watermark per source (its largest event
time less the bound, Spark's) a record of the slower partition up to the bound behind its own
newest, read in a later batch, fell behind the faster partition's watermark and was late."""

from __future__ import annotations

import json
import signal
from datetime import UTC, datetime

import pytest
from upi_events import START_MS, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from tests.faults.harness import duckdb_counts
from tests.helpers import EXAMPLES, poll, srt, srt_background, wait_for

pytestmark = pytest.mark.slow

DRIFT_MS = 600_000  # partition 1 (the faster) starts 10 minutes later in event time
BOUND_MS = 5_000  # the UPI job's bounded out-of-orderness


def _pay(i: int, at_s: float, merchant: str) -> bytes:
    ts = START_MS + int(at_s * 1000)
    return json.dumps(
        {"txn_id": f"t{i}", "merchant_id": merchant, "amount_paise": 100, "ts_ms": ts}
    ).encode()


def test_a_partition_ten_minutes_behind_loses_nothing_to_a_faster_one(kafka, tmp_path, srt_env):
    topic = "drift"
    kafka.create_topic(topic, 2)
    # Partition 0 from 0 s to 662 s, partition 1 from 600 s (10 minutes on) to 667 s: within
    # the bound of partition 0's newest, so the first batch reads both to their ends.
    slow = [_pay(i, s, f"M{i % 3}") for i, s in enumerate(range(0, 663))]
    fast = [_pay(10_000 + i, 600 + s, f"M{i % 3}") for i, s in enumerate(range(0, 68))]
    kafka.produce(topic, [(None, v, 0) for v in slow] + [(None, v, 1) for v in fast])
    db, ck = tmp_path / "upi.duckdb", tmp_path / "ck"
    sets = {
        "source.kind": "kafka",
        "source.bootstrap_servers": kafka.bootstrap,
        "source.topic": topic,
        "source.idle_timeout_s": 600,  # no partition goes idle during the test
        "sink.database": db,
        "checkpoint.dir": ck,
        "checkpoint.interval_s": 0.5,
        "parallelism": 2,
    }
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    log = tmp_path / "job.log"
    proc = srt_background(["run", str(EXAMPLES / "upi_per_minute.py"), *args], srt_env, log)
    query = QueryLayout(ck / "upi-counts")

    def read_to(ends: dict[str, int]) -> bool:
        last = query.last_committed()
        entry = query.committed_offsets(last) if last is not None else None
        return entry is not None and entry["sources"][0] == ends

    try:
        wait_for(lambda: read_to({f"{topic}:0": 663, f"{topic}:1": 68}), proc, log, "phase 1")
        # Then partition 0's record 4 s behind its newest (inside the bound): its window, 600 s
        # to 660 s, ended before the faster partition's newest less the bound (662 s).
        late_one = _pay(20_000, 658, "M0")
        more_slow = [_pay(30_000 + i, 663 + s, f"M{i % 3}") for i, s in enumerate(range(40))]
        more_fast = [_pay(40_000 + i, 668 + s, f"M{i % 3}") for i, s in enumerate(range(40))]
        kafka.produce(
            topic,
            [(None, v, 0) for v in [late_one, *more_slow]] + [(None, v, 1) for v in more_fast],
        )
        wait_for(lambda: read_to({f"{topic}:0": 704, f"{topic}:1": 108}), proc, log, "phase 2")

        # `srt status` (and Dagster, from the same health) shows each partition's event-time
        # lag and which partition holds the watermark.
        def health() -> dict:
            out = srt(["status", "upi-per-minute", "--json"], srt_env)
            found = json.loads(out.stdout)[0]["health"].get("upi-counts", {}) if out.stdout else {}
            return found if found.get("watermark_held_by") else {}

        shown = poll(health, 60, "the partitions' event times in srt status")
        assert shown["event_time_lag_by_partition"] == {"upi-source:0": 5_000, "upi-source:1": 0}
        assert shown["watermark_held_by"] == "upi-source:0"
        text = srt(["status", "upi-per-minute"], srt_env).stdout
        assert "watermark held by upi-source:0" in text
        assert "event-time lag by partition: upi-source:0 5.0 s, upi-source:1 0.0 s" in text
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    lines = slow + fast + [late_one] + more_slow + more_fast
    expected = oracle(lines)
    table = duckdb_counts(db)  # the windows the watermark closed
    window = datetime.fromtimestamp((START_MS + 600_000) / 1000, UTC).replace(tzinfo=None)
    assert table[("M0", window)] == expected[("M0", window)], log.read_text()[-3000:]
    assert {k: expected[k] for k in table} == table
    kept = query.input_watermarks_upto(query.last_committed() or 0)
    assert kept is not None
    [(_, parts)] = json.loads(kept.read_text())["partitions"].items()
    assert {int(k): v[0] for k, v in parts.items()} == {
        0: START_MS + 702_000,
        1: START_MS + 707_000,
    }
