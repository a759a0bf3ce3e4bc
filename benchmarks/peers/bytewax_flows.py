"""bytewax 0.21 peer: one workload as a bytewax dataflow.

Runs in the harness's bytewax venv (``benchmarks/.venvs/bytewax``), never with the project's
packages, as two processes of one worker each (``python -m bytewax.testing ... -p 2``), with
recovery snapshots every 2 s when the harness passes ``-r``/``-s``:

    BENCH_SPEC=/abs/spec.json python -m bytewax.testing bytewax_flows:get_flow -p 2

The spec (JSON) names the workload, the input files (one source partition per file, JSON
lines, decoded in the source; the harness gives one file, see systems.Bytewax), the output
directory (one JSON-lines file per worker) and a directory for timing marks: each source
partition writes when it read its first and last batch, each sink partition when it wrote
its first and last batch (``time.time()``).

Event time: ``EventClock`` with a fixed "system" clock, so the watermark is exactly the largest
event time seen minus 5 s (bytewax otherwise advances it with wall time too), and windows close
on later items or at the end of the input.
"""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import bytewax.operators as op
import bytewax.operators.windowing as win
from bytewax.dataflow import Dataflow
from bytewax.inputs import FixedPartitionedSource, StatefulSourcePartition
from bytewax.operators import StatefulLogic
from bytewax.outputs import DynamicSink, StatelessSinkPartition

BATCH = 2048
ALIGN = datetime(2025, 1, 1, tzinfo=UTC)  # a whole minute: windows align to the epoch's grid
ALIGN_MS = int(ALIGN.timestamp() * 1000)
FIXED_NOW = datetime(2000, 1, 1, tzinfo=UTC)
FRAUD_THRESHOLD = 1_000  # as harness/workloads.py: no alert trips (see oracle_fraud there)


def _mark(marks: str, name: str, data: dict) -> None:
    Path(marks).mkdir(parents=True, exist_ok=True)
    with open(os.path.join(marks, f"{name}-{os.getpid()}.json"), "w") as f:
        json.dump(data, f)


class _FilePartition(StatefulSourcePartition[dict, int]):
    def __init__(self, path: str, resume: int | None, marks: str) -> None:
        self.f = open(path, "rb")
        self.f.seek(resume or 0)
        self.path, self.marks = path, marks
        self.first: float | None = None
        self.rows = 0

    def next_batch(self) -> list[dict]:
        lines = self.f.readlines(BATCH * 140)
        if not lines:
            _mark(
                self.marks,
                f"source-{Path(self.path).stem}",
                {"first": self.first, "last": time.time(), "rows": self.rows},
            )
            raise StopIteration()
        if self.first is None:
            self.first = time.time()
        self.rows += len(lines)
        return [json.loads(x) for x in lines]

    def snapshot(self) -> int:
        return self.f.tell()

    def close(self) -> None:
        self.f.close()


class JsonLinesSource(FixedPartitionedSource[dict, int]):
    def __init__(self, paths: list[str], marks: str) -> None:
        self.paths, self.marks = paths, marks

    def list_parts(self) -> list[str]:
        return self.paths

    def build_part(self, step_id: str, for_part: str, resume_state: int | None) -> _FilePartition:
        return _FilePartition(for_part, resume_state, self.marks)


class _JsonLinesWriter(StatelessSinkPartition[dict]):
    def __init__(self, path: str, marks: str, name: str) -> None:
        self.f = open(path, "w")
        self.marks, self.name = marks, name
        self.first: float | None = None
        self.rows = 0

    def write_batch(self, items: list[Any]) -> None:
        if self.first is None:
            self.first = time.time()
        self.rows += len(items)
        self.f.write("".join(json.dumps(x) + "\n" for x in items))

    def close(self) -> None:
        self.f.close()
        _mark(self.marks, self.name, {"first": self.first, "last": time.time(), "rows": self.rows})


class JsonLinesSink(DynamicSink[dict]):
    def __init__(self, out_dir: str, marks: str) -> None:
        self.out_dir, self.marks = out_dir, marks

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _JsonLinesWriter:
        Path(self.out_dir).mkdir(parents=True, exist_ok=True)
        return _JsonLinesWriter(
            os.path.join(self.out_dir, f"worker-{worker_index}.jsonl"),
            self.marks,
            f"sink-{worker_index}",
        )


def _ts(e: dict) -> datetime:
    return datetime.fromtimestamp(e["ts_ms"] / 1000, tz=UTC)


def clock() -> win.EventClock:
    return win.EventClock(
        _ts,
        wait_for_system_duration=timedelta(seconds=5),
        now_getter=lambda: FIXED_NOW,
        to_system_utc=lambda t: None,
    )


def upi(s):
    keyed = op.key_on("key", s, lambda e: e["merchant_id"])
    wo = win.fold_window(
        "count",
        keyed,
        clock(),
        win.TumblingWindower(timedelta(minutes=1), ALIGN),
        lambda: 0,
        lambda acc, e: acc + 1,
        lambda a, b: a + b,
    )
    return op.map(
        "fmt",
        wo.down,
        lambda kv: {
            "merchant_id": kv[0],
            "window_start": ALIGN_MS + kv[1][0] * 60_000,
            "count": kv[1][1],
        },
    )


def q1(s):
    return op.map(
        "convert",
        s,
        lambda e: {
            "auction": e["auction"],
            "bidder": e["bidder"],
            "price_eur": e["price"] * 908 // 1000,
            "ts_ms": e["ts_ms"],
        },
    )


def q2(s):
    f = op.filter("filter", s, lambda e: e["auction"] % 123 == 0)
    return op.map("fmt", f, lambda e: {"auction": e["auction"], "price": e["price"]})


