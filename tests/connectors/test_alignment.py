"""Per-partition event-time alignment of the event-log source at plan time (`sources/alignment.py`).

Two partitions with equal backlogs but different event-time density: with a record cap the
batch is shared by backlog, so the dense partition would race minutes ahead in event time each
batch and the sparse one's records would fall behind Spark's single watermark (late, dropped).
The source cuts each batch where a partition's event time passes the slowest one's by more than
the watermark bound: nothing is late and the table equals the oracle.
"""

from __future__ import annotations

import io
import json

import duckdb
import pytest
from upi_events import oracle

from stateful_runtime.connectors.alignment import Idleness, bound_by_event_time, hold_for_silent
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.connectors.eventlog.store import Record
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import EXAMPLES

T0 = 1_767_225_600_000


def _payment(i: int, merchant: str, ts: int) -> bytes:
    return json.dumps(
        {"txn_id": f"t{i}", "merchant_id": merchant, "amount_paise": 100 + i, "ts_ms": ts}
    ).encode()


def test_bound_cuts_the_partition_running_ahead():
    times = {"0": [i * 1000 for i in range(100)], "1": [i * 100 for i in range(100)]}
    ends = bound_by_event_time(
        {"0": 0, "1": 0}, {"0": 50, "1": 50}, lambda p, o: times[p][o], drift_ms=500
    )
    # Partition 1 ends at 4.9 s: partition 0 may read up to 5.4 s (offsets 0..5).
    assert ends == {"0": 6, "1": 50}
    # A partition with nothing to read holds nobody back; one bad record is looked past.
    assert bound_by_event_time(
        {"0": 0, "1": 50}, {"0": 50, "1": 50}, lambda p, o: times[p][o], 500
    ) == {"0": 50, "1": 50}
    assert (
        bound_by_event_time(
            {"0": 0, "1": 0}, {"0": 50, "1": 50}, lambda p, o: None if o == 49 else times[p][o], 500
        )["0"]
        == 6
    )


def test_a_silent_partition_holds_the_others_at_its_last_record_until_idle(monkeypatch):
    """Flink without idleness: a partition with nothing new holds every other where it passes
    the silent one's last record by more than the bound; once silent for longer than the
    idleness it holds nobody, and a bounded run is never held whole."""
    times = {"0": [i * 1000 for i in range(100)], "1": [i * 100 for i in range(100)]}
    clock = [100.0]
    monkeypatch.setattr("stateful_runtime.connectors.alignment.time.monotonic", lambda: clock[0])
    idle = Idleness({"idleness_ms": "2000"})
    start, ends = {"0": 10, "1": 50}, {"0": 60, "1": 50}  # 1 read to 4.9 s, nothing new
    silent = idle.holding(start, ends)
    assert silent == ["1"]

    def held(silent: list[str], bounded: bool = False) -> dict[str, int]:
        return hold_for_silent(start, ends, silent, lambda p, o: times[p][o], 500, bounded=bounded)

    assert held(silent) == {"0": 10, "1": 50}  # 0 is at 10 s already: nothing to read
    assert held(silent, bounded=True) == ends
    assert hold_for_silent(
        {"0": 0, "1": 50}, ends, silent, lambda p, o: times[p][o], 500, bounded=False
    ) == {"0": 6, "1": 50}  # up to 5.4 s
    clock[0] += 2.5
    assert idle.holding(start, ends) == []
    assert held([]) == ends
    assert Idleness({}).holding(start, ends) == ["1"]  # without idleness: silent for ever


@pytest.mark.slow
def test_partition_racing_ahead_is_held_back_and_nothing_is_late(spark, tmp_path):
    n = 6_000
    # Partition 0: n events over 20 minutes. Partition 1: n events over 2 minutes.
    fast = [_payment(i, f"A{i % 7}", T0 + i * 20 * 60_000 // n) for i in range(n)]
    slow = [_payment(n + i, f"B{i % 7}", T0 + i * 2 * 60_000 // n) for i in range(n)]
    log = EventLog(tmp_path / "log")
    log.create_topic("upi-payments", 2)
    with log.writer("upi-payments") as w:
        w.append([Record(v, None, partition=0) for v in fast])
        w.append([Record(v, None, partition=1) for v in slow])

    jf = load_job_file(
        EXAMPLES / "upi_per_minute.py",
        {
            "source.log_dir": str(tmp_path / "log"),
            "sink.database": str(tmp_path / "upi.duckdb"),
            "checkpoint.dir": str(tmp_path / "ck"),
            "source.max_records_per_batch": "2000",
            "parallelism": "2",
        },
    )
    out = io.StringIO()
    runner = JobRunner(jf, available_now=True, out=out)
    assert runner.run() == 0, out.getvalue()
    assert runner.runs[0].records.late == 0, out.getvalue()

    con = duckdb.connect(str(tmp_path / "upi.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT merchant_id, window_start, payments, amount_paise FROM upi_counts"
    ).fetchall()
    con.close()
    assert {(m, w): (p, a) for m, w, p, a in rows} == oracle(fast + slow)
