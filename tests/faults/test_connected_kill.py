"""kill -9 of jobs of several streams at random points, state in the worker's RocksDB.

Each multi-stream example is started and killed (its whole process group) again and again on
one checkpoint, at a random moment of start-up or a random delay after a random number of new
committed batches (``harness.kill_at_random_points``); a final ``--available-now`` run drains
every topic, and its tables must equal the oracle computed from the inputs alone
(``tests/operators/example_inputs.py``), each bad record one dead letter, whatever the kills hit:

* connected streams, ``examples/payment_refunds.py``: a keyed co-process function with state
  written by one input and read by the other, timers of both, a side output, a refund it raises
  on;
* broadcast state, ``examples/fraud_rules.py``: rules on every partition, payers' device sets in
  keyed state, a rule the function raises on;
* joins, ``examples/merchant_tiers.py``: a temporal join holding payments until the tiers'
  watermark passes them, an interval join buffering both sides and a window join holding each
  hour's records of both, in one job.

Seeded: ``SRT_FAULT_SEED`` replays a run's kill points.
"""

from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.faults.harness import TrialLog, kill_at_random_points
from tests.helpers import EXAMPLES, append_lines, read_topic, srt
from tests.operators.example_inputs import (
    TIER_TOPICS,
    fraud_alerts,
    fraud_rule,
    payer_payments,
    refund_inputs,
    refund_oracle,
    same_hour_oracle,
    tier_inputs,
    tier_oracle,
)
from tests.operators.helpers import table

pytestmark = pytest.mark.faults

FAULT = "kill -9 of the job's process group ({what}, state in the worker's RocksDB)"
KILLS = int(os.environ.get("SRT_FAULT_CONNECTED_KILLS", "2"))


def _trial(
    tmp_path: Path,
    env: dict[str, str],
    trials: TrialLog,
    job: str,
    query: str,
    topics: dict[str, tuple[list[dict], str]],
    check: Callable[[Path, Path], list[str]],
    what: str,
    described: str,
    partitions: int = 2,
    **settings: Any,
) -> None:
    """Append ``topics`` ({topic: (records, key field)}, ``partitions`` each), kill ``job`` at
    random points (its query ``query``'s commits counted), drain, and record
    ``check(log_dir, database)``. Every record is there before the first run: a kill may come
    after an input was read to its end, or all of them (the drain then has nothing new to
    read, and must still fire what each input's watermark passed)."""
    seed = int(os.environ.get("SRT_FAULT_SEED") or random.randrange(1 << 31))
    log_dir, db, ckpt = tmp_path / "log", tmp_path / "out.duckdb", tmp_path / "ck"
    for topic, (records, key) in topics.items():
        EventLog(log_dir).create_topic(topic, partitions)
        append_lines(log_dir, [json.dumps(r).encode() for r in records], topic, key=key)
    sets = {
        "source.log_dir": log_dir,
        "sink.database": db,
        "checkpoint.dir": ckpt,
        "checkpoint.interval_s": 0.5,
        "parallelism": 2,
        **settings,
    }
    args = ["run", str(EXAMPLES / job)]
    args += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    points = kill_at_random_points(args, env, ckpt / query, KILLS, random.Random(seed), tmp_path)
    # One large batch a topic: the drain is the check, not another kill point.
    drain = ["--available-now", "--set", "source.max_records_per_batch=100000"]
    final = srt([*args, *drain], env, timeout=900)
    why = [] if final.returncode == 0 else [f"the drain exited {final.returncode}"]
    why += check(log_dir, db)
    trials.record(
        fault=FAULT.format(what=what),
        input=described,
        result="FAIL" if why else "pass",
        seed=seed,
        detail="; ".join(why) or f"killed {'; '.join(points)}; drain = oracle",
    )
    assert not why, f"seed {seed} (replay: SRT_FAULT_SEED={seed}): {why} {final.stderr[-1500:]}"


def _differ(name: str, got: dict, expected: dict) -> list[str]:
    if got == expected:
        return []
    missing = len(set(expected) - set(got))
    wrong = sum(1 for k in got if k in expected and got[k] != expected[k])
    return [f"{name}: {missing} missing, {wrong} wrong, {len(set(got) - set(expected))} extra"]


def _letters(log_dir: Path, topic: str) -> list[dict]:
    return [json.loads(m.value) for m in read_topic(log_dir, f"{topic}-dlq")]


