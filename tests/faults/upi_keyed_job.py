"""The UPI per-minute counts computed by the runtime's keyed operators (state in the worker's
RocksDB), for the fault trials of keyed state.

Same input, query, sink and table as ``examples/upi_per_minute.py``, so the trials' oracle and
checks apply unchanged. ``operator`` picks the operator:

* ``process``: a keyed process function; per merchant, a MapState of minute → (payments,
  amount) updated by every payment, each update written (the DuckDB sink keeps a batch's last
  row per key), and an event-time timer at the minute's end that drops it from state;
* ``window``: the runtime's window operator (tumbling minutes, an AggregateFunction and a
  trigger that fires on every element, none of which Spark's native aggregation runs), so the
  table holds every window's count as of each batch's end, as the native path's update mode.

``UPI_KEYED_PAUSE=<dir>:<txn_id>`` (tests only): the Python worker that meets that payment
first writes ``<dir>/paused`` (its pid) and waits there, in the middle of its task, to be
killed; a retried or replayed task passes on.
"""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from pathlib import Path

from dbt_sink import DuckDBUpsertSink
from stateful_runtime import (
    AggregateFunction,
    EarlyFiring,
    KeyedProcessFunction,
    LogSource,
    MapStateDescriptor,
    StreamJob,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import to_datetime, to_ms

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "source.max_records_per_batch": 100_000,
    "sink.database": "srt-data/upi.duckdb",
    "checkpoint.dir": "srt-data/checkpoints/upi-keyed",
    "checkpoint.interval_s": 2.0,
    "parallelism": 4,
    "operator": "process",  # or "window"
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
MINUTE = 60_000
PAUSE_ENV = "UPI_KEYED_PAUSE"


def _pause_at(payment: dict) -> None:
    where, _, txn = os.environ.get(PAUSE_ENV, "").partition(":")
    if where and payment["txn_id"] == txn:
        marker = Path(where) / "paused"
        if not marker.exists():
            marker.write_text(str(os.getpid()))
            time.sleep(600)  # the test kills this process here


class PerMinute(KeyedProcessFunction):
    output_schema = {
        "merchant_id": str,
        "window_start": datetime,
        "payments": int,
        "amount_paise": int,
    }

    def open(self, ctx):
        self.minutes = ctx.get_map_state(MapStateDescriptor("minutes", int, list))

    def process_element(self, payment, ctx):
        _pause_at(payment)
        start = to_ms(ctx.timestamp()) // MINUTE * MINUTE
        payments, amount = self.minutes.get(start) or (0, 0)
        if not payments:
            ctx.timer_service().register_event_time_timer(to_datetime(start + MINUTE))
        payments, amount = payments + 1, amount + payment["amount_paise"]
        self.minutes.put(start, [payments, amount])
        yield {
            "merchant_id": ctx.get_current_key(),
            "window_start": to_datetime(start),
            "payments": payments,
            "amount_paise": amount,
        }

    def on_timer(self, timestamp, ctx):
        self.minutes.remove(to_ms(timestamp) - MINUTE)
        return ()


class CountAndSum(AggregateFunction):
    def create_accumulator(self):
        return (0, 0)

    def add(self, payment, acc):
        _pause_at(payment)
        return (acc[0] + 1, acc[1] + payment["amount_paise"])

    def get_result(self, acc):
        return {"payments": acc[0], "amount_paise": acc[1]}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("upi-per-minute", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="upi-source",
    )
    keyed = payments.key_by("merchant_id")
    if config["operator"] == "process":
        counts = keyed.process(PerMinute(), name="upi-counts")
    elif config["operator"] == "window":
        counts = (
            keyed.window(TumblingEventTimeWindows.of(timedelta(minutes=1)))
            .trigger(EarlyFiring.every(count=1))
            .aggregate(
                CountAndSum(), name="upi-counts", output={"payments": int, "amount_paise": int}
            )
        )
    else:
        raise ConfigError(f"operator: 'process' or 'window', got {config['operator']!r}")
    (
        counts.sink_to(
            DuckDBUpsertSink(
                config["sink.database"], "upi_counts", key=("merchant_id", "window_start")
            ),
            name="upi-counts-duckdb",
        )
    )
    return job
