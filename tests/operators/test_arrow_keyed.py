"""The keyed operator on Arrow batches, driven as Spark's tasks drive it (batch id, partition,
the offset log's watermark) without Spark: outputs, timers due at a batch's watermark, a
replayed batch, the key-group routing."""

from __future__ import annotations

import gc
import json
import pickle
import zlib
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import StructType

from stateful_runtime import (
    AggregateFunction,
    CountTrigger,
    EarlyFiring,
    GlobalWindows,
    JoinFunction,
    KeyedProcessFunction,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
    ValueStateDescriptor,
)
from stateful_runtime.checkpoints.keyed import COMMIT_TAG, column_key_groups, key_group
from stateful_runtime.exceptions import StateError
from stateful_runtime.functions import CO_INPUT, UNION_INPUT, CoInput, CoProcess, to_datetime
from stateful_runtime.joins import (
    IntervalJoinOperator,
    ProcessJoinFunction,
    TemporalJoinFunction,
    TemporalJoinOperator,
    WindowJoinOperator,
)
from stateful_runtime.operators import arrow_keyed, keyed
from stateful_runtime.operators.arrow_keyed import (
    KEY_GROUP,
    SIDE,
    TAG,
    ArrowKeyedOperator,
    route_values,
    spark_hash_int,
    store_dir,
)
from stateful_runtime.operators.isolation import ORIGIN_OFFSET, ORIGIN_PARTITION
from stateful_runtime.operators.keyed_store import (
    MAX_PARALLELISM,
    KeyedStore,
    group_prefix,
    key_groups,
)
from stateful_runtime.operators.ticks import NEXT_TIMER
from stateful_runtime.operators.window import WindowOperator
from stateful_runtime.runtime.batch_writes import record_keyed_commits

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


def _task(op: ArrowKeyedOperator, batch: int, arrows, committed: bool = True) -> list[dict]:
    """The output rows of partition 0's task of ``batch``; unless told otherwise, its attempt
    recorded as the driver records it from the commit row the task hands over last."""
    rows = [r for b in op.run(batch, 0, iter(arrows)) for r in b.to_pylist()]
    assert [r[TAG] == COMMIT_TAG for r in rows][-1:] == [True]
    if committed:
        assert op.checkpoint is not None
        operator = Path(op.checkpoint) / "keyed" / op.name
        record_keyed_commits(operator, batch, op.parallelism, [rows[-1][SIDE]])
    return rows[:-1]


def _rows(op, batch: int, arrows, committed: bool = True) -> list[tuple]:
    return [(r["k"], r["n"], r["fired"]) for r in _task(op, batch, arrows, committed)]


def test_batches_count_fire_at_the_watermark_and_a_replay_starts_from_the_batch_before(tmp_path):
    query = tmp_path / "q"
    op = _operator(query)
    _offsets(query, 0, 0)
    batch = [_records([("a", 100), ("b", 200), ("a", 300)], 5)]
    assert _rows(op, 0, batch) == [
        ("a", 1, None), ("a", 2, None), ("b", 1, None),
    ]  # fmt: skip
    _offsets(query, 1, 1_150)  # a's timer (1,100) is due, b's (1,200) not yet
    first = _rows(op, 1, [_records([("b", 900)], 5)], committed=False)
    assert first == [("a", 2, 1), ("b", 2, None)]
    # Batch 1 again (its commit never written): the same output, from the state before it.
    assert _rows(op, 1, [_records([("b", 900)], 5)]) == first
    _offsets(query, 2, 1_200)  # a batch without data: b's timer fires
    assert _rows(op, 2, []) == [("b", 2, 1)]
    versions = [
        p.name.split(".")[0]
        for p in (query / "keyed" / "count" / "0").iterdir()
        if p.name != NEXT_TIMER  # the partition's earliest timer (operators/ticks.py)
    ]
    assert sorted(versions) == ["1", "2", "2", "3"]  # version 2 by two attempts


