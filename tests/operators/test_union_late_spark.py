"""Late records of a union, counted per source, on each state backend: the window operator and
the interval join read a union of two event-log topics, and a record that comes behind the
watermark is counted as its own topic's (``late:<source>``), whether it is dropped (a marker
row) or goes to a late side output. Before, a window operator's or join's late record in a
union was counted in the query's total only, or for a join only where one source was a whole
input."""

from __future__ import annotations

import json

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, read_topic
from tests.operators.helpers import run

pytestmark = pytest.mark.slow

JOB = """
from datetime import timedelta

from stateful_runtime import (AggregateFunction, LogSink, LogSource, OutputTag,
                              ProcessJoinFunction, StreamJob, TumblingEventTimeWindows,
                              WatermarkStrategy)

DEFAULTS = {"source.log_dir": "log", "sink.log_dir": "out", "checkpoint.dir": "ck",
            "parallelism": 2}
PAY = {"k": str, "n": int, "ts_ms": int}
TOO_LATE = OutputTag("too-late", PAY)


class Total(AggregateFunction):
    def create_accumulator(self):
        return 0

    def add(self, value, acc):
        return acc + value["n"]

    def merge(self, a, b):
        return a + b

    def get_result(self, acc):
        return {"total": acc}


class Pair(ProcessJoinFunction):
    output_schema = {"k": str, "a": int, "b": int}

    def process_element(self, left, right, ctx):
        yield {"k": left["k"], "a": left["n"], "b": right["n"]}


def build(config):
    job = StreamJob.from_config("union-late", config)

    def source(topic):
        return job.from_source(
            LogSource(config["source.log_dir"], topic, PAY, max_records_per_batch=50),
            WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
            .with_timestamp_field("ts_ms"), name=topic)

    both = source("app").union(source("bank"))
    windows = both.key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
    (windows.aggregate(Total(), name="totals", output={"total": int})
     .sink_to(LogSink(config["sink.log_dir"], "totals"), name="totals-out"))
    tagged = windows.side_output_late_data(TOO_LATE).aggregate(
        Total(), name="tagged", output={"total": int})
    tagged.sink_to(LogSink(config["sink.log_dir"], "tagged"), name="tagged-out")
    tagged.get_side_output(TOO_LATE).sink_to(
        LogSink(config["sink.log_dir"], "too-late"), name="too-late-out")
    (source("orders").key_by("k")
     .interval_join(source("app-refunds").union(source("bank-refunds")).key_by("k"))
     .between(timedelta(0), timedelta(seconds=30))
     .process(Pair(), name="pairs")
     .sink_to(LogSink(config["sink.log_dir"], "pairs"), name="pairs-out"))
    return job
"""

TOPICS = ("app", "bank", "orders", "app-refunds", "bank-refunds")


def _line(k: str, n: int, ts_ms: int) -> bytes:
    return json.dumps({"k": k, "n": n, "ts_ms": ts_ms}).encode()


def test_late_records_of_a_union_are_counted_per_source(spark, tmp_path):
    job_file = tmp_path / "union_late.py"
    job_file.write_text(JOB)
    log = tmp_path / "log"
    for topic in TOPICS:
        EventLog(log).create_topic(topic, 1)
    # Every topic's time moves to 100 s: the union's watermark (their minimum) is 95 s.
    for topic in TOPICS:
        append_lines(
            log, [_line(f"k{i % 3}", i, i * 1_000) for i in range(101)], topic=topic, key="k"
        )
    settings = {
        "sink.log_dir": tmp_path / "out",
        "checkpoint.dir": tmp_path / "ck",
    }
    run(str(job_file), tmp_path, **settings)
    # Behind the watermark now: one app record and two bank records (both windows' queries
    # count them, one dropping them, the other sending them to its side output), and a bank
    # refund (the join).
    append_lines(log, [_line("k0", 1_000, 12_000)], topic="app", key="k")
    append_lines(
        log, [_line("k1", 2_000, 13_000), _line("k2", 3_000, 14_000)], topic="bank", key="k"
    )
    append_lines(log, [_line("k0", 4_000, 15_000)], topic="bank-refunds", key="k")
    late = {"app": 2, "bank": 4, "orders": 0, "app-refunds": 0, "bank-refunds": 1}
    run(str(job_file), tmp_path, late=7, late_by_source=late, **settings)
    # The side output's rows are the late records as they came (the source's mark is not
    # written).
    too_late = sorted(json.loads(r.value)["n"] for r in read_topic(tmp_path / "out", "too-late"))
    assert too_late == [1_000, 2_000, 3_000]
    assert all(
        set(json.loads(r.value)) == {"k", "n", "ts_ms"}
        for r in read_topic(tmp_path / "out", "too-late")
    )
