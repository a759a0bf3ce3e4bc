"""The interval join and the temporal join through the test harness (the cluster's code: a
join is a co-process function over connected streams): exact outputs with out-of-order inputs,
state removed once the watermark passes, late records dropped and counted or sent to a side
output, on each state backend."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stateful_runtime import (
    JoinFunction,
    OutputTag,
    ProcessJoinFunction,
    SlidingEventTimeWindows,
    TemporalJoinFunction,
    TumblingEventTimeWindows,
)
from stateful_runtime.functions import to_ms
from stateful_runtime.testing import (
    interval_join_harness,
    temporal_join_harness,
    window_join_harness,
)

# Every test runs on each state backend (tests/operators/conftest.py).

M = 60_000


def pay(txn: str, ts: int, merchant: str = "M1") -> dict:
    return {"txn_id": txn, "merchant_id": merchant, "amount_paise": 1_000, "ts_ms": ts}


def refund(rid: str, txn: str, ts: int) -> dict:
    return {"refund_id": rid, "txn_id": txn, "refund_paise": 300, "ts_ms": ts}


class PairRefund(ProcessJoinFunction):
    output_schema = {"refund_id": str, "txn_id": str, "after_ms": int, "at_ms": int}

    def process_element(self, payment, refund, ctx):
        if refund["refund_paise"] < 0:
            raise ValueError("negative refund")
        yield {
            "refund_id": refund["refund_id"],
            "txn_id": payment["txn_id"],
            "after_ms": to_ms(ctx.right_timestamp()) - to_ms(ctx.left_timestamp()),
            "at_ms": to_ms(ctx.timestamp()),
        }


def interval(**kw):
    return interval_join_harness(
        PairRefund(), timedelta(0), timedelta(minutes=30), "txn_id", "ts_ms", **kw
    )


def test_interval_join_matches_whichever_side_comes_first_within_the_bounds():
    h = interval()
    assert h.process_element2(refund("r1", "t1", 10 * M)) == []  # before its payment
    assert h.process_element1(pay("t1", 0)) == [
        {"refund_id": "r1", "txn_id": "t1", "after_ms": 10 * M, "at_ms": 10 * M}
    ]
    assert h.process_element2(refund("r2", "t1", 31 * M)) == []  # after the upper bound
    assert h.process_element2(refund("r3", "t2", 4 * M)) == []
    assert h.process_element1(pay("t2", 5 * M)) == []  # r3 came before t2: below lower = 0
    [both] = h.process_element2(refund("r4", "t1", 30 * M))  # the upper bound is included
    assert both["after_ms"] == 30 * M
    assert h.state("t1", "left_buffer") == {0: [pay("t1", 0)]}
    assert h.state("t1", "right_buffer") == {
        10 * M: [refund("r1", "t1", 10 * M)],
        30 * M: [refund("r4", "t1", 30 * M)],
        31 * M: [refund("r2", "t1", 31 * M)],
    }
    # Two payments at one time and key: each meets the refund.
    h.process_element1(pay("t1", 0) | {"amount_paise": 7})
    assert len(h.process_element2(refund("r5", "t1", 20 * M))) == 2


def test_interval_join_state_goes_once_the_watermark_passes_and_late_records_are_dropped():
    h = interval()
    h.process_element1(pay("t1", 0))
    h.process_element2(refund("r1", "t1", 10 * M))
    h.process_element1(pay("t2", 5 * M))
    h.process_watermark(10 * M + 1)  # r1 can meet no payment not yet late: gone
    assert h.state("t1", "right_buffer") is None and h.state("t1", "left_buffer") is not None
    # A refund at the watermark is not late; t1 at 0 still waits for it.
    assert [o["refund_id"] for o in h.process_element2(refund("r2", "t1", 30 * M))] == ["r2"]
    # Behind the watermark: dropped, counted, never matched (t1 would have matched it).
    assert h.process_element2(refund("late", "t1", 10 * M)) == []
    assert h.late_dropped == 1
    h.process_watermark(35 * M + 1)  # past every interval
    assert h.stored_states() == set()
    assert h.user_timers("t1") == [] and h.user_timers("t2") == []
    assert h.process_element1(pay("t9", 35 * M)) == [] and h.late_dropped == 2
    # Each mark names the record's input: the job counts each source's late records apart.


def test_interval_join_late_side_outputs_and_negative_bounds():
    left_late, right_late = OutputTag("late-payments", {}), OutputTag("late-refunds", {})
    h = interval_join_harness(
        PairRefund(),
        timedelta(minutes=-5),
        timedelta(minutes=-1),
        "txn_id",
        "ts_ms",
        left_late=left_late,
        right_late=right_late,
    )
    h.process_element2(refund("r1", "t1", 10 * M))
    assert [o["after_ms"] for o in h.process_element1(pay("t1", 12 * M))] == [-2 * M]
    assert h.process_element1(pay("t1", 16 * M)) == []  # r1 is 6 minutes before it
    h.process_watermark(20 * M)
    assert h.stored_states() == set()  # t1 at 16: rights from 11 to 15 would be late now
    h.process_element1(pay("t5", M))
    h.process_element2(refund("r5", "t5", M))
    assert h.side_output(left_late) == [pay("t5", M)]
    assert h.side_output(right_late) == [refund("r5", "t5", M)]
    assert h.late_dropped == 0


def test_interval_join_function_that_raises_dead_letters_the_arriving_record_unbuffered():
    h = interval()
    h.process_element1(pay("t1", 0))
    bad = refund("bad", "t1", M) | {"refund_paise": -1}
    assert h.process_element2(bad) == []
    [(record, reason)] = h.dead_letters
    assert record == bad
    assert reason.startswith("PairRefund: PairRefund on a right record (input 2) raised ValueError")
    assert h.state("t1", "right_buffer") is None


def test_between_refuses_a_lower_bound_after_the_upper():
    from stateful_runtime import LogSource, StreamJob, WatermarkStrategy
    from stateful_runtime.exceptions import ConfigError

    job = StreamJob("j", checkpoint=None)  # type: ignore[arg-type]
    wm = WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts_ms")
    a = job.from_source(LogSource("/tmp/x", "a", schema={"k": str, "ts_ms": int}), wm, name="a")
    b = job.from_source(LogSource("/tmp/x", "b", schema={"k": str, "ts_ms": int}), wm, name="b")
    with pytest.raises(ConfigError, match="lower bound"):
        a.key_by("k").interval_join(b.key_by("k")).between(timedelta(1), timedelta(0))
    with pytest.raises(ConfigError, match="ProcessJoinFunction"):
        a.key_by("k").interval_join(b.key_by("k")).between(timedelta(0), timedelta(1)).process(
            TierAsOf(), name="x"
        )


class TierAsOf(TemporalJoinFunction):
    output_schema = {"txn_id": str, "merchant_id": str, "tier": str, "tier_since_ms": int}

    def process_element(self, payment, version, ctx):
        since = ctx.right_timestamp()
        yield {
            "txn_id": payment["txn_id"],
            "merchant_id": payment["merchant_id"],
            "tier": None if version is None else version["tier"],
            "tier_since_ms": None if since is None else to_ms(since),
        }


def tier(merchant: str, name: str, ts: int) -> dict:
    return {"merchant_id": merchant, "tier": name, "ts_ms": ts}


def temporal(**kw):
    return temporal_join_harness(TierAsOf(), "merchant_id", "ts_ms", **kw)


def out(txn: str, tier_name: str | None, since: int | None, merchant: str = "M1") -> dict:
    return {"txn_id": txn, "merchant_id": merchant, "tier": tier_name, "tier_since_ms": since}


def test_temporal_join_gives_each_record_the_version_valid_at_its_time():
    late = OutputTag("late-payments", {})
    h = temporal(late=late)
    h.process_element2(tier("M1", "low", 0))
    assert h.process_element1(pay("p1", 5 * M)) == []  # held until the watermark passes it
    h.process_element2(tier("M1", "high", 10 * M))
    h.process_element1(pay("p2", 12 * M))
    h.process_element1(pay("p0", 3 * M))  # out of order
    h.process_element2(tier("M1", "mid", 4 * M))  # a version read after a later one
    assert h.process_watermark(6 * M) == [out("p0", "low", 0), out("p1", "mid", 4 * M)]
    # Versions a future record can need: mid (from 4) and high (from 10); low is gone.
    assert h.state("M1", "versions") == {
        4 * M: tier("M1", "mid", 4 * M),
        10 * M: tier("M1", "high", 10 * M),
    }
    assert h.state("M1", "pending") == {12 * M: [pay("p2", 12 * M)]}
    assert h.process_watermark(20 * M) == [out("p2", "high", 10 * M)]
    # Only the newest version stays (the table's row); nothing is pending.
    assert h.stored_states() == {("versions", ("M1",))}
    assert h.state("M1", "versions") == {10 * M: tier("M1", "high", 10 * M)}
    # Late: a payment to the side output, a version dropped and counted.
    assert h.process_element1(pay("p3", 15 * M)) == []
    assert h.side_output(late) == [pay("p3", 15 * M)]
    h.process_element2(tier("M1", "low", 19 * M))
    assert h.late_dropped == 1
    # A merchant with no version yet: None (the function decides; this one keeps it).
    h.process_element1(pay("p4", 25 * M, merchant="M2"))
    h.process_element1(pay("p5", 26 * M))
    assert h.process_watermark(30 * M) == [
        out("p4", None, None, merchant="M2"),
        out("p5", "high", 10 * M),
    ]
    assert h.stored_states() == {("versions", ("M1",))}


def test_temporal_join_output_does_not_depend_on_which_input_is_read_first():
    payments = [pay(f"p{i}", i * M + 7) for i in range(12)]
    tiers = [tier("M1", name, i * 3 * M) for i, name in enumerate(["a", "b", "c", "d"])]
    results = []
    for order in (payments + tiers, tiers + payments, [*payments[6:], *tiers, *payments[:6]]):
        h = temporal()
        for record in order:
            (h.process_element1 if "txn_id" in record else h.process_element2)(record)
        results.append(h.process_watermark(60 * M))
    assert results[0] == results[1] == results[2]
    assert [o["tier"] for o in results[0]] == ["a"] * 3 + ["b"] * 3 + ["c"] * 3 + ["d"] * 3


class PaymentRefund(JoinFunction):
    output_schema = {"txn_id": str, "refund_id": str}

    def join(self, payment, refund):
        if refund["refund_id"] == "skip":
            return None
        return {"txn_id": payment["txn_id"], "refund_id": refund["refund_id"]}


def test_window_join_pairs_each_windows_records_when_it_ends_then_forgets_them():
    h = window_join_harness(
        PaymentRefund(), TumblingEventTimeWindows.of(timedelta(minutes=10)), "txn_id", "ts_ms"
    )
    h.process_element2(refund("r1", "t1", 9 * M))  # before its payment, same window
    h.process_element1(pay("t1", M))
    h.process_element1(pay("t1", 2 * M) | {"amount_paise": 5})
    h.process_element2(refund("r2", "t1", 11 * M))  # the next window: no payment there
    h.process_element2(refund("skip", "t1", 3 * M))
    assert h.process_watermark(10 * M - 2) == []
    assert h.process_watermark(10 * M - 1) == [
        {"txn_id": "t1", "refund_id": "r1"},
        {"txn_id": "t1", "refund_id": "r1"},
    ]
    assert list(h.state("t1", "windows")) == [10 * M]
    h.process_element1(pay("t1", 5 * M))  # its window has fired: late
    assert h.late_dropped == 1
    assert h.process_watermark(20 * M) == []
    assert h.stored_states() == set()


def test_sliding_window_join_pairs_in_every_window_both_share():
    h = window_join_harness(
        PaymentRefund(),
        SlidingEventTimeWindows.of(timedelta(minutes=10), timedelta(minutes=5)),
        "txn_id",
        "ts_ms",
    )
    h.process_element1(pay("t1", 6 * M))  # windows [0, 10) and [5, 15)
    h.process_element2(refund("r1", "t1", 8 * M))  # both
    h.process_element2(refund("r2", "t1", 12 * M))  # [5, 15) and [10, 20)
    assert [o["refund_id"] for o in h.process_watermark(30 * M)] == ["r1", "r1", "r2"]
    assert h.stored_states() == set()


def test_join_state_stays_flat_over_a_long_stream():
    """600 payments, refunds and tier changes over 10 hours of event time, a batch a minute,
    the watermark following a minute behind: the state rows stop growing once the first
    intervals pass."""
    pairs, tiers = interval(), temporal()
    sizes: dict[str, list[int]] = {"interval": [], "temporal": []}
    for i in range(600):
        ts = i * M
        merchant = f"M{i % 7}"
        pairs.process_elements(
            [pay(f"t{i}", ts)], [refund(f"r{i}", f"t{i - 3}", ts)], watermark=ts - M
        )
        tiers.process_elements(
            [pay(f"t{i}", ts, merchant=merchant)], [tier(merchant, f"v{i}", ts)], watermark=ts - M
        )
        if i % 60 == 59:
            sizes["interval"].append(len(pairs.stored_states()))
            sizes["temporal"].append(len(tiers.stored_states()))
    assert len(pairs.output) == 600 - 3  # every refund met its payment, 3 minutes before
    assert len(tiers.output) == 600 - 2  # the last two wait for the watermark to pass them
    # State rows (one per state and key): the payments of the last 31 minutes (32) and the
    # refunds of the last minute (2), which records not yet late can still meet; each
    # merchant's current tier (7) and the 2 payments the watermark has not passed.
    assert sizes["interval"] == [32 + 2] * 10
    assert sizes["temporal"] == [7 + 2] * 10


class StrictTier(TierAsOf):
    def process_element(self, payment, version, ctx):
        if payment["amount_paise"] < 0:
            raise ValueError("negative payment")
        yield from super().process_element(payment, version, ctx)


def test_temporal_join_record_that_raises_is_dead_lettered_alone():
    h = temporal_join_harness(StrictTier(), "merchant_id", "ts_ms")
    h.process_element2(tier("M1", "low", 0))
    bad = pay("bad", 5 * M) | {"amount_paise": -1}
    h.process_element1(bad)
    h.process_element1(pay("p1", 5 * M))
    assert h.process_watermark(10 * M) == [out("p1", "low", 0)]
    [(record, reason)] = h.dead_letters
    assert record == bad
    assert "StrictTier.process_element raised ValueError: negative payment" in reason
    assert h.state("M1", "pending") is None


class StrictPair(PaymentRefund):
    def join(self, payment, refund):
        if refund["refund_id"] == "bad":
            raise ValueError("bad refund")
        return super().join(payment, refund)


def test_window_join_pair_that_raises_is_dead_lettered_alone():
    h = window_join_harness(
        StrictPair(), TumblingEventTimeWindows.of(timedelta(minutes=10)), "txn_id", "ts_ms"
    )
    h.process_element1(pay("t1", M))
    h.process_element2(refund("bad", "t1", 2 * M))
    h.process_element2(refund("r1", "t1", 3 * M))
    assert h.process_watermark(10 * M) == [{"txn_id": "t1", "refund_id": "r1"}]
    [(record, reason)] = h.dead_letters
    assert record == {"first": pay("t1", M), "second": refund("bad", "t1", 2 * M)}
    assert "StrictPair.join raised ValueError: bad refund" in reason
    assert h.stored_states() == set()
