"""map and flat_map on Spark: a map ahead of a native window keeps every record's event time and
the watermark (windows close, records behind the watermark are counted late as without the
map); a flat_map feeds a stateless sink."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines
from tests.operators.helpers import run

pytestmark = pytest.mark.slow

T0 = 1_767_225_600_000

MAPS_JOB = """
from datetime import timedelta

from stateful_runtime import (Count, LogSink, LogSource, StreamJob, Sum,
                              TumblingEventTimeWindows, WatermarkStrategy)

DEFAULTS = {"source.log_dir": "log", "source.topic": "clicks", "sink.log_dir": "out",
            "checkpoint.dir": "ck", "source.max_records_per_batch": 300, "parallelism": 2}
CLICK = {"user": str, "n": int, "ts_ms": int}


def scale(click):
    return {"who": click["user"].upper(), "points": click["n"] * 10}


def build(config):
    job = StreamJob.from_config("maps", config)
    clicks = job.from_source(
        LogSource.from_config(config, CLICK),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=2))
        .with_timestamp_field("ts_ms"), name="clicks")
    (clicks.map(scale, output={"who": str, "points": int})
     .key_by("who").window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
     .aggregate({"clicks": Count(), "points": Sum("points")}, name="per-user")
     .sink_to(LogSink(config["sink.log_dir"], "per-user"), name="per-user-out"))
    (clicks.flat_map(lambda c: ({"user": c["user"], "i": i} for i in range(c["n"] % 3)),
                     output={"user": str, "i": int}, name="explode")
     .filter("i >= 0")
     .sink_to(LogSink(config["sink.log_dir"], "exploded"), name="exploded-out"))
    return job
"""


def _rows(log, topic: str) -> list[dict]:
    reader = EventLog(log).reader(topic)
    return [
        json.loads(r.value)
        for p, end in reader.end_offsets().items()
        for r in reader.read(p, 0, end)
    ]


def test_map_keeps_event_time_and_watermark_and_flat_map_feeds_a_sink(spark, tmp_path):
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.explain import explain
    from stateful_runtime.runtime.loader import load_job_file

    job_file = tmp_path / "maps.py"
    job_file.write_text(MAPS_JOB)
    log, out = tmp_path / "log", tmp_path / "out"
    EventLog(log).create_topic("clicks", 2)
    config = {"source.log_dir": log, "sink.log_dir": out, "checkpoint.dir": tmp_path / "ck"}
    job = load_job_file(job_file, {k: str(v) for k, v in config.items()}).job
    p = plan(job)
    assert [q.path for q in p.queries] == ["native", "stateless"]
    assert "map scale: scale in Python over whole Arrow batches" in explain(p)

    rng = random.Random(11)
    clicks = sorted(
        ((f"u{rng.randint(0, 4)}", rng.randint(0, 9), T0 + i * 37) for i in range(1_500)),
        key=lambda c: c[2] + rng.randint(0, 1_900),
    )
    clock = T0 + 1_500 * 37 + 60_000  # moves the watermark past every window
    lines = [json.dumps({"user": u, "n": n, "ts_ms": ts}).encode() for u, n, ts in clicks]
    append_lines(
        log,
        lines + [json.dumps({"user": "clock", "n": 1, "ts_ms": clock}).encode()],
        topic="clicks",
    )
    run(str(job_file), tmp_path, **config)

    def windows(cs) -> set[tuple]:
        acc: Counter = Counter()
        pts: Counter = Counter()
        for u, n, ts in cs:
            key = (u.upper(), (ts - T0) // 10_000)
            acc[key] += 1
            pts[key] += n * 10
        return {(u, w, acc[(u, w)], pts[(u, w)]) for u, w in acc}

    def got() -> set[tuple]:
        rows = _rows(out, "per-user")
        assert len(rows) == len({(r["who"], r["window_start"]) for r in rows}), "emitted twice"
        from datetime import UTC, datetime

        start = datetime.fromtimestamp(T0 / 1000, UTC).replace(tzinfo=None)
        return {
            (
                r["who"],
                int((datetime.fromisoformat(r["window_start"]) - start).total_seconds()) // 10,
                r["clicks"],
                r["points"],
            )
            for r in rows
        }

    assert got() == windows(clicks)  # every closed window, from the mapped records
    assert Counter((r["user"], r["i"]) for r in _rows(out, "exploded")) == Counter(
        (u, i) for u, n, _ in [*clicks, ("clock", 1, clock)] for i in range(n % 3)
    )

    # Records far behind the watermark: late for the window after the map, counted one by one
    # (the late bound is carried through the map); the flat_map takes them like any record.
    late = [("u1", 3, T0 + i) for i in range(6)]
    append_lines(
        log,
        [json.dumps({"user": u, "n": n, "ts_ms": ts}).encode() for u, n, ts in late],
        topic="clicks",
    )
    run(str(job_file), tmp_path, late=len(late), **config)
    assert got() == windows(clicks)
    assert sum(1 for r in _rows(out, "exploded") if r["user"] == "u1") == sum(
        n % 3 for u, n, _ in [*clicks, *late] if u == "u1"
    )
