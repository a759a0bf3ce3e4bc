"""The inputs of the multi-stream example jobs and their oracles, computed from the inputs alone
(the operators' Spark tests and the fault trials share them)."""

from __future__ import annotations

import random
from bisect import bisect_right

M = 60_000
T0 = 1_767_225_600_000
H = 60 * M


# -- payments and refunds (examples/payment_refunds.py) --------------------------------------
def refund_inputs(n: int = 40) -> tuple[list[dict], list[dict]]:
    """``n`` payments (``examples/payment_refunds.py``), one every 30 s; refunds up to 20
    minutes after their payment (some transactions have two, the second over-refunding),
    refunds of payments that never come, one refund of a negative amount; a payment and a
    refund five hours on close every timer."""
    rng = random.Random(11)
    payments = [
        {
            "txn_id": f"t{i}",
            "merchant_id": f"M{i % 3}",
            "amount_paise": 1_000,
            "ts_ms": T0 + i * 30_000,
        }
        for i in range(n)
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


def refund_oracle(payments: list[dict], refunds: list[dict]) -> tuple[dict, set]:
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


# -- payments, refunds and merchant tiers (examples/merchant_tiers.py) ------------------------
END = T0 + 5 * 60 * M
TIER_TOPICS = ("upi-payments", "upi-refunds", "merchant-tiers")


def jitter(records: list[dict], rng: random.Random) -> list[dict]:
    """Out of order by up to 4 s (the watermark's bound is 5 s: none is late)."""
    return sorted(records, key=lambda r: r["ts_ms"] + rng.randint(0, 4_000))


def tier_inputs() -> dict[str, list[dict]]:
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
    for record, topic in zip(late, TIER_TOPICS[1:], strict=True):
        lines = data[topic]
        lines.insert(len(lines) // 2, record)  # the first of the second run
    return data


def tier_oracle(data: dict[str, list[dict]]) -> tuple[dict, dict]:
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


def same_hour_oracle(data: dict[str, list[dict]]) -> dict[str, str]:
    """refund_id -> txn_id of the refunds made in their payment's clock hour (hours the watermark
    passes: all but the last records')."""
    paid = {p["txn_id"]: p for p in data["upi-payments"] if p["txn_id"] != "end"}
    return {
        r["refund_id"]: r["txn_id"]
        for r in data["upi-refunds"]
        if r["txn_id"] in paid and r["ts_ms"] // H == paid[r["txn_id"]]["ts_ms"] // H
    }


# -- payments by payer and device, fraud rules (examples/fraud_rules.py) ----------------------
def payer_payments(seed: int, start: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    return [
        {
            "txn_id": f"t{start + i}",
            "payer_id": f"P{rng.randint(0, 9)}",
            "device_id": f"D{rng.randint(0, 3)}",
            "amount_paise": rng.choice([1_000_000, 6_000_000, 12_000_000, 25_000_000]),
            "ts_ms": T0 + (start + i) * 1_000,
        }
        for i in range(n)
    ]


def fraud_rule(rid: str, min_paise: int, new_only: bool, active: bool = True, ts: int = T0) -> dict:
    return {
        "rule_id": rid,
        "min_paise": min_paise,
        "new_device_only": new_only,
        "active": active,
        "ts_ms": ts,
    }


def fraud_alerts(rules: dict[str, dict], batch: list[dict], devices: dict[str, set]) -> set:
    out = set()
    for p in batch:
        seen = devices.setdefault(p["payer_id"], set())
        new = p["device_id"] not in seen
        seen.add(p["device_id"])
        for rid, r in rules.items():
            if p["amount_paise"] > r["min_paise"] and (new or not r["new_device_only"]):
                out.add((p["txn_id"], rid, new))
    return out
