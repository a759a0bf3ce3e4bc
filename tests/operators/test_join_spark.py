"""Both joins on Spark (``examples/merchant_tiers.py``): payments, refunds and a changelog of
merchant tiers on three event-log topics; the temporal join and the interval join of one job
against an oracle computed from the inputs alone, with a restart from the checkpoint in the
middle of every topic (records held in the joins' state across it), a refund and a tier
version behind the watermark dropped and counted as late, and a payment the temporal join's
function raises on dead-lettered alone."""

from __future__ import annotations

import json

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, read_topic
from tests.operators.example_inputs import TIER_TOPICS, tier_inputs, tier_oracle
from tests.operators.helpers import run, table

pytestmark = pytest.mark.slow


def test_temporal_and_interval_join_against_an_oracle_across_a_restart(spark, tmp_path):
    log = tmp_path / "log"
    data = tier_inputs()
    for topic in TIER_TOPICS:
        EventLog(log).create_topic(topic, 1)
    db = tmp_path / "tiers.duckdb"
    settings = {"sink.database": db, "source.max_records_per_batch": 25}
    for topic in TIER_TOPICS:
        lines = [json.dumps(r).encode() for r in data[topic]]
        append_lines(log, lines[: len(lines) // 2], topic=topic)
    run("merchant_tiers.py", tmp_path, **settings)
    first = table(db, "SELECT count(*) FROM payment_tiers")[0][0]
    for topic in TIER_TOPICS:
        lines = [json.dumps(r).encode() for r in data[topic]]
        append_lines(log, lines[len(lines) // 2 :], topic=topic)
    run("merchant_tiers.py", tmp_path, late=2, **settings)  # one per join

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
    # The payment the temporal join's function raised on: dead-lettered alone, once.
    [letter] = read_topic(log, "upi-payments-dlq")
    assert json.loads(letter.value) == next(p for p in data["upi-payments"] if p["txn_id"] == "bad")
    assert letter.headers["step"] == "tier-as-of"
    assert letter.headers["error"].startswith(
        "tier-as-of: TierAsOf.process_element raised ValueError: payment of -5 paise"
    )
    assert 0 < len(pairs) < len(data["upi-refunds"]) - 7  # some refunds came too late to pair
