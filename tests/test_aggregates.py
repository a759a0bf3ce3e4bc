"""Built-in aggregates never overflow on valid input: a sum of int64 values is exact (decimal
(38,0)) on the Python path and on Spark's native path; an average of them is the exact mean,
rounded once."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    StructField,
    StructType,
)

from stateful_runtime.aggregates import WIDE_SUM, Avg, Count, Sum

INT64 = st.integers(-(2**63), 2**63 - 1)
# Many values at the int64 extremes: the sums that overflow a bigint.
EXTREME = st.sampled_from([2**63 - 1, -(2**63), 2**62]) | INT64


def _fold(agg, values: list[int | None], split: int):
    """The Python path as the window operator runs it: two accumulators (a session's two
    halves, say) merged."""
    a, b = agg.create(), agg.create()
    for v in values[:split]:
        a = agg.add(a, {"v": v})
    for v in values[split:]:
        b = agg.add(b, {"v": v})
    return agg.result(agg.merge(a, b))


@given(st.lists(EXTREME | st.none(), max_size=60), st.integers(0, 60))
@settings(max_examples=300, deadline=None)
def test_the_python_sum_of_int64_values_is_python_s_exact_sum(values, split):
    present = [v for v in values if v is not None]
    got = _fold(Sum("v"), values, split)
    if not present:
        assert got is None
        return
    assert got == Decimal(sum(present)) and isinstance(got, Decimal)
    assert len(got.as_tuple().digits) <= WIDE_SUM.precision
    assert _fold(Count(), values, split) == len(values)
    mean = _fold(Avg("v"), values, split)
    assert mean == float(Fraction(sum(present), len(present)))  # rounded once


def test_output_types_are_wide_enough_and_honest():
    assert Sum("v").output_type(LongType()) == DecimalType(38, 0)
    assert Sum("v").output_type(IntegerType()) == DecimalType(38, 0)
    assert Sum("v").output_type(DecimalType(12, 2)) == DecimalType(22, 2)  # Spark's p + 10
    assert Sum("v").output_type(DecimalType(38, 4)) == DecimalType(38, 4)
    assert Sum("v").output_type(DoubleType()) == DoubleType()
    assert Sum("v", wide=False).output_type(LongType()) == LongType()
    assert Avg("v").output_type(LongType()) == DoubleType()
    assert Count().output_type(None) == LongType()
    assert Sum("v").accumulator(LongType()) == "decimal(38,0)"
    assert Sum("v").accumulator(DoubleType()) is None
    assert Sum("v", wide=False).accumulator(LongType()) is None


@given(st.lists(EXTREME, min_size=1, max_size=40))
@settings(max_examples=25, deadline=None)
def test_the_native_sum_of_int64_values_is_python_s_exact_sum(spark, values):
    """Spark's aggregate expression as the native window path builds it (``column`` with the
    input's type) over any int64 values: Python's exact sum, never ARITHMETIC_OVERFLOW."""
    schema = StructType([StructField("k", IntegerType()), StructField("v", LongType())])
    df = spark.createDataFrame([(i % 3, v) for i, v in enumerate(values)], schema)
    out = (
        df.groupBy("k")
        .agg(
            Sum("v").column(LongType()).alias("total"),
            Avg("v").column(LongType()).alias("mean"),
            Count().column().alias("n"),
        )
        .collect()
    )
    for row in out:
        mine = [v for i, v in enumerate(values) if i % 3 == row["k"]]
        assert row["total"] == Decimal(sum(mine))
        assert row["n"] == len(mine)
        # The exact sum as a double, divided: at most two roundings from the exact mean.
        assert math.isclose(row["mean"], Fraction(sum(mine), len(mine)), rel_tol=1e-15)
