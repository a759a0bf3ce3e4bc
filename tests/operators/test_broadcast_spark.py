"""Broadcast state on Spark (``examples/fraud_rules.py``, two state partitions): rules from
one topic reach the payers of every partition, a rule appended later changes the alerts from
the batch it comes in, and the rules come back from the checkpoint after a restart and from a
savepoint restored at another parallelism (every new partition with its copy); against an
oracle computed from the inputs alone."""

from __future__ import annotations

import json

import pytest

from examples.fraud_rules import FraudRules  # noqa: F401  (the job under test)
from stateful_runtime.checkpoints import savepoints
from stateful_runtime.checkpoints.state_reader import inspect
from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, read_topic
from tests.operators.example_inputs import T0, fraud_alerts, fraud_rule, payer_payments
from tests.operators.helpers import run, table

pytestmark = pytest.mark.slow


def test_rules_appended_later_change_the_alerts_and_survive_restarts(spark, tmp_path):
    log = tmp_path / "log"
    for topic in ("upi-device-payments", "fraud-rules"):
        EventLog(log).create_topic(topic, 1)
    db = tmp_path / "fraud.duckdb"
    roots = tmp_path / "savepoints"
    settings = {
        "sink.database": db,
        "source.max_records_per_batch": 10,
        "parallelism": 2,
        "savepoint.dir": roots,
    }
    first_rules = [
        fraud_rule("big-new-device", 5_000_000, True),
        fraud_rule("huge", 20_000_000, False),
    ]
    later_rules = [
        fraud_rule("huge", 0, False, active=False, ts=T0 + 100_000),  # withdrawn
        fraud_rule("mid", 10_000_000, False, ts=T0 + 100_000),
        fraud_rule("broken", -1, False, ts=T0 + 100_000),  # the function raises on it
    ]
    before, after = payer_payments(1, 0, 30), payer_payments(2, 30, 30)
    rescaled = payer_payments(3, 60, 30)

    append_lines(log, [json.dumps(r).encode() for r in first_rules], topic="fraud-rules")
    append_lines(log, [json.dumps(p).encode() for p in before], topic="upi-device-payments")
    run("fraud_rules.py", tmp_path, **settings)
    append_lines(log, [json.dumps(r).encode() for r in later_rules], topic="fraud-rules")
    append_lines(log, [json.dumps(p).encode() for p in after], topic="upi-device-payments")
    run("fraud_rules.py", tmp_path, **settings)
    checkpoint = tmp_path / "ck" / "fraud_rules.py"
    sp = savepoints.create(checkpoint, roots)
    append_lines(log, [json.dumps(p).encode() for p in rescaled], topic="upi-device-payments")
    three = {**settings, "parallelism": 3, "checkpoint.dir": tmp_path / "ck3"}
    out = run("fraud_rules.py", tmp_path, from_savepoint=sp.id, **three)
    assert "from 2 to 3 partitions" in out, out

    devices: dict[str, set] = {}
    rules = {r["rule_id"]: r for r in first_rules}
    expected = fraud_alerts(rules, before, devices)
    rules.pop("huge")
    rules["mid"] = later_rules[1]
    expected |= fraud_alerts(rules, after, devices)
    expected |= fraud_alerts(rules, rescaled, devices)
    got = set(table(db, "SELECT txn_id, rule_id, new_device FROM fraud_alerts"))
    assert got == expected
    # Both partitions' payers alerted, by rules of both runs (one of them from the checkpoint).
    payers = {p["payer_id"] for p in before + after if any(t == p["txn_id"] for t, _, _ in got)}
    assert len(payers) > 3
    assert {rid for _, rid, _ in got} == {"big-new-device", "huge", "mid"}
    late = {t for t, rid, _ in got if rid == "big-new-device" and int(t[1:]) >= 30}
    assert late  # the second run's payments met the first run's rule: from the checkpoint

    # The rule the function raised on: dead-lettered once (every partition raised on it),
    # naming the call and the broadcast input; the rules are as if it never came.
    [letter] = read_topic(log, "upi-device-payments-dlq")
    assert json.loads(letter.value) == later_rules[2]
    assert letter.headers["error"].startswith(
        "fraud-rules: process_broadcast_element (input 2: rules) raised ValueError: rule 'broken'"
    )

    # srt state inspect shows each partition's copy of the rules, before the rescale and
    # after it (whole key-group ranges to new partitions, each with a copy).
    shown = inspect(None, checkpoint, state="rules")
    assert [(r["partition"], r["broadcast"]) for r in shown] == [(0, True), (1, True)]
    assert all(r["value"] == rules for r in shown)
    shown = inspect(None, tmp_path / "ck3", state="rules")
    assert [(r["partition"], r["broadcast"]) for r in shown] == [(0, True), (1, True), (2, True)]
    assert all(r["value"] == rules for r in shown)
    after_restore = {t for t, _, _ in got if int(t[1:]) >= 60}
    assert after_restore  # the restored rules alerted the third run's payments
