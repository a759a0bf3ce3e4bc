"""Declarative window aggregates.

Each compiles to a Spark aggregate expression (the native path) and also runs in Python over an
accumulator (the full-semantics window path): ``create``/``add``/``merge``/``result``.

**Valid input never overflows.** A sum of an integral field (int8..int64) accumulates, and is
written, as ``decimal(38,0)``: exact for any sum of up to 10^19 int64 values (Spark's
``SUM(BIGINT)`` is a ``BIGINT`` that fails the batch with ``ARITHMETIC_OVERFLOW`` under ANSI,
on every replay). A sum of ``decimal(p,s)`` widens to ``decimal(min(38, p+10), s)`` as Spark's
does; a float sum stays a double. An average of integers sums exactly and divides at the end
(a double, as Spark's; Spark's own sums them in a double); a count is a ``bigint``.
``Sum(field, wide=False)`` keeps the old ``bigint`` sum: the state of a native window
checkpointed before the widening holds it, and Spark cannot convert a state schema (the
compatibility check names this way back).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ByteType,
    DataType,
    DecimalType,
    DoubleType,
    IntegerType,
    LongType,
    ShortType,
)

from stateful_runtime.exceptions import ConfigError

INTEGRAL = (ByteType, ShortType, IntegerType, LongType)
# What an integral sum accumulates in: 38 digits hold 10^19 int64 values at their extreme.
WIDE_SUM = DecimalType(38, 0)


@dataclass(frozen=True)
class Aggregate:
    """Base of the built-in aggregates; ``field`` is the input column (None for Count)."""

    field: str | None = None

    def column(self, input_type: DataType | None = None) -> Column:
        """The Spark aggregate expression over a field of ``input_type``."""
        raise NotImplementedError

    def describe(self) -> str:
        return f"{type(self).__name__.lower()}({self.field or '*'})"

    def accumulator(self, input_type: DataType | None) -> str | None:
        """The type the native path's state keeps, where it is not the input's (None): part
        of the state's signature, so a change of it is named by the compatibility check."""
        return None

    def create(self) -> Any:
        return None

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        if b is None:
            return a
        return self._combine(a, b)

    def _combine(self, a: Any, b: Any) -> Any:
        raise NotImplementedError

    def result(self, acc: Any) -> Any:
        return acc

    def output_type(self, input_type: DataType | None) -> DataType:
        assert input_type is not None
        return input_type

    def _value(self, record: dict[str, Any]) -> Any:
        return record[self._field()]

    def _field(self) -> str:
        """The input field of an aggregate that needs one."""
        if self.field is None:
            raise ConfigError(f"{type(self).__name__}() needs the field it aggregates")
        return self.field


@dataclass(frozen=True)
class Count(Aggregate):
    """Number of elements in the window."""

    def column(self, input_type: DataType | None = None) -> Column:
        return F.count(F.lit(1))

    def create(self) -> int:
        return 0

    def add(self, acc: int, record: dict[str, Any]) -> int:
        return acc + 1

    def _combine(self, a: int, b: int) -> int:
        return a + b

    def output_type(self, input_type: DataType | None) -> DataType:
        return LongType()


@dataclass(frozen=True)
class Sum(Aggregate):
    """Sum of ``field``; integral fields sum exactly in ``decimal(38,0)`` (module docstring).

    Args:
        field: the input column.
        wide: False keeps Spark's ``bigint`` sum of integral fields (overflow fails the batch):
            only to keep running on native-window state checkpointed before the widening.
    """

    wide: bool = True

    def column(self, input_type: DataType | None = None) -> Column:
        col = F.col(self._field())
        if self.wide and isinstance(input_type, INTEGRAL):
            col = col.cast(WIDE_SUM)
        return F.sum(col)

    def accumulator(self, input_type: DataType | None) -> str | None:
        wide = self.wide and isinstance(input_type, INTEGRAL)
        return WIDE_SUM.simpleString() if wide else None

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        v = self._value(record)
        return v if acc is None else (acc if v is None else acc + v)

    def _combine(self, a: Any, b: Any) -> Any:
        return a + b

    def result(self, acc: Any) -> Any:
        # Python's int is exact; the output column's decimal(38,0) takes it as a Decimal.
        return Decimal(acc) if self.wide and isinstance(acc, int) else acc

    def output_type(self, input_type: DataType | None) -> DataType:
        assert input_type is not None
        if isinstance(input_type, INTEGRAL):
            return WIDE_SUM if self.wide else LongType()
        if isinstance(input_type, DecimalType):  # Spark's widening of a decimal sum
            return DecimalType(min(38, input_type.precision + 10), input_type.scale)
        return input_type


@dataclass(frozen=True)
class Min(Aggregate):
    def column(self, input_type: DataType | None = None) -> Column:
        return F.min(self._field())

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        v = self._value(record)
        return v if acc is None else (acc if v is None else min(acc, v))

    def _combine(self, a: Any, b: Any) -> Any:
        return min(a, b)


@dataclass(frozen=True)
class Max(Aggregate):
    def column(self, input_type: DataType | None = None) -> Column:
        return F.max(self._field())

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        v = self._value(record)
        return v if acc is None else (acc if v is None else max(acc, v))

    def _combine(self, a: Any, b: Any) -> Any:
        return max(a, b)


@dataclass(frozen=True)
class Avg(Aggregate):
    """Mean of ``field`` as a double. Of an integral field: summed exactly (``decimal(38,0)``
    on the native path, Python's int on the other), then divided once by the count. Spark's
    ``avg`` sums integers in a double, which loses whole values (the mean of 2^63-1 three
    times and -2^63 came out 0, not 3.5e18)."""

    def column(self, input_type: DataType | None = None) -> Column:
        if not isinstance(input_type, INTEGRAL):
            return F.avg(self._field())
        col = F.col(self._field())
        return F.sum(col.cast(WIDE_SUM)).cast(DoubleType()) / F.count(col)

    def accumulator(self, input_type: DataType | None) -> str | None:
        return WIDE_SUM.simpleString() if isinstance(input_type, INTEGRAL) else None

    def create(self) -> tuple[int | float, int]:
        # An int 0: integers then sum exactly (a state written as (0.0, n) still adds up).
        return (0, 0)

    def add(self, acc: tuple[float, int], record: dict[str, Any]) -> tuple[float, int]:
        v = self._value(record)
        return acc if v is None else (acc[0] + v, acc[1] + 1)

    def _combine(self, a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc: tuple[float, int]) -> float | None:
        return float(acc[0] / acc[1]) if acc[1] else None

    def output_type(self, input_type: DataType | None) -> DataType:
        return DoubleType()