def test_a_worker_keeps_its_values_only_for_the_version_it_committed(tmp_path):
    """The values a worker's task ended with serve its next task of the partition only when
    the store opens at the version that task committed: here another executor re-ran batch 0
    after it (a retry whose commit Spark kept), so the next batch starts from that state."""
    query = tmp_path / "q"
    op = _operator(query)
    _offsets(query, 0, 0)
    assert _rows(op, 0, [_records([("a", 100)], 5)]) == [("a", 1, None)]
    other = KeyedStore(store_dir(query, "count", 0), tmp_path / "elsewhere")
    other.open(0)
    row = group_prefix(5) + b"k" + pickle.dumps(("a",), pickle.HIGHEST_PROTOCOL)
    other.put(row, pickle.dumps({"count": 5}, pickle.HIGHEST_PROTOCOL))
    other.commit()
    other.publish()
    other.close()
    _offsets(query, 1, 0)
    assert _rows(op, 1, [_records([("a", 200)], 5)]) == [("a", 6, None)]
    _offsets(query, 2, 0)  # and this worker's own version 2 is used as it is
    assert _rows(op, 2, [_records([("a", 300)], 5)]) == [("a", 7, None)]


class Hoarder(KeyedProcessFunction):
    """Keeps what a task of many keys keeps: a long-lived object per record (the rows it read),
    and says how many young collections the collector now waits for before a full one."""

    output_schema = {"k": str, "n": int, "fired": int}

    def __init__(self) -> None:
        self.kept: list[dict] = []

    def process_element(self, e, ctx):
        self.kept.extend({"k": e["k"], "i": i} for i in range(200_000))
        yield {"k": e["k"], "n": gc.get_threshold()[2]}


def test_a_task_makes_no_full_collection_and_gives_the_collector_back_as_it_was(tmp_path):
    """Python's collector walked a task's long-lived objects (its state) on every full pass;
    a task leaves them to the full collection Spark's worker makes after it. Young
    collections go on."""
    query = tmp_path / "q"
    op = ArrowKeyedOperator(
        Hoarder(), "hoard", ["k"], ["k", "ts"], TS, OUTPUT, str(query), parallelism=1
    )
    _offsets(query, 0, 0)
    collections: Counter = Counter()

    def count(phase, info):
        if phase == "stop":
            collections[info["generation"]] += 1

    before = gc.get_threshold()
    gc.callbacks.append(count)
    try:
        rows = _rows(op, 0, [_records([("a", 100), ("b", 200)], 5)])
    finally:
        gc.callbacks.remove(count)
    assert [k for k, _, _ in rows] == ["a", "b"]
    assert all(waits > 1_000_000 for _, waits, _ in rows)  # no full pass in the task
    assert collections[2] == 0 and collections[0] > 100
    assert gc.get_threshold() == before


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


def test_key_groups_computed_in_python_are_the_ones_spark_computes(spark):
    """The harness groups keys without Spark (``key_group``): each kind of key field, nulls,
    unicode, every tail length of a string, mixed keys, as Spark's ``pmod(hash(...), 128)``
    of the same rows."""
    import random

    from pyspark.sql import functions as F

    rng = random.Random(7)
    words = ["", "a", "ab", "abc", "abcd", "abcde", "M1", "merchant-0042", "é", "日本語", "🙂x"]
    words += [
        "".join(rng.choice("ab\u00e9\u65e5z") for _ in range(rng.randint(0, 13))) for _ in range(60)
    ]
    ints = [0, 1, -1, 2**31, -(2**31) - 1, 2**63 - 1, -(2**63)] + [
        rng.randint(-(2**40), 2**40) for _ in range(40)
    ]
    rows = [
        (
            rng.choice(words + [None]),
            rng.choice(ints + [None]),
            rng.choice([0.0, -0.0, 1.5, -2.25e10, None]),
            rng.choice([True, False, None]),
        )
        for _ in range(300)
    ]
    df = spark.createDataFrame(rows, "s string, i bigint, f double, b boolean")
    keys = [["s"], ["i"], ["f"], ["b"], ["s", "i"], ["i", "s", "f", "b"]]
    got = df.select(
        *[F.pmod(F.hash(*k), F.lit(MAX_PARALLELISM)).alias(str(n)) for n, k in enumerate(keys)]
    ).collect()
    fields = ["s", "i", "f", "b"]
    for row, groups in zip(rows, got, strict=True):
        values = dict(zip(fields, row, strict=True))
        mine = [key_group([values[f] for f in k]) for k in keys]
        assert mine == list(groups), row
    # a whole column at once (a keyed source's read: operators/keyed_read.py), sliced too
    for n, field in ((0, "s"), (1, "i")):
        column = pa.array([r[n] for r in rows], pa.string() if field == "s" else pa.int64())
        assert list(column_key_groups(column)) == [g[str(n)] for g in got]
        assert list(column_key_groups(column.slice(7, 50))) == [g[str(n)] for g in got[7:57]]


