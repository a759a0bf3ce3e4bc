"""The seeds' FraudCounter on 200,000 merchants: two ValueStates and an event-time timer per
merchant (``examples/fraud_rate_limit.py``'s function, its alerts to the event log).

Benchmark job (benchmarks/run.py, workload ``fraud``): the ``process`` path, where nearly every
payment reads and writes a key's state for the first time in its minute and registers a timer.
"""

import sys
from datetime import timedelta
from pathlib import Path

from pyspark import cloudpickle

from stateful_runtime import LogSink, StreamJob, WatermarkStrategy, source_from_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import fraud_rate_limit  # noqa: E402

# The function travels to Spark's workers by value: examples/ is not on their path.
cloudpickle.register_pickle_by_value(fraud_rate_limit)

DEFAULTS = {
    "source.kind": "log",  # or "kafka" (benchmarks/kafka_keyed.py)
    "source.bootstrap_servers": "",
    "source.keyed_by": "",
    "source.log_dir": "srt-data/bench/log",
    "source.topic": "upi200k",
    "source.max_records_per_batch": 250_000,
    "sink.log_dir": "srt-data/bench/out",
    "sink.topic": "fraud",
    "checkpoint.dir": "srt-data/bench/checkpoints/fraud",
    "checkpoint.interval_s": 2.0,
    "parallelism": 2,
    "threshold": 1_000,  # no merchant reaches it (benchmarks/harness/workloads.py:oracle_fraud)
}


def build(config: dict) -> StreamJob:
    job = StreamJob.from_config("bench-fraud", config)
    payments = job.from_source(
        source_from_config(config, fraud_rate_limit.PAYMENT),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    (
        payments.key_by("merchant_id")
        .process(fraud_rate_limit.FraudCounter(int(config["threshold"])), name="fraud-counter")
        .sink_to(LogSink(config["sink.log_dir"], config["sink.topic"]), name="alerts")
    )
    return job