def _count_into(acc: dict, e: dict) -> dict:
    acc[e["auction"]] = acc.get(e["auction"], 0) + 1
    return acc


def _merge_counts(a: dict, b: dict) -> dict:
    for k, v in b.items():
        a[k] = a.get(k, 0) + v
    return a


def _hot(kv) -> dict:
    channel, (wid, counts) = kv
    auction, n = min(counts.items(), key=lambda x: (-x[1], x[0]))
    return {
        "channel": channel,
        "window_start": ALIGN_MS + wid * 2_000,
        "auction": auction,
        "bids": n,
    }


def q5(s):
    keyed = op.key_on("key", s, lambda e: e["channel"])
    wo = win.fold_window(
        "hot",
        keyed,
        clock(),
        win.SlidingWindower(timedelta(seconds=10), timedelta(seconds=2), ALIGN),
        dict,
        _count_into,
        _merge_counts,
    )
    return op.map("fmt", wo.down, _hot)


def q7(s):
    keyed = op.key_on("key", s, lambda e: e["channel"])
    wo = win.fold_window(
        "max",
        keyed,
        clock(),
        win.TumblingWindower(timedelta(seconds=10), ALIGN),
        lambda: -1,
        lambda acc, e: max(acc, e["price"]),
        max,
    )
    return op.map(
        "fmt",
        wo.down,
        lambda kv: {
            "channel": kv[0],
            "window_start": ALIGN_MS + kv[1][0] * 10_000,
            "max_price": kv[1][1],
        },
    )


def _session_add(acc: list | None, e: dict) -> list:
    t = e["ts_ms"]
    if acc is None:
        return [t, t, 1]
    return [min(acc[0], t), max(acc[1], t), acc[2] + 1]


def _session_merge(a: list | None, b: list | None) -> list | None:
    if a is None or b is None:
        return a or b
    return [min(a[0], b[0]), max(a[1], b[1]), a[2] + b[2]]


def q11(s):
    keyed = op.key_on("key", s, lambda e: str(e["bidder"]))
    wo = win.fold_window(
        "sessions",
        keyed,
        clock(),
        win.SessionWindower(timedelta(seconds=10)),
        lambda: None,
        _session_add,
        _session_merge,
    )
    return op.map(
        "fmt",
        wo.down,
        lambda kv: {
            "bidder": int(kv[0]),
            "session_start": kv[1][1][0],
            "last_ts": kv[1][1][1],
            "bids": kv[1][1][2],
        },
    )


def _count(state: int | None, e: dict):
    n = (state or 0) + 1
    return n, ([n] if n % 100 == 0 else [])


def counter(s):
    keyed = op.key_on("key", s, lambda e: e["merchant_id"])
    counts = op.stateful_flat_map("counter", keyed, _count)
    return op.map("fmt", counts, lambda kv: {"merchant_id": kv[0], "count": kv[1]})


class _Dedup(StatefulLogic[dict, dict, float]):
    """Seen-flag per txn_id, discarded 60 s after it was set. bytewax has no event-time timers
    outside its window operators, so this TTL runs in processing time (like Flink SQL's)."""

    def __init__(self, expires: float | None) -> None:
        self.expires = expires

    def on_item(self, value: dict):
        if self.expires is not None:
            return [], StatefulLogic.RETAIN
        self.expires = time.time() + 60
        return [value], StatefulLogic.RETAIN

    def on_notify(self):
        return [], StatefulLogic.DISCARD

    def notify_at(self) -> datetime | None:
        return None if self.expires is None else datetime.fromtimestamp(self.expires, UTC)

    def snapshot(self) -> float | None:
        return self.expires


def dedup(s):
    keyed = op.key_on("key", s, lambda e: e["txn_id"])
    firsts = op.stateful("dedup", keyed, _Dedup)
    return op.map(
        "fmt",
        firsts,
        lambda kv: {
            "txn_id": kv[1]["txn_id"],
            "merchant_id": kv[1]["merchant_id"],
            "amount_paise": kv[1]["amount_paise"],
            "ts_ms": kv[1]["ts_ms"],
        },
    )


def _fraud(state: tuple | None, e: dict):
    """The seeds' FraudCounter: a count and the minute's first payment time per merchant, an
    alert past the threshold. bytewax has no event-time timers outside its window operators:
    the minute ends at the merchant's first payment at or after its end (by event time), and
    the state is kept (a processing-time expiry per key, as the dedup's, ran at a tenth of
    this speed with 200,000 keys)."""
    first, n = state if state is not None else (e["ts_ms"], 0)
    if e["ts_ms"] >= first + 60_000:
        first, n = e["ts_ms"], 0
    n += 1
    if n <= FRAUD_THRESHOLD:
        return (first, n), []
    return (first, n), [{"merchant_id": e["merchant_id"], "window_start_ms": first, "payments": n}]


def fraud(s):
    keyed = op.key_on("key", s, lambda e: e["merchant_id"])
    return op.map("fmt", op.stateful_flat_map("fraud", keyed, _fraud), lambda kv: kv[1])


FLOWS = {
    "upi": upi,
    "q1": q1,
    "q2": q2,
    "q5": q5,
    "q7": q7,
    "q11": q11,
    "counter": counter,
    "dedup": dedup,
    "fraud": fraud,
}


def get_flow() -> Dataflow:
    spec = json.loads(Path(os.environ["BENCH_SPEC"]).read_text())
    flow = Dataflow(f"bench_{spec['workload']}")
    events = op.input("in", flow, JsonLinesSource(spec["inputs"], spec["marks"]))
    op.output("out", FLOWS[spec["workload"]](events), JsonLinesSink(spec["output"], spec["marks"]))
    return flow
