"""Keyed state in the worker without Spark: the keyed operator (state in the worker's RocksDB)
driven as Spark's tasks drive it, to see where a key's time goes.

Runs :class:`~stateful_runtime.operators.arrow_keyed.ArrowKeyedOperator` over UPI payments
(the benchmarks' generator) in Arrow batches, one state partition, batch after batch as one
Python worker would (the store stays on disk between them; each batch opens it at its version
and commits the next), and prints per workload the events per CPU second of the batches after
the first and the CPU seconds of the slowest commit (CPU time of the process, RocksDB's threads
included: steadier than wall time on a shared machine):

* ``counter``: a ValueState count per merchant (``benchmarks/jobs/keyed_counter.py``);
* ``dedup``: the first payment per ``txn_id``, event-time TTL one minute (every key new);
* ``fraud``: the seeds' FraudCounter (two ValueStates and an event-time timer a minute after
  a merchant's first payment), ``--merchants`` keys;
* ``q5``: Nexmark q5 on the window operator (``benchmarks/jobs/q5_hot_items.py``: sliding
  10 s windows every 2 s, an AggregateFunction keyed by channel) over bids;
* ``interval`` / ``temporal``: the join workloads (``benchmarks/jobs/interval_join.py``,
  ``temporal_join.py``) on their two inputs in order of arrival, ``--events`` payments.

    .venv/bin/python benchmarks/keyed_local.py --events 600000 --batch 100000
    py-spy record -o /tmp/keyed.svg -- .venv/bin/python benchmarks/keyed_local.py -w dedup

Not a measure of the job: no shuffle, no JVM, no Arrow crossing; a ceiling for the Python side.
"""

from __future__ import annotations

import argparse
import gc
import heapq
import json
import shutil
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "examples")]

import pyarrow as pa  # noqa: E402

from benchmarks.harness.data import (  # noqa: E402
    JOIN_STEP_MS,
    START_MS,
    bid_events,
    jpay_events,
    jrefunds_arrivals,
    jtiers_arrivals,
    parse,
    upi_events,
)
from stateful_runtime.connectors.formats.json import to_struct  # noqa: E402
from stateful_runtime.functions import CO_INPUT  # noqa: E402
from stateful_runtime.operators.arrow_keyed import KEY_GROUP, SIDE, ArrowKeyedOperator  # noqa: E402
from stateful_runtime.operators.keyed_store import MAX_PARALLELISM  # noqa: E402
from stateful_runtime.operators.output import TS, output_struct  # noqa: E402
from stateful_runtime.runtime.batch_writes import record_keyed_commits  # noqa: E402

UPI = ["txn_id", "merchant_id", "amount_paise", "ts_ms"]
BID = ["auction", "bidder", "price", "channel", "url", "ts_ms"]
REFUND = ["refund_id", "txn_id", "refund_paise", "ts_ms"]
TIER = ["merchant_id", "tier", "ts_ms"]
JOINED = [*UPI, "refund_id", "refund_paise", "tier", CO_INPUT]


