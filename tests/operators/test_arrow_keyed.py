"""The keyed operator on Arrow batches, driven as Spark's tasks drive it (batch id, partition,
the offset log's watermark) without Spark: outputs, timers due at a batch's watermark, a
replayed batch, the key-group routing."""

from __future__ import annotations

import json
import pickle
from collections import Counter

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stateful_runtime import KeyedProcessFunction, ValueStateDescriptor
from stateful_runtime.exceptions import StateError
from stateful_runtime.functions import to_datetime
from stateful_runtime.operators.arrow_keyed import (
    KEY_GROUP,
    SIDE,
    TAG,
    ArrowKeyedOperator,
    route_values,
    spark_hash_int,
    store_dir,
)
from stateful_runtime.operators.keyed_store import (
    MAX_PARALLELISM,
    KeyedStore,
    group_prefix,
    key_groups,
)

TS = "srt_event_ms"
OUTPUT = pa.schema(
    [("k", pa.string()), ("n", pa.int64()), ("fired", pa.int64()), (TAG, pa.string()),
     (SIDE, pa.string())]
)  # fmt: skip


class CountThenFire(KeyedProcessFunction):
    """Counts a key's records; one second after its first, a timer emits the count."""

    output_schema = {"k": str, "n": int, "fired": int}

    def open(self, ctx):
        self.count = ctx.get_state(ValueStateDescriptor("count", int))

    def process_element(self, e, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        if n == 1:
            ctx.timer_service().register_event_time_timer(to_datetime(e["ts"] + 1_000))
        yield {"k": e["k"], "n": n}

    def on_timer(self, ts, ctx):
        yield {"k": ctx.get_current_key(), "n": self.count.value(), "fired": 1}
        self.count.clear()


def _offsets(query, batch: int, watermark: int) -> None:
    (query / "offsets").mkdir(parents=True, exist_ok=True)
    meta = {"batchWatermarkMs": watermark, "batchTimestampMs": 0}
    (query / "offsets" / str(batch)).write_text(f"v1\n{json.dumps(meta)}\n{{}}\n")


def _records(pairs, group: int) -> pa.RecordBatch:
    keys = [k for k, _ in pairs]
    times = [t for _, t in pairs]
    return pa.record_batch(
        {"k": keys, "ts": times, TS: times, KEY_GROUP: pa.array([group] * len(keys), pa.int32())}
    )


def _operator(query) -> ArrowKeyedOperator:
    return ArrowKeyedOperator(
        CountThenFire(), "count", ["k"], ["k", "ts"], TS, OUTPUT, str(query), parallelism=1
    )


def _rows(out) -> list[tuple]:
    return [(r["k"], r["n"], r["fired"]) for b in out for r in b.to_pylist()]


def test_batches_count_fire_at_the_watermark_and_a_replay_starts_from_the_batch_before(tmp_path):
    query = tmp_path / "q"
    op = _operator(query)
    _offsets(query, 0, 0)
    assert _rows(op.run(0, 0, iter([_records([("a", 100), ("b", 200), ("a", 300)], 5)]))) == [
        ("a", 1, None), ("a", 2, None), ("b", 1, None),
    ]  # fmt: skip
    _offsets(query, 1, 1_150)  # a's timer (1,100) is due, b's (1,200) not yet
    first = _rows(op.run(1, 0, iter([_records([("b", 900)], 5)])))
    assert first == [("a", 2, 1), ("b", 2, None)]
    # Batch 1 again (its commit never written): the same output, from the state before it.
    assert _rows(op.run(1, 0, iter([_records([("b", 900)], 5)]))) == first
    _offsets(query, 2, 1_200)  # a batch without data: b's timer fires
    assert _rows(op.run(2, 0, iter([]))) == [("b", 2, 1)]
    assert sorted(p.name for p in (query / "keyed" / "count" / "0").iterdir()) == [
        "1.delta", "2.delta", "3.delta",
    ]  # fmt: skip


def test_a_worker_keeps_its_values_only_for_the_version_it_committed(tmp_path):
    """The values a worker's task ended with serve its next task of the partition only when
    the store opens at the version that task committed: here another executor re-ran batch 0
    after it (a retry whose commit Spark kept), so the next batch starts from that state."""
    query = tmp_path / "q"
    op = _operator(query)
    _offsets(query, 0, 0)
    assert _rows(op.run(0, 0, iter([_records([("a", 100)], 5)]))) == [("a", 1, None)]
    other = KeyedStore(store_dir(query, "count", 0), tmp_path / "elsewhere")
    other.open(0)
    row = group_prefix(5) + b"k" + pickle.dumps(("a",), pickle.HIGHEST_PROTOCOL)
    other.put(row, pickle.dumps({"count": 5}, pickle.HIGHEST_PROTOCOL))
    other.commit()
    other.close()
    _offsets(query, 1, 0)
    assert _rows(op.run(1, 0, iter([_records([("a", 200)], 5)]))) == [("a", 6, None)]
    _offsets(query, 2, 0)  # and this worker's own version 2 is used as it is
    assert _rows(op.run(2, 0, iter([_records([("a", 300)], 5)]))) == [("a", 7, None)]


def test_a_record_outside_the_tasks_key_groups_is_refused(tmp_path):
    query = tmp_path / "q"
    _offsets(query, 0, 0)
    op = ArrowKeyedOperator(
        CountThenFire(), "count", ["k"], ["k", "ts"], TS, OUTPUT, str(query), parallelism=2
    )
    with pytest.raises(StateError, match="key group 127 reached the task of key groups 0..63"):
        list(op.run(0, 0, iter([_records([("a", 1)], 127)])))


def test_spark_hash_of_an_int_is_murmur3_as_spark_computes_it():
    assert [spark_hash_int(v) for v in (0, 1, 42, -1, 2147483647)] == SPARK_HASHES


# SELECT hash(0), hash(1), hash(42), hash(-1), hash(2147483647) on Spark 4.3 (seed 42).
SPARK_HASHES = [933211791, -559580957, 29417773, -1604776387, 133916647]


@given(st.integers(1, MAX_PARALLELISM))
def test_route_values_send_each_partition_its_own_key_groups(n):
    routes = route_values(n)
    assert [spark_hash_int(v) % n for v in routes] == list(range(n))
    owner = Counter(g * n // MAX_PARALLELISM for g in range(MAX_PARALLELISM))
    assert all(owner[p] == len(key_groups(p, n)) for p in range(n))
