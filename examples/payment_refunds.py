"""Refunds matched with their payments: two connected streams, one keyed state.

Input: payments on event-log topic ``upi-payments`` and refunds on topic ``upi-refunds``, both
JSON lines, keyed by ``txn_id``::

    {"txn_id": "t1", "merchant_id": "M001", "amount_paise": 12500, "ts_ms": 1767225600000}
    {"refund_id": "r1", "txn_id": "t1", "refund_paise": 2500, "ts_ms": 1767225660000}

``MatchRefunds`` is a :class:`~stateful_runtime.functions.KeyedCoProcessFunction`: a payment
(``process_element1``) is kept for 30 minutes of event time and matches every refund of its
transaction that comes in that time (``process_element2``), whichever of the two topics is
read first; a refund whose payment has not come 30 minutes after it goes to the side output
``unmatched-refunds``. The connected streams' watermark is the minimum of the two topics', so
a topic that lags holds the timers back and no refund misses its payment because of it. A
refund of zero or fewer paise is a producer's bug: the function raises, and the refund is
dead-lettered (to ``upi-payments-dlq``) with a reason naming ``process_element2`` and its input.

Output: DuckDB table ``refund_matches(refund_id, txn_id, merchant_id, payment_paise,
refund_paise, refunded_paise, over_refund)`` upserted by refund_id (``refunded_paise``: the
transaction's refunds so far; ``over_refund``: more refunded than paid), and
``unmatched_refunds(refund_id, txn_id, refund_paise, ts_ms)``.

    srt run examples/payment_refunds.py --available-now --set source.log_dir=/tmp/log
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    Context,
    KeyedCoProcessFunction,
    ListStateDescriptor,
    LogSource,
    OutputTag,
    RuntimeContext,
    StreamJob,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from stateful_runtime.functions import to_ms

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 100_000,
    "refunds.topic": "upi-refunds",
    "sink.database": "srt-data/refunds.duckdb",
    "checkpoint.dir": "srt-data/checkpoints/payment-refunds",
    "checkpoint.interval_s": 2.0,
    "match_within_minutes": 30,
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
REFUND = {"refund_id": str, "txn_id": str, "refund_paise": int, "ts_ms": int}
UNMATCHED = OutputTag("unmatched-refunds", REFUND)


class MatchRefunds(KeyedCoProcessFunction):
    output_schema = {
        "refund_id": str,
        "txn_id": str,
        "merchant_id": str,
        "payment_paise": int,
        "refund_paise": int,
        "refunded_paise": int,
        "over_refund": bool,
    }
    side_outputs = (UNMATCHED,)

    def __init__(self, within: timedelta = timedelta(minutes=30)) -> None:
        self.within = within

    def open(self, ctx: RuntimeContext) -> None:
        self.payment = ctx.get_state(ValueStateDescriptor("payment", dict))
        self.refunded = ctx.get_state(ValueStateDescriptor("refunded_paise", int))
        self.waiting = ctx.get_list_state(ListStateDescriptor("waiting_refunds", dict))

    def process_element1(self, payment, ctx: Context):
        self.payment.update(payment)
        ctx.timer_service().register_event_time_timer(ctx.timestamp() + self.within)
        for refund in self.waiting.get():  # refunds read before their payment
            yield self._match(payment, refund)
        self.waiting.clear()

    def process_element2(self, refund, ctx: Context):
        if refund["refund_paise"] <= 0:
            raise ValueError(f"refund of {refund['refund_paise']} paise")
        payment = self.payment.value()
        if payment is None:
            self.waiting.add(refund)
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + self.within)
            return
        yield self._match(payment, refund)

    def _match(self, payment: dict, refund: dict) -> dict:
        total = (self.refunded.value() or 0) + refund["refund_paise"]
        self.refunded.update(total)
        return {
            "refund_id": refund["refund_id"],
            "txn_id": refund["txn_id"],
            "merchant_id": payment["merchant_id"],
            "payment_paise": payment["amount_paise"],
            "refund_paise": refund["refund_paise"],
            "refunded_paise": total,
            "over_refund": total > payment["amount_paise"],
        }

    def on_timer(self, timestamp, ctx: Context):
        # One timer service for both inputs: a payment's time is up, or a waiting refund's.
        now = to_ms(timestamp)
        span = self.within // timedelta(milliseconds=1)
        payment = self.payment.value()
        if payment is not None and payment["ts_ms"] + span <= now:
            self.payment.clear()
            self.refunded.clear()
        waiting = self.waiting.get()
        due = [r for r in waiting if r["ts_ms"] + span <= now]
        for refund in due:
            ctx.output(UNMATCHED, refund)
        if due:
            self.waiting.update([r for r in waiting if r["ts_ms"] + span > now])
        return ()


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("payment-refunds", config)
    bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        bound.with_timestamp_field("ts_ms"),
        name="payments",
    )
    refunds = job.from_source(
        LogSource.from_config({**config, "source.topic": config["refunds.topic"]}, REFUND),
        bound.with_timestamp_field("ts_ms"),
        name="refunds",
    )
    within = timedelta(minutes=int(config["match_within_minutes"]))
    matches = (
        payments.key_by("txn_id")
        .connect(refunds.key_by("txn_id"))
        .process(MatchRefunds(within), name="match-refunds")
    )
    database = config["sink.database"]
    matches.sink_to(
        DuckDBUpsertSink(database, "refund_matches", key=("refund_id",)), name="matches"
    )
    matches.get_side_output(UNMATCHED).sink_to(
        DuckDBUpsertSink(database, "unmatched_refunds", key=("refund_id",)), name="unmatched"
    )
    return job