def _functions(merchants: int) -> dict:
    """workload → (function, key field, fields, rows: a function of the event count)."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "jobs"))
    from dedup_ttl import Deduplicator
    from fraud_rate_limit import FraudCounter
    from keyed_counter import Counter
    from merchant_tiers import PairRefund, TierAsOf
    from pyspark.sql.types import (
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampNTZType,
    )
    from q5_hot_items import HotItem

    from stateful_runtime import SlidingEventTimeWindows
    from stateful_runtime.functions import CoInput, CoProcess
    from stateful_runtime.joins import IntervalJoinOperator, TemporalJoinOperator
    from stateful_runtime.operators.window import WindowOperator

    window = SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=2))
    out = StructType(
        [
            StructField("channel", StringType()),
            StructField("window_start", TimestampNTZType()),
            StructField("window_end", TimestampNTZType()),
            StructField("auction", LongType()),
            StructField("bids", LongType()),
        ]
    )
    q5 = WindowOperator(window, ["channel"], HotItem(), out)
    interval = CoProcess(
        IntervalJoinOperator(PairRefund(), timedelta(0), timedelta(minutes=30)),
        (CoInput("jpay", tuple(UPI)), CoInput("jrefunds", tuple(REFUND))),
    )
    temporal = CoProcess(
        TemporalJoinOperator(TierAsOf()),
        (CoInput("jpay", tuple(UPI)), CoInput("jtiers", tuple(TIER))),
    )

    def upi(keys: int) -> Callable[[int], list[dict]]:
        return lambda n: parse(list(upi_events(n, 7, merchants=keys)))

    return {
        "counter": (Counter(), "merchant_id", UPI, upi(1_000)),
        "dedup": (Deduplicator(timedelta(minutes=1)), "txn_id", UPI, upi(1_000)),
        "fraud": (FraudCounter(), "merchant_id", UPI, upi(merchants)),
        "q5": (q5, "channel", BID, lambda n: parse(list(bid_events(n, 7)))),
        "interval": (interval, "txn_id", JOINED, lambda n: _two(n, jrefunds_arrivals)),
        "temporal": (temporal, "merchant_id", JOINED, lambda n: _two(n, jtiers_arrivals)),
    }


def _two(payments: int, second: Callable[[int, int], list[tuple[int, bytes]]]) -> list[dict]:
    """The join workloads' payments and their second input (refunds or tier versions) in
    order of arrival, as the connected stream's rows (every field of both, the input's tag)."""
    seed = 14
    first = (
        (START_MS + i * JOIN_STEP_MS, line) for i, line in enumerate(jpay_events(payments, seed))
    )
    rows = []
    for _, line in heapq.merge(first, second(payments, seed), key=lambda a: a[0]):
        record = json.loads(line)
        row = dict.fromkeys(JOINED)
        row.update(record)
        row[CO_INPUT] = 2 if "refund_id" in record or "tier" in record else 1
        rows.append(row)
    return rows


def _batches(rows: list[dict], batch: int, fields: list[str], key: str) -> list[pa.RecordBatch]:
    out = []
    for lo in range(0, len(rows), batch):
        part = rows[lo : lo + batch]
        cols = {f: [r[f] for r in part] for f in fields}
        cols[TS] = cols["ts_ms"]
        cols[KEY_GROUP] = [zlib.crc32(str(r[key]).encode()) % MAX_PARALLELISM for r in part]
        out.append(
            pa.record_batch(
                {**{c: v for c, v in cols.items() if c != KEY_GROUP}},
            ).append_column(KEY_GROUP, pa.array(cols[KEY_GROUP], pa.int32()))
        )
    return out


def _offsets(query: Path, batch: int, watermark: int) -> None:
    (query / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": watermark, "batchTimestampMs": 0}
    (query / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{{}}\n")


def run(workload: str, events: int, batch: int, merchants: int) -> dict:
    fn, key, fields, rows = _functions(merchants)[workload]
    batches = _batches(rows(events), batch, fields, key)
    work = Path(tempfile.mkdtemp(prefix="srt-keyed-local-"))
    query = work / "q"
    from pyspark.sql.pandas.types import to_arrow_schema

    output = to_arrow_schema(output_struct(to_struct(fn.output_schema)))
    op = ArrowKeyedOperator(fn, workload, [key], fields, TS, output, str(query), parallelism=1)
    import stateful_runtime.operators.keyed_store as ks

    local = work / "local"
    ks.local_root = lambda: local  # type: ignore[assignment]
    watermark, rows, seconds, commits = 0, 0, 0.0, []
    newest: dict[int, int] = {}
    from stateful_runtime.operators import keyed_store

    commit = keyed_store.KeyedStore.commit

    def timed_commit(self, *args):  # noqa: ANN001, ANN002, ANN202
        t = time.process_time()
        try:
            return commit(self, *args)
        finally:
            commits.append(time.process_time() - t)

    keyed_store.KeyedStore.commit = timed_commit  # type: ignore[method-assign]
    try:
        for n, arrow in enumerate(batches):
            _offsets(query, n, watermark)
            t = time.process_time()
            out_batches = list(op.run(n, 0, iter([arrow])))
            took = time.process_time() - t
            # As a Spark worker after each task (pyspark/daemon.py): untimed, and it keeps the
            # collector's full passes out of the next task, as there (NOTES.md, "Where
            # FraudCounter's 150k stops").
            gc.collect()
            # The last row is the task's commit row: recorded as the driver records it.
            commit_row = out_batches[-1].column(SIDE)[-1].as_py()
            record_keyed_commits(query / "keyed" / op.name, n, 1, [commit_row])
            out = sum(b.num_rows for b in out_batches) - 1
            if n:
                rows, seconds = rows + arrow.num_rows, seconds + took
            print(
                f"  {workload} batch {n}: {arrow.num_rows} events {took:.2f} s "
                f"({arrow.num_rows / took:,.0f}/s), out {out}, commit {commits[-1]:.3f} s",
                flush=True,
            )
            # Each input's newest time so far; the watermark is the least of them (Spark's and
            # Flink's rule for two inputs) less the 5 s bound.
            inputs = arrow.column(CO_INPUT).to_pylist() if CO_INPUT in fields else None
            for i, ts in zip(
                inputs or [1] * arrow.num_rows, arrow.column("ts_ms").to_pylist(), strict=True
            ):
                newest[i] = max(newest.get(i, ts), ts)
            watermark = max(watermark, min(newest.values()) - 5_000)
        # A batch of no rows at the last watermark: the timers the input left due (the end
        # of an --available-now run, a tick batch), and what firing them costs.
        _offsets(query, len(batches), watermark)
        t = time.process_time()
        out_batches = list(op.run(len(batches), 0, iter([batches[0].slice(0, 0)])))
        tick_s = time.process_time() - t
        print(f"  {workload} tick batch: {tick_s:.2f} s", flush=True)
    finally:
        keyed_store.KeyedStore.commit = commit  # type: ignore[method-assign]
        # A snapshot still being written aside must not find its directory gone.
        for writers in keyed_store._writers.values():
            for writer in writers:
                writer.wait()
        keyed_store._writers.clear()
        shutil.rmtree(work, ignore_errors=True)
    return {
        "workload": workload,
        "events_per_s": round(rows / seconds) if seconds else None,
        "commit_s_max": round(max(commits[1:] or commits), 3),
        "tick_batch_s": round(tick_s, 3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-w", "--workloads", default="counter,dedup,fraud")
    p.add_argument("--events", type=int, default=300_000)
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--merchants", type=int, default=200_000, help="the fraud workload's keys")
    a = p.parse_args()
    for w in a.workloads.split(","):
        print(json.dumps(run(w, a.events, a.batch, a.merchants)), flush=True)


if __name__ == "__main__":
    main()
