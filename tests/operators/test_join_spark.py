"""Both joins on Spark (``examples/merchant_tiers.py``): payments, refunds and a changelog of
merchant tiers on three event-log topics; the temporal join and the interval join of one job
against an oracle computed from the inputs alone, with a restart from the checkpoint in the
middle of every topic (records held in the joins' state across it), a refund and a tier
version behind the watermark dropped and counted as late, and a payment the temporal join's
function raises on dead-lettered alone."""

from __future__ import annotations

import json
import random
from bisect import bisect_right

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, read_topic
from tests.operators.helpers import run, table

pytestmark = pytest.mark.slow

M = 60_000
T0 = 1_767_225_600_000
END = T0 + 5 * 60 * M
TOPICS = ("upi-payments", "upi-refunds", "merchant-tiers")


def jitter(records: list[dict], rng: random.Random) -> list[dict]:
    """Out of order by up to 4 s (the watermark's bound is 5 s: none is late)."""
    return sorted(records, key=lambda r: r["ts_ms"] + rng.randint(0, 4_000))


def inputs() -> dict[str, list[dict]]:
    """90 payments of 3 merchants over 90 minutes; each merchant's tier changes every 20-40
    minutes (the first change before any payment for one merchant only); refunds of every
    third payment from 0 to 40 minutes after it (those after 30 pair with nothing), refunds of
    payments that never come; a payment, a refund and a tier five hours on move the watermark
    past everything else."""
    rng = random.Random(25)
    payments = [
        {
            "txn_id": f"t{i}",
            "merchant_id": f"M{i % 3}",
            "amount_paise": 1_000 + i,
            "ts_ms": T0 + i * M + rng.randint(0, 59_000),
        }
        for i in range(90)
    ]
    tiers = [{"merchant_id": "M0", "tier": "low", "ts_ms": T0 - 10 * M}]
    for m in range(3):
        at = T0 + rng.randint(5, 30) * M
        while at < T0 + 90 * M:
            tiers.append(
                {"merchant_id": f"M{m}", "tier": rng.choice(["low", "mid", "high"]), "ts_ms": at}
            )
            at += rng.randint(20, 40) * M
    refunds = [
        {
            "refund_id": f"r{i}",
            "txn_id": p["txn_id"],
            "refund_paise": 100,
            "ts_ms": p["ts_ms"] + rng.randint(0, 40 * M),
        }
        for i, p in enumerate(payments[::3])
    ]
    refunds += [
        {"refund_id": f"x{k}", "txn_id": f"none{k}", "refund_paise": 1, "ts_ms": T0 + k * 9 * M}
        for k in range(5)
    ]
    late = [
        # Behind the watermark when read (after the restart): dropped, counted; applied,
        # the tier would change what payments of M1 got.
        {"refund_id": "late", "txn_id": "late", "refund_paise": 1, "ts_ms": T0 + M},
        {"merchant_id": "M1", "tier": "late", "ts_ms": T0 + 2 * M},
    ]
    payments.append(
        {"txn_id": "bad", "merchant_id": "M1", "amount_paise": -5, "ts_ms": T0 + 30 * M}
    )
    payments.append({"txn_id": "end", "merchant_id": "M0", "amount_paise": 1, "ts_ms": END})
    refunds.append({"refund_id": "end", "txn_id": "none", "refund_paise": 1, "ts_ms": END})
    tiers.append({"merchant_id": "M9", "tier": "end", "ts_ms": END})
    data = {
        "upi-payments": jitter(payments, rng),
        "upi-refunds": jitter(refunds, rng),
        "merchant-tiers": jitter(tiers, rng),
    }
    for record, topic in zip(late, TOPICS[1:], strict=True):
        lines = data[topic]
        lines.insert(len(lines) // 2, record)  # the first of the second run
    return data


def oracle(data: dict[str, list[dict]]) -> tuple[dict, dict]:
    """txn_id -> (tier, since) as of each payment's time (all but the last: the watermark
    never passes it), and refund_id -> (txn_id, after_s) of the refunds within 30 minutes."""
    by_merchant: dict[str, list[tuple[int, str]]] = {}
    for t in data["merchant-tiers"]:
        if t["tier"] == "late":
            continue
        by_merchant.setdefault(t["merchant_id"], []).append((t["ts_ms"], t["tier"]))
    tiers = {}
    for p in data["upi-payments"]:
        if p["txn_id"] in ("end", "bad"):
            continue
        versions = sorted(by_merchant.get(p["merchant_id"], []))
        i = bisect_right([at for at, _ in versions], p["ts_ms"]) - 1
        tiers[p["txn_id"]] = (versions[i][1], versions[i][0]) if i >= 0 else ("unrated", None)
    paid = {p["txn_id"]: p for p in data["upi-payments"]}
    pairs = {}
    for r in data["upi-refunds"]:
        p = paid.get(r["txn_id"])
        if p is not None and 0 <= r["ts_ms"] - p["ts_ms"] <= 30 * M:
            pairs[r["refund_id"]] = (p["txn_id"], (r["ts_ms"] - p["ts_ms"]) // 1000)
    return tiers, pairs


def test_temporal_and_interval_join_against_an_oracle_across_a_restart(spark, tmp_path):
    log = tmp_path / "log"
    data = inputs()
    for topic in TOPICS:
        EventLog(log).create_topic(topic, 1)
    db = tmp_path / "tiers.duckdb"
    settings = {"sink.database": db, "source.max_records_per_batch": 25}
    for topic in TOPICS:
        lines = [json.dumps(r).encode() for r in data[topic]]
        append_lines(log, lines[: len(lines) // 2], topic=topic)
    run("merchant_tiers.py", tmp_path, **settings)
    first = table(db, "SELECT count(*) FROM payment_tiers")[0][0]
    for topic in TOPICS:
        lines = [json.dumps(r).encode() for r in data[topic]]
        append_lines(log, lines[len(lines) // 2 :], topic=topic)
    run("merchant_tiers.py", tmp_path, late=2, **settings)  # one per join

    tiers, pairs = oracle(data)
    got_tiers = {
        txn: (tier, since)
        for txn, tier, since in table(db, "SELECT txn_id, tier, tier_since_ms FROM payment_tiers")
    }
    assert 0 < first < len(got_tiers)  # the restart came in the middle of the payments
    assert got_tiers == tiers
    assert {"unrated", "low", "mid", "high"} <= {t for t, _ in tiers.values()}
    got_pairs = {
        rid: (txn, after)
        for rid, txn, after in table(db, "SELECT refund_id, txn_id, after_s FROM refund_pairs")
    }
    assert got_pairs == pairs
    # The payment the temporal join's function raised on: dead-lettered alone, once.
    [letter] = read_topic(log, "upi-payments-dlq")
    assert json.loads(letter.value) == next(p for p in data["upi-payments"] if p["txn_id"] == "bad")
    assert letter.headers["step"] == "tier-as-of"
    assert letter.headers["error"].startswith(
        "tier-as-of: TierAsOf.process_element raised ValueError: payment of -5 paise"
    )
    assert 0 < len(pairs) < len(data["upi-refunds"]) - 7  # some refunds came too late to pair
