"""Keyed state in processing time: the migration fixtures' job of processing-time TTL (a value
expired by the time the fixture is read, a map that lives a century) and processing-time
timers, the twin of ``every_state.py``.

Input: payments (``txn_id, merchant_id, amount_paise, ts_ms``) on ``upi-payments``. Output:
one row per merchant and kind (``recent`` per element, ``recent-timer`` when its timer
fires), upserted into DuckDB, with a digest of the merchant's state.
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    KeyedProcessFunction,
    LogSource,
    MapStateDescriptor,
    StateTtlConfig,
    StreamJob,
    TimeDomain,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from stateful_runtime.functions import to_ms

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "sink.database": "srt-data/every-state-processing.duckdb",
    "source.max_records_per_batch": 50,
    "checkpoint.dir": "srt-data/checkpoints/every-state-processing",
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
DIGEST = {"merchant_id": str, "function": str, "digest": str}


class Recent(KeyedProcessFunction):
    """Processing time: a value and a map under processing-time TTL, a count without TTL, a
    processing-time timer an hour after a merchant's first payment."""

    output_schema = DIGEST
    time_domain = TimeDomain.PROCESSING_TIME

    def open(self, ctx):
        # A second (expired when the fixture is read) and a century (live whenever it is).
        second = StateTtlConfig(timedelta(seconds=1))
        century = StateTtlConfig(timedelta(days=36_500))
        self.count = ctx.get_state(ValueStateDescriptor("count", int))
        self.last = ctx.get_state(ValueStateDescriptor("last_txn", str, ttl=second))
        self.amounts = ctx.get_map_state(MapStateDescriptor("amounts", str, int, ttl=century))
        self.timer = ctx.get_state(ValueStateDescriptor("timer_ms", int))

    def process_element(self, p, ctx):
        if self.timer.value() is None:
            at = ctx.timer_service().current_processing_time() + timedelta(hours=1)
            ctx.timer_service().register_processing_time_timer(at)
            self.timer.update(to_ms(at))
        self.count.update((self.count.value() or 0) + 1)
        self.last.update(p["txn_id"])
        self.amounts.put(p["txn_id"], p["amount_paise"])
        yield {
            "merchant_id": ctx.get_current_key(),
            "function": "recent",
            "digest": repr((self.count.value(), self.last.value(), len(list(self.amounts.keys())))),
        }

    def on_timer(self, timestamp, ctx):
        self.timer.clear()
        yield {
            "merchant_id": ctx.get_current_key(),
            "function": "recent-timer",
            "digest": repr((self.count.value(), self.last.value(), len(list(self.amounts.keys())))),
        }


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("every-state-processing", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="recent-source",
    )
    (
        payments.key_by("merchant_id")
        .process(Recent(), name="recent")
        .sink_to(
            DuckDBUpsertSink(
                config["sink.database"], "recent_digests", key=("merchant_id", "function")
            ),
            name="recent-digests",
        )
    )
    return job
