"""Declarative window aggregates.

Each compiles to a Spark aggregate expression (the native path) and also runs in Python over an
accumulator (the full-semantics window path): ``create``/``add``/``merge``/``result``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DoubleType, LongType

from stateful_runtime.exceptions import ConfigError


@dataclass(frozen=True)
class Aggregate:
    """Base of the built-in aggregates; ``field`` is the input column (None for Count)."""

    field: str | None = None

    def column(self) -> Column:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{type(self).__name__.lower()}({self.field or '*'})"

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

    def column(self) -> Column:
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
    def column(self) -> Column:
        return F.sum(self._field())

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        v = self._value(record)
        return v if acc is None else (acc if v is None else acc + v)

    def _combine(self, a: Any, b: Any) -> Any:
        return a + b


@dataclass(frozen=True)
class Min(Aggregate):
    def column(self) -> Column:
        return F.min(self._field())

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        v = self._value(record)
        return v if acc is None else (acc if v is None else min(acc, v))

    def _combine(self, a: Any, b: Any) -> Any:
        return min(a, b)


@dataclass(frozen=True)
class Max(Aggregate):
    def column(self) -> Column:
        return F.max(self._field())

    def add(self, acc: Any, record: dict[str, Any]) -> Any:
        v = self._value(record)
        return v if acc is None else (acc if v is None else max(acc, v))

    def _combine(self, a: Any, b: Any) -> Any:
        return max(a, b)


@dataclass(frozen=True)
class Avg(Aggregate):
    def column(self) -> Column:
        return F.avg(self._field())

    def create(self) -> tuple[float, int]:
        return (0.0, 0)

    def add(self, acc: tuple[float, int], record: dict[str, Any]) -> tuple[float, int]:
        v = self._value(record)
        return acc if v is None else (acc[0] + v, acc[1] + 1)

    def _combine(self, a: tuple[float, int], b: tuple[float, int]) -> tuple[float, int]:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc: tuple[float, int]) -> float | None:
        return acc[0] / acc[1] if acc[1] else None

    def output_type(self, input_type: DataType | None) -> DataType:
        return DoubleType()
