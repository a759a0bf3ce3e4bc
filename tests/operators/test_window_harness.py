"""Every window type through the harness, against brute-force oracles."""

from __future__ import annotations

import random
from collections import defaultdict
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import LongType, StringType, StructField, StructType

from stateful_runtime import AggregateFunction, Count, OutputTag, ProcessWindowFunction, Sum
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.operators.window import WindowOperator
from stateful_runtime.testing import KeyedProcessHarness, window_harness
from stateful_runtime.windows import (
    CountTrigger,
    EarlyFiring,
    EventTimeSessionWindows,
    GlobalWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)

# Every test runs on each state backend (tests/operators/conftest.py).

AGGS = {"n": Count(), "s": Sum("v")}
SCHEMA = StructType([StructField("k", StringType()), StructField("n", LongType())])
S = 1_000


def events(seed: int, count: int = 400) -> list[dict]:
    rng = random.Random(seed)
    out, ts = [], 0
    for _ in range(count):
        ts += rng.choice([100, 700, 2_500, 9_000])
        out.append({"k": rng.choice("ab"), "v": rng.randint(1, 9), "ts": ts})
    return out


def run(op: WindowOperator, evs: list[dict]) -> dict:
    """Feed events in order, a batch each, the watermark trailing by 0; return the last
    result per window."""
    h = KeyedProcessHarness(op, "k", "ts")
    for e in evs:
        h.process_elements([e], watermark=e["ts"] - 1)
    h.process_watermark(10**12)
    return {(r["k"], r["window_start"]): (r["n"], r["s"]) for r in h.output}


def key(k, start_ms):
    from stateful_runtime.operators.window import _naive_utc

    return (k, _naive_utc(start_ms))


def test_tumbling_and_sliding_windows_equal_the_oracle():
    evs = events(1)
    tumbling = run(
        WindowOperator(TumblingEventTimeWindows.of(timedelta(seconds=10)), ["k"], AGGS, SCHEMA), evs
    )
    expected = defaultdict(lambda: [0, 0])
    for e in evs:
        acc = expected[key(e["k"], e["ts"] - e["ts"] % (10 * S))]
        acc[0] += 1
        acc[1] += e["v"]
    assert tumbling == {k: tuple(v) for k, v in expected.items()}

    sliding = run(
        WindowOperator(
            SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=5)),
            ["k"],
            AGGS,
            SCHEMA,
        ),
        evs,
    )
    expected = defaultdict(lambda: [0, 0])
    for e in evs:
        for start in range(e["ts"] - e["ts"] % (5 * S) - 5 * S, e["ts"] + 1, 5 * S):
            if start <= e["ts"] < start + 10 * S:
                acc = expected[key(e["k"], start)]
                acc[0] += 1
                acc[1] += e["v"]
    assert sliding == {k: tuple(v) for k, v in expected.items()}


def sessions_oracle(evs: list[dict], gap: int) -> dict:
    """(key, session start) → (count, sum) for in-order events."""
    expected = {}
    for k in "ab":
        sessions: list[list] = []
        for e in (e for e in evs if e["k"] == k):
            if sessions and e["ts"] < sessions[-1][1] + gap:
                sessions[-1][1] = e["ts"]
                sessions[-1][2] += 1
                sessions[-1][3] += e["v"]
            else:
                sessions.append([e["ts"], e["ts"], 1, e["v"]])
        expected.update({key(k, s[0]): (s[2], s[3]) for s in sessions})
    return expected


def test_session_windows_merge_and_equal_the_oracle():
    evs = events(2)
    got = run(
        WindowOperator(EventTimeSessionWindows.with_gap(timedelta(seconds=5)), ["k"], AGGS, SCHEMA),
        evs,
    )
    assert got == sessions_oracle(evs, 5 * S)


