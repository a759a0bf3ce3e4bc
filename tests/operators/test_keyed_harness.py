"""Keyed state, timers, TTL and side outputs through the test harness (the Spark path's code)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stateful_runtime import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    MapStateDescriptor,
    OutputTag,
    ReducingStateDescriptor,
    StateTtlConfig,
    TimeDomain,
    UpdateType,
    ValueStateDescriptor,
)
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import to_ms
from stateful_runtime.operators.keyed import TIMERS_STATE
from stateful_runtime.testing import KeyedProcessHarness

# Every test runs on each state backend (tests/operators/conftest.py).


class Mean(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc):
        return acc[0] / acc[1]

    def merge(self, a, b):
        return (a[0] + b[0], a[1] + b[1])


class AllStates(KeyedProcessFunction):
    output_schema = {"k": str, "n": int}

    def open(self, ctx):
        self.value = ctx.get_state(ValueStateDescriptor("last", int))
        self.items = ctx.get_list_state(ListStateDescriptor("items", int))
        self.by_parity = ctx.get_map_state(MapStateDescriptor("by_parity", str, int))
        self.total = ctx.get_reducing_state(ReducingStateDescriptor("total", lambda a, b: a + b))
        self.mean = ctx.get_aggregating_state(AggregatingStateDescriptor("mean", Mean()))

    def process_element(self, e, ctx):
        n = e["n"]
        self.value.update(n)
        self.items.add(n)
        parity = "even" if n % 2 == 0 else "odd"
        self.by_parity.put(parity, (self.by_parity.get(parity) or 0) + 1)
        self.total.add(n)
        self.mean.add(n)
        if n < 0:
            self.value.clear()
            self.items.clear()
            self.by_parity.clear()
            self.total.clear()
            self.mean.clear()
        yield {"k": ctx.get_current_key(), "n": n}


def test_every_state_type_reads_and_writes_per_key():
    h = KeyedProcessHarness(AllStates(), key_by="k")
    for i, n in enumerate([1, 2, 3, 4]):
        h.process_element({"k": "a", "n": n}, timestamp=i)
    h.process_element({"k": "b", "n": 10}, timestamp=5)
    assert h.state("a", "last") == 4 and h.state("b", "last") == 10
    assert h.state("a", "items") == [1, 2, 3, 4]
    assert h.state("a", "by_parity") == {"odd": 2, "even": 2}
    assert h.state("a", "total") == 10
    assert h.state("a", "mean") == 2.5
    assert h.state("b", "mean") == 10
    h.process_element({"k": "a", "n": -1}, timestamp=6)
    for name in ("last", "items", "by_parity", "total", "mean"):
        assert h.state("a", name) is None, name
    assert h.state("b", "total") == 10
    assert [o["n"] for o in h.output] == [1, 2, 3, 4, 10, -1]


class Timers(KeyedProcessFunction):
    output_schema = {"k": str, "fired": int}

    def open(self, ctx):
        self.pending = ctx.get_state(ValueStateDescriptor("pending", int))

    def process_element(self, e, ctx):
        if e.get("cancel"):
            ctx.timer_service().delete_event_time_timer(ctx.timestamp() + timedelta(seconds=1))
            return
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + timedelta(seconds=1))
        self.pending.update((self.pending.value() or 0) + 1)
        yield from ()

    def on_timer(self, timestamp, ctx):
        self.pending.update(self.pending.value() - 1)
        yield {"k": ctx.get_current_key(), "fired": to_ms(timestamp)}


def test_event_time_timers_fire_once_in_order_and_can_be_deleted():
    h = KeyedProcessHarness(Timers(), key_by="k")
    h.process_element({"k": "a"}, timestamp=1_000)
    h.process_element({"k": "a"}, timestamp=1_000)  # same instant: one timer
    h.process_element({"k": "a"}, timestamp=3_000)
    h.process_element({"k": "b"}, timestamp=500)
    h.process_element({"k": "b", "cancel": True}, timestamp=500)
    assert h.user_timers("a") == [2_000, 4_000] and h.user_timers("b") == []
    assert h.process_watermark(1_999) == []
    assert h.process_watermark(5_000) == [{"k": "a", "fired": 2_000}, {"k": "a", "fired": 4_000}]
    assert h.process_watermark(10_000) == []  # nothing fires twice
    assert h.state("a", "pending") == 1  # two registrations, one timer, two firings → 3 - 2


def test_due_timers_fire_before_the_keys_next_elements():
    # Flink order: a timer due by the watermark acts before later elements of its key.
    h = KeyedProcessHarness(Timers(), key_by="k", timestamp_field="ts")
    h.process_element({"k": "a"}, timestamp=0)
    # A batch whose watermark moved, with an element of the key: the timer acts first.
    h.process_elements([{"k": "a", "ts": 6_000}], watermark=5_000)
    assert h.output[0] == {"k": "a", "fired": 1_000}


class Proc(KeyedProcessFunction):
    output_schema = {"k": str}
    time_domain = TimeDomain.PROCESSING_TIME

    def open(self, ctx):
        self.seen = ctx.get_state(
            ValueStateDescriptor(
                "seen",
                int,
                ttl=StateTtlConfig(
                    timedelta(seconds=10), UpdateType.ON_READ_AND_WRITE, TimeDomain.PROCESSING_TIME
                ),
            )
        )

    def process_element(self, e, ctx):
        if e.get("read"):
            self.seen.value()
        else:
            self.seen.update(1)
        ctx.timer_service().register_processing_time_timer(
            ctx.timer_service().current_processing_time() + timedelta(seconds=5)
        )
        return ()

    def on_timer(self, timestamp, ctx):
        yield {"k": ctx.get_current_key()}


def test_processing_time_timers_and_ttl_with_refresh_on_read():
    h = KeyedProcessHarness(Proc(), key_by="k")
    h.set_processing_time(0)
    h.process_element({"k": "a"}, timestamp=0)
    assert h.set_processing_time(4_999) == []
    assert h.set_processing_time(5_000) == [{"k": "a"}]
    h.set_processing_time(8_000)
    h.process_element({"k": "a", "read": True}, timestamp=0)  # read at 8 s restarts the clock
    h.set_processing_time(17_000)
    assert h.state("a", "seen") == 1
    h.set_processing_time(18_000)
    assert h.state("a", "seen") is None  # expired: never returned


class Dedup(KeyedProcessFunction):
    output_schema = {"id": str}

    def __init__(self, update_type=UpdateType.ON_CREATE_AND_WRITE):
        self.update_type = update_type

    def open(self, ctx):
        self.seen = ctx.get_state(
            ValueStateDescriptor(
                "seen",
                bool,
                ttl=StateTtlConfig(timedelta(hours=24), self.update_type, TimeDomain.EVENT_TIME),
            )
        )
        self.notes = ctx.get_map_state(
            MapStateDescriptor(
                "notes",
                str,
                int,
                ttl=StateTtlConfig(timedelta(hours=1), time_domain=TimeDomain.EVENT_TIME),
            )
        )

    def process_element(self, e, ctx):
        self.notes.put(e.get("note", "x"), 1)
        if self.seen.value():
            return
        self.seen.update(True)
        yield {"id": e["id"]}


H = 3_600_000


def test_event_time_ttl_expires_by_element_time_and_is_cleaned_by_the_watermark():
    h = KeyedProcessHarness(Dedup(), key_by="id")
    assert h.process_element({"id": "t1"}, timestamp=0) == [{"id": "t1"}]
    assert h.process_element({"id": "t1"}, timestamp=23 * H) == []  # duplicate within 24 h
    assert h.process_element({"id": "t1"}, timestamp=24 * H) == [{"id": "t1"}]  # expired
    assert h.state("t1", "seen") is True
    h.process_element({"id": "t2", "note": "a"}, timestamp=0)
    assert h.timers("t2")  # cleanup timers exist ...
    h.process_watermark(25 * H)
    assert h.state("t2", "seen") is None and h.state("t2", "notes") is None
    assert h.timers("t2") == []  # ... and are gone once the state is cleaned
    stored = h.stored_states()  # really removed, not just hidden: the value and the map
    assert ("seen", ("t2",)) not in stored and ("notes", ("t2",)) not in stored
    assert ("seen", ("t1",)) in stored  # (written at 24 h: lives on)


class TtlAndTimers(KeyedProcessFunction):
    """Event-time TTL state and a user timer at the TTL's own cleanup instant."""

    output_schema = {"id": str, "fired": int, "seen": bool}

    def open(self, ctx):
        self.seen = ctx.get_state(
            ValueStateDescriptor(
                "seen",
                bool,
                ttl=StateTtlConfig(timedelta(hours=1), time_domain=TimeDomain.EVENT_TIME),
            )
        )

    def process_element(self, e, ctx):
        self.seen.update(True)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + timedelta(hours=1))
        return ()

    def on_timer(self, timestamp, ctx):
        yield {
            "id": ctx.get_current_key(),
            "fired": to_ms(timestamp),
            "seen": bool(self.seen.value()),
        }


