"""Implausible event times (issue 23): one record from the year 2100 must not move the watermark
(before the fix it moved it to 2099 and every later record was dropped as late, after restarts
too), one before 1970 is refused, and a checkpoint poisoned before the fix is brought back by
`srt checkpoint rewind` without losing its state. Through the real CLI on the embedded event log;
the oracles are the generator's own counts and `srt reconcile`."""

from __future__ import annotations

import json
from datetime import UTC
from pathlib import Path

import pytest
from upi_events import events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.eventlog import EventLog
from tests.faults.harness import TrialLog
from tests.helpers import EXAMPLES, UpiWorkspace, append_lines, srt

pytestmark = [pytest.mark.slow, pytest.mark.faults]

FUTURE_MS = 4_102_444_800_000  # 2100-01-01T00:00:00Z
FUTURE = b'{"txn_id":"future","merchant_id":"M001","amount_paise":100,"ts_ms":%d}' % FUTURE_MS
NEGATIVE = b'{"txn_id":"negative","merchant_id":"M001","amount_paise":100,"ts_ms":-1000}'
# A dead letter of another kind later in the same partition (the key): before the rewind the
# dead-letter topic's mark for the partition lies past the year-2100 record.
BAD = b'{"txn_id":"bad","merchant_id":"M001","amount_paise":"ten","ts_ms":1767225600000}'
DELAY_MS = 5_000  # the UPI job's bounded out-of-orderness
POLICY_OFF = [
    *("--set", "event_time.floor=off", "--set", "event_time.max_ahead_s=off"),
    *("--set", "event_time.max_ahead_of_stream_s=off"),
]


@pytest.fixture(scope="module")
def trials_log():
    log = TrialLog.open("event-time")
    yield log
    log.close()


def _corpus() -> tuple[list[bytes], list[bytes]]:
    """(good lines, every line): 20,000 payments over ~7 minutes of event time, the two
    implausible records a third of the way in."""
    good = list(events(20_000, merchants=10, rate_per_s=50, disorder_ms=4_000, seed=23))
    return good, good[:6_000] + [FUTURE, NEGATIVE] + good[6_000:9_000] + [BAD] + good[9_000:]


def _workspace(tmp_path: Path, partitions: int = 4) -> UpiWorkspace:
    ws = UpiWorkspace(tmp_path, partitions, extra={"source.max_records_per_batch": "2000"})
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    return ws


def _records(srt_env: dict[str, str]) -> dict:
    status = json.loads(srt(["status", "upi-per-minute", "--json"], srt_env).stdout)[0]
    return status["health"]["upi-counts"]["records"]


def _dead_letters(ws: UpiWorkspace) -> dict[bytes, str]:
    """Value → reason of every dead letter; each value exactly once (asserted)."""
    reader = EventLog(ws.log_dir).reader("upi-payments-dlq")
    found = [r for p, end in reader.end_offsets().items() for r in reader.read(p, 0, end)]
    assert len({r.value for r in found}) == len(found), "a dead letter published twice"
    return {r.value: r.headers["error"] for r in found}


def _watermarks(ws: UpiWorkspace) -> list[int]:
    query = QueryLayout(ws.checkpoint_dir / "upi-counts")
    return [int(query.watermark_ms(b) or 0) for b in query.planned_batches()]


def _good_max(good: list[bytes]) -> int:
    return max(json.loads(line)["ts_ms"] for line in good)


def _drain_and_record(
    ws: UpiWorkspace,
    srt_env: dict[str, str],
    trials_log: TrialLog,
    good: list[bytes],
    refused: list[bytes],
    **trial: str,
) -> tuple[dict[bytes, str], dict, int]:
    """Run the job to the end of its log and record the trial: passed when exactly
    ``refused`` are dead letters, nothing is late, no watermark passed the good records' and
    the table is the oracle's. (dead letters by value, the run's record counts, the highest
    watermark logged.)"""
    result = srt(ws.run_args("--available-now"), srt_env)
    assert result.returncode == 0, result.stderr[-3000:]
    dead = _dead_letters(ws)
    records = _records(srt_env)
    top = max(_watermarks(ws))
    held = (
        sorted(dead) == sorted(refused)
        and top <= _good_max(good) - DELAY_MS
        and records["late"] == 0
        and ws.table() == oracle(good)
    )
    trials_log.record(
        **trial,
        result="pass" if held else "FAIL",
        watermark_max=top,
        records=records,
        reasons=sorted(dead.values()),
    )
    return dead, records, top


