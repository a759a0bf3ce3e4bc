"""Every kind of keyed state in event time: the job of the migration fixtures that the example
jobs do not cover (list, map, reducing and aggregating state; event-time TTL on a value and a
map; an event-time timer). ``every_state_processing.py`` is its processing-time twin.

Input: payments (``txn_id, merchant_id, amount_paise, ts_ms``) on ``upi-payments``. Output:
one row per merchant, upserted into DuckDB, with a digest of every state the merchant holds
after the element or timer.
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    AggregateFunction,
    AggregatingStateDescriptor,
    KeyedProcessFunction,
    ListStateDescriptor,
    LogSource,
    MapStateDescriptor,
    ReducingStateDescriptor,
    StateTtlConfig,
    StreamJob,
    TimeDomain,
    ValueStateDescriptor,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "sink.database": "srt-data/every-state.duckdb",
    "source.max_records_per_batch": 50,
    "checkpoint.dir": "srt-data/checkpoints/every-state",
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
DIGEST = {"merchant_id": str, "function": str, "digest": str}


class Mean(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, value, acc):
        return (acc[0] + value, acc[1] + 1)

    def get_result(self, acc):
        return acc[0] // max(1, acc[1])


class Tallies(KeyedProcessFunction):
    """Event time: value, list, map, reducing and aggregating state; event-time TTL on a
    value and a map; an event-time timer per merchant an hour after its first payment."""

    output_schema = DIGEST

    def open(self, ctx):
        day = StateTtlConfig(timedelta(hours=6), time_domain=TimeDomain.EVENT_TIME)
        self.first = ctx.get_state(ValueStateDescriptor("first_ms", int))
        self.last_ids = ctx.get_list_state(ListStateDescriptor("last_ids", str))
        self.by_amount = ctx.get_map_state(MapStateDescriptor("by_amount", int, int))
        self.total = ctx.get_reducing_state(
            ReducingStateDescriptor("total", lambda a, b: a + b, int)
        )
        self.mean = ctx.get_aggregating_state(AggregatingStateDescriptor("mean", Mean()))
        self.recent = ctx.get_state(ValueStateDescriptor("recent_txn", str, ttl=day))
        self.seen = ctx.get_map_state(MapStateDescriptor("seen_txns", str, int, ttl=day))
        self.fired = ctx.get_state(ValueStateDescriptor("fired", int))

    def process_element(self, p, ctx):
        if self.first.value() is None:
            self.first.update(p["ts_ms"])
            ctx.timer_service().register_event_time_timer(ctx.timestamp() + timedelta(hours=1))
        ids = list(self.last_ids.get())[-2:] + [p["txn_id"]]
        self.last_ids.update(ids)
        bucket = p["amount_paise"] // 100
        self.by_amount.put(bucket, (self.by_amount.get(bucket) or 0) + 1)
        self.total.add(p["amount_paise"])
        self.mean.add(p["amount_paise"])
        self.recent.update(p["txn_id"])
        self.seen.put(p["txn_id"], p["ts_ms"])
        yield self._digest(ctx.get_current_key())

    def on_timer(self, timestamp, ctx):
        self.fired.update((self.fired.value() or 0) + 1)
        self.first.clear()
        yield self._digest(ctx.get_current_key())

    def _digest(self, merchant):
        return {
            "merchant_id": merchant,
            "function": "tallies",
            "digest": repr(
                (
                    self.first.value(),
                    list(self.last_ids.get()),
                    sorted(self.by_amount.items()),
                    self.total.get(),
                    self.mean.get(),
                    self.recent.value(),
                    len(list(self.seen.keys())),
                    self.fired.value(),
                )
            ),
        }


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("every-state", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="tallies-source",
    )
    (
        payments.key_by("merchant_id")
        .process(Tallies(), name="tallies")
        .sink_to(
            DuckDBUpsertSink(
                config["sink.database"], "tallies_digests", key=("merchant_id", "function")
            ),
            name="tallies-digests",
        )
    )
    return job