@given(st.lists(st.text(max_size=23) | st.none()), st.lists(st.integers(-(2**63), 2**63 - 1)))
def test_a_columns_key_groups_are_each_values_key_group(texts, ints):
    assert list(column_key_groups(pa.array(texts, pa.string()))) == [key_group([t]) for t in texts]
    assert list(column_key_groups(pa.array(ints, pa.int64()))) == [key_group([i]) for i in ints]


@given(st.integers(1, MAX_PARALLELISM))
def test_route_values_send_each_partition_its_own_key_groups(n):
    routes = route_values(n)
    assert [spark_hash_int(v) % n for v in routes] == list(range(n))
    owner = Counter(g * n // MAX_PARALLELISM for g in range(MAX_PARALLELISM))
    assert all(owner[p] == len(key_groups(p, n)) for p in range(n))


class InPlaceSum(AggregateFunction):
    """Adds in place, then raises on 13: the window's sum must not keep the 13."""

    def create_accumulator(self):
        return {"sum": 0, "seen": []}

    def add(self, value, acc):
        acc["sum"] += value["v"]
        acc["seen"].append(value["v"])
        if value["v"] == 13:
            raise OverflowError("13")
        return acc

    def get_result(self, acc):
        return {"sum": acc["sum"], "seen": acc["seen"]}  # a list of the accumulator's own

    def merge(self, a, b):
        return {"sum": a["sum"] + b["sum"], "seen": a["seen"] + b["seen"]}


WINDOW_OUTPUT = pa.schema(
    [("k", pa.string()), ("window_start", pa.timestamp("us")), ("window_end", pa.timestamp("us")),
     ("sum", pa.int64()), ("seen", pa.list_(pa.int64())), (TAG, pa.string()), (SIDE, pa.string())]
)  # fmt: skip


WINDOWINGS = {
    # a result per element: output before a failure
    "tumbling": (TumblingEventTimeWindows.of(timedelta(seconds=1)), EarlyFiring.every(count=1)),
    "sliding": (SlidingEventTimeWindows.of(timedelta(seconds=2), timedelta(seconds=1)), None),
    "global": (GlobalWindows.create(), CountTrigger.of(2)),  # fire and purge in the element
}


def _window_operator(query, shared: bool, windowing: str = "tumbling") -> ArrowKeyedOperator:
    assigner, trigger = WINDOWINGS[windowing]
    fn = WindowOperator(assigner, ["k"], InPlaceSum(), StructType(), trigger=trigger)
    if not shared:
        fn.writes_back_reads = False  # type: ignore[misc]
    return ArrowKeyedOperator(
        fn, "sums", ["k"], ["k", "v", "ts"], TS, WINDOW_OUTPUT, str(query), parallelism=1
    )


def _valued(rows) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "k": [k for k, _, _ in rows],
            "v": [v for _, v, _ in rows],
            "ts": [t for _, _, t in rows],
            TS: [t for _, _, t in rows],
            KEY_GROUP: pa.array([zlib.crc32(k.encode()) % MAX_PARALLELISM for k, _, _ in rows],
                                pa.int32()),
        }
    )  # fmt: skip


row = st.tuples(st.sampled_from("abc"), st.sampled_from([1, 2, 13]), st.integers(0, 2_500))


