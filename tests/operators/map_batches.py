"""Arrow batches as Spark's mapInArrow hands them to a map step (records, their event time,
their source origin), for the map operators' tests."""

from __future__ import annotations

import pyarrow as pa

from stateful_runtime.job import ErrorPolicy
from stateful_runtime.operators.isolation import ORIGIN_OFFSET, ORIGIN_PARTITION

OUT = pa.schema([("user", pa.string()), ("k", pa.int64())])


def batch(rows: list[tuple[str, int, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "user": [u for u, _, _ in rows],
            "n": [n for _, n, _ in rows],
            "_event_time": pa.array([ts for _, _, ts in rows], pa.timestamp("us", "UTC")),
            ORIGIN_PARTITION: pa.array([i % 3 for i in range(len(rows))], pa.int32()),
            ORIGIN_OFFSET: pa.array([100 + i for i in range(len(rows))], pa.int64()),
        }
    )


CARRIED = ["_event_time", ORIGIN_PARTITION, ORIGIN_OFFSET]
FAIL = ErrorPolicy("fail")
NO_BOUND = ErrorPolicy(max_consecutive=10**9, max_fraction=1.0)
