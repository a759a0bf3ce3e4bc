"""Fraud rules by broadcast state: rules appended to a topic change the alerts of a running job.

Input: payments on event-log topic ``upi-device-payments`` (keyed by payer) and rules on topic
``fraud-rules``, both JSON lines::

    {"txn_id": "t1", "payer_id": "P7", "device_id": "D1", "amount_paise": 6000000, "ts_ms": ...}
    {"rule_id": "big-new-device", "min_paise": 5000000, "new_device_only": true,
     "active": true, "ts_ms": ...}

The seeds' rule — "block any UPI payment > ₹50,000 from a new device" — is the second line.
``FraudRules`` is a :class:`~stateful_runtime.functions.KeyedBroadcastProcessFunction`: every
rule reaches every parallel instance (``process_broadcast_element`` puts it in the broadcast
state ``rules``, or removes it when ``active`` is false), and each payment is checked against
the rules in force (``process_element``, the broadcast state read-only) with the payer's
devices in keyed state (a device is new the first time the payer uses it). A rule appended
while the job runs applies from the micro-batch it arrives in: no restart, no redeploy. The
rules are in the job's checkpoints and savepoints, so a restarted job keeps them.

Output: DuckDB table ``fraud_alerts(txn_id, rule_id, payer_id, device_id, amount_paise,
new_device)`` upserted by (txn_id, rule_id).

    srt run examples/fraud_rules.py --set source.log_dir=/tmp/log
    srt log append fraud-rules --log-dir /tmp/log < rule.json   # while it runs
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    KeyedBroadcastProcessFunction,
    LogSource,
    MapStateDescriptor,
    RuntimeContext,
    StreamJob,
    WatermarkStrategy,
)
from stateful_runtime.functions import BroadcastContext, ReadOnlyContext

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-device-payments",
    "source.max_records_per_batch": 100_000,
    "rules.topic": "fraud-rules",
    "sink.database": "srt-data/fraud.duckdb",
    "sink.table": "fraud_alerts",
    "checkpoint.dir": "srt-data/checkpoints/fraud-rules",
    "checkpoint.interval_s": 2.0,
    # Broadcast state lives in the worker's RocksDB.
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "payer_id": str, "device_id": str, "amount_paise": int, "ts_ms": int}
RULE = {"rule_id": str, "min_paise": int, "new_device_only": bool, "active": bool, "ts_ms": int}
RULES = MapStateDescriptor("rules", str, dict)


class FraudRules(KeyedBroadcastProcessFunction):
    output_schema = {
        "txn_id": str,
        "rule_id": str,
        "payer_id": str,
        "device_id": str,
        "amount_paise": int,
        "new_device": bool,
    }

    def open(self, ctx: RuntimeContext) -> None:
        self.devices = ctx.get_map_state(MapStateDescriptor("devices", str, int))

    def process_broadcast_element(self, rule, ctx: BroadcastContext):
        if rule["active"] and (rule["min_paise"] is None or rule["min_paise"] < 0):
            # Dead-lettered (once, naming the call and the rules topic); the rules stay as
            # they were.
            raise ValueError(f"rule {rule['rule_id']!r} has no threshold")
        rules = ctx.get_broadcast_state(RULES)
        if rule["active"]:
            rules.put(rule["rule_id"], rule)
        else:
            rules.remove(rule["rule_id"])
        return ()

    def process_element(self, payment, ctx: ReadOnlyContext):
        new_device = not self.devices.contains(payment["device_id"])
        if new_device:
            self.devices.put(payment["device_id"], payment["ts_ms"])
        for rule_id, rule in sorted(ctx.get_broadcast_state(RULES).items()):
            if payment["amount_paise"] > rule["min_paise"] and (
                new_device or not rule["new_device_only"]
            ):
                yield {
                    "txn_id": payment["txn_id"],
                    "rule_id": rule_id,
                    "payer_id": payment["payer_id"],
                    "device_id": payment["device_id"],
                    "amount_paise": payment["amount_paise"],
                    "new_device": new_device,
                }


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("fraud-rules", config)
    bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT), bound.with_timestamp_field("ts_ms"), name="payments"
    )
    rules = job.from_source(
        LogSource.from_config({**config, "source.topic": config["rules.topic"]}, RULE),
        bound.with_timestamp_field("ts_ms"),
        name="rules",
    )
    alerts = (
        payments.key_by("payer_id")
        .connect(rules.broadcast(RULES))
        .process(FraudRules(), name="fraud-rules")
    )
    alerts.sink_to(
        DuckDBUpsertSink(config["sink.database"], config["sink.table"], key=("txn_id", "rule_id")),
        name="alerts",
    )
    return job
