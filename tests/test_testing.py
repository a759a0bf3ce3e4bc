"""The harness is the engine: fed the batches a Spark run made (each batch's records and its
watermark, read back from the run's checkpoint), it emits the records the run emitted, in the
same order — for random inputs to a function with state and timers that register, move and
delete timers and emit from both ``process_element`` and ``on_timer``."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from stateful_runtime.testing import KeyedProcessHarness
from tests.helpers import append_lines, read_topic

pytestmark = pytest.mark.slow

JOB = """
from datetime import timedelta

from stateful_runtime import (
    KeyedProcessFunction, LogSink, LogSource, StreamJob, ValueStateDescriptor, WatermarkStrategy,
)
from stateful_runtime.functions import to_datetime

DEFAULTS = {"log": "log", "checkpoint.dir": "ck", "batch": 5, "parallelism": 1}
EVENT = {"k": str, "v": int, "ts": int}


class Moves(KeyedProcessFunction):
    output_schema = {"k": str, "what": str, "at": int, "n": int}

    def open(self, ctx):
        self.n = ctx.get_state(ValueStateDescriptor("n", int))
        self.timer = ctx.get_state(ValueStateDescriptor("timer", int))

    def process_element(self, e, ctx):
        n = (self.n.value() or 0) + e["v"]
        self.n.update(n)
        timers = ctx.timer_service()
        old = self.timer.value()
        if old is not None and e["v"] % 3 == 0:  # moved
            timers.delete_event_time_timer(to_datetime(old))
            old = None
        if old is None and e["v"] % 4 != 1:
            at = (e["ts"] // 1000 + 1 + e["v"] % 3) * 1000  # keys share timers' times
            timers.register_event_time_timer(to_datetime(at))
            self.timer.update(at)
        if n % 2 == 0:
            yield {"k": ctx.get_current_key(), "what": "even", "at": e["ts"], "n": n}

    def on_timer(self, timestamp, ctx):
        self.timer.clear()
        yield {"k": ctx.get_current_key(), "what": "timer", "at": 0, "n": self.n.value()}


def build(config):
    job = StreamJob.from_config("moves", config)
    source = LogSource(config["log"], "in", EVENT, max_records_per_batch=config["batch"])
    events = job.from_source(
        source,
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1))
        .with_timestamp_field("ts"),
        name="in",
    )
    events.key_by("k").process(Moves(), name="moves").sink_to(
        LogSink(config["log"], "out"), name="out"
    )
    return job
"""

EVENTS = st.lists(
    st.tuples(st.sampled_from(["a", "b", "c", "d", "e"]), st.integers(0, 9), st.integers(0, 900)),
    min_size=1,
    max_size=40,
)


def _batches(query: QueryLayout, records: list[dict]) -> list[tuple[list[dict], int]]:
    """Each committed batch's records (by its source offsets) and watermark."""
    out = []
    start = 0
    for batch in query.committed_batches():
        offsets = query.committed_offsets(batch)
        assert offsets is not None
        end = int(offsets["sources"][0]["0"])
        out.append((records[start:end], offsets["watermark_ms"] or 0))
        start = end
    return out


@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(events=EVENTS, batch=st.integers(1, 7))
def test_the_harness_emits_what_a_spark_run_emits_in_the_same_order(
    spark, tmp_path_factory, events, batch
):
    root = tmp_path_factory.mktemp("moves")
    job_file = root / "moves.py"
    job_file.write_text(JOB)
    log = root / "log"
    EventLog(log).create_topic("in", 1)
    ts, records = 0, []
    for k, v, step in events:
        ts += step
        records.append({"k": k, "v": v, "ts": ts})
    append_lines(log, [json.dumps(r).encode() for r in records], topic="in", key="k")
    values = {"log": str(log), "checkpoint.dir": str(root / "ck"), "batch": str(batch)}
    out = io.StringIO()
    assert JobRunner(load_job_file(job_file, values), available_now=True, out=out).run() == 0
    ran = [json.loads(r.value) for r in read_topic(log, "out")]

    namespace: dict = {}
    exec(compile(JOB, str(job_file), "exec"), namespace)
    harness = KeyedProcessHarness(namespace["Moves"](), "k", "ts")
    for batch_records, watermark in _batches(QueryLayout(Path(root / "ck" / "moves")), records):
        harness.process_elements(batch_records, watermark=watermark)

    assert harness.output == ran