@pytest.mark.parametrize("windowing", WINDOWINGS)
@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(row, max_size=12), min_size=1, max_size=3))
def test_a_window_task_with_shared_reads_equals_one_with_copies(
    tmp_path_factory, windowing, batches
):
    """The window operator reads its windows without a copy (the key's windows changed in
    place); a call that raised after changing an accumulator in place runs the task again
    with copies from the batch's version. Outputs (those already handed over included,
    once), and the state the next batch finds, equal a task's that copied every read; a
    batch without a failure makes no copy."""
    outputs = {}
    for shared in (True, False):
        query = tmp_path_factory.mktemp("q")
        op = _window_operator(query, shared, windowing)
        got = []
        for n, rows in enumerate([*batches, []]):
            _offsets(query, n, 10_000 if n == len(batches) else 0)  # the last closes all
            got.append(_task(op, n, [_valued(rows)]))
        outputs[shared] = got
    assert outputs[True] == outputs[False]
    if windowing != "tumbling":
        return
    final = {(r["k"], r["window_start"]): r["sum"] for r in outputs[True][-1]}
    expected: dict = {}
    for k, v, t in (r for rows in batches for r in rows):
        if v != 13:
            start = datetime(1970, 1, 1) + timedelta(seconds=t // 1000)
            expected[(k, start)] = expected.get((k, start), 0) + v
    assert final == expected


def test_a_window_task_without_failures_copies_no_read(tmp_path, monkeypatch):
    copies = []
    monkeypatch.setattr(keyed, "own_copy", lambda v: copies.append(v) or v)
    monkeypatch.setattr(arrow_keyed, "FLUSH_ROWS", 1)
    query = tmp_path / "q"
    _offsets(query, 0, 0)
    op = _window_operator(query, shared=True)
    rows = [("a", 1, 10), ("a", 2, 20), ("b", 1, 30)]
    out = [r["sum"] for r in _task(op, 0, [_valued(rows)])]
    assert out == [1, 3, 1]
    assert copies == []
    op = _window_operator(tmp_path / "copying", shared=False)
    _offsets(tmp_path / "copying", 0, 0)
    _task(op, 0, [_valued(rows)])
    assert copies  # the same task with copies on read: the counting above sees them


def test_a_failure_after_output_was_handed_over_hands_it_over_once(tmp_path, monkeypatch):
    monkeypatch.setattr(arrow_keyed, "FLUSH_ROWS", 1)  # each key's results go to Spark at once
    query = tmp_path / "q"
    _offsets(query, 0, 0)
    op = _window_operator(query, shared=True)
    rows = [("a", 1, 10), ("a", 2, 20), ("b", 1, 30), ("b", 13, 40), ("b", 2, 50)]
    out = [(r["k"], r["sum"], r["seen"]) for r in _task(op, 0, [_valued(rows)])]
    assert out == [("a", 1, [1]), ("a", 3, [1, 2]), ("b", 1, [1]), ("b", 3, [1, 2])]


class Tally(JoinFunction):
    """Changes its inputs in place (as a function may): each pair sees its records as the
    window held them, whatever another window's pair did to the same record."""

    output_schema = {"k": str, "a": int, "b": int}

    def join(self, first, second):
        first["v"] += 100
        second["v"] += 1_000
        return {"k": first["k"], "a": first["v"], "b": second["v"]}


JOIN_OUTPUT = pa.schema(
    [("k", pa.string()), ("a", pa.int64()), ("b", pa.int64()), (TAG, pa.string()),
     (SIDE, pa.string())]
)  # fmt: skip


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 2), st.integers(0, 4_000)),
                 max_size=10),
        min_size=1, max_size=3,
    )
)  # fmt: skip
def test_a_window_join_task_with_shared_reads_equals_one_with_copies(tmp_path_factory, batches):
    """The window join reads its windows without a copy, and hands its function copies of a
    window's records when the window fires: the same pairs as a task that copied each read."""
    fields = ("k", "v", "ts")
    outputs = {}
    for shared in (True, False):
        fn = CoProcess(
            WindowJoinOperator(
                Tally(), SlidingEventTimeWindows.of(timedelta(seconds=2), timedelta(seconds=1))
            ),
            (CoInput("", fields), CoInput("", fields)),
        )
        if not shared:
            fn.writes_back_reads = False
        query = tmp_path_factory.mktemp("q")
        op = ArrowKeyedOperator(
            fn, "tally", ["k"], [*fields, CO_INPUT], TS, JOIN_OUTPUT, str(query), parallelism=1
        )
        got = []
        for n, rows in enumerate([*batches, []]):
            _offsets(query, n, 10_000 if n == len(batches) else 0)
            arrow = _valued([(k, i, t) for k, i, t in rows]).append_column(
                CO_INPUT, pa.array([i for _, i, _ in rows], pa.int64())
            )
            got.append(sorted(r["a"] * 10_000 + r["b"] for r in _task(op, n, [arrow])))
        outputs[shared] = got
    assert outputs[True] == outputs[False]


