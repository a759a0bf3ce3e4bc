"""How the Spark adapter turns the pandas frames of transformWithStateInPandas into a keyed
function's records: Python values of each column's own type (no upcast across columns), a
null in a numeric column as None, the event time apart."""

from __future__ import annotations

import pandas as pd

from stateful_runtime import KeyedProcessFunction
from stateful_runtime.operators.spark import TS, SparkKeyedProcessor


class Echo(KeyedProcessFunction):
    output_schema = {"n": int}


def test_records_keep_each_columns_python_type_and_nulls_are_none():
    processor = SparkKeyedProcessor(Echo(), ["id", "n", "price", "ok"], ["n"])
    frames = [
        pd.DataFrame(
            {"id": ["a", "b"], "n": [1, 2], "price": [2.5, 3.0], "ok": [True, False], TS: [10, 20]}
        ),
        # Spark hands a null int as NaN in a float column; one-row frames are the common case
        pd.DataFrame(
            {"id": ["c"], "n": [float("nan")], "price": [float("nan")], "ok": [True], TS: [30]}
        ),
        pd.DataFrame({TS: [40], "n": [7], "id": ["d"], "price": [1.0], "ok": [False]}),
    ]
    out = list(processor._elements(iter(frames)))
    assert out == [
        (10, {"id": "a", "n": 1, "price": 2.5, "ok": True}),
        (20, {"id": "b", "n": 2, "price": 3.0, "ok": False}),
        (30, {"id": "c", "n": None, "price": None, "ok": True}),
        (40, {"id": "d", "n": 7, "price": 1.0, "ok": False}),
    ]
    assert [type(r["n"]) for _, r in out] == [int, int, type(None), int]
    assert all(type(ts) is int for ts, _ in out)
