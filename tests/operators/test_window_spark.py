"""The full window model on Spark: early firing, allowed lateness and the late side output."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

import pytest

from stateful_runtime.checkpoints import savepoints
from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines
from tests.operators.helpers import run, table

pytestmark = pytest.mark.slow

M = 60_000
H = 60 * M
T0 = 1_767_225_600_000


def ride(i: int, zone: int, ts: int, amount: float) -> bytes:
    return json.dumps(
        {"ride_id": f"r{i}", "PULocationID": zone, "total_amount": amount, "pickup_ms": ts}
    ).encode()


def test_taxi_zone_hourly_with_late_updates_and_late_side_output(spark, tmp_path):
    """The window operator's open windows, early firings and allowed lateness through a
    savepoint restored at another parallelism: late updates of a closed hour (within its
    lateness) refire it from the restored state; later ones go to the side output."""
    log = tmp_path / "log"
    EventLog(log).create_topic("taxi-rides", 1)
    rng = random.Random(4)
    on_time = []
    for i in range(3_000):  # 0 .. 3h05m of event time, disorder inside the 5 s bound
        ts = T0 + int(i * (3 * H + 5 * M) / 3_000) - rng.randint(0, 4_000)
        on_time.append((ts, rng.randint(1, 5), round(rng.uniform(5, 60), 2)))
    append_lines(
        log, [ride(i, z, ts, a) for i, (ts, z, a) in enumerate(on_time)], topic="taxi-rides"
    )
    db = tmp_path / "t.duckdb"
    roots = tmp_path / "savepoints"
    settings = {
        "sink.database": db,
        "early_every": 50,
        "source.max_records_per_batch": 400,
        "savepoint.dir": roots,
    }
    run("taxi_zone_hourly.py", tmp_path, **settings)
    sp = savepoints.create(tmp_path / "ck" / "taxi_zone_hourly.py", roots)
    # The watermark now stands at ~3h04m55s: hour 2 closed < 10 min ago, hour 1 long ago.
    within = [(T0 + 2 * H + rng.randint(0, H - 1), rng.randint(1, 5), 7.0) for _ in range(30)]
    too_late = [(T0 + H + rng.randint(0, H - 1), rng.randint(1, 5), 9.0) for _ in range(20)]
    late = within + too_late
    rng.shuffle(late)
    append_lines(
        log, [ride(10_000 + i, z, ts, a) for i, (ts, z, a) in enumerate(late)], topic="taxi-rides"
    )
    rescaled = {**settings, "parallelism": 3, "checkpoint.dir": tmp_path / "ck3"}
    out = run("taxi_zone_hourly.py", tmp_path, late=len(too_late), from_savepoint=sp.id, **rescaled)
    assert "from 2 to 3 partitions" in out, out

    expected: dict = defaultdict(lambda: [0, 0.0])
    for ts, zone, amount in on_time + within:
        acc = expected[(zone, (ts - T0) // H)]
        acc[0] += 1
        acc[1] += amount
    rows = table(
        db, "SELECT PULocationID, epoch_ms(window_start), num_trips, revenue FROM zone_hourly"
    )
    got = {(z, (w - T0) // H): [n, r] for z, w, n, r in rows}
    # Hour 3 is still open (the last rows are early firings, refreshed every 50 rides).
    closed = {k: v for k, v in expected.items() if k[1] < 3}
    assert {k: (v[0], round(v[1], 2)) for k, v in got.items() if k[1] < 3} == {
        k: (v[0], round(v[1], 2)) for k, v in closed.items()
    }
    assert all(got[k][0] <= expected[k][0] for k in got if k[1] == 3)  # partial, never more

    reader = EventLog(log).reader("taxi-rides-late")
    side = sorted(
        json.loads(r.value)["pickup_ms"] for r in reader.read(0, 0, reader.end_offsets()[0])
    )
    assert side == sorted(ts for ts, _, _ in too_late)


NATIVE_WINDOWS_JOB = """
from datetime import timedelta

from stateful_runtime import (Count, EventTimeSessionWindows, LogSink, LogSource, Max,
                              SlidingEventTimeWindows, StreamJob, Sum, WatermarkStrategy)

DEFAULTS = {"source.log_dir": "log", "source.topic": "clicks", "sink.log_dir": "out",
            "checkpoint.dir": "ck", "source.max_records_per_batch": 250, "parallelism": 2}