def test_connected_streams_killed_at_random_points_drain_to_the_oracle(tmp_path, job_env, trials):
    payments, refunds = refund_inputs(240)

    def check(log_dir: Path, db: Path) -> list[str]:
        matched, unmatched = refund_oracle(payments, refunds)
        got = {
            rid: (merchant, total, over)
            for rid, merchant, total, over in table(
                db, "SELECT refund_id, merchant_id, refunded_paise, over_refund FROM refund_matches"
            )
        }
        why = _differ("matches", got, matched)
        got_unmatched = {r for (r,) in table(db, "SELECT refund_id FROM unmatched_refunds")}
        if got_unmatched != unmatched:
            why.append(f"unmatched {sorted(got_unmatched ^ unmatched)} differ from the oracle")
        letters = [d["refund_id"] for d in _letters(log_dir, "upi-payments")]
        if letters != ["bad"]:
            why.append(f"dead letters {letters}, expected the one bad refund once")
        return why

    _trial(
        tmp_path,
        job_env,
        trials,
        "payment_refunds.py",
        "match-refunds",
        # by transaction: a transaction's refunds in one partition, in their order
        {"upi-payments": (payments, "txn_id"), "upi-refunds": (refunds, "txn_id")},
        check,
        "connected streams",
        "payments and refunds on two topics (240 payments, refunds before and after, 1 bad)",
        **{"source.max_records_per_batch": 40},
    )


def test_broadcast_state_killed_at_random_points_drains_to_the_oracle(tmp_path, job_env, trials):
    # Every rule before the first payment (read in the first batch, applied before its keyed
    # elements): which payments a rule sees does not depend on where the kills cut batches.
    rules = [
        fraud_rule("big-new-device", 5_000_000, True),
        fraud_rule("huge", 20_000_000, False),
        fraud_rule("broken", -1, False),  # the function raises on it
    ]
    payments = payer_payments(3, 0, 300)

    def check(log_dir: Path, db: Path) -> list[str]:
        good = {r["rule_id"]: r for r in rules if r["rule_id"] != "broken"}
        expected = {a: True for a in fraud_alerts(good, payments, {})}
        got = {a: True for a in table(db, "SELECT txn_id, rule_id, new_device FROM fraud_alerts")}
        why = _differ("alerts", got, expected)
        letters = [d.get("rule_id") for d in _letters(log_dir, "upi-device-payments")]
        if letters != ["broken"]:
            why.append(f"dead letters {letters}, expected the broken rule once")
        return why

    _trial(
        tmp_path,
        job_env,
        trials,
        "fraud_rules.py",
        "fraud-rules",
        {"fraud-rules": (rules, "rule_id"), "upi-device-payments": (payments, "payer_id")},
        check,
        "broadcast state",
        "3 rules (1 the function raises on), 300 payments of 10 payers on 4 devices",
        **{"source.max_records_per_batch": 30},
    )


def test_joins_killed_at_random_points_drain_to_the_oracle(tmp_path, job_env, trials):
    # Without the two records the Spark test makes late on purpose: whether they are late
    # depends on where a run's batches were cut.
    data = {
        topic: [r for r in records if "late" not in (r.get("refund_id"), r.get("tier"))]
        for topic, records in tier_inputs().items()
    }
    keys = dict(zip(TIER_TOPICS, ("merchant_id", "txn_id", "merchant_id"), strict=True))

    def check(log_dir: Path, db: Path) -> list[str]:
        tiers, pairs = tier_oracle(data)
        got_tiers = {
            txn: (tier, since)
            for txn, tier, since in table(
                db, "SELECT txn_id, tier, tier_since_ms FROM payment_tiers"
            )
        }
        got_pairs = {
            rid: (txn, after)
            for rid, txn, after in table(db, "SELECT refund_id, txn_id, after_s FROM refund_pairs")
        }
        same_hour = dict(table(db, "SELECT refund_id, txn_id FROM same_hour_refunds"))
        why = (
            _differ("tiers", got_tiers, tiers)
            + _differ("pairs", got_pairs, pairs)
            + _differ("same-hour refunds", same_hour, same_hour_oracle(data))
        )
        letters = [d.get("txn_id") for d in _letters(log_dir, "upi-payments")]
        if letters != ["bad"]:
            why.append(f"dead letters {letters}, expected the bad payment once")
        return why

    _trial(
        tmp_path,
        job_env,
        trials,
        "merchant_tiers.py",
        "tier-as-of",
        {topic: (records, keys[topic]) for topic, records in data.items()},
        check,
        "temporal, interval and window joins",
        "payments, refunds and merchant tiers on three topics (90 payments over 90 minutes)",
        # one partition a topic: the records five hours on, which move each topic's watermark
        # past the rest, are one a topic (a partition without them would hold it back)
        partitions=1,
        **{"source.max_records_per_batch": 15},
    )
