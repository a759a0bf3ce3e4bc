"""The full window model on Spark: early firing, allowed lateness and the late side output."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.conftest import append_lines
from tests.e2e.test_process_functions import run, table

pytestmark = pytest.mark.slow

M = 60_000
H = 60 * M
T0 = 1_767_225_600_000


def ride(i: int, zone: int, ts: int, amount: float) -> bytes:
    return json.dumps({"ride_id": f"r{i}", "PULocationID": zone, "total_amount": amount,
                       "pickup_ms": ts}).encode()


def test_taxi_zone_hourly_with_late_updates_and_late_side_output(spark, tmp_path):
    log = tmp_path / "log"
    EventLog(log).create_topic("taxi-rides", 1)
    rng = random.Random(4)
    on_time = []
    for i in range(3_000):  # 0 .. 3h05m of event time, disorder inside the 5 s bound
        ts = T0 + int(i * (3 * H + 5 * M) / 3_000) - rng.randint(0, 4_000)
        on_time.append((ts, rng.randint(1, 5), round(rng.uniform(5, 60), 2)))
    append_lines(log, [ride(i, z, ts, a) for i, (ts, z, a) in enumerate(on_time)],
                 topic="taxi-rides")
    db = tmp_path / "t.duckdb"
    run("taxi_zone_hourly.py", tmp_path, **{"sink.database": db, "early_every": 50,
                                             "source.max_records_per_batch": 400})
    # The watermark now stands at ~3h04m55s: hour 2 closed < 10 min ago, hour 1 long ago.
    within = [(T0 + 2 * H + rng.randint(0, H - 1), rng.randint(1, 5), 7.0) for _ in range(30)]
    too_late = [(T0 + H + rng.randint(0, H - 1), rng.randint(1, 5), 9.0) for _ in range(20)]
    late = within + too_late
    rng.shuffle(late)
    append_lines(log, [ride(10_000 + i, z, ts, a) for i, (ts, z, a) in enumerate(late)],
                 topic="taxi-rides")
    run("taxi_zone_hourly.py", tmp_path, late=len(too_late),
        **{"sink.database": db, "early_every": 50, "source.max_records_per_batch": 400})

    expected: dict = defaultdict(lambda: [0, 0.0])
    for ts, zone, amount in on_time + within:
        acc = expected[(zone, (ts - T0) // H)]
        acc[0] += 1
        acc[1] += amount
    rows = table(db, "SELECT PULocationID, epoch_ms(window_start), num_trips, revenue "
                     "FROM zone_hourly")
    got = {(z, (w - T0) // H): [n, r] for z, w, n, r in rows}
    # Hour 3 is still open (the last rows are early firings, refreshed every 50 rides).
    closed = {k: v for k, v in expected.items() if k[1] < 3}
    assert {k: (v[0], round(v[1], 2)) for k, v in got.items() if k[1] < 3} == \
           {k: (v[0], round(v[1], 2)) for k, v in closed.items()}
    assert all(got[k][0] <= expected[k][0] for k in got if k[1] == 3)  # partial, never more

    reader = EventLog(log).reader("taxi-rides-late")
    side = sorted(json.loads(r.value)["pickup_ms"] for r in reader.read(0, 0,
                                                                         reader.end_offsets()[0]))
    assert side == sorted(ts for ts, _, _ in too_late)