def test_a_user_timer_and_a_ttl_cleanup_at_one_instant_fire_once_and_each_acts():
    h = KeyedProcessHarness(TtlAndTimers(), key_by="id")
    h.process_element({"id": "a"}, timestamp=0)
    assert h.user_timers("a") == [H] and h.timers("a") == [H]  # one timer, both kinds
    assert h.process_watermark(2 * H) == [{"id": "a", "fired": H, "seen": False}]
    assert ("seen", ("a",)) not in h.stored_states() and h.timers("a") == []


def test_functions_with_one_kind_of_timer_never_touch_the_timer_kind_map():
    """On Spark each state access is a round trip per key: TTL-only and timer-only functions
    must not read or write ``_srt_timers``."""
    for fn, key in ((Dedup(), "id"), (Timers(), "k")):
        h = KeyedProcessHarness(fn, key_by=key)
        h.process_element({key: "a"}, timestamp=0)
        h.process_element({key: "a"}, timestamp=10)
        assert h.timers("a")
        h.process_watermark(30 * H)
        assert not any(name == TIMERS_STATE for name, _ in h.stored_states()), type(fn).__name__


def test_event_time_ttl_refresh_on_read():
    h = KeyedProcessHarness(Dedup(UpdateType.ON_READ_AND_WRITE), key_by="id")
    h.process_element({"id": "t"}, timestamp=0)
    h.process_element({"id": "t"}, timestamp=20 * H)  # read refreshes to 44 h
    assert h.process_element({"id": "t"}, timestamp=30 * H) == []


