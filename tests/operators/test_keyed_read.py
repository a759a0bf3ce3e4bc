"""The keyed operator inside its source's read (``operators/keyed_read.py``): what it computes
for each record as Spark did, and when a tick split runs the operator. Whole jobs read so are
in ``test_keyed_spark.py`` (the event log) and ``connectors/kafka/test_kafka_keyed.py``."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.operators.keyed_read import _event_ms, _reads_source


def test_event_times_are_read_as_sparks_unix_millis(spark):
    """An integer in ms or s, and a timestamp (its microseconds floored), as
    ``unix_millis(timestamp_millis | timestamp_seconds | cast)`` gives them; nulls kept."""
    from pyspark.sql import functions as F

    ints = [0, 1, 1_767_225_600_123, -1_500, None]
    times = [
        datetime(2026, 1, 1, 0, 0, 0, 999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 500_500, tzinfo=UTC),
        None,
    ]
    df = spark.createDataFrame([(i,) for i in ints], "v bigint")
    ms = [r[0] for r in df.select(F.unix_millis(F.timestamp_millis("v"))).collect()]
    s = [r[0] for r in df.select(F.unix_millis(F.timestamp_seconds("v"))).collect()]
    assert _event_ms(pa.array(ints, pa.int64()), "ms").to_pylist() == ms
    assert _event_ms(pa.array(ints, pa.int64()), "s").to_pylist() == s
    ts = spark.createDataFrame([(t,) for t in times], "t timestamp")
    expected = [r[0] for r in ts.select(F.unix_millis("t")).collect()]
    column = pa.array(times, pa.timestamp("us", tz="UTC"))
    assert _event_ms(column, "timestamp").to_pylist() == expected


def test_a_tick_split_runs_the_operator_only_in_a_batch_that_does_not_read_the_source(tmp_path):
    """Spark reads a source in batch N when its offsets differ from batch N-1's (as JSON text),
    and every source in a query's first batch."""
    query = QueryLayout(tmp_path)

    def plan(batch: int, source: dict, due: int) -> None:
        path = query.offsets(batch)
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1}
        path.write_text(
            "\n".join(["v1", json.dumps(meta), json.dumps(source), json.dumps({"due": due})])
        )

    assert _reads_source(str(tmp_path))  # nothing planned yet
    plan(0, {"0": 0, "1": 0}, 0)
    assert _reads_source(str(tmp_path))  # the first batch reads every source
    plan(1, {"0": 0, "1": 0}, 5)
    assert not _reads_source(str(tmp_path))  # ticks alone
    plan(2, {"0": 3, "1": 0}, 9)
    assert _reads_source(str(tmp_path))  # records and ticks: the source's tasks fire timers
