"""The joins' state over a long run: state rows and buffered records of the interval join and
the temporal join, sampled as the benchmark's join streams go through them, to show that the
watermark's cleanup keeps the state bounded (issue 25's "state bounded at 10M events").

Drives the runtime's join operators (``IntervalJoinOperator`` / ``TemporalJoinOperator``, what
``interval_join`` and ``temporal_join`` run) through the test harness
(``stateful_runtime.testing``, the engine a job runs: state in the worker's RocksDB), with the
workloads' functions (``examples/merchant_tiers.py``'s
``PairRefund`` and ``TierAsOf``) over the ``interval`` and ``temporal`` workloads' streams
(``harness/data.py``: ``jpay`` with ``jrefunds`` or ``jtiers``, 10 payments a second of event
time) in order of arrival, a micro-batch of records every ``--chunk`` payments, at the
watermark (max event time - 5 s) the batch before left. Every ``--sample`` payments it records
the state rows (one per state and key, as the store holds them) and the records buffered in
them.

    .venv/bin/python benchmarks/join_state.py --events 10000000 --join interval

Prints a line per sample and writes ``benchmarks/results/join_state.json``. Bounded means the
rows of the last sample are no more than the most of the first quarter's after the first
30 minutes of event time (the interval join's plateau): the figure is that ratio.
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "examples")]

from harness import data  # noqa: E402
from merchant_tiers import PairRefund, TierAsOf  # noqa: E402

from stateful_runtime.testing import interval_join_harness, temporal_join_harness  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def arrivals(join: str, n: int, seed: int):
    """(arrival ms, input 1 or 2, record) of both inputs, in order of arrival."""
    payments = (
        (data.START_MS + i * data.JOIN_STEP_MS, 1, p)
        for i, p in enumerate(data.jpay_events(n, seed))
    )
    second = data.jrefunds_arrivals if join == "interval" else data.jtiers_arrivals
    others = ((at, 2, line) for at, line in second(n, seed))
    for at, side, line in heapq.merge(payments, others, key=lambda x: x[0]):
        yield at, side, json.loads(line)


def buffered(h, join: str) -> int:
    """Records held in the join's map states (lists of records by time; versions one each)."""
    total = 0
    for name, key in h.stored_states():
        value = h.state(key, name)
        if not value:
            continue
        for entry in value.values():
            total += len(entry) if isinstance(entry, list) else 1
    return total


def run(join: str, n: int, seed: int, chunk: int, sample: int) -> dict:
    if join == "interval":
        h = interval_join_harness(
            PairRefund(), timedelta(0), timedelta(minutes=30), "txn_id", "ts_ms"
        )
    else:
        h = temporal_join_harness(TierAsOf(), "merchant_id", "ts_ms")
    samples = []
    max_ts = watermark = 0
    payments = records = outputs = 0
    batch: dict[int, list[dict]] = {1: [], 2: []}
    t0 = time.monotonic()
    for _, side, record in arrivals(join, n, seed):
        records += 1
        max_ts = max(max_ts, record["ts_ms"])
        batch[side].append(record)
        if side != 1:
            continue
        payments += 1
        if payments % chunk == 0:
            outputs += len(h.process_elements(batch[1], batch[2], watermark=watermark))
            batch = {1: [], 2: []}
            watermark = max_ts - data.OUT_OF_ORDERNESS_MS
            h.output.clear()  # the harness keeps every output; only the count matters here
        if payments % sample == 0:
            s = {
                "payments": payments,
                "records": records,
                "event_time_h": round((max_ts - data.START_MS) / 3_600_000, 2),
                "state_rows": len(h.stored_states()),
                "buffered_records": buffered(h, join),
                "outputs": outputs,
                "late": h.late_dropped,
                "elapsed_s": round(time.monotonic() - t0, 1),
            }
            samples.append(s)
            print(json.dumps(s), flush=True)
    # After the first 30 minutes of event time (the interval join's plateau), the first
    # quarter's most against the end.
    settled = [s for s in samples if s["event_time_h"] > 0.6]
    quarter = settled[: max(1, len(settled) // 4)]
    peak = max((s["state_rows"] for s in quarter), default=None)
    last = samples[-1]["state_rows"] if samples else None
    return {
        "join": join,
        "events": n,
        "records": records,
        "chunk": chunk,
        "samples": samples,
        "late": h.late_dropped,
        "first_quarter_max_rows": peak,
        "last_rows": last,
        "max_rows": max((s["state_rows"] for s in samples), default=None),
        "last_over_first_quarter": None if not peak or last is None else round(last / peak, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=10_000_000, help="payments")
    ap.add_argument("--join", choices=["interval", "temporal", "both"], default="both")
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--chunk", type=int, default=1_000, help="payments between watermarks")
    ap.add_argument("--sample", type=int, default=250_000, help="payments between samples")
    ap.add_argument("--output", type=Path, default=RESULTS / "join_state.json")
    a = ap.parse_args()
    joins = ["interval", "temporal"] if a.join == "both" else [a.join]
    out = [run(j, a.events, a.seed, a.chunk, a.sample) for j in joins]
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(out, indent=1) + "\n")

    def count(v: int | None) -> str:
        return "n/a" if v is None else f"{v:,}"  # (a run shorter than the plateau)

    for r in out:
        print(
            f"{r['join']}: {r['records']:,} records, state rows at the end "
            f"{count(r['last_rows'])}, most {count(r['max_rows'])}, first quarter's most "
            f"{count(r['first_quarter_max_rows'])} (end / first quarter "
            f"{r['last_over_first_quarter']}); late {r['late']}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
