"""Per-merchant activity sessions that end after 30 minutes without a payment.

The seed's ``SessionWindowFunction`` as a keyed process function: every payment moves the
session's end timer (delete the old timer, register a new one); when the timer fires the
session's summary is emitted and its state cleared. Summaries are upserted into DuckDB.

    srt run examples/session_summary.py --available-now
"""

from __future__ import annotations

from datetime import timedelta

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    KeyedProcessFunction,
    LogSource,
    StreamJob,
    ValueStateDescriptor,
    WatermarkStrategy,
)
from stateful_runtime.functions import to_datetime, to_ms

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 100_000,
    "sink.database": "srt-data/upi.duckdb",
    "sink.table": "merchant_sessions",
    "checkpoint.dir": "srt-data/checkpoints/session-summary",
    "checkpoint.interval_s": 2.0,
    "gap_minutes": 30.0,
    "parallelism": 4,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


class SessionWindowFunction(KeyedProcessFunction):
    output_schema = {
        "merchant_id": str,
        "session_start_ms": int,
        "session_end_ms": int,
        "payments": int,
        "amount_paise": int,
    }

    def __init__(self, gap: timedelta = timedelta(minutes=30)) -> None:
        self.gap = gap

    def open(self, ctx):
        # One value holding (start, last, payments, amount): one state read per key per batch.
        self.session = ctx.get_state(ValueStateDescriptor("session", tuple))

    def process_element(self, payment, ctx):
        ts = to_ms(ctx.timestamp())
        timers = ctx.timer_service()
        current = self.session.value()
        if current is not None:
            timers.delete_event_time_timer(to_datetime(current[1]) + self.gap)
            if ts - current[1] >= self.gap_ms:
                # A gap in event time ends the session even if the watermark lags behind it.
                yield self._summary(ctx.get_current_key(), current)
                current = None
        start, last, n, amount = current or (ts, ts, 0, 0)
        last = max(last, ts)
        self.session.update((min(start, ts), last, n + 1, amount + payment["amount_paise"]))
        timers.register_event_time_timer(to_datetime(last) + self.gap)

    def on_timer(self, timestamp, ctx):
        current = self.session.value()
        self.session.clear()
        yield self._summary(ctx.get_current_key(), current)

    def _summary(self, merchant, session):
        start, last, n, amount = session
        return {
            "merchant_id": merchant,
            "session_start_ms": start,
            "session_end_ms": last + self.gap_ms,
            "payments": n,
            "amount_paise": amount,
        }

    @property
    def gap_ms(self) -> int:
        return int(self.gap / timedelta(milliseconds=1))


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("session-summary", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="upi-source",
    )
    (
        payments.key_by("merchant_id")
        .process(SessionWindowFunction(timedelta(minutes=config["gap_minutes"])), name="sessions")
        .sink_to(
            DuckDBUpsertSink(
                config["sink.database"],
                config["sink.table"],
                key=("merchant_id", "session_start_ms"),
            ),
            name="sessions-table",
        )
    )
    return job