def test_global_window_count_trigger_fires_and_purges():
    evs = events(3, 100)
    h = KeyedProcessHarness(
        WindowOperator(GlobalWindows(), ["k"], AGGS, SCHEMA, trigger=CountTrigger.of(7)), "k", "ts"
    )
    h.process_elements(evs)
    for k in "ab":
        values = [e["v"] for e in evs if e["k"] == k]
        chunks = [values[i : i + 7] for i in range(0, len(values) - len(values) % 7, 7)]
        assert [(r["n"], r["s"]) for r in h.output if r["k"] == k] == [(7, sum(c)) for c in chunks]


def test_early_firing_every_k_elements_then_final_result():
    h = KeyedProcessHarness(
        WindowOperator(
            TumblingEventTimeWindows.of(timedelta(seconds=60)),
            ["k"],
            AGGS,
            SCHEMA,
            trigger=EarlyFiring.every(count=3),
        ),
        "k",
        "ts",
    )
    for i in range(8):
        h.process_element({"k": "a", "v": 1, "ts": i})
    assert [r["n"] for r in h.output] == [3, 6]  # running counts
    h.process_watermark(60_000)
    assert [r["n"] for r in h.output] == [3, 6, 8]  # and the final one


def test_allowed_lateness_updates_and_later_data_goes_to_the_side_output():
    late = OutputTag("late", {"k": str, "v": int, "ts": int})
    h = KeyedProcessHarness(
        WindowOperator(
            TumblingEventTimeWindows.of(timedelta(seconds=10)),
            ["k"],
            AGGS,
            SCHEMA,
            allowed_lateness=timedelta(seconds=5),
            late_tag=late,
        ),
        "k",
        "ts",
    )
    h.process_element({"k": "a", "v": 1, "ts": 1_000})
    assert [r["n"] for r in h.process_watermark(10_000)] == [1]  # on time
    assert [r["n"] for r in h.process_element({"k": "a", "v": 1, "ts": 2_000})] == [2]  # late
    h.process_watermark(14_999)  # the window is purged at 9 999 + 5 000
    assert h.process_element({"k": "a", "v": 5, "ts": 3_000}) == []
    assert h.side_output(late) == [{"k": "a", "v": 5, "ts": 3_000}]


def test_late_data_without_a_side_output_is_counted_not_silently_lost():
    h = KeyedProcessHarness(
        WindowOperator(TumblingEventTimeWindows.of(timedelta(seconds=10)), ["k"], AGGS, SCHEMA),
        "k",
        "ts",
    )
    h.process_watermark(50_000)
    h.process_element({"k": "a", "v": 1, "ts": 1_000})
    assert h.output == [] and h.state("a", "late_dropped") == 1


def test_window_configuration_errors():
    with pytest.raises(ConfigError, match="multiple of the slide"):
        SlidingEventTimeWindows.of(timedelta(seconds=10), timedelta(seconds=3))
    with pytest.raises(ConfigError, match="count="):
        EarlyFiring.every()


class TopTwo(ProcessWindowFunction):
    output_schema = {"k": str, "top": str}

    def process(self, key, window, elements):
        best = sorted((e["v"] for e in elements), reverse=True)[:2]
        yield {"k": key, "top": f"{window.start:%H:%M:%S} {best}"}


class MeanFn(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + value["v"], acc[1] + 1)

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])

    def get_result(self, acc):
        return {"mean": acc[0] / acc[1]}