CLICK = {"user": str, "n": int, "ts_ms": int}


def build(config):
    job = StreamJob.from_config("native-windows", config)
    clicks = job.from_source(
        LogSource.from_config(config, CLICK),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2))
        .with_timestamp_field("ts_ms"), name="clicks")
    (clicks.key_by("user").window(EventTimeSessionWindows.with_gap(timedelta(seconds=10)))
     .aggregate({"clicks": Count(), "total": Sum("n")}, name="sessions")
     .sink_to(LogSink(config["sink.log_dir"], "sessions"), name="sessions-out"))
    (clicks.key_by("user")
     .window(SlidingEventTimeWindows.of(timedelta(seconds=30), timedelta(seconds=10)))
     .aggregate({"clicks": Count(), "top": Max("n")}, name="sliding")
     .sink_to(LogSink(config["sink.log_dir"], "sliding"), name="sliding-out"))
    return job
"""


def _windows_out(log, topic: str) -> set[tuple]:
    reader = EventLog(log).reader(topic)
    rows = [
        json.loads(r.value)
        for p, end in reader.end_offsets().items()
        for r in reader.read(p, 0, end)
    ]
    assert len(rows) == len({(r["user"], r["window_start"]) for r in rows}), "emitted twice"
    return {tuple(r.values()) for r in rows}


def test_sliding_and_session_windows_with_builtin_aggregates_run_native(spark, tmp_path):
    """Sessions and sliding windows with built-in aggregates compile to Spark's own
    session_window / window (the native path) and give Flink's results: every closed window
    once, records behind the watermark counted as late and in no result."""
    from datetime import UTC, datetime

    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.loader import load_job_file

    job_file = tmp_path / "native_windows.py"
    job_file.write_text(NATIVE_WINDOWS_JOB)
    log, out = tmp_path / "log", tmp_path / "out"
    EventLog(log).create_topic("clicks", 1)
    config = {"source.log_dir": log, "sink.log_dir": out, "checkpoint.dir": tmp_path / "ck"}
    job = load_job_file(job_file, {k: str(v) for k, v in config.items()}).job
    assert [q.path for q in plan(job).queries] == ["native", "native"]

    rng = random.Random(7)
    events = []  # bursts per user with pauses of 0-25 s: some sessions merge across bursts
    for u in range(5):
        t = T0 + rng.randint(0, 20_000)
        for _ in range(12):
            for _ in range(rng.randint(1, 8)):
                t += rng.randint(100, 4_000)
                events.append((f"u{u}", rng.randint(1, 99), t))
            t += rng.randint(0, 25_000)
    events.sort(key=lambda e: e[2])
    # Disorder within the 2 s bound: nothing is late.
    shuffled = sorted(events, key=lambda e: e[2] + rng.randint(0, 1_900))
    clock = max(e[2] for e in events) + 120_000  # moves the watermark past every window
    lines = [json.dumps({"user": u, "n": n, "ts_ms": ts}).encode() for u, n, ts in shuffled]
    append_lines(
        log,
        lines + [json.dumps({"user": "clock", "n": 0, "ts_ms": clock}).encode()],
        topic="clicks",
    )
    run(str(job_file), tmp_path, **config)

    def closed(clicks: list[tuple], watermark: int) -> tuple[set, set]:
        """Flink's sessions and sliding windows of ``clicks`` that end by ``watermark``; a
        click ``(user, n, ts, behind)`` came when the watermark stood at ``behind`` and is
        dropped from each of its windows (its own session, for sessions) that had ended."""
        by_user: dict = defaultdict(list)
        sliding = defaultdict(list)
        for u, n, ts, *behind in clicks:
            ended = behind[0] if behind else -1
            if ts + 10_000 > ended:
                by_user[u].append((ts, n))
            for k in range(3):
                if ts - ts % 10_000 - k * 10_000 + 30_000 > ended:
                    sliding[(u, ts - ts % 10_000 - k * 10_000)].append(n)
        sessions = set()
        for u, rows in by_user.items():
            rows.sort()
            start, last, ns = rows[0][0], rows[0][0], []
            for ts, n in rows:
                if ts - last >= 10_000:
                    sessions.add((u, start, last + 10_000, len(ns), sum(ns)))
                    start, ns = ts, []
                last = ts
                ns.append(n)
            sessions.add((u, start, last + 10_000, len(ns), sum(ns)))
        windows = {(u, s, s + 30_000, len(ns), max(ns)) for (u, s), ns in sliding.items()}
        return (
            {(u, ntz(s), ntz(e), *rest) for u, s, e, *rest in sessions if e <= watermark},
            {(u, ntz(s), ntz(e), *rest) for u, s, e, *rest in windows if e <= watermark},
        )

    def ntz(ms: int) -> str:
        return datetime.fromtimestamp(ms / 1000, UTC).replace(tzinfo=None).isoformat(" ")

    def click(u: str, n: int, ts: int) -> bytes:
        return json.dumps({"user": u, "n": n, "ts_ms": ts}).encode()

    first = [*events, ("clock", 0, clock)]
    sessions, sliding = closed(first, clock - 2_000)
    assert _windows_out(out, "sessions") == sessions
    assert _windows_out(out, "sliding") == sliding

    # Behind the watermark (clock - 2 s), three kinds of record. Late for both queries (every
    # window of theirs ended): counted late twice, in no result. Late for sessions only (their
    # own session ended; their last sliding window is open). Counted late by neither (their
    # session and last sliding window are open; an earlier sliding window of theirs has ended,
    # and they are left out of that one, as Flink does).
    wm = clock - 2_000
    too_late = [("u1", 1_000, T0 + i) for i in range(7)]
    half_late = [("u2", 500 + i, wm - 15_000 + i * 100) for i in range(3)]
    edge = [("u3", 700 + i, wm - 5_000 + i * 100) for i in range(2)]
    append_lines(log, [click(*c) for c in too_late + half_late + edge], topic="clicks")
    run(str(job_file), tmp_path, late=2 * len(too_late) + len(half_late), **config)
    assert _windows_out(out, "sessions") == sessions
    assert _windows_out(out, "sliding") == sliding

    # The watermark moves on: the windows that took the records behind it close, with them.
    clock2 = clock + 120_000
    append_lines(log, [click("clock", 0, clock2)], topic="clicks")
    run(str(job_file), tmp_path, **config)
    late_ones = [(u, n, ts, wm) for u, n, ts in too_late + half_late + edge]
    sessions, sliding = closed([*first, *late_ones, ("clock", 0, clock2)], clock2 - 2_000)
    assert _windows_out(out, "sessions") == sessions
    assert _windows_out(out, "sliding") == sliding


def test_a_window_that_raises_when_it_fires_is_dead_lettered_whole_once(spark, tmp_path):
    """On Spark: a window whose function raises when it fires goes to the
    dead-letter topic as one record (key, bounds, its elements) with the step and the
    exception; every other closed window is emitted; each record is in exactly one of them;
    a second run emits and dead-letters nothing again (the window's state was cleared)."""
    import io

    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import JobRunner

    log = tmp_path / "log"
    EventLog(log).create_topic("payments", 2)
    rng = random.Random(9)
    records = []
    for i in range(200):
        amount = 13 if i % 37 == 3 else rng.randint(20, 90)
        ts = T0 + i * 500
        records.append(
            {"txn_id": f"t{i}", "merchant_id": f"M{i % 3}", "amount": amount, "ts_ms": ts}
        )
    closer = {"txn_id": "last", "merchant_id": "M9", "amount": 1, "ts_ms": T0 + 10 * M}
    append_lines(log, [json.dumps(r).encode() for r in [*records, closer]], topic="payments")

    def go() -> None:
        jf = load_job_file(
            Path(__file__).with_name("window_failure_job.py"),
            {
                "source.log_dir": str(log),
                "checkpoint.dir": str(tmp_path / "ck"),
            },
        )
        out = io.StringIO()
        assert JobRunner(jf, available_now=True, out=out).run() == 0, out.getvalue()

    def topic(name: str) -> list:
        reader = EventLog(log).reader(name)
        try:
            return [r for p, e in reader.end_offsets().items() for r in reader.read(p, 0, e)]
        finally:
            reader.close()

    go()
    windows = [json.loads(r.value) for r in topic("windows")]
    letters = topic("payments-dlq")
    emitted = [t for w in windows for t in w["txn_ids"].split()]
    lettered = [e["txn_id"] for r in letters for e in json.loads(r.value)["elements"]]
    assert sorted(emitted + lettered) == sorted(r["txn_id"] for r in records)
    bad = {r["txn_id"] for r in records if r["amount"] == 13}
    assert bad and bad <= set(lettered) and not bad & set(emitted)
    for r in letters:
        letter = json.loads(r.value)
        assert r.headers["step"] == "list-window"
        assert "on_timer: the window function raised ValueError: unlucky" in r.headers["error"]
        assert letter["key"].startswith("M") and letter["window_start"] < letter["window_end"]
    go()  # nothing fires twice, nothing dead-lettered twice
    assert len(topic("windows")) == len(windows) and len(topic("payments-dlq")) == len(letters)


IN_PLACE_JOB = """
from datetime import timedelta

from stateful_runtime import (AggregateFunction, LogSink, LogSource, StreamJob,
                              TumblingEventTimeWindows, WatermarkStrategy)

DEFAULTS = {"source.log_dir": "log", "source.topic": "payments", "checkpoint.dir": "ck",
            "source.max_records_per_batch": 60, "parallelism": 2}
PAYMENT = {"txn_id": str, "merchant_id": str, "amount": int, "ts_ms": int}


class InPlaceSum(AggregateFunction):
    def create_accumulator(self):
        return {"sum": 0, "n": 0}

    def add(self, value, acc):
        acc["sum"] += value["amount"]
        acc["n"] += 1
        if value["amount"] == 13:
            raise ValueError("unlucky payment")
        return acc

    def get_result(self, acc):
        return {"total": acc["sum"], "payments": acc["n"]}

    def merge(self, a, b):
        return {"sum": a["sum"] + b["sum"], "n": a["n"] + b["n"]}


def build(config):
    job = StreamJob.from_config("in-place-sum", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1))
        .with_timestamp_field("ts_ms"), name="payments")
    (payments.key_by("merchant_id").window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
     .aggregate(InPlaceSum(), name="sums", output={"total": int, "payments": int})
     .sink_to(LogSink(config["source.log_dir"], "sums", partitions=1), name="out"))
    return job
"""


def test_an_aggregate_that_raises_after_changing_its_accumulator_keeps_no_part_of_it(
    spark, tmp_path
):
    """On the worker's store the window operator reads its windows without copies: a task in
    which the aggregate raised after changing an accumulator in place runs again with copies
    (on Spark: the redo inside the task). Every window's sum is that of its good records,
    each bad record is one dead letter, and nothing is emitted twice."""
    job_file = tmp_path / "in_place_sum.py"
    job_file.write_text(IN_PLACE_JOB)
    log = tmp_path / "log"
    EventLog(log).create_topic("payments", 2)
    records = [
        {"txn_id": f"t{i}", "merchant_id": f"M{i % 3}", "amount": 13 if i % 29 == 5 else i % 50,
         "ts_ms": T0 + i * 250}
        for i in range(400)
    ]  # fmt: skip
    closer = {"txn_id": "last", "merchant_id": "M9", "amount": 1, "ts_ms": T0 + 10 * M}
    append_lines(log, [json.dumps(r).encode() for r in [*records, closer]], topic="payments")
    bad = [r for r in records if r["amount"] == 13]
    run(str(job_file), tmp_path, **{"source.log_dir": log, "checkpoint.dir": tmp_path / "ck"})

    expected: dict = defaultdict(lambda: [0, 0])
    for r in records:
        if r["amount"] != 13:
            acc = expected[(r["merchant_id"], (r["ts_ms"] - T0) // 10_000)]
            acc[0] += r["amount"]
            acc[1] += 1
    reader = EventLog(log).reader("sums")
    rows = [json.loads(r.value) for r in reader.read(0, 0, reader.end_offsets()[0])]
    got = {}
    for row in rows:
        if row["merchant_id"] == "M9":
            continue
        start = int(datetime.fromisoformat(row["window_start"]).replace(tzinfo=UTC).timestamp())
        got[(row["merchant_id"], (start * 1000 - T0) // 10_000)] = [row["total"], row["payments"]]
    assert len(got) == len([r for r in rows if r["merchant_id"] != "M9"]), "emitted twice"
    assert got == dict(expected)
    dlq = EventLog(log).reader("payments-dlq")
    letters = [json.loads(r.value) for p, e in dlq.end_offsets().items() for r in dlq.read(p, 0, e)]
    assert sorted(d["txn_id"] for d in letters) == sorted(r["txn_id"] for r in bad)
