"""Processing-time timers without input: the tick source's reading of the partitions' next
timers, and on Spark a timer firing in a batch without input (with a processing-time TTL
expired by then), replayed after a crash with the same timers and the same time."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.operators.ticks import NEXT_TIMER, earliest_due, write_next_timer
from tests.helpers import poll


def _commit(query: Path, batch: int) -> None:
    (query / "commits").mkdir(parents=True, exist_ok=True)
    (query / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_earliest_timer_of_the_committed_version_or_now_when_a_partition_did_not_say(
    tmp_path,
):
    query = tmp_path / "q"
    parts = [query / "keyed" / "op" / str(p) for p in range(3)]
    for p in parts:
        p.mkdir(parents=True)
    assert earliest_due(str(query), parts, now=500) == 500  # nothing ran yet: a batch now
    _commit(query, 4)  # batch 4 made version 5
    write_next_timer(parts[0], 5, 9_000)
    write_next_timer(parts[1], 5, None)
    write_next_timer(parts[2], 4, 100)  # of an older version: not to be trusted
    assert earliest_due(str(query), parts, now=500) == 500
    write_next_timer(parts[2], 5, 7_000)
    assert earliest_due(str(query), parts, now=500) == 7_000
    for p in parts:
        write_next_timer(p, 5, None)
    assert earliest_due(str(query), parts, now=500) is None
    (parts[1] / NEXT_TIMER).write_text("{torn")
    assert earliest_due(str(query), parts, now=500) == 500


JOB = '''
from datetime import timedelta

from stateful_runtime import (
    KeyedProcessFunction, LogSource, StateTtlConfig, StreamJob, TimeDomain,
    ValueStateDescriptor, WatermarkStrategy,
)
from stateful_runtime.connectors.eventlog.sink import LogSink
from stateful_runtime.functions import to_ms

DEFAULTS = {"log": "", "checkpoint.dir": "", "checkpoint.interval_s": 0.5, "parallelism": 2}


class Reminder(KeyedProcessFunction):
    """A reminder 2 s after a key's elements; a value with a 1 s TTL is gone by then."""

    time_domain = TimeDomain.PROCESSING_TIME
    output_schema = {"k": str, "timer_ms": int, "now_ms": int, "seen": int, "kept": int}

    def open(self, ctx):
        self.seen = ctx.get_state(ValueStateDescriptor("seen", int))
        self.kept = ctx.get_state(ValueStateDescriptor(
            "kept", int, ttl=StateTtlConfig(timedelta(seconds=1))))

    def process_element(self, event, ctx):
        self.seen.update((self.seen.value() or 0) + 1)
        self.kept.update(7)
        service = ctx.timer_service()
        service.register_processing_time_timer(
            service.current_processing_time() + timedelta(seconds=2))
        return ()

    def on_timer(self, timestamp, ctx):
        now = to_ms(ctx.timer_service().current_processing_time())
        kept = self.kept.value()
        yield {"k": ctx.get_current_key(), "timer_ms": to_ms(timestamp), "now_ms": now,
               "seen": self.seen.value(), "kept": -1 if kept is None else kept}


def build(config):
    job = StreamJob.from_config("reminders", config)
    (
        job.from_source(
            LogSource(config["log"], "in", {"k": str, "ts": int}),
            WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts"),
            name="in",
        )
        .key_by("k")
        .process(Reminder(), name="remind")
        .sink_to(LogSink(config["log"], "out"))
    )
    return job
'''


def _rows(log: Path) -> list[tuple]:
    from stateful_runtime.connectors.eventlog import EventLog

    try:
        reader = EventLog(log).reader("out")
    except Exception:  # noqa: BLE001 - the sink creates the topic when the job starts
        return []
    reader.catch_up()
    end = reader.end_offsets().get(0, 0)
    records = [json.loads(v) for v in reader.read_values(0, 0, end)]
    return sorted(
        (r["k"], r["timer_ms"], r["now_ms"], r["seen"], r["kept"])
        for r in records
        if r.get("k") is not None
    )


def _run_until(job_file: Path, values: dict[str, str], done) -> None:  # noqa: ANN001
    import io

    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import JobRunner

    out = io.StringIO()
    runner = JobRunner(load_job_file(job_file, values), available_now=False, out=out)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(runner.run()), daemon=True)
    thread.start()

    def ended_or_done():  # noqa: ANN202
        if codes:
            pytest.fail(f"the job ended ({codes[0]}): {out.getvalue()}")
        return done()

    try:
        poll(ended_or_done, 300, "the job's batches")
    finally:
        runner.stop_and_wait()
        thread.join(60)


def _crash_back_to(query: Path, batch: int) -> None:
    """As if the job died after the tasks of ``batch`` and before its commit: the commits from
    ``batch`` on and the offsets after it are gone (the sink already holds the batch's rows:
    a replay appends none, so rows the replay fired late would show as extra rows)."""
    for kind, first in (("commits", batch), ("offsets", batch + 1)):
        for path in list((query / kind).iterdir()):
            stem = path.name.lstrip(".").removesuffix(".crc")
            if stem.isdigit() and int(stem) >= first:
                path.unlink()


def _time_of(layout: QueryLayout, batch: int) -> int:
    return json.loads(layout.offsets(batch).read_text().splitlines()[1])["batchTimestampMs"]


@pytest.mark.slow
def test_a_processing_time_timer_fires_without_input_and_again_on_replay(spark, tmp_path):
    from stateful_runtime.connectors.eventlog import EventLog
    from tests.helpers import append_lines

    log = tmp_path / "log"
    EventLog(log).create_topic("in", 1)
    job_file = tmp_path / "reminders.py"
    job_file.write_text(JOB)
    values = {
        "log": str(log),
        "checkpoint.dir": str(tmp_path / "ck"),
    }
    append_lines(log, [json.dumps({"k": k, "ts": 1_000}).encode() for k in "aba"], topic="in")
    # The only input, read by one batch; the timers it registers are 2 s after that batch's
    # time, so a batch without input fires them.
    _run_until(job_file, values, lambda: len(_rows(log)) == 2)
    first = _rows(log)
    assert [(k, seen, kept) for k, _, _, seen, kept in first] == [("a", 2, -1), ("b", 1, -1)]
    assert first[0][1:3] == first[1][1:3]  # one batch's timers, fired in one batch
    query = next((tmp_path / "ck").rglob("commits")).parent
    layout = QueryLayout(str(query))
    last = layout.last_committed()
    assert last is not None
    fired = next(b for b in range(last + 1) if _time_of(layout, b) == first[0][2])
    assert first[0][2] >= first[0][1]  # the batch's time, at or after the timer
    assert fired >= 1 and _time_of(layout, fired - 1) < first[0][1]  # the first batch it was due
    sources = [json.loads(line) for line in layout.offsets(fired).read_text().splitlines()[2:]]
    before = [json.loads(line) for line in layout.offsets(fired - 1).read_text().splitlines()[2:]]
    assert sources[0] == before[0]  # the source read nothing in the batch that fired
    _crash_back_to(query, fired)

    def replayed_and_past() -> bool:
        done = layout.last_committed()
        if done is None or done < fired:
            return False
        pending = [json.loads(p.read_text()) for p in (query / "keyed").rglob(NEXT_TIMER)]
        return all(p["version"] == done + 1 and p["due"] is None for p in pending)

    _run_until(job_file, values, replayed_and_past)
    assert _time_of(layout, fired) == first[0][2]
    assert _rows(log) == first  # the replay fired them: none left to fire later
