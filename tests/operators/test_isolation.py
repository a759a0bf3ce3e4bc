"""A user function that raises, isolated by the keyed engine (the code the cluster runs, driven
through the test harness): the element or timer is dead-lettered with the step and the reason,
and the key's state, timers and outputs are exactly as if it had never come, whatever the
function changed before it raised; the window operator's user functions the same; under
``errors.policy=fail`` and past the bound the call raises instead."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    OutputTag,
    ValueStateDescriptor,
)
from stateful_runtime.exceptions import UserFunctionError
from stateful_runtime.job import ErrorPolicy
from stateful_runtime.operators.backend import MemoryBackend
from stateful_runtime.operators.isolation import StepGuard
from stateful_runtime.operators.keyed import KeyedOperator
from stateful_runtime.testing import KeyedProcessHarness, window_harness
from stateful_runtime.windows import TumblingEventTimeWindows

NO_BOUND = ErrorPolicy(max_consecutive=10**9, max_fraction=1.0)
ALERTS = OutputTag("alerts", {"k": str, "n": int})


class InPlace(AggregateFunction):
    """An accumulator changed in place (a dict), as many user aggregates do."""

    def create_accumulator(self):
        return {"sum": 0, "seen": []}

    def add(self, value, acc):
        acc["sum"] += value
        acc["seen"].append(value)
        return acc

    def get_result(self, acc):
        return acc["sum"]

    def merge(self, a, b):
        return {"sum": a["sum"] + b["sum"], "seen": a["seen"] + b["seen"]}


class Everything(KeyedProcessFunction):
    """Changes every kind of state, registers and deletes timers, writes both outputs, then
    raises when the element says so (and on_timer at a timestamp ending in 13)."""

    output_schema = {"k": str, "n": int}
    side_outputs = (ALERTS,)

    def open(self, ctx):
        self.last = ctx.get_state(ValueStateDescriptor("last", int))
        self.items = ctx.get_list_state(ListStateDescriptor("items", int))
        self.counts = ctx.get_map_state(MapStateDescriptor("counts", int, list))
        self.agg = ctx.get_aggregating_state(AggregatingStateDescriptor("agg", InPlace()))
        self.fired = ctx.get_state(ValueStateDescriptor("fired", int))

    def process_element(self, e, ctx):
        n = e["n"]
        self.last.update(n)
        self.items.add(n)
        bucket = self.counts.get(n % 3) or []
        bucket.append(n)  # changed in place, then put back
        self.counts.put(n % 3, bucket)
        if n % 5 == 0:
            self.counts.remove((n + 1) % 3)
        self.agg.add(n)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + timedelta(seconds=n))
        if n % 4 == 0:
            ctx.timer_service().delete_event_time_timer(ctx.timestamp() + timedelta(seconds=4))
        ctx.output(ALERTS, {"k": e["k"], "n": n})
        yield {"k": e["k"], "n": n}
        if e["fail"]:
            raise ValueError(f"cannot take {n}")

    def on_timer(self, timestamp, ctx):
        self.fired.update((self.fired.value() or 0) + 1)
        self.items.add(-1)
        yield {"k": ctx.get_current_key(), "n": -1}
        if round(timestamp.timestamp() * 1000) % 100 == 13:
            raise RuntimeError("timer")


def _state(h: KeyedProcessHarness, keys: set[str]) -> dict:
    names = ["last", "items", "counts", "agg", "fired"]
    return {
        k: ({n: h.state(k, n) for n in names}, h.timers(k), h.user_timers(k)) for k in sorted(keys)
    }


element = st.fixed_dictionaries(
    {
        "k": st.sampled_from("ab"),
        "n": st.integers(0, 40),
        "ts": st.integers(0, 20_000),
        "fail": st.booleans(),
    }
)


FEED = st.lists(st.tuples(element, st.integers(0, 3_000)), max_size=25)


def _as_if_never_came(feed) -> None:
    """The harness fed every element equals the harness fed only those that do not fail:
    state, timers, main and side outputs; the failures are its dead letters, in order."""
    with (
        KeyedProcessHarness(Everything(), "k", "ts", errors=NO_BOUND, name="everything") as failing,
        KeyedProcessHarness(Everything(), "k", "ts", errors=NO_BOUND) as clean,
    ):
        _compare(feed, failing, clean)


def _compare(feed, failing: KeyedProcessHarness, clean: KeyedProcessHarness) -> None:
    watermark = 0
    for e, advance in feed:
        failing.process_element(e)
        if not e["fail"]:
            clean.process_element(e)
        watermark += advance
        failing.process_watermark(watermark)
        clean.process_watermark(watermark)
    keys = {e["k"] for e, _ in feed}
    assert _state(failing, keys) == _state(clean, keys)
    assert failing.output == clean.output
    assert failing.side_output(ALERTS) == clean.side_output(ALERTS)
    elements = [(d, r) for d, r in failing.dead_letters if "ts" in d]
    assert [d for d, _ in elements] == [e for e, _ in feed if e["fail"]]
    assert all(
        r.startswith("everything: process_element raised ValueError: cannot take")
        for _, r in elements
    )


@settings(max_examples=40, deadline=None)
@given(FEED)
def test_a_failed_call_leaves_state_timers_and_outputs_as_if_it_never_came(feed):
    _as_if_never_came(feed)


def test_a_timer_that_raises_is_dead_lettered_and_changes_nothing():
    h = KeyedProcessHarness(Everything(), "k", "ts")
    h.process_element({"k": "a", "n": 1, "ts": 12, "fail": False})  # a timer at 1_012
    h.process_watermark(1_012)
    assert h.state("a", "fired") == 1  # a timer that returns is applied
    h = KeyedProcessHarness(Everything(), "k", "ts")
    h.process_element({"k": "a", "n": 1, "ts": 13, "fail": False})  # a timer at 1_013
    before = _state(h, {"a"})["a"][0]
    h.process_watermark(1_013)
    assert _state(h, {"a"})["a"][0] == before  # the timer's call changed nothing
    assert h.output == [{"k": "a", "n": 1}]  # and emitted nothing
    [(letter, reason)] = h.dead_letters
    assert letter["key"] == "a" and letter["timer"].startswith("1970-01-01T00:00:01.013")
    assert reason.startswith("Everything: on_timer raised RuntimeError: timer")
    assert h.timers("a") == []  # consumed: it does not fire (and fail) for ever


def test_the_fail_policy_raises_with_the_step_and_the_record():
    h = KeyedProcessHarness(Everything(), "k", "ts", errors=ErrorPolicy("fail"), name="step")
    with pytest.raises(UserFunctionError, match=r"step: process_element raised ValueError"):
        h.process_element({"k": "a", "n": 3, "ts": 5, "fail": True})
    assert h.state("a", "last") is None


def test_a_function_that_fails_for_every_element_stops_after_the_bound():
    h = KeyedProcessHarness(Everything(), "k", "ts", errors=ErrorPolicy(max_consecutive=3))
    failing = [{"k": "a", "n": 3, "ts": ts, "fail": True} for ts in range(3)]
    h.process_elements(failing[:2])  # two in a row in one batch: dead-lettered
    assert len(h.dead_letters) == 2
    with pytest.raises(UserFunctionError, match="rejected 3 records in a row"):
        h.process_elements(failing)  # a task counts its own: three in a row stop the job
    assert len(h.dead_letters) == 2  # and the failed batch dead-letters nothing


class FailingSum(AggregateFunction):
    """Adds in place, then raises on 13: the window's accumulator must not keep the 13."""

    def create_accumulator(self):
        return {"sum": 0}

    def add(self, value, acc):
        acc["sum"] += value["v"]
        if value["v"] == 13:
            raise OverflowError("13")
        return acc

    def get_result(self, acc):
        return {"sum": acc["sum"]}

    def merge(self, a, b):
        return {"sum": a["sum"] + b["sum"]}


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("ab"), st.sampled_from([1, 2, 13]), st.integers(0, 5_000)))
)
def test_the_window_operator_isolates_a_record_its_aggregate_raises_on(rows):
    h = window_harness(
        TumblingEventTimeWindows.of(timedelta(seconds=1)),
        "k",
        FailingSum(),
        timestamp_field="ts",
        errors=NO_BOUND,
    )
    for k, v, ts in rows:
        h.process_element({"k": k, "v": v, "ts": ts})
    h.process_watermark(10_000)
    got = {(r["k"], r["window_start"].timestamp()): r["sum"] for r in h.output}
    expected: dict = {}
    for k, v, ts in rows:
        if v != 13:
            start = (ts // 1000) * 1.0
            expected[(k, start)] = expected.get((k, start), 0) + v
    # a window whose only records were 13s has no result at all
    assert {w: s for w, s in got.items()} == expected
    assert [d["v"] for d, _ in h.dead_letters] == [v for _, v, _ in rows if v == 13]


def test_the_share_bound_is_over_the_whole_task_not_the_first_key():
    """A keyed task meets one key's elements together: a bad key first must not stop a task
    whose share of failures is small; a task whose share is large stops at its end."""
    guard = StepGuard("totals", "payments", ErrorPolicy(max_fraction=0.1), None)
    op = KeyedOperator(Everything(), guard)
    op.open(MemoryBackend(clock=lambda: 0))
    op.process(("bad",), [(i, {"k": "bad", "n": 1, "ts": i, "fail": True}) for i in range(12)])
    op.process(("ok",), [(i, {"k": "ok", "n": 1, "ts": i, "fail": False}) for i in range(200)])
    assert guard.stage() == 0  # 12 of 212: staged (no directory in this test)
    assert len(guard.rejected_records) == 12
    guard = StepGuard("totals", "payments", ErrorPolicy(max_fraction=0.1), None)
    op = KeyedOperator(Everything(), guard)
    op.open(MemoryBackend(clock=lambda: 0))
    op.process(("bad",), [(i, {"k": "bad", "n": 1, "ts": i, "fail": True}) for i in range(12)])
    op.process(("ok",), [(i, {"k": "ok", "n": 1, "ts": i, "fail": False}) for i in range(50)])
    with pytest.raises(UserFunctionError, match=r"rejected 12 of the 62 records of one task"):
        guard.stage()


@settings(max_examples=60, deadline=None)
@given(st.lists(element, max_size=30))
def test_a_keys_elements_in_one_turn_equal_one_turn_each(elements):
    """The Arrow path hands a key's elements over in one turn, where the engine holds the
    committed writes of plain value cells until the turn ends: state, timers, outputs and dead
    letters equal those of one turn per element, failures included."""

    def run(turns: list[list[dict]]) -> tuple:
        guard = StepGuard("everything", "in", NO_BOUND, None)
        op = KeyedOperator(Everything(), guard)
        backend = MemoryBackend(clock=lambda: 0)
        op.open(backend)
        op.set_time(-1, 0)  # no timer is due: a turn fires the due ones before its elements
        for turn in turns:
            op.process(("a",), [(e["ts"], e) for e in turn])
        return backend.data, backend.timers, op.drain(), guard.rejected_records

    assert run([elements]) == run([[e] for e in elements])


class TwoHandles(KeyedProcessFunction):
    """One state declared twice: each handle sees what the other's earlier calls wrote."""

    output_schema = {"n": int}

    def open(self, ctx):
        self.a = ctx.get_state(ValueStateDescriptor("n", int))
        self.b = ctx.get_state(ValueStateDescriptor("n", int))

    def process_element(self, e, ctx):
        before = self.b.value() or 0
        self.a.update(before + 1)
        yield {"n": before}


def test_two_handles_of_one_state_see_each_others_writes_within_a_turn():
    op = KeyedOperator(TwoHandles())
    backend = MemoryBackend(clock=lambda: 0)
    op.open(backend)
    op.process(("a",), [(i, {"i": i}) for i in range(3)])
    assert [r["n"] for r in op.drain()[0]] == [0, 1, 2]
