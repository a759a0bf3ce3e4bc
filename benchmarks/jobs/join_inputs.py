"""The two inputs of the join benchmark jobs (``interval_join.py``, ``temporal_join.py``): the
payments topic (``source.*``) and a second topic (``second.*``: log dir, topic, records per
batch, which the harness sets in proportion so both inputs' batches cover the same event
time), each with the same bounded out-of-orderness on ``ts_ms``."""

from datetime import timedelta

from stateful_runtime import DataStream, LogSource, StreamJob, WatermarkStrategy


def payments_and(
    job: StreamJob, config: dict, payment: dict, second: dict, name: str
) -> tuple[DataStream, DataStream]:
    bound = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))
    payments = job.from_source(
        LogSource.from_config(config, payment), bound.with_timestamp_field("ts_ms"), name="payments"
    )
    settings = {
        **config,
        **{f"source.{k}": config[f"second.{k}"] for k in ("log_dir", "topic")},
        "source.max_records_per_batch": config["second.max_records_per_batch"],
    }
    other = job.from_source(
        LogSource.from_config(settings, second), bound.with_timestamp_field("ts_ms"), name=name
    )
    return payments, other