def _reconciled(table: dict, srt_env: dict[str, str]) -> tuple[dict[int, int], dict[int, int]]:
    """(payments per closed window in the table, per window as `srt reconcile` counts the
    log by the batches' own bounds)."""
    reconciled = json.loads(
        srt(
            ["reconcile", "upi-per-minute", "--query", "upi-counts", "--window", "1m", "--json"],
            srt_env,
        ).stdout
    )
    closed = {int(w): n for w, n in reconciled["windows"].items()}
    in_table: dict[int, int] = {}
    for (_, start), (payments, _) in table.items():
        ms = int(start.replace(tzinfo=UTC).timestamp() * 1000)  # DuckDB's naive UTC
        if ms + 60_000 <= reconciled["watermark_ms"]:
            in_table[ms] = in_table.get(ms, 0) + payments
    return in_table, closed


def test_implausible_event_times_are_dead_letters_and_never_move_the_watermark(
    tmp_path, srt_env, trials_log
):
    ws = _workspace(tmp_path)
    good, lines = _corpus()
    append_lines(ws.log_dir, lines)
    dead, records, top = _drain_and_record(
        ws,
        srt_env,
        trials_log,
        good,
        [FUTURE, NEGATIVE, BAD],
        fault="implausible event time",
        input="a year-2100 and a pre-1970 record among 20,000 payments",
    )
    assert sorted(dead) == sorted([FUTURE, NEGATIVE, BAD])
    assert dead[FUTURE].startswith("event time 'ts_ms' 2100-01-01T00:00:00Z (4102444800000 ms) is")
    assert "years ahead of the batch's processing time" in dead[FUTURE]
    assert dead[FUTURE].endswith("; max_ahead_of_processing_time 1:00:00")
    assert dead[NEGATIVE] == (
        "event time 'ts_ms' 1969-12-31T23:59:59Z (-1000 ms) is before the floor "
        "1970-01-01T00:00:00Z"
    )
    assert top <= _good_max(good) - DELAY_MS  # no logged watermark beyond the good records'
    assert records == {
        **records,
        "input": len(lines),
        "dead_letters": 3,
        "late": 0,
        "output": len(good),
    }
    assert ws.table() == oracle(good)
    explained = srt(["explain", str(EXAMPLES / "upi_per_minute.py"), "--no-spark"], srt_env)
    assert (
        "event-time policy: event times accepted from 1970-01-01T00:00:00Z, at most 1:00:00 "
        "ahead of the batch's processing time, (off) ahead of the watermark and 1:00:00 ahead "
        "of the watermark and the stream at once"
    ) in explained.stdout


def test_a_replay_refuses_an_outlier_and_keeps_a_stream_that_resumed_after_days(
    tmp_path, srt_env, trials_log
):
    """Last year's payments replayed (the batch's processing time says nothing): one record
    stamped 60 days after its neighbours (still before today) is a dead letter saying why, and
    a stream that resumed after 3 silent days is not refused. Before the stream bound, the
    record moved the watermark 60 days and every payment after it was late."""
    ws = _workspace(tmp_path)
    day = 86_400_000
    first = list(events(24_000, merchants=10, rate_per_s=20, disorder_ms=4_000, seed=41))
    resumed_at = _good_max(first) + 3 * day
    resumed = list(
        events(4_000, merchants=10, rate_per_s=20, disorder_ms=4_000, seed=42, start_ms=resumed_at)
    )
    ts = json.loads(first[12_000])["ts_ms"] + 60 * day
    outlier = b'{"txn_id":"outlier","merchant_id":"M003","amount_paise":100,"ts_ms":%d}' % ts
    good = first + resumed
    append_lines(ws.log_dir, first[:12_000] + [outlier] + first[12_000:] + resumed)
    dead, records, top = _drain_and_record(
        ws,
        srt_env,
        trials_log,
        good,
        [outlier],
        fault="an outlier in a replay of history",
        input="28,000 payments of last year, one 60 days ahead, a resumption after 3 days",
    )
    assert list(dead) == [outlier]
    assert (
        "is an outlier: 60.0 days ahead of the records after it in its partition" in dead[outlier]
    )
    assert dead[outlier].endswith("; max_ahead_of_stream 1:00:00")
    assert records == {**records, "dead_letters": 1, "late": 0, "output": len(good)}
    assert top <= _good_max(good) - DELAY_MS
    assert ws.table() == oracle(good)
    in_table, closed = _reconciled(ws.table(), srt_env)  # the outlier is no window's
    assert in_table == closed and len(closed) == 25  # 20 minutes, and 3 after 3 days
    # Each partition's newest event time is kept with the batch (the outlier's not).
    query = QueryLayout(ws.checkpoint_dir / "upi-counts")
    kept = query.input_watermarks_upto(query.last_committed() or 0)
    assert kept is not None
    [(_, parts)] = json.loads(kept.read_text())["partitions"].items()
    reader = EventLog(ws.log_dir).reader("upi-payments")
    newest = {
        p: max(json.loads(r.value)["ts_ms"] for r in reader.read(p, 0, end) if r.value != outlier)
        for p, end in reader.end_offsets().items()
    }
    assert {int(k): v[0] for k, v in parts.items()} == newest


