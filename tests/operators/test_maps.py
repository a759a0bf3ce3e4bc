"""The map / flat_map operator on Arrow batches (the code Spark's mapInArrow runs): outputs in
the declared schema, every output with its input's carried columns (event time), and errors that
name the step and the record."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stateful_runtime.exceptions import UserFunctionError
from stateful_runtime.operators.maps import MapOperator

OUT = pa.schema([("user", pa.string()), ("k", pa.int64())])


def batch(rows: list[tuple[str, int, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "user": [u for u, _, _ in rows],
            "n": [n for _, n, _ in rows],
            "_event_time": pa.array([ts for _, _, ts in rows], pa.timestamp("us", "UTC")),
        }
    )


def operator(fn, flat: bool = False) -> MapOperator:
    return MapOperator("step", fn, flat, ["user", "n"], OUT, ["_event_time"])


def test_map_converts_each_record_and_keeps_its_event_time():
    op = operator(lambda r: {"user": r["user"].upper(), "k": r["n"] * 10})
    out = op.apply(batch([("a", 1, 5), ("b", 2, 7)]))
    assert out.schema.names == ["user", "k", "_event_time"]
    assert out.to_pydict()["user"] == ["A", "B"]
    assert out.to_pydict()["k"] == [10, 20]
    assert out.column("_event_time").cast(pa.int64()).to_pylist() == [5, 7]


def test_a_missing_output_column_is_null():
    out = operator(lambda r: {"user": r["user"]}).apply(batch([("a", 1, 5)]))
    assert out.to_pydict()["k"] == [None]


@given(
    st.lists(st.tuples(st.text(max_size=3), st.integers(0, 4), st.integers(0, 10**12)), max_size=40)
)
def test_flat_map_outputs_carry_their_own_inputs_event_time(rows):
    def explode(r):
        return ({"user": r["user"], "k": i} for i in range(r["n"]))

    out = operator(explode, flat=True).apply(batch(rows)).to_pydict()
    expected = [(u, i, ts) for u, n, ts in rows for i in range(n)]
    times = pa.array(out["_event_time"], pa.timestamp("us", "UTC")).cast(pa.int64()).to_pylist()
    assert list(zip(out["user"], out["k"], times, strict=True)) == expected


def test_flat_map_may_return_none_or_a_list():
    op = operator(lambda r: None if r["n"] == 0 else [{"user": "x", "k": r["n"]}], flat=True)
    assert op.apply(batch([("a", 0, 1), ("b", 3, 2)])).to_pydict()["k"] == [3]


def test_a_function_that_raises_names_the_step_and_the_record():
    op = operator(lambda r: {"user": r["user"], "k": 100 // r["n"]})
    with pytest.raises(
        UserFunctionError,
        match=r"step: the map function raised "
        r"ZeroDivisionError.*'user': 'b', 'n': 0",
    ):
        op.apply(batch([("a", 1, 1), ("b", 0, 2)]))


def test_an_output_that_does_not_fit_names_the_record_it_came_from():
    op = operator(lambda r: {"user": r["user"], "k": "many" if r["n"] == 2 else r["n"]})
    with pytest.raises(UserFunctionError, match=r"does not fit the declared output.*'n': 2"):
        op.apply(batch([("a", 1, 1), ("b", 2, 2)]))


def test_a_result_that_is_not_a_record_is_refused():
    op = operator(lambda r: [r["user"]], flat=True)  # a list of strings, not of dicts
    with pytest.raises(UserFunctionError, match=r"returned str 'a', not a record.*'n': 1"):
        op.apply(batch([("a", 1, 1)]))
