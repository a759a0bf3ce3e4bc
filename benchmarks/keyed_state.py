"""Keyed state benchmark: a ValueState counter and session windows on transformWithStateInPandas.

Measures events/s after the first micro-batch for three queries over the same events in one
Spark session, and reports the API layer's cost as a ratio against the peer in the same run:

* ``source``: reading and decoding the events only (no state): the ceiling for the others.
* ``raw``: a minimal StatefulProcessor written directly on Spark's API (one ValueState read and
  write per key per batch) — the peer.
* ``counter``: the same counter as a KeyedProcessFunction (per-element ``value()``/``update()``
  through the runtime's cached state cells).
* ``sessions``: ``EventTimeSessionWindows`` with Count/Sum on the runtime's window operator.

    .venv/bin/python benchmarks/keyed_state.py --events 400000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=400_000)
    p.add_argument("--batch-size", type=int, default=100_000)
    p.add_argument("--keys", type=int, default=1_000)
    p.add_argument("--output", default=str(ROOT / "benchmarks/results/keyed_state.json"))
    a = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="srt-bench-keyed-"))
    os.environ["SRT_HOME"] = str(work / "home")

    from pyspark.sql.streaming.stateful_processor import StatefulProcessor
    from upi_events import events

    from stateful_runtime import (
        CheckpointConfig,
        Count,
        KeyedProcessFunction,
        LogSink,
        LogSource,
        StreamJob,
        Sum,
        ValueStateDescriptor,
        WatermarkStrategy,
    )
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import _records
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.dataframes import build, read_source
    from stateful_runtime.runtime.session import build_session
    from stateful_runtime.windows import EventTimeSessionWindows

    log = work / "log"
    EventLog(log).create_topic("upi-payments", 2)
    t = time.perf_counter()
    with EventLog(log).writer("upi-payments") as w:
        chunk = []
        for line in events(a.events, merchants=a.keys, rate_per_s=2_000, seed=1):
            chunk.append(line)
            if len(chunk) == 5_000:
                w.append(_records(chunk, "merchant_id"))
                chunk = []
        if chunk:
            w.append(_records(chunk, "merchant_id"))
    append_s = time.perf_counter() - t

    schema = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}

    class Counter(KeyedProcessFunction):
        output_schema = {"merchant_id": str, "count": int}

        def open(self, ctx):
            self.count = ctx.get_state(ValueStateDescriptor("count", int))

        def process_element(self, e, ctx):
            self.count.update((self.count.value() or 0) + 1)
            return ()

    class RawCounter(StatefulProcessor):
        def init(self, handle):
            self.count = handle.getValueState("count", "c BIGINT")

        def handleInputRows(self, key, rows, timerValues):
            n = sum(len(pdf) for pdf in rows)
            current = self.count.get()
            self.count.update(((current[0] if current else 0) + n,))
            yield from ()

    def job(name: str) -> tuple[StreamJob, object]:
        j = StreamJob(name, CheckpointConfig(str(work / "ck" / name), timedelta(0)), parallelism=2)
        src = j.from_source(
            LogSource(str(log), "upi-payments", schema, max_records_per_batch=a.batch_size),
            WatermarkStrategy.for_bounded_out_of_orderness(
                timedelta(seconds=5)
            ).with_timestamp_field("ts_ms"),
            name="src",
        )
        return j, src

    spark = build_session(parallelism=2, master="local[2]")

    def measure(name: str, df) -> dict:
        q = (
            df.writeStream.queryName(name)
            .outputMode("append")
            .option("checkpointLocation", str(work / "ck" / f"q-{name}"))
            .foreachBatch(lambda b, i: b.count())
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        progress = [pr for pr in q.recentProgress if pr["numInputRows"]]
        rest = progress[1:]
        rows = sum(pr["numInputRows"] for pr in rest)
        ms = sum(pr["durationMs"]["triggerExecution"] for pr in rest)
        return {
            "batches": len(progress),
            "events": sum(pr["numInputRows"] for pr in progress),
            "first_batch_ms": progress[0]["durationMs"]["triggerExecution"],
            "events_per_s_after_first": round(rows / ms * 1000) if ms else None,
        }

    results = {}
    j, src = job("source")
    results["source"] = measure("source", read_source(spark, src.node))

    j, src = job("raw")
    raw = read_source(spark, src.node).drop("_event_time")
    results["raw"] = measure(
        "raw",
        raw.groupBy("merchant_id").transformWithStateInPandas(
            RawCounter(), "merchant_id STRING", "Append", "None"
        ),
    )

    j, src = job("counter")
    src.key_by("merchant_id").process(Counter(), name="counter").sink_to(
        LogSink(str(log), "unused"), name="out"
    )
    results["counter"] = measure("counter", build(spark, plan(j).queries[0]))

    j, src = job("sessions")
    (
        src.key_by("merchant_id")
        .window(EventTimeSessionWindows.with_gap(timedelta(seconds=30)))
        .aggregate({"n": Count(), "amount": Sum("amount_paise")}, name="sessions")
        .sink_to(LogSink(str(log), "unused2"), name="out")
    )
    results["sessions"] = measure("sessions", build(spark, plan(j).queries[0]))

    raw_rate = results["raw"]["events_per_s_after_first"] or 1
    report = {
        "events": a.events,
        "keys": a.keys,
        "batch_size": a.batch_size,
        "append_events_per_s": round(a.events / append_s),
        "load_avg": os.getloadavg()[0],
        "results": results,
        "counter_vs_raw": round(
            (results["counter"]["events_per_s_after_first"] or 0) / raw_rate, 3
        ),
        "sessions_vs_raw": round(
            (results["sessions"]["events_per_s_after_first"] or 0) / raw_rate, 3
        ),
    }
    print(f"{'query':10} {'events/s after 1st batch':>26} {'first batch ms':>15} {'batches':>8}")
    for name, r in results.items():
        print(
            f"{name:10} {r['events_per_s_after_first'] or 0:>26,} {r['first_batch_ms']:>15,} "
            f"{r['batches']:>8}"
        )
    print(
        f"counter / raw = {report['counter_vs_raw']}, sessions / raw = "
        f"{report['sessions_vs_raw']}  (load average {report['load_avg']:.1f})"
    )
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(json.dumps(report, indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