def test_process_window_function_and_user_aggregate_function():
    evs = events(5, 200)
    h = window_harness(
        TumblingEventTimeWindows.of(timedelta(seconds=30)), "k", TopTwo(), timestamp_field="ts"
    )
    h.process_elements(evs)
    h.process_watermark(10**12)
    by_window = defaultdict(list)
    for e in evs:
        by_window[(e["k"], e["ts"] // 30_000)].append(e["v"])
    assert sorted(r["top"].split(" ", 1)[1] for r in h.output) == sorted(
        str(sorted(v, reverse=True)[:2]) for v in by_window.values()
    )

    h = window_harness(
        EventTimeSessionWindows.with_gap(timedelta(seconds=5)), "k", MeanFn(), timestamp_field="ts"
    )
    h.process_elements(evs)
    h.process_watermark(10**12)
    expected = {k: s / n for k, (n, s) in sessions_oracle(evs, 5 * S).items()}
    assert {(r["k"], r["window_start"]): r["mean"] for r in h.output} == expected


class Picky(ProcessWindowFunction):
    """Emits each window's elements' values; raises for a window holding a 13."""

    output_schema = {"k": str, "vs": str}

    def process(self, key, window, elements):
        values = sorted(e["v"] for e in elements)
        if 13 in values:
            raise ValueError("unlucky window")
        yield {"k": key, "vs": " ".join(map(str, values))}


class PickyMean(MeanFn):
    def get_result(self, acc):
        if acc[0] % 7 == 0:
            raise ZeroDivisionError("a sum of sevens")
        return super().get_result(acc)


@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.sampled_from([1, 2, 13]), st.integers(0, 120_000)),
        max_size=60,
    )
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_a_window_whose_function_raises_on_firing_is_dead_lettered_whole_and_released(items):
    """Nothing lost, state bounded: every element is either in a fired window's output or in
    the dead letter of the window that raised (with its key, bounds, the step and the
    exception), once; and after the watermark passed every window no window state is left."""
    evs = [{"k": k, "v": v, "ts": ts} for k, v, ts in items]
    h = window_harness(
        TumblingEventTimeWindows.of(timedelta(seconds=30)), "k", Picky(), timestamp_field="ts"
    )
    h.process_elements(evs)
    out = h.process_watermark(10**12)
    emitted = sorted(int(v) for r in out for v in r["vs"].split())
    letters = h.dead_letters
    lettered = sorted(e["v"] for letter, _ in letters for e in letter["elements"])
    assert sorted(emitted + lettered) == sorted(e["v"] for e in evs)
    windows = defaultdict(list)
    for e in evs:
        windows[(e["k"], e["ts"] // 30_000)].append(e["v"])
    bad = {w for w, vs in windows.items() if 13 in vs}
    assert len(letters) == len(bad)
    starts = {(k, key(k, n * 30_000)[1].isoformat()) for k, n in bad}
    assert {(letter["key"], letter["window_start"]) for letter, _ in letters} == starts
    for _, reason in letters:
        assert "on_timer: the window function raised ValueError: unlucky" in reason
        assert "its state was cleared" in reason
    assert not any(h.state(k, "windows") for k in "ab")


def test_an_aggregate_whose_result_raises_dead_letters_its_accumulator_or_stops_under_fail():
    evs = [{"k": "a", "v": 7, "ts": 1_000}, {"k": "a", "v": 7, "ts": 2_000}]
    evs += [{"k": "b", "v": 1, "ts": 1_000}]
    h = window_harness(
        TumblingEventTimeWindows.of(timedelta(seconds=30)), "k", PickyMean(), timestamp_field="ts"
    )
    h.process_elements(evs)
    out = h.process_watermark(10**12)
    assert [r["k"] for r in out] == ["b"]
    [(letter, reason)] = h.dead_letters
    assert letter["key"] == "a" and letter["accumulator"] == [14, 2]
    assert letter["window_start"] == "1970-01-01T00:00:00" and "ZeroDivisionError" in reason
    assert not h.state("a", "windows")

    from stateful_runtime.exceptions import UserFunctionError
    from stateful_runtime.job import ErrorPolicy

    strict = window_harness(
        TumblingEventTimeWindows.of(timedelta(seconds=30)),
        "k",
        PickyMean(),
        timestamp_field="ts",
        errors=ErrorPolicy("fail"),
    )
    strict.process_elements(evs)
    with pytest.raises(UserFunctionError, match="a sum of sevens"):
        strict.process_watermark(10**12)
    assert strict.dead_letters == []
    assert strict.state("a", "windows")  # kept as it was: the batch is replayed
