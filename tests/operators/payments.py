"""Payments for the keyed functions' Spark tests (the Deduplicator's input and its oracle),
shared by the event-log and Kafka tests."""

from __future__ import annotations

import json
import random

from stateful_runtime.connectors.eventlog import EventLog

M = 60_000
H = 60 * M
T0 = 1_767_225_600_000


def payment(i: int, merchant: str, ts: int, amount: int = 100, txn: str | None = None) -> bytes:
    return json.dumps(
        {"txn_id": txn or f"t{i}", "merchant_id": merchant, "amount_paise": amount, "ts_ms": ts}
    ).encode()


def dedup_lines() -> list[bytes]:
    rng = random.Random(5)
    lines = []
    for i in range(3_000):
        ts = T0 + i * 60_000  # 50 hours of event time
        txn = f"t{rng.randint(0, 400)}"  # ids repeat within and beyond 24 h
        lines.append(payment(i, f"M{i % 7}", ts, txn=txn))
    return lines


def assert_deduplicated(log, lines: list[bytes]) -> None:
    expected, stamped = [], {}
    for line in lines:
        e = json.loads(line)
        if e["txn_id"] in stamped and e["ts_ms"] < stamped[e["txn_id"]] + 24 * H:
            continue
        stamped[e["txn_id"]] = e["ts_ms"]
        expected.append(e)
    reader = EventLog(log).reader("upi-payments-deduped")
    got = [
        json.loads(r.value)
        for p, end in reader.end_offsets().items()
        for r in reader.read(p, 0, end)
    ]
    key = lambda e: (e["txn_id"], e["ts_ms"])  # noqa: E731
    assert sorted(got, key=key) == sorted(expected, key=key)
    assert len(expected) < len(lines)
