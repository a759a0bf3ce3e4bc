"""Interval join: each refund with its payment when it comes 0 to 30 minutes after it
(``examples/merchant_tiers.py``'s ``PairRefund``), the pairs to the event log.

Benchmark job (benchmarks/run.py, workload ``interval``): two topics (``jpay`` and
``jrefunds``), keyed by txn_id, through ``interval_join`` (the ``process`` path: a
co-process function of the runtime's, both inputs buffered in keyed map state by event time
and cleaned by the watermark). The refunds' batches cover the same event time as the
payments' (``second.max_records_per_batch``, set by the harness in proportion).
"""

import sys
from datetime import timedelta
from pathlib import Path

from pyspark import cloudpickle

from stateful_runtime import LogSink, StreamJob

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import join_inputs  # noqa: E402
import merchant_tiers  # noqa: E402

# The function travels to Spark's workers by value: examples/ is not on their path.
cloudpickle.register_pickle_by_value(merchant_tiers)

DEFAULTS = {
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "jpay",
    "source.max_records_per_batch": 250_000,
    "second.log_dir": "srt-data/bench/log",
    "second.topic": "jrefunds",
    "second.max_records_per_batch": 25_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "interval",
    "checkpoint.dir": "srt-data/bench/checkpoints/interval",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
    "within_minutes": 30,
}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-interval-join", config)
    payments, refunds = join_inputs.payments_and(
        job, config, merchant_tiers.PAYMENT, merchant_tiers.REFUND, "refunds"
    )
    (
        payments.key_by("txn_id")
        .interval_join(refunds.key_by("txn_id"))
        .between(timedelta(0), timedelta(minutes=int(config["within_minutes"])))
        .process(merchant_tiers.PairRefund(), name="refunds-within-30m")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="refund-pairs")
    )
    return job
