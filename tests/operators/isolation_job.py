"""A job whose user functions fail on some records (the step-isolation tests run it):

* ``double`` (a map) raises on a payment of ``amount`` 13;
* ``totals`` (a keyed process function) keeps a running total and the ids it saw per
  merchant, and raises for merchant ``BAD`` on an amount over 100 *after* it changed both
  states: the key's state must stay as before that element;
* every output row goes to the topic ``totals``.
"""

from __future__ import annotations

from datetime import timedelta

from stateful_runtime import (
    KeyedProcessFunction,
    LogSink,
    LogSource,
    MapStateDescriptor,
    StreamJob,
    ValueStateDescriptor,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "payments",
    "checkpoint.dir": "srt-data/checkpoints/isolation",
    "checkpoint.interval_s": 0.5,
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount": int, "ts_ms": int}


def double(payment):
    if payment["amount"] == 13:
        raise ValueError("unlucky amount")
    return {**payment, "amount": payment["amount"] * 2}


class Totals(KeyedProcessFunction):
    output_schema = {"merchant_id": str, "txn_id": str, "total": int, "ids": int}

    def open(self, ctx):
        self.total = ctx.get_state(ValueStateDescriptor("total", int))
        self.ids = ctx.get_map_state(MapStateDescriptor("ids", str, int))

    def process_element(self, payment, ctx):
        total = (self.total.value() or 0) + payment["amount"]
        self.total.update(total)
        self.ids.put(payment["txn_id"], payment["amount"])
        if payment["merchant_id"] == "BAD" and payment["amount"] > 200:
            raise RuntimeError(f"cannot take {payment['amount']}")
        yield {
            "merchant_id": payment["merchant_id"],
            "txn_id": payment["txn_id"],
            "total": total,
            "ids": sum(1 for _ in self.ids.keys()),
        }


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("isolation", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    (
        payments.map(double, output=PAYMENT, name="double")
        .key_by("merchant_id")
        .process(Totals(), name="totals")
        .sink_to(LogSink(config["source.log_dir"], "totals", partitions=1), name="out")
    )
    return job
