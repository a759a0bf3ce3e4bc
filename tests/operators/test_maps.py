"""The map / flat_map operator on Arrow batches (the code Spark's mapInArrow runs): outputs in
the declared schema, every output with its input's carried columns (event time); a record the
function fails on isolated (dead-lettered with the step, the reason and its source origin) while
the rest of the batch goes on, or, under ``errors.policy=fail`` and past the error bound, an
error that names the step, the record and the command that skips it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from stateful_runtime.exceptions import UserFunctionError
from stateful_runtime.job import ErrorPolicy
from stateful_runtime.operators.isolation import ORIGIN_OFFSET, StepGuard
from stateful_runtime.operators.maps import MapOperator
from tests.operators.map_batches import CARRIED, FAIL, NO_BOUND, OUT, batch


def operator(fn, flat: bool = False, errors: ErrorPolicy = FAIL) -> MapOperator:
    guard = StepGuard("step", "payments", errors, None)
    return MapOperator("step", fn, flat, ["user", "n"], OUT, CARRIED, guard)


def test_map_converts_each_record_and_keeps_its_event_time():
    op = operator(lambda r: {"user": r["user"].upper(), "k": r["n"] * 10})
    out = op.apply(batch([("a", 1, 5), ("b", 2, 7)]))
    assert out.schema.names == ["user", "k", *CARRIED]
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


def test_under_the_fail_policy_the_error_names_the_origin_and_the_skip_command():
    op = operator(lambda r: {"user": r["user"], "k": 100 // r["n"]})
    with pytest.raises(
        UserFunctionError, match=r"source record payments:1:101.*srt run <job file> --skip "
    ):
        op.apply(batch([("a", 1, 1), ("b", 0, 2)]))


def _fails(n: int) -> bool:
    return n % 7 == 3


def _raising(r):
    if _fails(r["n"]):
        raise ValueError(f"bad n {r['n']}")
    return {"user": r["user"], "k": r["n"]}


@given(st.lists(st.tuples(st.text(max_size=3), st.integers(0, 30), st.integers(0, 10**12))))
def test_a_record_the_map_raises_on_is_dead_lettered_and_the_rest_go_on(rows):
    op = operator(_raising, errors=NO_BOUND)
    out = op.apply(batch(rows)).to_pydict() if rows else {"user": [], "k": [], ORIGIN_OFFSET: []}
    good = [i for i, (_, n, _) in enumerate(rows) if not _fails(n)]
    assert out["k"] == [rows[i][1] for i in good]
    assert out[ORIGIN_OFFSET] == [100 + i for i in good]  # each output keeps its own origin
    rejected = op.guard.rejected_records
    bad = [i for i, (_, n, _) in enumerate(rows) if _fails(n)]
    assert [(p, o) for _, _, p, o in rejected] == [(i % 3, 100 + i) for i in bad]
    for (raw, reason, _, _), i in zip(rejected, bad, strict=True):
        assert reason.startswith("step: the map function raised ValueError: bad n")
        assert "test_maps.py" in reason  # where it was raised
        assert f'"n": {rows[i][1]}' in raw.decode()


@given(st.lists(st.tuples(st.text(max_size=3), st.integers(0, 5), st.integers(0, 10**12))))
def test_a_flat_map_record_that_fails_loses_all_its_outputs_and_no_other(rows):
    def explode(r):
        for i in range(r["n"]):
            # the third output of a record is not a record: the whole record is rejected
            yield {"user": r["user"], "k": i} if i < 2 else "oops"

    op = operator(explode, flat=True, errors=NO_BOUND)
    got = op.apply(batch(rows)).to_pydict() if rows else {"k": []}
    assert got["k"] == [i for _, n, _ in rows if n <= 2 for i in range(n)]
    assert len(op.guard.rejected_records) == sum(1 for _, n, _ in rows if n > 2)
    assert all("not a record" in r for _, r, _, _ in op.guard.rejected_records)


def test_an_output_that_does_not_fit_is_dead_lettered_alone():
    op = operator(
        lambda r: {"user": r["user"], "k": "many" if r["n"] == 2 else r["n"]}, errors=NO_BOUND
    )
    out = op.apply(batch([("a", 1, 1), ("b", 2, 2), ("c", 3, 3)])).to_pydict()
    assert out["k"] == [1, 3]
    assert out[ORIGIN_OFFSET] == [100, 102]
    [(raw, reason, p, o)] = op.guard.rejected_records
    assert (p, o) == (1, 101) and "does not fit the declared output" in reason


def test_a_function_that_fails_for_every_record_stops_the_job():
    op = operator(_raising, errors=ErrorPolicy(max_consecutive=5))
    with pytest.raises(UserFunctionError, match=r"rejected 5 records in a row.*max_consecutive"):
        op.apply(batch([("a", 3, 1)] * 6))


def test_a_function_that_fails_for_a_large_share_stops_the_job():
    rows = [("a", 3 if i % 4 == 0 else 1, i) for i in range(200)]  # every fourth fails
    op = operator(_raising, errors=ErrorPolicy(max_fraction=0.1))
    with pytest.raises(UserFunctionError, match=r"rejected 50 of the 200 records.*max_fraction"):
        list(op(iter([batch(rows)])))  # checked at the end of the task, before staging
    ok = operator(_raising, errors=ErrorPolicy(max_fraction=0.5))
    assert sum(b.num_rows for b in ok(iter([batch(rows)]))) == 150
