"""Declarative window aggregates. Each compiles to a Spark aggregate expression (the fast path)."""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column
from pyspark.sql import functions as F


@dataclass(frozen=True)
class Aggregate:
    """Base of the built-in aggregates; ``field`` is the input column (None for Count)."""

    field: str | None = None

    def column(self) -> Column:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{type(self).__name__.lower()}({self.field or '*'})"


@dataclass(frozen=True)
class Count(Aggregate):
    """Number of elements in the window."""

    def column(self) -> Column:
        return F.count(F.lit(1))


@dataclass(frozen=True)
class Sum(Aggregate):
    def column(self) -> Column:
        return F.sum(self.field)


@dataclass(frozen=True)
class Min(Aggregate):
    def column(self) -> Column:
        return F.min(self.field)


@dataclass(frozen=True)
class Max(Aggregate):
    def column(self) -> Column:
        return F.max(self.field)


@dataclass(frozen=True)
class Avg(Aggregate):
    def column(self) -> Column:
        return F.avg(self.field)