class Pairs(ProcessJoinFunction):
    """Changes both records in place and raises on a pair of 13s: each pair sees its records
    as the join holds them, and a failed pair changes nothing."""

    output_schema = {"k": str, "a": int, "b": int}

    def process_element(self, left, right, ctx):
        left["v"] += 100
        right["v"] += 1_000
        if left["v"] % 100 == 13 and right["v"] % 100 == 13:
            raise OverflowError("13")
        yield {"k": left["k"], "a": left["v"], "b": right["v"]}


class AsOf(TemporalJoinFunction):
    """Changes the record and the version in place and raises on a 13 joined with a 13."""

    output_schema = {"k": str, "a": int, "b": int}

    def process_element(self, value, version, ctx):
        value["v"] += 100
        if version is not None:
            version["v"] += 1_000
        if value["v"] % 100 == 13 and version is not None and version["v"] % 100 == 13:
            raise OverflowError("13")
        yield {"k": value["k"], "a": value["v"], "b": version["v"] if version else -1}


JOINS = {
    "interval": lambda: IntervalJoinOperator(Pairs(), timedelta(seconds=-1), timedelta(seconds=1)),
    "temporal": lambda: TemporalJoinOperator(AsOf()),
}


@pytest.mark.parametrize("join", JOINS)
@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from("ab"), st.integers(1, 2), st.sampled_from([1, 13]),
                           st.integers(0, 4_000)), max_size=10),
        min_size=1, max_size=3,
    )
)  # fmt: skip
# A record read from state joined twice: in one batch (interval), in two firings (temporal).
@example(batches=[[("a", 1, 1, 0), ("a", 2, 1, 500), ("a", 2, 1, 700)]])
@example(batches=[[("a", 2, 1, 0), ("a", 1, 1, 1_000)], [("a", 1, 1, 2_500)]])
def test_a_join_task_with_shared_reads_equals_one_with_copies(tmp_path_factory, join, batches):
    """The interval and temporal joins read their state without a copy and hand their
    function copies of what stays in it; a pair that raises runs the task again with copies
    (interval) or is dead-lettered in the timer's call (temporal): the same outputs and dead
    letters as a task that copied each read."""
    fields = ("k", "v", "ts")
    outputs = {}
    for shared in (True, False):
        fn = CoProcess(JOINS[join](), (CoInput("", fields), CoInput("", fields)))
        if not shared:
            fn.writes_back_reads = False
        query = tmp_path_factory.mktemp("q")
        op = ArrowKeyedOperator(
            fn, join, ["k"], [*fields, CO_INPUT], TS, JOIN_OUTPUT, str(query), parallelism=1
        )
        got = []
        for n, rows in enumerate([*batches, []]):
            # The watermark moves within the rows' times: some records join in a later batch.
            _offsets(query, n, 10_000 if n == len(batches) else 2_000 * n)
            arrow = _valued([(k, v, t) for k, _, v, t in rows]).append_column(
                CO_INPUT, pa.array([i for _, i, _, _ in rows], pa.int64())
            )
            out = _task(op, n, [arrow])
            got.append(sorted(json.dumps(r, sort_keys=True, default=str) for r in out))
        outputs[shared] = got
    assert outputs[True] == outputs[False]


class _Counted(list):
    looked = 0

    def __getitem__(self, i):
        type(self).looked += 1
        return super().__getitem__(i)


def test_an_elements_origin_is_found_in_one_pass_over_its_run():
    """A late element's input (and a rejected one's partition and offset) is looked up by the
    element's identity in its key's run: asked in order, as the operator asks, every element
    of a run costs one pass over it, not one each (a run of late records would be quadratic)."""
    n = 1_000
    records = _Counted({"v": i} for i in range(n))
    arrow = pa.record_batch(
        {
            "v": list(range(n)),
            ORIGIN_PARTITION: pa.array([i % 3 for i in range(n)], pa.int32()),
            ORIGIN_OFFSET: pa.array(range(100, 100 + n), pa.int64()),
            UNION_INPUT: pa.array([i % 2 for i in range(n)], pa.int32()),
        }
    )
    origins = arrow_keyed._Origins(arrow, records)
    origins.lo, origins.hi = 0, n
    _Counted.looked = 0
    assert [origins(records[i]) for i in range(n)] == [(i % 3, 100 + i, i % 2) for i in range(n)]
    assert _Counted.looked <= 3 * n  # the asks' own n, and one pass
    assert origins(records[5]) == (2, 105, 1)  # out of order: found all the same
    assert origins({"v": 5}) == (None, None, None)  # not of the run