def test_rewind_brings_back_a_poisoned_checkpoint_with_its_state(tmp_path, srt_env, trials_log):
    # One partition: with several, the others' watermarks hold the poisoned one's back.
    ws = _workspace(tmp_path, partitions=1)
    good, lines = _corpus()
    append_lines(ws.log_dir, lines)
    # Before the fix (every bound off): the year-2100 record poisons the watermark.
    poisoned = srt(ws.run_args("--available-now", *POLICY_OFF), srt_env)
    assert poisoned.returncode == 0, poisoned.stderr[-3000:]
    dropped = _records(srt_env)["late"]
    assert dropped > 1_000 and max(_watermarks(ws)) > FUTURE_MS - 10_000
    assert list(_dead_letters(ws)) == [BAD]

    job = [str(EXAMPLES / "upi_per_minute.py"), *ws.sets()]
    dry = srt(["checkpoint", "rewind", *job, "--dry-run", "--json"], srt_env)
    assert dry.returncode == 0, dry.stderr[-3000:]
    [plan] = json.loads(dry.stdout)["queries"]
    assert plan["query"] == "upi-counts" and json.loads(dry.stdout)["quarantine"] is None
    query = QueryLayout(ws.checkpoint_dir / "upi-counts")
    watermarks = _watermarks(ws)
    # The batch it re-runs is the one that read the record: the next batch's watermark jumped.
    assert (
        watermarks[plan["rerun_batch"]] < FUTURE_MS - 10_000 < watermarks[plan["rerun_batch"] + 1]
    )
    assert (
        f"batch {plan['rerun_batch'] + 1}'s watermark is poisoned" in plan["why"]
        and "max_ahead_of_processing_time" in (plan["why"])
    )
    files = sorted(str(p) for p in query.root.rglob("*"))
    rewound = srt(["checkpoint", "rewind", *job], srt_env)
    assert rewound.returncode == 0, rewound.stderr[-3000:]
    assert f"re-runs batch {plan['rerun_batch']}" in rewound.stdout
    assert files != sorted(str(p) for p in query.root.rglob("*"))
    # Nothing deleted: every file moved is in the quarantine.
    [quarantine] = (ws.checkpoint_dir / "_quarantine").iterdir()
    moved = json.loads((quarantine / "quarantine.json").read_text())["queries"]["upi-counts"]
    assert all((quarantine / "upi-counts" / m["path"]).exists() for m in moved["moved"])
    assert query.last_committed() == plan["restart_after"]

    again = srt(ws.run_args("--available-now"), srt_env)
    assert again.returncode == 0, again.stderr[-3000:]
    records = _records(srt_env)
    dead = _dead_letters(ws)
    table = ws.table()
    stale = {k: v for k, v in table.items() if k[1].year >= 2100}
    in_table, closed = _reconciled(table, srt_env)
    held = (
        records["late"] == 0
        and sorted(dead) == sorted([FUTURE, NEGATIVE, BAD])
        and {k: v for k, v in table.items() if k not in stale} == oracle(good)
        and in_table == closed
        and max(_watermarks(ws)) <= _good_max(good) - DELAY_MS
    )
    trials_log.record(
        fault="poisoned watermark in the checkpoint",
        input=f"checkpoint made with the policy off ({dropped:,} records dropped as late)",
        result="pass" if held else "FAIL",
        rerun_batch=plan["rerun_batch"],
        records=records,
    )
    # The replay starts from the state of the batch before the poisoned one: it reads only the
    # records from there on, and none of them is late any more.
    assert records["late"] == 0 and records["input"] < len(lines)
    # Each dead letter once: the replay's new ones although the topic's mark for their
    # partition lay past them (the bad record's), the bad record not twice.
    assert sorted(dead) == sorted([FUTURE, NEGATIVE, BAD])
    assert "ahead of the batch's processing time" in dead[FUTURE]
    assert max(_watermarks(ws)) <= _good_max(good) - DELAY_MS
    # Every window counts what the generator wrote, and the closed ones what `srt reconcile`
    # counts from the source; the year-2100 row the poisoned run wrote stays (documented).
    assert {k: v for k, v in table.items() if k not in stale} == oracle(good)
    assert in_table == closed and sum(closed.values()) > 15_000
    assert list(stale.values()) == [(1, 100)]
