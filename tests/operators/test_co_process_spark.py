"""Connected streams on Spark (``examples/payment_refunds.py``): payments and refunds from two
event-log topics, matched by a keyed co-process function, against an oracle computed from the
inputs alone, with a restart from the checkpoint in the middle of both topics: state written by
one input and read by the other, timers of both, a refund the function raises on
dead-lettered naming its input, on each state backend."""

from __future__ import annotations

import json
import random

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, read_topic
from tests.operators.helpers import crash_before_commit, run, table

pytestmark = pytest.mark.slow

M = 60_000
T0 = 1_767_225_600_000


def inputs() -> tuple[list[dict], list[dict]]:
    """Payments every 30 s; refunds up to 20 minutes after their payment (some transactions
    have two, the second over-refunding), refunds of payments that never come, one refund of
    a negative amount; a payment and a refund five hours on close every timer."""
    rng = random.Random(11)
    payments = [
        {
            "txn_id": f"t{i}",
            "merchant_id": f"M{i % 3}",
            "amount_paise": 1_000,
            "ts_ms": T0 + i * 30_000,
        }
        for i in range(40)
    ]
    refunds = []
    for p in payments[::2]:
        for n in range(rng.choice([1, 1, 2])):
            refunds.append(
                {
                    "refund_id": f"r{len(refunds)}",
                    "txn_id": p["txn_id"],
                    "refund_paise": 400 + 300 * n,
                    "ts_ms": p["ts_ms"] + rng.randint(0, 20 * M),
                }
            )
    for k in range(4):
        refunds.append(
            {"refund_id": f"o{k}", "txn_id": f"x{k}", "refund_paise": 100, "ts_ms": T0 + k * 7 * M}
        )
    refunds.append({"refund_id": "bad", "txn_id": "t3", "refund_paise": -5, "ts_ms": T0 + 9 * M})
    refunds.sort(key=lambda r: r["ts_ms"])
    end = T0 + 5 * 60 * M
    payments.append({"txn_id": "end", "merchant_id": "M0", "amount_paise": 1, "ts_ms": end})
    refunds.append({"refund_id": "end", "txn_id": "end", "refund_paise": 1, "ts_ms": end})
    return payments, refunds


def oracle(payments: list[dict], refunds: list[dict]) -> tuple[dict, set]:
    """refund_id -> (merchant, refunded so far, over-refunded) of each matched refund, and the
    unmatched refunds' ids (every refund of a payment comes within 20 minutes of it)."""
    paid = {p["txn_id"]: p for p in payments}
    totals: dict[str, int] = {}
    matched, unmatched = {}, set()
    for r in refunds:  # each transaction's refunds in the refunds topic's order
        if r["refund_paise"] <= 0:
            continue
        p = paid.get(r["txn_id"])
        if p is None:
            unmatched.add(r["refund_id"])
            continue
        totals[r["txn_id"]] = totals.get(r["txn_id"], 0) + r["refund_paise"]
        total = totals[r["txn_id"]]
        matched[r["refund_id"]] = (p["merchant_id"], total, total > p["amount_paise"])
    return matched, unmatched


def test_refunds_matched_with_payments_across_a_restart(spark, tmp_path, state_backend):
    log = tmp_path / "log"
    for topic in ("upi-payments", "upi-refunds"):
        EventLog(log).create_topic(topic, 1)
    payments, refunds = inputs()
    lines = {
        "upi-payments": [json.dumps(p).encode() for p in payments],
        "upi-refunds": [json.dumps(r).encode() for r in refunds],
    }
    db = tmp_path / "refunds.duckdb"
    settings = {
        "sink.database": db,
        "source.max_records_per_batch": 8,
        "state.backend": state_backend,
    }
    for topic, all_lines in lines.items():
        append_lines(log, all_lines[: len(all_lines) // 2], topic=topic)
    run("payment_refunds.py", tmp_path, **settings)
    first = table(db, "SELECT count(*) FROM refund_matches")[0][0]
    if state_backend == "rocksdb_local":  # and the worker's store ahead of the commit
        crash_before_commit(tmp_path / "ck" / "payment_refunds.py" / "match-refunds", db)
    for topic, all_lines in lines.items():
        append_lines(log, all_lines[len(all_lines) // 2 :], topic=topic)
    run("payment_refunds.py", tmp_path, **settings)

    matched, unmatched = oracle(payments, refunds)
    got = {
        rid: (merchant, total, over)
        for rid, merchant, total, over in table(
            db, "SELECT refund_id, merchant_id, refunded_paise, over_refund FROM refund_matches"
        )
    }
    assert 0 < first < len(got)  # the restart came in the middle of the matches
    assert got == matched and any(over for _, _, over in matched.values())
    assert {r for (r,) in table(db, "SELECT refund_id FROM unmatched_refunds")} == unmatched
    # The refund the function raised on: in the first input's dead-letter topic (a connected
    # stream's, as a union's), its reason naming the call and the input.
    [letter] = read_topic(log, "upi-payments-dlq")
    bad = json.loads(letter.value)
    # Whole as it came (Spark's pandas batches hold the refunds' integer columns as floats,
    # null in the payments' rows): -5, not -5.0.
    assert bad == next(r for r in refunds if r["refund_id"] == "bad")
    assert isinstance(bad["refund_paise"], int)
    assert letter.headers["step"] == "match-refunds"
    assert letter.headers["error"].startswith(
        "match-refunds: process_element2 (input 2: refunds) raised ValueError: refund of -5"
    )
