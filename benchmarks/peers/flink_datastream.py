"""Flink 2.3 Python DataStream peer: one workload written with PyFlink's DataStream API.

Runs in the harness's Flink venv (``benchmarks/.venvs/flink``). Local MiniCluster, parallelism
2, RocksDB state backend (incremental), a checkpoint every 2 s into ``--checkpoints``. The
input directory's files are read as text lines (``FileSource``, one split per file) and
decoded by a Python ``json.loads`` map; every function below runs in PyFlink's Python workers,
as a user's Python job would. Output: JSON lines through ``FileSink`` into ``--output``.

    python flink_datastream.py --workload upi --input /abs/parts --output /abs/out \
        --checkpoints /abs/ck --result /abs/result.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time

T_IMPORT = time.time()

from pyflink.common import Configuration, Duration, Encoder, Time, Types, WatermarkStrategy  # noqa: E402
from pyflink.common.watermark_strategy import TimestampAssigner  # noqa: E402
from pyflink.datastream import StreamExecutionEnvironment  # noqa: E402
from pyflink.datastream.connectors.file_system import FileSink, FileSource, StreamFormat  # noqa: E402
from pyflink.datastream.functions import (  # noqa: E402
    AggregateFunction,
    KeyedProcessFunction,
    ProcessWindowFunction,
    RuntimeContext,
)
from pyflink.datastream.state import ValueStateDescriptor  # noqa: E402
from pyflink.datastream.window import (  # noqa: E402
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)


class EventTime(TimestampAssigner):
    def extract_timestamp(self, value, record_timestamp) -> int:
        return value["ts_ms"]


class CountAgg(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, accumulator):
        return accumulator + 1

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return a + b


class MaxPrice(AggregateFunction):
    def create_accumulator(self):
        return -1

    def add(self, value, accumulator):
        return max(accumulator, value["price"])

    def get_result(self, accumulator):
        return accumulator

    def merge(self, a, b):
        return max(a, b)


class HotItem(AggregateFunction):
    def create_accumulator(self):
        return {}

    def add(self, value, acc):
        acc[value["auction"]] = acc.get(value["auction"], 0) + 1
        return acc

    def get_result(self, acc):
        return min(acc.items(), key=lambda kv: (-kv[1], kv[0]))

    def merge(self, a, b):
        for k, v in b.items():
            a[k] = a.get(k, 0) + v
        return a


class Emit(ProcessWindowFunction):
    """Turns a window's aggregate into the workload's output record."""

    def __init__(self, fmt):
        self.fmt = fmt

    def process(self, key, context, elements):
        w = context.window()
        for value in elements:
            yield json.dumps(self.fmt(key, w.start, w.end, value))


class Counter(KeyedProcessFunction):
    def open(self, ctx: RuntimeContext):
        self.count = ctx.get_state(ValueStateDescriptor("count", Types.LONG()))

    def process_element(self, value, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if n % 100 == 0:
            yield json.dumps({"merchant_id": value["merchant_id"], "count": n})


class Dedup(KeyedProcessFunction):
    """Seen-flag per txn_id, cleared by an event-time timer one minute after it was set (Flink's
    own state TTL runs in processing time only)."""

    def open(self, ctx: RuntimeContext):
        self.seen = ctx.get_state(ValueStateDescriptor("seen", Types.BOOLEAN()))

    def process_element(self, value, ctx):
        if self.seen.value():
            return
        self.seen.update(True)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + 60_000)
        yield json.dumps({k: value[k] for k in ("txn_id", "merchant_id", "amount_paise", "ts_ms")})

    def on_timer(self, timestamp, ctx):
        self.seen.clear()
        return iter(())


def build(workload: str, events):
    s = Types.STRING()
    if workload == "q1":
        return events.map(
            lambda e: json.dumps(
                {
                    "auction": e["auction"],
                    "bidder": e["bidder"],
                    "price_eur": e["price"] * 908 // 1000,
                    "ts_ms": e["ts_ms"],
                }
            ),
            output_type=s,
        )
    if workload == "q2":
        return events.filter(lambda e: e["auction"] % 123 == 0).map(
            lambda e: json.dumps({"auction": e["auction"], "price": e["price"]}), output_type=s
        )
    if workload == "upi":
        return (
            events.key_by(lambda e: e["merchant_id"], key_type=s)
            .window(TumblingEventTimeWindows.of(Time.minutes(1)))
            .aggregate(
                CountAgg(),
                Emit(lambda k, st, en, n: {"merchant_id": k, "window_start": st, "count": n}),
                output_type=s,
            )
        )
    if workload == "q5":
        return (
            events.key_by(lambda e: e["channel"], key_type=s)
            .window(SlidingEventTimeWindows.of(Time.seconds(10), Time.seconds(2)))
            .aggregate(
                HotItem(),
                Emit(
                    lambda k, st, en, best: {
                        "channel": k,
                        "window_start": st,
                        "auction": best[0],
                        "bids": best[1],
                    }
                ),
                output_type=s,
            )
        )
    if workload == "q7":
        return (
            events.key_by(lambda e: e["channel"], key_type=s)
            .window(TumblingEventTimeWindows.of(Time.seconds(10)))
            .aggregate(
                MaxPrice(),
                Emit(lambda k, st, en, p: {"channel": k, "window_start": st, "max_price": p}),
                output_type=s,
            )
        )
    if workload == "q11":
        return (
            events.key_by(lambda e: e["bidder"], key_type=Types.LONG())
            .window(EventTimeSessionWindows.with_gap(Time.seconds(10)))
            .aggregate(
                CountAgg(),
                Emit(
                    lambda k, st, en, n: {
                        "bidder": k,
                        "session_start": st,
                        "window_end": en,
                        "bids": n,
                    }
                ),
                output_type=s,
            )
        )
    if workload == "counter":
        return events.key_by(lambda e: e["merchant_id"], key_type=s).process(
            Counter(), output_type=s
        )
    if workload == "dedup":
        return events.key_by(lambda e: e["txn_id"], key_type=s).process(Dedup(), output_type=s)
    raise SystemExit(f"unknown workload {workload}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--input", required=True, help="absolute path of a directory of JSON lines")
    ap.add_argument("--output", required=True)
    ap.add_argument("--checkpoints", required=True)
    ap.add_argument("--result", required=True)
    ap.add_argument("--parallelism", type=int, default=2)
    a = ap.parse_args()

    conf = Configuration()
    for k, v in {
        "state.backend.type": "rocksdb",
        "execution.checkpointing.incremental": "true",
        "execution.checkpointing.dir": f"file://{a.checkpoints}",
        "python.executable": sys.executable,  # else "python" on PATH runs the UDF workers
        "python.client.executable": sys.executable,
        "restart-strategy.type": "none",  # a failing job fails the run instead of looping
        "rest.bind-address": "127.0.0.1",
        "rest.address": "127.0.0.1",
    }.items():
        conf.set_string(k, v)
    env = StreamExecutionEnvironment.get_execution_environment(conf)
    env.set_parallelism(a.parallelism)
    env.enable_checkpointing(2000)
    source = FileSource.for_record_stream_format(
        StreamFormat.text_line_format(), f"file://{a.input}"
    ).build()
    lines = env.from_source(source, WatermarkStrategy.no_watermarks(), "json-lines")
    events = lines.map(json.loads).assign_timestamps_and_watermarks(
        WatermarkStrategy.for_bounded_out_of_orderness(
            Duration.of_seconds(5)
        ).with_timestamp_assigner(EventTime())
    )
    out = build(a.workload, events)
    out.sink_to(
        FileSink.for_row_format(f"file://{a.output}", Encoder.simple_string_encoder()).build()
    )
    t_submit = time.time()
    client = env.execute_async(f"bench-{a.workload}")
    job_result = client.get_job_execution_result().result()
    t_done = time.time()
    with open(a.result, "w") as f:
        json.dump(
            {
                "t_import": T_IMPORT,
                "t_submit": t_submit,
                "t_done": t_done,
                "job_id": str(client.get_job_id()),
                "net_runtime_ms": job_result.get_net_runtime(),
            },
            f,
        )


if __name__ == "__main__":
    main()
