"""Keyed state, timers, TTL and side outputs through the test harness (the Spark path's code)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

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
from stateful_runtime.checkpoints.keyed import STATE_ROW
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import to_ms
from stateful_runtime.operators import local_state
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


# -- a function whose only state is an event-time TTL value: cleanups that do not read --------
TTL_MS = 1_000


class LastSeen(KeyedProcessFunction):
    """Emits what the key held before each element (None once expired), then holds the
    element's ``n`` (0 clears it); ``spare``: a second state, never written (a function of
    another shape, whose cleanup timers are not its keys' only ones)."""

    output_schema = {"k": str, "was": int}

    def __init__(self, update_type=UpdateType.ON_CREATE_AND_WRITE, spare=False):
        self.update_type, self.spare = update_type, spare

    def open(self, ctx):
        ttl = StateTtlConfig(
            timedelta(milliseconds=TTL_MS), self.update_type, TimeDomain.EVENT_TIME
        )
        self.last = ctx.get_state(ValueStateDescriptor("last", int, ttl=ttl))
        if self.spare:
            ctx.get_state(ValueStateDescriptor("spare", int, ttl=ttl))

    def process_element(self, e, ctx):
        yield {"k": e["k"], "was": self.last.value()}
        if e["n"]:
            self.last.update(e["n"])
        else:
            self.last.clear()


_BATCH = st.tuples(
    st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(0, 6_000), st.integers(0, 3)), max_size=8
    ),
    st.integers(0, 1_500),  # how far the watermark moves before the batch
    st.booleans(),  # whether the batch runs on another worker (none of the values kept)
)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(_BATCH, min_size=1, max_size=8),
    st.sampled_from([UpdateType.ON_CREATE_AND_WRITE, UpdateType.ON_READ_AND_WRITE]),
    st.integers(0, 4),
)
@example(  # a key written twice by the older shape: its earlier timer must not cut it
    [([("a", 3_000, 1), ("a", 3_500, 2)], 0, False), ([], 1_200, False)],
    UpdateType.ON_CREATE_AND_WRITE,
    1,
)
@example(  # cleaned unread, then read by a late element of the batch on another worker
    [([("a", 3_000, 1)], 0, False), ([("a", 0, 2)], 1_010, True)],
    UpdateType.ON_CREATE_AND_WRITE,
    0,
)
def test_a_sole_ttl_value_is_cleaned_at_its_last_expiry_and_never_before(
    batches, update_type, upgraded_after
):
    """A key's only state, an event-time TTL value, keeps one cleanup timer (its row is
    deleted there unread); whatever the writes, clears and reads (TTL refreshed on read or
    not), in or out of order, the function sees what the TTL says, and once the watermark
    passes a value's cleanup time its row is gone and not before. The first batches may run
    a function of another shape (``spare``: a second state), as before an upgrade: the
    cleanup timers its keys hold are several and unmarked, and must not cut a live value."""
    h = KeyedProcessHarness(LastSeen(update_type, spare=True), key_by="k", timestamp_field="ts")
    model: dict[str, tuple[int, int]] = {}  # key → (value, expires)

    def cleaned(model: dict[str, tuple[int, int]], watermark: int) -> None:
        granularity = TTL_MS // 100
        for k in list(model):
            if -(-model[k][1] // granularity) * granularity <= watermark:
                del model[k]  # its cleanup timer fired: its row must be gone

    watermark = 10_000
    for i, (elements, advance, moved) in enumerate(batches):
        if i == upgraded_after:
            h.fn = LastSeen(update_type)
        if moved:
            local_state._warm.clear()
        watermark += advance
        cleaned(model, watermark)  # (due cleanups fire before the batch's elements)
        records = [{"k": k, "n": n, "ts": watermark + ts - 3_000} for k, ts, n in elements]
        want = []
        for r in records:
            stored = model.get(r["k"])
            live = stored is not None and stored[1] > r["ts"]
            want.append({"k": r["k"], "was": stored[0] if live else None})
            if live and update_type is UpdateType.ON_READ_AND_WRITE:
                model[r["k"]] = (stored[0], r["ts"] + TTL_MS)
            if r["n"]:
                model[r["k"]] = (r["n"], r["ts"] + TTL_MS)
            else:
                model.pop(r["k"], None)
        got = h.process_elements(records, watermark=watermark)
        # (a key's outputs in its order; keys in the harness's own order)
        assert sorted(got, key=lambda o: o["k"]) == sorted(want, key=lambda o: o["k"])
        cleaned(model, watermark)
        assert {k[0] for name, k in h.stored_states() if name == "last"} == set(model)
    h.process_watermark(watermark + 10 * TTL_MS)
    assert not h.stored_states() and not any(h.timers(k) for k in "abc")


@pytest.mark.parametrize("spare, reads", [(False, 0), (True, 50)])
def test_a_sole_ttl_values_cleanup_deletes_its_row_unread(monkeypatch, spare, reads):
    """The cleanups of a function whose only state is an event-time TTL value read none of
    the keys' rows (the deduplication pattern: a wave of expiries is most of its work); a
    function of another shape reads each before cutting it."""
    h = KeyedProcessHarness(LastSeen(spare=spare), key_by="k", timestamp_field="ts")
    h.process_elements([{"k": f"k{i}", "n": 1, "ts": 10_000} for i in range(50)])
    local_state._warm.clear()  # (as when the partition's next batch runs on another worker)
    read: list[bytes] = []
    get_many = h.store.get_many
    monkeypatch.setattr(h.store, "get_many", lambda rows: read.extend(rows) or get_many(rows))
    monkeypatch.setattr(h.store, "get", lambda row: read.append(row) or get_many([row])[0])
    h.process_watermark(20_000)
    assert len([r for r in read if r[2:3] == STATE_ROW]) == reads
    assert not h.stored_states()
    h.close()
