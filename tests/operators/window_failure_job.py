"""A job whose window function raises when some windows fire (the window-failure tests run
it): per merchant and 10 s, ``list-window`` emits the window's amounts, and raises for a window
holding an amount of 13. Every emitted window goes to the topic ``windows``.
"""

from __future__ import annotations

from datetime import timedelta

from stateful_runtime import (
    LogSink,
    LogSource,
    ProcessWindowFunction,
    StreamJob,
    TumblingEventTimeWindows,
    WatermarkStrategy,
)

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "payments",
    "checkpoint.dir": "srt-data/checkpoints/window-failure",
    "parallelism": 2,
}

PAYMENT = {"txn_id": str, "merchant_id": str, "amount": int, "ts_ms": int}


class Amounts(ProcessWindowFunction):
    output_schema = {"merchant_id": str, "txn_ids": str}

    def process(self, key, window, elements):
        if any(e["amount"] == 13 for e in elements):
            raise ValueError("unlucky window")
        yield {"merchant_id": key, "txn_ids": " ".join(sorted(e["txn_id"] for e in elements))}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("window-failure", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    (
        payments.key_by("merchant_id")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=10)))
        .process(Amounts(), name="list-window")
        .sink_to(LogSink(config["source.log_dir"], "windows", partitions=1), name="out")
    )
    return job
