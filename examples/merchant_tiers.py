"""Payments enriched with the merchant's risk tier as of the payment's time (a temporal join),
refunds paired with their payment within 30 minutes (an interval join) and refunds made in
their payment's clock hour (a window join): three topics, three joins, one job.

Input: JSON lines on event-log topics ``upi-payments``, ``upi-refunds`` and
``merchant-tiers`` (a changelog of upserts: each line is the merchant's new tier, valid from
its ``ts_ms``)::

    {"txn_id": "t1", "merchant_id": "M001", "amount_paise": 12500, "ts_ms": 1767225600000}
    {"refund_id": "r1", "txn_id": "t1", "refund_paise": 2500, "ts_ms": 1767225660000}
    {"merchant_id": "M001", "tier": "high", "ts_ms": 1767225000000}

* ``tier-as-of``: each payment waits until the watermark (the minimum of the payments' and
  the tiers' topics) passes its time, then takes the tier valid at that time, so a tier
  change read late or early gives the same rows on every replay. A merchant with no tier yet
  is ``unrated``. Only each merchant's current tier (and newer ones) stays in state. A
  payment of zero or fewer paise is a producer's bug: the function raises, and the payment
  is dead-lettered (to ``upi-payments-dlq``), alone.
* ``refunds-within-30m``: each refund is paired with its transaction's payment when it comes
  at most 30 minutes after it (either topic may be read first); both are dropped from state
  once the watermark passes their half hour. A refund with no payment in that time makes no
  row.
* ``refunds-same-hour``: each clock hour's payments and refunds of one transaction, paired
  when the watermark passes the hour's end (a tumbling window join); both are dropped from
  state then.

Records behind the watermark when they arrive are dropped and counted as late
(``srt status``).

Output: DuckDB tables ``payment_tiers(txn_id, merchant_id, amount_paise, tier,
tier_since_ms, ts_ms)`` upserted by txn_id, ``refund_pairs(refund_id, txn_id, merchant_id,
payment_paise, refund_paise, after_s)`` upserted by refund_id and ``same_hour_refunds(refund_id,
txn_id, merchant_id, refund_paise)`` upserted by refund_id.

    srt run examples/merchant_tiers.py --available-now --set source.log_dir=/tmp/log
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    JoinFunction,
    LogSource,
    ProcessJoinFunction,
    StreamJob,
    TemporalJoinFunction,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from stateful_runtime.functions import to_ms

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 100_000,
    "refunds.topic": "upi-refunds",
    "tiers.topic": "merchant-tiers",
    "sink.database": "srt-data/merchant-tiers.duckdb",
    "checkpoint.dir": "srt-data/checkpoints/merchant-tiers",
    "checkpoint.interval_s": 2.0,
    "refund_within_minutes": 30,
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
REFUND = {"refund_id": str, "txn_id": str, "refund_paise": int, "ts_ms": int}
TIER = {"merchant_id": str, "tier": str, "ts_ms": int}


class TierAsOf(TemporalJoinFunction):
    output_schema = {
        "txn_id": str,
        "merchant_id": str,
        "amount_paise": int,
        "tier": str,
        "tier_since_ms": int,
        "ts_ms": int,
    }

    def process_element(self, payment, version, ctx):
        if payment["amount_paise"] <= 0:  # a producer's bug: dead-lettered, the rest joined
            raise ValueError(f"payment of {payment['amount_paise']} paise")
        since = ctx.right_timestamp()
        yield {
            **payment,
            "tier": "unrated" if version is None else version["tier"],
            "tier_since_ms": None if since is None else to_ms(since),
        }


class PairRefund(ProcessJoinFunction):
    output_schema = {
        "refund_id": str,
        "txn_id": str,
        "merchant_id": str,
        "payment_paise": int,
        "refund_paise": int,
        "after_s": int,
    }

    def process_element(self, payment, refund, ctx):
        yield {
            "refund_id": refund["refund_id"],
            "txn_id": payment["txn_id"],
            "merchant_id": payment["merchant_id"],
            "payment_paise": payment["amount_paise"],
            "refund_paise": refund["refund_paise"],
            "after_s": (refund["ts_ms"] - payment["ts_ms"]) // 1000,
        }


class SameHour(JoinFunction):
    output_schema = {"refund_id": str, "txn_id": str, "merchant_id": str, "refund_paise": int}

    def join(self, payment, refund):
        return {
            "refund_id": refund["refund_id"],
            "txn_id": payment["txn_id"],
            "merchant_id": payment["merchant_id"],
            "refund_paise": refund["refund_paise"],
        }


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("merchant-tiers", config)
    bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))

    def source(topic_key: str, schema: dict, name: str):
        settings = {**config, "source.topic": config[topic_key]}
        return job.from_source(
            LogSource.from_config(settings, schema), bound.with_timestamp_field("ts_ms"), name=name
        )

    database = config["sink.database"]
    # Each join is a query of its own, and a query reads a source of its own: the payments
    # topic is read once per join.
    tiers = source("tiers.topic", TIER, "tiers")
    (
        source("source.topic", PAYMENT, "payments")
        .key_by("merchant_id")
        .temporal_join(tiers.key_by("merchant_id"))
        .process(TierAsOf(), name="tier-as-of")
        .sink_to(DuckDBUpsertSink(database, "payment_tiers", key=("txn_id",)), name="tiers")
    )
    within = timedelta(minutes=int(config["refund_within_minutes"]))
    (
        source("source.topic", PAYMENT, "refunded-payments")
        .key_by("txn_id")
        .interval_join(source("refunds.topic", REFUND, "refunds").key_by("txn_id"))
        .between(timedelta(0), within)
        .process(PairRefund(), name="refunds-within-30m")
        .sink_to(DuckDBUpsertSink(database, "refund_pairs", key=("refund_id",)), name="refunds")
    )
    (
        source("source.topic", PAYMENT, "hour-payments")
        .join(source("refunds.topic", REFUND, "hour-refunds"))
        .where("txn_id")
        .equal_to("txn_id")
        .window(TumblingEventTimeWindows.of(timedelta(hours=1)))
        .apply(SameHour(), name="refunds-same-hour")
        .sink_to(
            DuckDBUpsertSink(database, "same_hour_refunds", key=("refund_id",)), name="same-hour"
        )
    )
    return job
