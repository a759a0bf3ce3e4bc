"""Temporal join: each payment with its merchant's risk tier as of the payment's time, from a
changelog of upserts (``examples/merchant_tiers.py``'s ``TierAsOf``), to the event log.

Benchmark job (benchmarks/run.py, workload ``temporal``): two topics (``jpay`` and
``jtiers``), keyed by merchant_id, through ``temporal_join`` (the ``process`` path: each
payment held in keyed map state until the watermark passes it, the versions a future payment
can still need kept beside it). The tiers' batches cover the same event time as the payments'
(``second.max_records_per_batch``, set by the harness in proportion).
"""

import sys
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
    "second.topic": "jtiers",
    "second.max_records_per_batch": 25_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "temporal",
    "checkpoint.dir": "srt-data/bench/checkpoints/temporal",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-temporal-join", config)
    payments, tiers = join_inputs.payments_and(
        job, config, merchant_tiers.PAYMENT, merchant_tiers.TIER, "tiers"
    )
    (
        payments.key_by("merchant_id")
        .temporal_join(tiers.key_by("merchant_id"))
        .process(merchant_tiers.TierAsOf(), name="tier-as-of")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="payment-tiers")
    )
    return job
