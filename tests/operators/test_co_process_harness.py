"""A keyed co-process function through the test harness's two inputs (the cluster's code:
the connected streams' records tagged by input and handed to ``process_element1`` / ``2``):
shared state and timers across the inputs, isolation of an element naming its input."""

from __future__ import annotations

from datetime import timedelta

import pytest

from examples.payment_refunds import UNMATCHED, MatchRefunds
from stateful_runtime import KeyedCoProcessFunction, ValueStateDescriptor
from stateful_runtime.job import ErrorPolicy
from stateful_runtime.testing import KeyedCoProcessHarness

# Every test runs on each state backend (tests/operators/conftest.py).

M = 60_000


def pay(txn: str, ts: int, amount: int = 1_000) -> dict:
    return {"txn_id": txn, "merchant_id": "M1", "amount_paise": amount, "ts_ms": ts}


def refund(rid: str, txn: str, ts: int, paise: int = 300) -> dict:
    return {"refund_id": rid, "txn_id": txn, "refund_paise": paise, "ts_ms": ts}


def harness() -> KeyedCoProcessHarness:
    return KeyedCoProcessHarness(MatchRefunds(), key_by="txn_id", timestamp_field="ts_ms")


def test_both_inputs_share_the_keys_state_whichever_comes_first():
    h = harness()
    assert h.process_element2(refund("r1", "t1", 1_000)) == []  # before its payment: waits
    assert h.state("t1", "waiting_refunds") == [refund("r1", "t1", 1_000)]
    [first] = h.process_element1(pay("t1", 500))
    assert first["refund_id"] == "r1" and first["refunded_paise"] == 300
    assert h.state("t1", "waiting_refunds") is None
    [second] = h.process_element2(refund("r2", "t1", 2_000, paise=800))
    assert (second["refunded_paise"], second["over_refund"]) == (1_100, True)
    assert second["merchant_id"] == "M1"  # from the payment the first input put in state
    # Other keys are apart: t2's refund finds no payment.
    assert h.process_element2(refund("r3", "t2", 2_000)) == []


def test_one_timer_service_for_both_inputs():
    h = harness()
    h.process_element1(pay("t1", 0))
    h.process_element2(refund("r9", "t9", M))  # no payment: unmatched after 30 minutes
    assert h.user_timers("t1") == [30 * M] and h.user_timers("t9") == [31 * M]
    h.process_watermark(30 * M)  # t1's payment is forgotten
    assert h.state("t1", "payment") is None
    assert h.process_element2(refund("r1", "t1", 30 * M)) == []  # too late to match: waits
    h.process_watermark(31 * M)
    assert h.side_output(UNMATCHED) == [refund("r9", "t9", M)]
    h.process_watermark(60 * M)
    assert [r["refund_id"] for r in h.side_output(UNMATCHED)] == ["r9", "r1"]


def test_a_call_that_raises_is_dead_lettered_naming_its_input_and_changes_nothing():
    h = harness()
    h.process_element1(pay("t1", 0))
    h.process_element2(refund("r1", "t1", 1_000))
    assert h.process_element2(refund("bad", "t1", 2_000, paise=-5)) == []
    [(record, reason)] = h.dead_letters
    assert record == refund("bad", "t1", 2_000, paise=-5)  # the input's record, untagged
    assert reason.startswith("MatchRefunds: process_element2 (input 2) raised ValueError: refund")
    assert h.state("t1", "refunded_paise") == 300


def test_under_the_fail_policy_the_harness_raises_as_the_job_would_stop():
    from stateful_runtime.exceptions import UserFunctionError

    h = KeyedCoProcessHarness(
        MatchRefunds(), key_by="txn_id", timestamp_field="ts_ms", errors=ErrorPolicy("fail")
    )
    with pytest.raises(UserFunctionError, match="process_element2"):
        h.process_element2(refund("bad", "t1", 0, paise=0))


class LimitByMerchant(KeyedCoProcessFunction):
    """Different key fields on the two inputs: payments by merchant_id, limits by merchant."""

    output_schema = {"txn_id": str, "over": int}

    def open(self, ctx):
        self.limit = ctx.get_state(ValueStateDescriptor("limit", int))

    def process_element1(self, payment, ctx):
        limit = self.limit.value()
        if limit is not None and payment["amount_paise"] > limit:
            yield {"txn_id": payment["txn_id"], "over": payment["amount_paise"] - limit}

    def process_element2(self, update, ctx):
        assert set(update) == {"merchant", "limit_paise", "ts_ms"}
        self.limit.update(update["limit_paise"])
        return ()


def test_the_second_input_may_be_keyed_by_fields_of_other_names():
    h = KeyedCoProcessHarness(
        LimitByMerchant(), key_by="merchant_id", key_by2="merchant", timestamp_field="ts_ms"
    )
    assert h.process_element1(pay("t1", 0, amount=900)) == []
    h.process_element2({"merchant": "M1", "limit_paise": 500, "ts_ms": 1})
    assert h.process_element1(pay("t2", 2, amount=900)) == [{"txn_id": "t2", "over": 400}]
    assert h.state("M1", "limit") == 500
    with pytest.raises(TypeError, match="process_element1 or process_element2"):
        h.process_element(pay("t3", 3))


def test_timedelta_window_of_the_example_is_a_setting():
    h = KeyedCoProcessHarness(
        MatchRefunds(timedelta(minutes=5)), key_by="txn_id", timestamp_field="ts_ms"
    )
    h.process_element1(pay("t1", 0))
    assert h.user_timers("t1") == [5 * M]
