"""What a warehouse table's existing column can hold, and the rows of a batch it cannot.

A sink creates its table with a column type that holds every value of the job's output type
(a wide sum's ``decimal(38,0)`` as DuckDB ``DECIMAL(38,0)``, PostgreSQL ``numeric``, ClickHouse
``Decimal(38, 0)``). A table that already exists may be narrower: created by an earlier version
(``BIGINT`` sums), or by hand (a ``varchar(8)``, a ClickHouse ``FixedString(4)``). Such a column
is taken when each value can be checked against it (:func:`takes`): an integer or integral
decimal into an integer or decimal column, a string into a string of bounded length. Then
every row is checked before the write (:func:`unstorable`), and a value the column cannot hold
is named (the sink, the column and its type, the value, the row's key), never truncated,
rounded or wrapped by the warehouse, and never allowed to fail the whole batch on every replay.

Some values no column of a warehouse's type can hold, whatever its width: a NUL character in
a PostgreSQL string (``text``, ``varchar``), a time outside ClickHouse's ``DateTime`` (1970 to
2106), ``DateTime64`` (1900 to 2299) or ``Date`` (1970 to 2149); the sink gives those columns a
limit too (:func:`holds_no_nul`; :func:`limit_of` knows ClickHouse's time types).

Where each sink row is one source record (a query without a stateful step), the runtime asks
the sink for the rows it cannot store before the write (:func:`reasons`) and dead-letters them
by the record's origin, and the rest of the batch is written; a row of a window (an
aggregate of many records) cannot be pinned on one record, and stops the job by name
(:func:`storable`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime.exceptions import SinkError

_INTS = {
    # DuckDB / PostgreSQL / ClickHouse names of the fixed-width integers: (bits, signed)
    "tinyint": (8, True),
    "int1": (8, True),
    "int8": (8, True),  # ClickHouse Int8 (lower-cased); PostgreSQL's int8 is below
    "smallint": (16, True),
    "int2": (16, True),
    "int16": (16, True),
    "integer": (32, True),
    "int": (32, True),
    "int4": (32, True),
    "int32": (32, True),
    "bigint": (64, True),
    "int64": (64, True),
    "hugeint": (128, True),
    "int128": (128, True),
    "utinyint": (8, False),
    "uint8": (8, False),
    "usmallint": (16, False),
    "uint16": (16, False),
    "uinteger": (32, False),
    "uint32": (32, False),
    "ubigint": (64, False),
    "uint64": (64, False),
}
_WRAPPERS = re.compile(r"^(?:nullable|lowcardinality)\((.*)\)$", re.IGNORECASE)
_DECIMAL = re.compile(r"^(?:decimal|numeric)\s*\(\s*(\d+)\s*(?:,\s*(\d+)\s*)?\)$", re.IGNORECASE)
_CH_DECIMAL = re.compile(r"^decimal(32|64|128|256)\s*\(\s*(\d+)\s*\)$", re.IGNORECASE)
_BOUNDED_STRING = re.compile(
    r"^(?:varchar|character varying|char|character|bpchar|fixedstring)\s*\(\s*(\d+)\s*\)$",
    re.IGNORECASE,
)
_CH_DIGITS = {"32": 9, "64": 18, "128": 38, "256": 76}
# ClickHouse's time types and the range each holds (outside it the server wraps or clamps).
_CH_DATETIME = re.compile(r"^datetime(?:\s*\(\s*'[^']*'\s*\))?$", re.IGNORECASE)
_CH_DATETIME64 = re.compile(r"^datetime64\s*\(.*\)$", re.IGNORECASE)
_CH_TIMES = {
    "datetime": (datetime(1970, 1, 1, tzinfo=UTC), datetime(2106, 2, 7, 6, 28, 15, tzinfo=UTC)),
    "datetime64": (
        datetime(1900, 1, 1, tzinfo=UTC),
        datetime(2299, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ),
    "date": (datetime(1970, 1, 1, tzinfo=UTC), datetime(2149, 6, 6, tzinfo=UTC)),
}


@dataclass(frozen=True)
class Limit:
    """What one column holds.

    Attributes:
        type: the column's type as the warehouse names it (for messages).
        low, high: the inclusive range of a number column (None: not a number column).
        scale: digits after the point of a decimal column (0 for integers).
        length: the longest string (None: unbounded or not a string column).
        in_bytes: ``length`` counts UTF-8 bytes (ClickHouse ``FixedString``), not characters.
        integer: an integer column (a checked decimal is written to it as an integer: not
            every client converts one).
        earliest, latest: the inclusive range of a time column (UTC; None: not checked).
        nul: a string column holds the NUL character (PostgreSQL's do not).
    """

    type: str
    low: int | None = None
    high: int | None = None
    scale: int = 0
    length: int | None = None
    in_bytes: bool = False
    integer: bool = False
    earliest: datetime | None = None
    latest: datetime | None = None
    nul: bool = True

    def why_not(self, value: object) -> str | None:
        """Why ``value`` does not fit (None: it does)."""
        if value is None:
            return None
        if self.low is not None and self.high is not None and isinstance(value, int | Decimal):
            whole = int(value) if isinstance(value, int) else value.scaleb(self.scale)
            if not self.low <= whole <= self.high:
                return f"{value} is outside the range of {self.type}"
        if self.length is not None and isinstance(value, str):
            n = len(value.encode()) if self.in_bytes else len(value)
            if n > self.length:
                unit = "bytes" if self.in_bytes else "characters"
                return f"a string of {n} {unit} does not fit {self.type}"
        if not self.nul and isinstance(value, str) and "\x00" in value:
            return f"a string holding the NUL character does not fit {self.type}"
        if self.earliest is not None and self.latest is not None and isinstance(value, date):
            at = _utc(value)
            if not self.earliest <= at <= self.latest:
                return (
                    f"{value.isoformat()} is outside the range of {self.type} "
                    f"({self.earliest:%Y-%m-%d} to {self.latest:%Y-%m-%d})"
                )
        return None


def _utc(value: date) -> datetime:
    """A date or time as an aware UTC time (a naive time is UTC, as the sinks store it)."""
    if not isinstance(value, datetime):
        return datetime(value.year, value.month, value.day, tzinfo=UTC)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def holds_no_nul(limit: Limit | None, type_name: str) -> Limit:
    """``limit`` (or none) of a PostgreSQL string column, which cannot hold a NUL character."""
    return replace(limit, nul=False) if limit is not None else Limit(type_name, nul=False)


def limit_of(type_name: str) -> Limit | None:
    """The limit of a column of warehouse type ``type_name`` (DuckDB, PostgreSQL or ClickHouse
    spelling); None when it has none the sink checks (text, floats, timestamps...)."""
    inner = type_name.strip()
    while m := _WRAPPERS.match(inner):
        inner = m.group(1).strip()
    low = inner.lower()
    if low in _INTS:
        bits, signed = _INTS[low]
        if low == "int8" and type_name.strip() == "int8":  # PostgreSQL's int8 is a bigint
            bits = 64
        lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
        return Limit(type_name, lo, hi, integer=True)
    if m := _DECIMAL.match(inner):
        precision, scale = int(m.group(1)), int(m.group(2) or 0)
        return Limit(type_name, -(10**precision) + 1, 10**precision - 1, scale)
    if m := _CH_DECIMAL.match(inner):
        precision, scale = _CH_DIGITS[m.group(1)], int(m.group(2))
        return Limit(type_name, -(10**precision) + 1, 10**precision - 1, scale)
    if m := _BOUNDED_STRING.match(inner):
        return Limit(type_name, length=int(m.group(1)), in_bytes=low.startswith("fixedstring"))
    for pattern, kind in ((_CH_DATETIME, "datetime"), (_CH_DATETIME64, "datetime64")):
        if pattern.match(inner) and inner[:1] == "D":  # ClickHouse spells it DateTime
            return Limit(type_name, earliest=_CH_TIMES[kind][0], latest=_CH_TIMES[kind][1])
    if inner == "Date":
        return Limit(type_name, earliest=_CH_TIMES["date"][0], latest=_CH_TIMES["date"][1])
    return None


def _numeric(t: pa.DataType) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_decimal(t))


def takes(limit: Limit | None, t: pa.DataType) -> bool:
    """Whether a column of ``limit`` takes values of Arrow type ``t`` once each is checked:
    numbers of the same scale into a number column, strings into a bounded string."""
    if limit is None or limit.earliest is not None:
        return False
    if limit.low is not None:
        scale = t.scale if pa.types.is_decimal(t) else 0
        return _numeric(t) and scale == limit.scale
    return limit.length is not None and (pa.types.is_string(t) or pa.types.is_large_string(t))


def _may_exceed(limit: Limit, t: pa.DataType) -> bool:
    """Whether some value of Arrow type ``t`` could be outside ``limit`` (else no row needs a
    look: the hot path of a table whose types are the job's)."""
    if limit.length is not None or limit.earliest is not None:
        return True
    if not limit.nul and (pa.types.is_string(t) or pa.types.is_large_string(t)):
        return True
    if pa.types.is_integer(t) and limit.low is not None and limit.high is not None:
        info = (
            (-(2 ** (t.bit_width - 1)), 2 ** (t.bit_width - 1) - 1)
            if pa.types.is_signed_integer(t)
            else (0, 2**t.bit_width - 1)
        )
        return info[0] < limit.low or info[1] > limit.high
    if pa.types.is_decimal(t) and limit.high is not None:
        return bool(10**t.precision - 1 > limit.high)
    return False


@dataclass(frozen=True)
class Unstorable:
    """A row a table cannot take: its position in the batch, the column, and why."""

    row: int
    column: str
    reason: str


def unstorable(batch: pa.Table, limits: Mapping[str, Limit]) -> list[Unstorable]:
    """The rows of ``batch`` holding a value its column's ``limits`` cannot take, in row
    order (one entry per row: its first such column)."""
    found: dict[int, Unstorable] = {}
    for name, limit in limits.items():
        if name not in batch.column_names:
            continue
        col = batch.column(name)
        if not _may_exceed(limit, col.type):
            continue
        suspects = _suspects(col, limit)
        for i in suspects:
            if i in found:
                continue
            why = limit.why_not(col[i].as_py())
            if why is not None:
                found[i] = Unstorable(i, name, why)
    return [found[i] for i in sorted(found)]


def _suspects(col: pa.ChunkedArray, limit: Limit) -> Sequence[int]:
    """Rows that may not fit, found in Arrow (each is then judged in Python)."""
    if limit.earliest is not None and limit.latest is not None:
        t = col.type
        if not (pa.types.is_timestamp(t) or pa.types.is_date(t)):
            return []
        if pa.types.is_date(t):
            low, high = pa.scalar(limit.earliest.date(), t), pa.scalar(limit.latest.date(), t)
        else:  # the bounds in the column's own zone (a naive column holds UTC wall times)
            bound = (lambda d: d) if t.tz else (lambda d: d.replace(tzinfo=None))
            low, high = pa.scalar(bound(limit.earliest), t), pa.scalar(bound(limit.latest), t)
        mask = pc.or_(pc.less(col, low), pc.greater(col, high))
    elif limit.length is None and not limit.nul:
        mask = pc.match_substring(col, "\x00")
    elif limit.length is not None:
        size = pc.binary_length(col) if limit.in_bytes else pc.utf8_length(col)
        mask = pc.greater(size, limit.length)
        if not limit.nul:
            mask = pc.or_(mask, pc.match_substring(col, "\x00"))
    else:
        assert limit.low is not None and limit.high is not None
        if pa.types.is_decimal(col.type):
            t = col.type
            low = pa.scalar(Decimal(limit.low).scaleb(-limit.scale), t)
            high = pa.scalar(Decimal(limit.high).scaleb(-limit.scale), t)
        else:
            low, high = pa.scalar(limit.low, pa.int64()), pa.scalar(limit.high, pa.int64())
            if limit.low < -(2**63) or limit.high > 2**63 - 1:
                return []  # an int64 fits any wider integer column
        mask = pc.or_(pc.less(col, low), pc.greater(col, high))
    return [int(i) for i in pc.indices_nonzero(pc.fill_null(mask, False)).to_pylist()]


def reasons(batch: pa.Table, limits: Mapping[str, Limit], table: str) -> list[tuple[int, str]]:
    """The rows of ``batch`` that ``table`` (``"PostgreSQL table t"``) cannot store, each with
    the reason a dead letter gives: (row, reason), in row order."""
    return [(u.row, f"{table}: column {u.column}: {u.reason}") for u in unstorable(batch, limits)]


def describe(row: Unstorable, batch: pa.Table, keys: Sequence[str]) -> str:
    """One rejected row for a message: its key and the value that does not fit."""
    values = ((k, batch.column(k)[row.row].as_py()) for k in keys)
    key = ", ".join(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in values)
    return f"row ({key}): column {row.column}: {row.reason}"


def storable(
    batch: pa.Table,
    limits: Mapping[str, Limit],
    keys: Sequence[str],
    *,
    table: str,
    batch_id: int,
    widen: Mapping[str, str],
) -> pa.Table:
    """``batch`` if its table can take every value; else a :class:`SinkError` naming each
    row that does not fit (its key, the column, the value and the column's type) and the way
    on, before any of the rows is written. ``widen``: per column, the type the sink would
    create it with (what to widen it to)."""
    bad = unstorable(batch, limits)
    if not bad:
        return _as_columns(batch, limits)
    shown = "; ".join(describe(r, batch, keys) for r in bad[:3])
    more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
    columns = sorted({r.column for r in bad})
    alter = ", ".join(f"{c} to {widen.get(c, '(its type in the job)')}" for c in columns)
    raise SinkError(
        f"{table}: {len(bad)} row(s) of batch {batch_id} hold a value the table's "
        f"column cannot store: {shown}{more}. None of these rows was written (never "
        f"truncated or wrapped) and the batch was not committed: it is replayed when the job "
        f"runs again (nothing written twice), and stops here again until the table takes it: "
        f"widen {alter} (ALTER TABLE), or write to a new sink.table (the sink creates it "
        f"with those types)"
    )


def _as_columns(batch: pa.Table, limits: Mapping[str, Limit]) -> pa.Table:
    """Checked decimals bound for an integer column, as integers (ClickHouse's client refuses
    a Decimal for an Int64)."""
    for name, limit in limits.items():
        if name not in batch.column_names or not limit.integer:
            continue
        col = batch.column(name)
        if not pa.types.is_decimal(col.type) or limit.low is None or limit.high is None:
            continue
        if -(2**63) <= limit.low and limit.high < 2**63:
            to = pa.int64()
        elif 0 <= limit.low and limit.high < 2**64:
            to = pa.uint64()
        else:
            continue  # a 128-bit integer column takes the decimal as it is
        i = batch.column_names.index(name)
        batch = batch.set_column(i, pa.field(name, to), col.cast(to))
    return batch
