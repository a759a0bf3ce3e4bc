"""The joins on Spark (``examples/merchant_tiers.py``), on each state backend: payments, refunds
and a changelog of merchant tiers on three event-log topics; the temporal, interval and window
joins of one job against an oracle computed from the inputs alone, with a savepoint in the
middle of every topic restored at another parallelism (records held in the joins' state across
it), a refund and a tier version behind the watermark dropped and counted as late, and a
payment the temporal join's function raises on dead-lettered alone."""

from __future__ import annotations

import json

import pytest

from stateful_runtime.checkpoints import savepoints
from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, read_topic
from tests.operators.example_inputs import (
    TIER_TOPICS,
    same_hour_oracle,
    tier_inputs,
    tier_oracle,
)
from tests.operators.helpers import run, table

pytestmark = pytest.mark.slow


def test_the_joins_against_an_oracle_across_a_rescaling_restore(spark, tmp_path):
    log = tmp_path / "log"
    data = tier_inputs()
    for topic in TIER_TOPICS:
        EventLog(log).create_topic(topic, 1)
    db = tmp_path / "tiers.duckdb"
    roots = tmp_path / "savepoints"
    settings = {
        "sink.database": db,
        "source.max_records_per_batch": 25,
        "savepoint.dir": roots,
    }
    for topic in TIER_TOPICS:
        lines = [json.dumps(r).encode() for r in data[topic]]
        append_lines(log, lines[: len(lines) // 2], topic=topic)
    run("merchant_tiers.py", tmp_path, **settings)
    first = table(db, "SELECT count(*) FROM payment_tiers")[0][0]
    sp = savepoints.create(tmp_path / "ck" / "merchant_tiers.py", roots)
    for topic in TIER_TOPICS:
        lines = [json.dumps(r).encode() for r in data[topic]]
        append_lines(log, lines[len(lines) // 2 :], topic=topic)
    # The late refund is late for the interval join only: the hour it falls in is still open.
    rescaled = {**settings, "parallelism": 3, "checkpoint.dir": tmp_path / "ck3"}
    # Each counted as its source's: a refund (the interval join's right input), a version of
    # the temporal join's table.
    late = dict.fromkeys(("payments", "refunded-payments", "hour-payments", "hour-refunds"), 0)
    late |= {"tiers": 1, "refunds": 1}
    out = run(
        "merchant_tiers.py", tmp_path, late=2, from_savepoint=sp.id, late_by_source=late, **rescaled
    )
    assert "from 2 to 3 partitions" in out, out

    tiers, pairs = tier_oracle(data)
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
    same_hour = dict(table(db, "SELECT refund_id, txn_id FROM same_hour_refunds"))
    assert same_hour == same_hour_oracle(data)
    assert same_hour and set(same_hour) != set(pairs)  # an hour is not the half hour after
    # The payment the temporal join's function raised on: dead-lettered alone, once.
    [letter] = read_topic(log, "upi-payments-dlq")
    assert json.loads(letter.value) == next(p for p in data["upi-payments"] if p["txn_id"] == "bad")
    assert letter.headers["step"] == "tier-as-of"
    assert letter.headers["error"].startswith(
        "tier-as-of: TierAsOf.process_element raised ValueError: payment of -5 paise"
    )
    assert 0 < len(pairs) < len(data["upi-refunds"]) - 7  # some refunds came too late to pair