LATE = OutputTag("big", {"k": str, "n": int})


class Side(KeyedProcessFunction):
    output_schema = {"k": str, "n": int}
    side_outputs = (LATE,)

    def process_element(self, e, ctx):
        if e["n"] > 10:
            ctx.output(LATE, {"k": e["k"], "n": e["n"]})
        else:
            yield e


def test_side_outputs_by_tag():
    h = KeyedProcessHarness(Side(), key_by="k")
    h.process_element({"k": "a", "n": 1}, timestamp=0)
    h.process_element({"k": "a", "n": 50}, timestamp=1)
    assert h.output == [{"k": "a", "n": 1}]
    assert h.side_output(LATE) == [{"k": "a", "n": 50}]


def test_mismatched_time_domains_and_undeclared_side_outputs_are_errors():
    class Bad(KeyedProcessFunction):
        output_schema = {"k": str}

        def open(self, ctx):
            ctx.get_state(ValueStateDescriptor("s", int, ttl=StateTtlConfig(timedelta(1))))

    with pytest.raises(ConfigError, match="processing_time TTL but Bad runs in event_time"):
        KeyedProcessHarness(Bad(), key_by="k")

    class BadTimer(KeyedProcessFunction):
        output_schema = {"k": str}

        def process_element(self, e, ctx):
            ctx.timer_service().register_processing_time_timer(ctx.timestamp())
            return ()

    with pytest.raises(ConfigError, match="cannot use processing_time timers"):
        KeyedProcessHarness(BadTimer(), key_by="k").process_element({"k": "a"}, timestamp=0)

    class Undeclared(KeyedProcessFunction):
        output_schema = {"k": str}

        def process_element(self, e, ctx):
            ctx.output(LATE, e)
            return ()

    with pytest.raises(ConfigError, match="not in its side_outputs"):
        KeyedProcessHarness(Undeclared(), key_by="k").process_element({"k": "a"}, timestamp=0)


class MapKeys(KeyedProcessFunction):
    """Lists a map's keys in the call that changes it: the stored ones, its own puts, not its
    removals (what a join reads its buffers' times with)."""

    output_schema = {"keys": str, "empty": bool, "items": str}

    def open(self, ctx):
        self.m = ctx.get_map_state(MapStateDescriptor("m", int, list))

    def process_element(self, value, ctx):
        if value["op"] == "put":
            self.m.put(value["at"], [value["at"]])
        else:
            self.m.remove(value["at"])
        yield {
            "keys": ",".join(str(k) for k in sorted(self.m.keys())),
            "empty": self.m.is_empty(),
            "items": ",".join(f"{k}:{v}" for k, v in sorted(self.m.items())),
        }


def test_map_keys_in_a_call_see_its_own_puts_and_removals():
    h = KeyedProcessHarness(MapKeys(), "k")
    rows = [
        h.process_element({"k": "a", "op": op, "at": at}, timestamp=1)
        for op, at in [("put", 2), ("put", 1), ("remove", 2), ("remove", 1), ("put", 3)]
    ]
    assert [(r["keys"], r["empty"], r["items"]) for [r] in rows] == [
        ("2", False, "2:[2]"),
        ("1,2", False, "1:[1],2:[2]"),
        ("1", False, "1:[1]"),
        ("", True, ""),
        ("3", False, "3:[3]"),
    ]
