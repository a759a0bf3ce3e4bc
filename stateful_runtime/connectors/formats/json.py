r"""JSON records → typed Arrow columns, with a reason for every record that does not fit.

Every input record yields exactly one output row, in input order, whatever its neighbours:
good rows have ``_error`` null; bad rows carry ``_error`` and their original bytes in ``_raw``
(other columns null) and go to the dead-letter output.

**One judge, one fast path that provably agrees with it.** The per-record parser
(:func:`parse_record` + the field checks, in Python) defines what is good. The fast path parses a
chunk of records with Arrow's C++ JSON reader (joined by ``\n``), and its result is used only
where it must equal the judge's:

* the chunk is screened first (six numpy/memchr passes, ~10% of the decode time): every record
  must start with ``{``, end with ``}`` and hold no newline, NUL, ``NaN``/``Inf``, invalid UTF-8,
  more than :data:`MAX_RECORD_BYTES` or more ``{``/``[`` than :data:`MAX_DEPTH`. With the first
  three, a record boundary can only fall between two top-level values (a newline inside a string
  is a parse error; ``}`` followed by ``{`` inside a container is one too), so each record is
  one or more whole objects, and Arrow's row count equal to the record count proves one row per
  record — a blank record next to ``{..}{..}`` can no longer shift rows. Records failing the
  screen are located (vectorised) and go to the judge; the runs between them stay on the fast
  path;
* a chunk Arrow refuses (a wrong type, malformed JSON), or whose double column holds an
  infinity (an integer literal past 1.8e308, which Arrow reads as inf), is halved until the
  failing part is :data:`BISECT_MIN` records, which go to the judge;
* the checks after parsing (required fields, event time) are the same vectorised code for both
  paths.

**Two halves.** :func:`parse_json` (the screen, the fast path, the judge) depends only on the
fields' names and types: typed columns and the structural reason a record is refused.
:func:`finish_parsed` judges what the job decides (required fields, event time, the batch's
bounds) and keeps the bad records' bytes. :func:`decode_json` is the two in a row; the event log
stores the first half of a topic with a schema at append (``eventlog/store.py``).

Outcomes (``*`` = dead letter, with the reason shown; the tests name each class):

==============================================  ==============================================
input                                           outcome
==============================================  ==============================================
an object with every required field typed       good; unknown fields ignored
missing or ``null`` required field              * ``missing field 'f'`` (null counts as missing)
missing or ``null`` Optional field              good, the column is null
wrong type (``"1"`` or ``1.5`` for an int,      * ``field 'f': expected int64, got string "1"``
``true`` for a number, an object for a string)
int for a double field                          good, converted (``3`` → ``3.0``)
int out of int64/int32 range                    * ``field 'f': ... does not fit int64``
number out of double range (``1e400``)          * ``number 1e400 is out of range for a double``
``NaN``, ``Infinity``, ``-Infinity``            * ``NaN is not JSON ...``, anywhere in the record
                                                (RFC 8259 §6); ``Inf``: ``malformed JSON``
a declared field given twice                    * ``field 'f' appears twice`` (an unknown field
                                                given twice is ignored)
top-level array, string, number, null, bool     * ``expected a JSON object, got array`` ...
two objects in one record (``{..}{..}``)        * ``malformed JSON: Extra data ...``
empty or whitespace-only record                 * ``empty record``
``\r\n``, spaces or newlines around the object  good (JSON whitespace); such records take the
                                                per-record path, ~6x slower
invalid UTF-8 anywhere (also inside a string)   * ``not valid UTF-8 (byte N)``
lone surrogate escape (``"\ud800"``)            * ``lone surrogate escape \ud800: not valid
                                                Unicode``, anywhere in the record
escaped NUL (``"\u0000"``) in a string          good (Spark, Arrow and DuckDB keep it)
raw NUL or other control byte                   * ``malformed JSON: Invalid control character``
UTF-8 byte-order mark before the object         * ``starts with a byte-order mark ...``
nested deeper than :data:`MAX_DEPTH` (128)      * ``nested deeper than 128 levels``
longer than :data:`MAX_RECORD_BYTES` (1 MiB),   * ``record is 10485760 bytes, over the
e.g. a 10 MB record                             1048576-byte limit`` (``_raw`` keeps all of it)
event time (``event_time=``) before 0001-01-02  * ``event time 'ts': 10000000000000000 (ms) is
or after 9999-01-01 (e.g. ``ts_ms`` 1e16)       outside 0001-01-02..9999-01-01``
negative event time inside that range           good here (an instant before 1970); the
                                                default policy's floor refuses it
event time string not ``YYYY-MM-DD[Thh:mm[:ss   * ``event time 't': "..." is not an ISO-8601
[.ffffff][Z|±hh:mm]]]`` or not a real date      timestamp ...`` / ``is not a valid timestamp``
event time outside the batch's ``bounds``       * ``event time 'ts' 2100-01-01T00:00:00Z
(:class:`TimeBounds`: the source's policy, a    (4102444800000 ms) is 73.1 years ahead of the
floor and a ceiling ahead of processing time    batch's processing time 2026-...Z;
or of the watermark)                            max_ahead_of_processing_time 1:00:00``
==============================================  ==============================================
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from itertools import groupby
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    DataType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from stateful_runtime.exceptions import ConfigError
from stateful_runtime.instants import iso_ms, span

ERROR_COLUMN = "_error"
RAW_COLUMN = "_raw"
# Arrow parses 4k records in ~1 ms; a bad record costs a Python re-parse of its chunk only.
CHUNK = 4096
# Below this many records a failing chunk goes straight to the per-record Python parser.
BISECT_MIN = 64
# Kafka's default message.max.bytes (1 MiB): a record larger than this cannot pass a default
# broker anyway, and bounds what one record costs the per-record path (a 1 MiB record of small
# objects: ~80 ms). `srt log append/serve` refuse longer lines (the same number).
MAX_RECORD_BYTES = 1 << 20
# serde_json's default recursion limit. Python's json recurses once per level against a limit of
# 1000 frames (minus the Spark worker's own stack), so 128 leaves it > 800 levels of headroom;
# event records rarely nest beyond 10.
MAX_DEPTH = 128
# A fast-path buffer larger than this is split before parsing (Arrow's block size is an int32).
MAX_CHUNK_BYTES = 64 << 20
# Event times every layer can represent: Python's datetime (the sinks' Arrow → Python
# conversions, the test harness) holds years 1-9999 and Spark's timestamp_millis overflows past
# ~292,000 AD (DATETIME_OVERFLOW fails the batch on every replay). A day of margin at the bottom
# for session time zones, a year at the top for the end of the window holding the event.
EVENT_TIME_MIN = datetime(1, 1, 2, tzinfo=UTC)
EVENT_TIME_MAX = datetime(9999, 1, 1, tzinfo=UTC)
# Timestamp strings both Spark's cast (ANSI mode fails the batch on anything else) and
# datetime.fromisoformat accept: Spark refuses a zone without seconds and a bare date with Z.
_ISO_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?"
    r"(?:Z|[+-]\d{2}:\d{2})?)?)?"
)
_RANGE = f"{EVENT_TIME_MIN.date().isoformat()}..{EVENT_TIME_MAX.date().isoformat()}"

_PY_TYPES: dict[Any, DataType] = {
    str: StringType(),
    int: LongType(),
    float: DoubleType(),
    bool: BooleanType(),
    bytes: BinaryType(),
    datetime: TimestampType(),
}
_ARROW: dict[type, pa.DataType] = {
    StringType: pa.string(),
    LongType: pa.int64(),
    IntegerType: pa.int32(),
    DoubleType: pa.float64(),
    BooleanType: pa.bool_(),
}
_INT_RANGE = {"int64": (-(2**63), 2**63), "int32": (-(2**31), 2**31)}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MIN_MS = (EVENT_TIME_MIN - _EPOCH) // _EPOCH.resolution // 1000
_MAX_MS = (EVENT_TIME_MAX - _EPOCH) // _EPOCH.resolution // 1000
_OPEN, _CLOSE, _NL, _SQUARE = ord("{"), ord("}"), ord("\n"), ord("[")
_JSON_TYPES = (
    (bool, "boolean"),
    (int | float, "number"),
    (str, "string"),
    (dict, "object"),
    (list, "array"),
)


def _plain(value: Any) -> Any:
    """What JSON holds of a value it has no type for: an integral decimal (a wide sum's
    ``decimal(38,0)``) as the exact integer, a JSON number a reader takes whole (never a
    float); anything else as its str()."""
    if isinstance(value, Decimal) and value.is_finite() and int(value.as_tuple().exponent) >= 0:
        return int(value)
    return str(value)


# Records the sinks write: compact JSON, values JSON cannot hold as _plain() gives them; one
# encoder for every row (json.dumps with these options builds a new encoder per call).
_RECORD_ENCODER = json.JSONEncoder(default=_plain, separators=(",", ":"))


def encode_record(record: Mapping[str, Any]) -> bytes:
    """A record as the sinks write it (``json.dumps(record, default=_plain, separators=(",",
    ":"))``, byte for byte): an integral decimal is a JSON integer, exact at any size."""
    return _RECORD_ENCODER.encode(record).encode()


# A character json.dumps escapes (control characters, quote, backslash; non-ASCII is checked
# apart).
_ESCAPED = r'[\x00-\x1f"\\]'


def encode_records(table: pa.Table) -> list[bytes]:
    """Every row of ``table`` as :func:`encode_record` writes it, byte for byte.

    Built a column at a time in Arrow (~0.3 µs a row against ~2 µs for the row encoder) when
    every column's JSON text is exact there: strings that need no escape, integers and
    integral decimals, booleans, nulls. Any other table (floats, timestamps, nested values,
    escapes) goes row by row.
    """
    names = table.column_names
    texts = None if len(set(names)) != len(names) else [_json_texts(c) for c in table.columns]
    if not names or texts is None or any(t is None for t in texts):
        return [encode_record(row) for row in table.to_pylist()]
    parts: list[Any] = []
    for i, (name, text) in enumerate(zip(names, texts, strict=True)):
        parts += [("{" if i == 0 else ",") + json.dumps(name) + ":", text]
    parts.append("}")
    joined = pc.binary_join_element_wise(*parts, "")
    return pc.cast(joined, pa.binary()).to_pylist()  # type: ignore[no-any-return]


def _json_texts(col: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """A column's values as JSON text, or None where Arrow's text would differ from json's."""
    t = col.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        if (
            pc.any(pc.invert(pc.string_is_ascii(col))).as_py()
            or pc.any(pc.match_substring_regex(col, _ESCAPED)).as_py()
        ):
            return None
        text = pc.binary_join_element_wise('"', col, '"', "")
    elif pa.types.is_integer(t) or (pa.types.is_decimal(t) and t.scale == 0):
        text = pc.cast(col, pa.string())  # digits, as _plain's int of a decimal prints
    elif pa.types.is_boolean(t):
        text = pc.if_else(col, "true", "false")
    elif pa.types.is_null(t):
        text = pa.chunked_array([pa.nulls(len(col), pa.string())])
    else:
        return None
    return pc.fill_null(text, "null") if text.null_count else text


def _json_type(value: Any) -> str:
    return next((name for tp, name in _JSON_TYPES if isinstance(value, tp)), "null")


def to_struct(schema: StructType | Mapping[str, Any]) -> StructType:
    """A record schema from a StructType or a ``{field: python type}`` mapping.

    Fields are required (a record without them is a dead letter); wrap a type in ``Optional[...]``
    (or give a nullable StructField) to allow missing or null values.
    """
    if isinstance(schema, StructType):
        return schema
    fields = []
    for name, tp in schema.items():
        nullable = False
        args = getattr(tp, "__args__", None)
        if args and type(None) in args:
            nullable = True
            tp = next(a for a in args if a is not type(None))
        if isinstance(tp, DataType):
            fields.append(StructField(name, tp, nullable))
        elif tp in _PY_TYPES:
            fields.append(StructField(name, _PY_TYPES[tp], nullable))
        else:
            raise ConfigError(
                f"field {name!r}: unsupported type {tp!r}; use one of str, int, float, bool, "
                f"or a pyspark.sql.types DataType"
            )
    return StructType(fields)


# The field types a schema string (`srt log create --schema`) names, as Spark's DDL spells them.
_DDL_TYPES: dict[str, DataType] = {
    "string": StringType(),
    "bigint": LongType(),
    "long": LongType(),
    "int": IntegerType(),
    "integer": IntegerType(),
    "double": DoubleType(),
    "boolean": BooleanType(),
}


def schema_from_ddl(text: str) -> StructType:
    """A record schema from ``"name type, name type, ..."`` (Spark's DDL for the types JSON
    decoding reads: string, bigint, int, double, boolean; ``NOT NULL`` after a type makes the
    field required, as a job's plain ``{name: type}`` field is)."""
    fields = []
    for part in text.split(","):
        words = part.split()
        required = [w.lower() for w in words[2:]] == ["not", "null"]
        if len(words) < 2 or (len(words) > 2 and not required):
            raise ConfigError(
                f"schema {text!r}: each field is 'name type' (or 'name type NOT NULL'), "
                f"got {part.strip()!r}"
            )
        name, kind = words[0], words[1].lower()
        if kind not in _DDL_TYPES:
            raise ConfigError(
                f"schema {text!r}: field {name!r} has type {words[1]!r}; JSON decoding reads "
                f"{', '.join(sorted(set(_DDL_TYPES) - {'long', 'integer'}))}"
            )
        fields.append(StructField(name, _DDL_TYPES[kind], not required))
    names = [f.name for f in fields]
    if len(set(names)) != len(names):
        raise ConfigError(f"schema {text!r}: a field is named twice")
    return StructType(fields)


def arrow_schema(schema: StructType) -> pa.Schema:
    out = []
    for f in schema.fields:
        tp = _ARROW.get(type(f.dataType))
        if tp is None:
            raise ConfigError(
                f"field {f.name!r}: JSON decoding supports string, bigint, int, double and "
                f"boolean fields; got {f.dataType.simpleString()}"
            )
        out.append(pa.field(f.name, tp, nullable=True))
    return pa.schema(out)


def output_schema(schema: pa.Schema) -> pa.Schema:
    return schema.append(pa.field(ERROR_COLUMN, pa.string())).append(
        pa.field(RAW_COLUMN, pa.binary())
    )


@dataclass(frozen=True)
class TimeBounds:
    """The event times one batch accepts, in ms since the epoch (both ends inclusive), and what
    each bound is, for the reason a record outside gets. Computed by the driver for a batch
    (:mod:`stateful_runtime.connectors.event_time`) and applied by the decoder on both paths.

    Attributes:
        floor_ms: the earliest event time accepted (None: no floor).
        floor_why: what the floor is, e.g. ``"the floor 1970-01-01T00:00:00Z"``.
        ceiling_ms: the latest event time accepted (None: no ceiling).
        ceiling_from_ms: the instant the ceiling is measured from.
        ceiling_from: what that instant is, e.g. ``"the batch's processing time"``.
        ceiling_setting: the setting and its value, e.g. ``"max_ahead_of_processing_time
            1:00:00"``.
        stream_ms: how far a record may lie ahead of both the watermark and the records around
            it in its partition (None: not judged; applied per split by the source,
            :func:`stateful_runtime.connectors.event_time.refuse_outliers`).
        watermark_ms: the source's watermark at the start of the batch (0: none yet).
    """

    floor_ms: int | None = None
    floor_why: str = ""
    ceiling_ms: int | None = None
    ceiling_from_ms: int = 0
    ceiling_from: str = ""
    ceiling_setting: str = ""
    stream_ms: int | None = None
    watermark_ms: int = 0

    def reason(self, name: str, ms: float, shown: str) -> str | None:
        """Why event time ``ms`` (shown as ``shown``, the record's own value) is refused, or
        None if it lies inside."""
        if self.floor_ms is not None and ms < self.floor_ms:
            return f"event time {name!r} {iso_ms(ms)} ({shown}) is before {self.floor_why}"
        if self.ceiling_ms is not None and ms > self.ceiling_ms:
            return (
                f"event time {name!r} {iso_ms(ms)} ({shown}) is "
                f"{span(ms - self.ceiling_from_ms)} ahead of {self.ceiling_from} "
                f"{iso_ms(self.ceiling_from_ms)}; {self.ceiling_setting}"
            )
        return None


# -- the judge: one record ------------------------------------------------------------------


class _Reject(ValueError):
    """A record the JSON grammar allows (or Python's json does) but we refuse, with why."""


class _Object(dict):
    __slots__ = ("repeated",)
    repeated: set[str]  # keys given more than once (set only then)


def _pairs(pairs: list[tuple[str, Any]]) -> _Object:
    obj = _Object(pairs)
    if len(obj) != len(pairs):
        obj.repeated = {k for k, n in Counter(k for k, _ in pairs).items() if n > 1}
    return obj


def _constant(name: str) -> float:
    raise _Reject(f"{name} is not JSON (non-finite numbers are not allowed)")


def _float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Reject(f"number {text[:40]} is out of range for a double")
    return value


_DECODER = json.JSONDecoder(parse_float=_float, parse_constant=_constant)
# The same, noting repeated keys: ~10x slower on object-heavy records, so only used when a
# watched field's name occurs twice in the text or an escape could spell it differently.
_PAIRS_DECODER = json.JSONDecoder(
    parse_float=_float, parse_constant=_constant, object_pairs_hook=_pairs
)
# A JSON string (escapes included) or one bracket: what _depth needs to skip strings.
_TOKENS = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.S)


def _depth(text: str) -> int:
    """Nesting depth of a JSON text (stops counting past MAX_DEPTH)."""
    depth = 0
    for m in _TOKENS.finditer(text):
        c = m.group()
        if c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return depth
        elif c in "]}":
            depth -= 1
    return 0


def _lone_surrogate(obj: Any) -> str | None:
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"\\u{ord(item[exc.start]):04x}"
    return None


def parse_record(
    line: bytes, watch: Sequence[str] = ()
) -> tuple[dict[str, Any] | None, str | None]:
    """One record → (its JSON object, None) or (None, why it is not a valid record).

    The record-level rules of the table in this module's docstring (size, UTF-8, emptiness,
    depth, JSON grammar without NaN/Infinity, an object at the top, no lone surrogate); the
    field checks come after. Never raises, whatever the bytes: ``srt log append/serve`` use it
    to take a key from a line. If a top-level key in ``watch`` is given twice, the object has
    an attribute ``repeated`` naming the repeated keys.
    """
    if len(line) > MAX_RECORD_BYTES:
        return None, f"record is {len(line)} bytes, over the {MAX_RECORD_BYTES}-byte limit"
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, f"not valid UTF-8 (byte {exc.start})"
    if not text.strip(" \t\r\n"):
        return None, "empty record"
    if text[0] == "\ufeff":
        return None, "starts with a byte-order mark (not allowed in JSON, RFC 8259 §8.1)"
    if text.count("{") + text.count("[") > MAX_DEPTH and _depth(text) > MAX_DEPTH:
        return None, f"nested deeper than {MAX_DEPTH} levels"
    escaped = "\\u" in text
    decoder = _DECODER
    if watch and (escaped or any(text.count(f'"{name}"') > 1 for name in watch)):
        decoder = _PAIRS_DECODER
    try:
        obj = decoder.decode(text)
    except _Reject as exc:
        return None, str(exc)
    except RecursionError:  # not reachable under MAX_DEPTH; kept so a bad line never raises
        return None, f"nested deeper than {MAX_DEPTH} levels"
    except ValueError as exc:
        return None, f"malformed JSON: {exc}"
    if not isinstance(obj, dict):
        return None, f"expected a JSON object, got {_json_type(obj)}"
    if escaped:
        lone = _lone_surrogate(obj)
        if lone is not None:
            return None, f"lone surrogate escape {lone}: not valid Unicode"
    return obj, None


def _field_error(name: str, value: Any, kind: str) -> tuple[Any, str | None]:
    """(the column value, None) or (None, why the value does not fit ``kind``)."""
    if kind == "string":
        if isinstance(value, str):
            return value, None
    elif kind == "bool":
        if isinstance(value, bool):
            return value, None
    elif isinstance(value, bool):
        pass
    elif kind == "double":
        if isinstance(value, float):
            return value, None
        if isinstance(value, int):
            try:
                return float(value), None
            except OverflowError:
                return None, f"field {name!r}: {str(value)[:40]} is out of range for a double"
    elif isinstance(value, int):  # int64, int32
        lo, hi = _INT_RANGE[kind]
        if lo <= value < hi:
            return value, None
        return None, f"field {name!r}: {value} does not fit {kind}"
    shown = json.dumps(value)[:40]
    return None, f"field {name!r}: expected {kind}, got {_json_type(value)} {shown}"


class _Plan:
    """What one decode_json call checks, derived once per call."""

    def __init__(
        self,
        schema: StructType,
        event_time: tuple[str, str] | None,
        bounds: TimeBounds | None = None,
    ) -> None:
        self.bounds = bounds if bounds is not None and bounds != TimeBounds() else None
        self.schema = arrow_schema(schema)
        self.out = output_schema(self.schema)
        self.parsed = self.schema.append(pa.field(ERROR_COLUMN, pa.string()))
        self.required = [f.name for f in schema.fields if not f.nullable]
        field, self.time_unit = event_time or (None, "ms")
        # A field outside the record (a source's metadata column) is the source's business.
        self.time_field: str | None = field if field in self.schema.names else None
        if self.time_field is not None and self.time_field not in self.required:
            # No event time, no place in event time: the field is required.
            self.required = [
                n for n in self.schema.names if n in self.required or n == self.time_field
            ]
        self.doubles = [f.name for f in self.schema if f.type == pa.float64()]
        # (name, Arrow type name) per field, for the per-record checks.
        self.kinds = [(f.name, str(f.type)) for f in self.schema]
        self.parse = pajson.ParseOptions(
            explicit_schema=self.schema, unexpected_field_behavior="ignore"
        )


class _Span:
    """Records ``lo..hi`` of one :func:`decode_json` call. Given as an Arrow binary array (the
    event log's read), they stay in Arrow: each followed by a newline in one buffer Arrow
    builds, a chunk's fast-path input a slice of it, and no Python object per record unless
    the per-record path asks for them (:meth:`lines`). Given as Python bytes (Kafka's
    messages), a chunk is joined as it comes (converting them to Arrow first costs more)."""

    __slots__ = ("data", "ends", "hi", "lo", "values")

    def __init__(
        self,
        values: Sequence[bytes] | pa.Array,
        ends: np.ndarray | None,
        data: pa.Buffer | None,
        lo: int,
        hi: int,
    ) -> None:
        self.values, self.ends, self.data, self.lo, self.hi = values, ends, data, lo, hi

    @classmethod
    def of(cls, lines: Sequence[bytes] | pa.Array) -> _Span:
        if not isinstance(lines, pa.Array):
            return cls(lines, None, None, 0, len(lines))
        values = lines if lines.type == pa.large_binary() else lines.cast(pa.large_binary())
        newline = pa.scalar(b"\n", pa.large_binary())
        joined = pc.binary_join_element_wise(values, pa.scalar(b"", pa.large_binary()), newline)
        n = len(joined)
        ends = np.frombuffer(joined.buffers()[1], np.int64)[joined.offset : joined.offset + n + 1]
        return cls(values, ends, joined.buffers()[2], 0, n)

    def __len__(self) -> int:
        return self.hi - self.lo

    def __getitem__(self, part: slice) -> _Span:
        lo, hi, _ = part.indices(self.hi - self.lo)
        return _Span(self.values, self.ends, self.data, self.lo + lo, self.lo + max(lo, hi))

    def joined(self) -> bytes:
        """The records joined by ``\\n`` (``b"\\n".join(self.lines())``)."""
        if self.lo == self.hi:
            return b""
        if self.ends is None or self.data is None:
            return b"\n".join(self.values[self.lo : self.hi])  # type: ignore[arg-type]
        return self.data[int(self.ends[self.lo]) : int(self.ends[self.hi]) - 1].to_pybytes()

    def lengths(self) -> np.ndarray:
        if self.ends is None:
            return np.fromiter(map(len, self.lines()), np.int64, self.hi - self.lo)
        return np.diff(self.ends[self.lo : self.hi + 1]) - 1

    def lines(self) -> list[bytes]:
        part = self.values[self.lo : self.hi]
        return part.to_pylist() if isinstance(part, pa.Array) else list(part)

    def array(self) -> pa.Array:
        """The records as a ``binary`` array (the ``_raw`` column's type)."""
        part = self.values[self.lo : self.hi]
        if isinstance(part, pa.Array):
            return part.cast(pa.binary())
        return pa.array(part, pa.binary())


def _slow(lines: _Span, plan: _Plan) -> pa.Table:
    """The judge's parse of each record: the declared fields and ``_error`` (the parsed form)."""
    names = plan.schema.names
    cols: dict[str, list[Any]] = {n: [] for n in names}
    errors: list[str | None] = []
    for line in lines.lines():
        obj, error = parse_record(line, names)
        row: dict[str, Any] = {}
        if obj is not None:
            repeated = getattr(obj, "repeated", ())
            for name, kind in plan.kinds:
                if name in repeated:
                    error = f"field {name!r} appears twice"
                    break
                value = obj.get(name)
                if value is None:
                    continue  # null or missing: the required check in _finish decides
                value, error = _field_error(name, value, kind)
                if error is not None:
                    break
                row[name] = value
        for n in names:
            cols[n].append(None if error else row.get(n))
        errors.append(error)
    arrays = [pa.array(cols[f.name], type=f.type) for f in plan.schema]
    return pa.Table.from_arrays([*arrays, pa.array(errors, pa.string())], schema=plan.parsed)


# -- the fast path ----------------------------------------------------------------------------


def _screen(buf: bytes, lines: _Span) -> list[bool] | None:
    """None if every record may take the fast path, else a per-record "suspect" flag.

    Chunk-wide scans (numpy and memchr, ~40 ns/record in place); a chunk failing one is
    located record by record (:func:`_locate`).
    """
    n = len(lines)
    if not buf:
        return [True] * n
    a = np.frombuffer(buf, np.uint8)
    nl = a == _NL
    seps = int(np.count_nonzero(nl))
    opens = a == _OPEN
    framed = bool(
        a[0] == _OPEN
        and a[-1] == _CLOSE
        and seps == n - 1
        and (n == 1 or _separators(a, nl, opens) == seps)
    )
    plain = buf.find(b"\x00") < 0 and (buf.isascii() or _valid_utf8(buf)) and not _nonfinite(buf, a)
    small = len(buf) <= MAX_RECORD_BYTES or int(lines.lengths().max()) <= MAX_RECORD_BYTES
    # Each record starts with '{', so one record holds at most all opening brackets but the
    # other records' one each.
    brackets = int(np.count_nonzero(opens))
    if buf.find(b"[") >= 0:
        brackets += int(np.count_nonzero(a == _SQUARE))
    if framed and plain and small and brackets - (n - 1) <= MAX_DEPTH:
        return None
    return _locate(a, nl, lines, framed, plain, brackets)


def _locate(
    a: np.ndarray, nl: np.ndarray, lines: _Span, framed: bool, plain: bool, brackets: int
) -> list[bool]:
    """Which records of a chunk fail the screen; vectorised but for the rare byte checks."""
    n = len(lines)
    lens = lines.lengths()
    starts = np.zeros(n, np.int64)
    np.cumsum(lens[:-1] + 1, out=starts[1:])
    suspect = (lens == 0) | (lens > MAX_RECORD_BYTES)
    full = ~suspect
    if not framed:
        suspect[full] = (a[starts[full]] != _OPEN) | (a[(starts + lens - 1)[full]] != _CLOSE)
        newlines = np.flatnonzero(nl)
        if len(newlines) != n - 1:  # some record holds a newline: which
            owner = np.searchsorted(starts, newlines, side="right") - 1
            inside = newlines != starts[owner] + lens[owner]
            suspect[owner[inside]] = True
    # As in _screen, over the records that start with '{' (the others are suspect already).
    if brackets - (n - int(np.count_nonzero(suspect)) - 1) > MAX_DEPTH:
        is_bracket = (a == _OPEN) | (a == _SQUARE)
        counts = np.add.reduceat(is_bracket, np.minimum(starts, len(a) - 1), dtype=np.int32)
        suspect |= counts > MAX_DEPTH
    out = suspect.tolist()
    if not plain:
        for i, line in enumerate(lines.lines()):
            if not out[i] and (
                b"\x00" in line
                or b"NaN" in line
                or b"Inf" in line
                or not (line.isascii() or _valid_utf8(line))
            ):
                out[i] = True
    return out


def _separators(a: np.ndarray, nl: np.ndarray, opens: np.ndarray) -> int:
    """How many newlines sit between a ``}`` and a ``{``."""
    m = a[:-2] == _CLOSE
    m &= nl[1:-1]
    m &= opens[2:]
    return int(np.count_nonzero(m))


def _valid_utf8(buf: bytes) -> bool:
    try:
        buf.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _nonfinite(buf: bytes, a: np.ndarray) -> bool:
    """Whether ``NaN`` or ``Inf`` (also ``Infinity``) occurs: Arrow accepts them, JSON not."""
    if buf.find(b"N") >= 0 and np.any((a[:-2] == 78) & (a[1:-1] == 97) & (a[2:] == 78)):
        return True
    return buf.find(b"I") >= 0 and bool(np.any((a[:-2] == 73) & (a[1:-1] == 110) & (a[2:] == 102)))


def _fast(lines: _Span, buf: bytes, plan: _Plan) -> pa.Table | None:
    """Arrow's parse of screened records (the parsed form), or None if Arrow refuses or rows do
    not match."""
    try:
        table = pajson.read_json(
            io.BytesIO(buf),
            read_options=pajson.ReadOptions(use_threads=False, block_size=len(buf) + 1),
            parse_options=plan.parse,
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    if table.num_rows != len(lines):  # cannot happen for screened input; never trust it
        return None
    table = table.select(plan.schema.names).cast(plan.schema)
    for name in plan.doubles:  # an integer literal past 1.8e308 reads as inf: the judge says why
        if not pc.all(pc.is_finite(table.column(name))).as_py():
            return None
    return table.append_column(plan.parsed.field(ERROR_COLUMN), pa.nulls(len(lines), pa.string()))


def _finish(parsed: pa.Table, raw: Callable[[], pa.Array], plan: _Plan) -> pa.Table:
    """Checks shared by both paths and by records parsed earlier (required fields, event time)
    on a parsed table; bad rows nulled, their bytes (``raw()``, asked only then) kept."""
    n = parsed.num_rows
    table = parsed.drop_columns([ERROR_COLUMN])
    error = parsed.column(ERROR_COLUMN).combine_chunks()
    if plan.time_field is not None:
        error = _check_event_time(
            plan.time_field, plan.time_unit, table.column(plan.time_field), error, plan.bounds
        )
    for name in plan.required:  # the first missing field in schema order wins
        col = table.column(name)
        if col.null_count:
            error = pc.if_else(
                pc.and_(pc.is_null(col), pc.is_null(error)), f"missing field {name!r}", error
            )
            if isinstance(error, pa.ChunkedArray):
                error = error.combine_chunks()
    if error.null_count == n:
        raw_col = pa.nulls(n, pa.binary())
    else:
        bad = pc.is_valid(error)
        raw_col = pc.if_else(bad, raw(), pa.scalar(None, pa.binary()))
        table = pa.Table.from_arrays(
            [pc.if_else(bad, pa.scalar(None, c.type), c) for c in table.columns], schema=plan.schema
        )
    return pa.Table.from_arrays([*table.columns, error, raw_col], schema=plan.out)


def _check_event_time(
    name: str, unit: str, col: pa.ChunkedArray, error: pa.Array, bounds: TimeBounds | None
) -> pa.Array:
    values = col.combine_chunks()
    if pa.types.is_string(values.type):
        return _check_time_strings(name, values, error, bounds)
    if not (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)):
        return error
    scale = 1 if unit == "ms" else 1000  # "s", and "timestamp" of a number (Spark: seconds)
    if pa.types.is_integer(values.type):  # int64 scalars: a double would not hold 1e16 exactly
        lo, hi = pa.scalar(-(-_MIN_MS // scale)), pa.scalar(_MAX_MS // scale)
    else:
        lo, hi = pa.scalar(_MIN_MS / scale), pa.scalar(_MAX_MS / scale)
    out = pc.or_(pc.less(values, lo), pc.greater(values, hi))
    if pc.any(out).as_py():
        bad = pc.and_(out, pc.is_null(error)).to_pylist()
        vals = values.to_pylist()
        errs = error.to_pylist()
        for i, b in enumerate(bad):
            if b:
                errs[i] = f"event time {name!r}: {vals[i]} ({unit}) is outside {_RANGE}"
        error = pa.array(errs, pa.string())
    if bounds is None:
        return error
    # In range (checked above), every event time is below 2.6e14 ms: exact in a double; one out
    # of range (already refused) may lose precision, not the verdict.
    ms = pc.multiply(pc.cast(values, pa.float64(), safe=False), pa.scalar(float(scale)))
    outside = None
    if bounds.floor_ms is not None:
        outside = pc.less(ms, pa.scalar(float(bounds.floor_ms)))
    if bounds.ceiling_ms is not None:
        above = pc.greater(ms, pa.scalar(float(bounds.ceiling_ms)))
        outside = above if outside is None else pc.or_(outside, above)
    if outside is None:
        return error
    outside = pc.and_(outside, pc.is_null(error))
    if not pc.any(outside).as_py():
        return error
    errs = error.to_pylist()
    vals, in_ms = values.to_pylist(), ms.to_pylist()
    for i, b in enumerate(outside.to_pylist()):
        if b:
            errs[i] = bounds.reason(name, in_ms[i], f"{vals[i]} {unit}")
    return pa.array(errs, pa.string())


def _check_time_strings(
    name: str, values: pa.Array, error: pa.Array, bounds: TimeBounds | None
) -> pa.Array:
    """ISO-8601 strings both Spark's ANSI cast and Python accept, inside the range. One Python
    call per string: only jobs with string event times pay it."""
    errs = error.to_pylist()
    changed = False
    for i, s in enumerate(values.to_pylist()):
        if s is None or errs[i] is not None:
            continue
        why = None
        if not _ISO_RE.fullmatch(s):
            why = "is not an ISO-8601 timestamp (YYYY-MM-DD[Thh:mm[:ss[.ffffff][Z|±hh:mm]]])"
        else:
            try:
                t = datetime.fromisoformat(s)
            except ValueError as exc:
                why = f"is not a valid timestamp ({exc})"
            else:
                t = t if t.tzinfo else t.replace(tzinfo=UTC)
                if not EVENT_TIME_MIN <= t <= EVENT_TIME_MAX:
                    why = f"is outside {_RANGE}"
                elif bounds is not None:
                    # Spark's cast keeps microseconds; the bounds are whole ms.
                    ms = (t - _EPOCH) / timedelta(milliseconds=1)
                    reason = bounds.reason(name, ms, json.dumps(s)[:60])
                    if reason is not None:
                        errs[i], changed = reason, True
                        continue
        if why is not None:
            errs[i] = f"event time {name!r}: {json.dumps(s)[:60]} {why}"
            changed = True
    return pa.array(errs, pa.string()) if changed else error


def _decode_chunk(
    lines: _Span,
    plan: _Plan,
    out: list[pa.Table],
    screened: bool = False,
) -> None:
    """Screen, then the fast path; a chunk Arrow refuses is halved until ~BISECT_MIN records
    (one bad record costs a Python parse of ~64 records, not of its whole chunk: ~6x slower)."""
    if not lines:
        return
    buf = lines.joined()
    if len(buf) > MAX_CHUNK_BYTES and len(lines) > 1:
        half = len(lines) // 2
        _decode_chunk(lines[:half], plan, out, screened=screened)
        _decode_chunk(lines[half:], plan, out, screened=screened)
        return
    if not screened:
        suspects = _screen(buf, lines)
        if suspects is not None:
            _decode_mixed(lines, suspects, plan, out)
            return
    table = _fast(lines, buf, plan)
    if table is not None:
        out.append(table)
    elif len(lines) <= BISECT_MIN:
        out.append(_slow(lines, plan))
    else:
        half = len(lines) // 2
        _decode_chunk(lines[:half], plan, out, screened=True)
        _decode_chunk(lines[half:], plan, out, screened=True)


def _decode_mixed(lines: _Span, suspects: list[bool], plan: _Plan, out: list[pa.Table]) -> None:
    """Suspect records to the judge, the runs between them to the fast path (in order)."""
    runs = [(bad, sum(1 for _ in group)) for bad, group in groupby(suspects)]
    if len(runs) > 2 * BISECT_MIN:  # suspects everywhere: small Arrow calls would cost more
        out.append(_slow(lines, plan))
        return
    pos = 0
    for bad, size in runs:
        part = lines[pos : pos + size]
        if bad:
            out.append(_slow(part, plan))
        else:
            _decode_chunk(part, plan, out, screened=True)
        pos += size


def decode_json(
    lines: Sequence[bytes] | pa.Array,
    schema: StructType,
    *,
    event_time: tuple[str, str] | None = None,
    bounds: TimeBounds | None = None,
) -> pa.Table:
    """Decode JSON records into the declared schema plus ``_error`` and ``_raw`` columns.

    Args:
        lines: the records, one JSON object each (no trailing newline needed), as bytes or
            as an Arrow binary array (what the event log reads: no Python object per record).
        schema: the declared fields (see :func:`to_struct`).
        event_time: ``(field, unit)`` of the job's event time (``WatermarkStrategy``'s
            timestamp field and unit ``"ms"``, ``"s"`` or ``"timestamp"``): the field becomes
            required and a value Spark could not turn into a timestamp, or one outside
            ``EVENT_TIME_MIN..EVENT_TIME_MAX``, is a dead letter instead of a failed batch.
        bounds: the event times the batch accepts (the source's event-time policy applied to
            the batch); an event time outside is a dead letter naming the bound. Needs
            ``event_time``.

    Returns:
        One row per record, in order; the module docstring's table says which are good.
    """
    plan = _Plan(schema, event_time, bounds)
    if not len(lines):
        return plan.out.empty_table()
    records = _Span.of(lines)
    return _finish(_parse(records, plan), records.array, plan)


def parse_json(lines: Sequence[bytes] | pa.Array, schema: StructType) -> pa.Table:
    """The first half of :func:`decode_json`, which depends only on the fields' names and types
    (in order): the declared fields and ``_error``, the reason a record is not a JSON object of
    those types (null for the others; null and missing values are not judged yet). The event
    log stores this for a topic with a schema, and :func:`finish_parsed` completes it."""
    plan = _Plan(schema, None)
    return _parse(_Span.of(lines), plan) if len(lines) else plan.parsed.empty_table()


def parsed_schema(schema: StructType) -> pa.Schema:
    """The Arrow schema of :func:`parse_json`'s result for ``schema``."""
    return _Plan(schema, None).parsed


def finish_parsed(
    parsed: pa.Table,
    raw: Callable[[], pa.Array],
    schema: StructType,
    *,
    event_time: tuple[str, str] | None = None,
    bounds: TimeBounds | None = None,
) -> pa.Table:
    """:func:`decode_json`'s result from :func:`parse_json`'s (``parsed``, of the same names and
    types as ``schema``): the required fields, the event time and ``bounds`` judged, the bytes of
    each bad record (``raw()``: the records as a binary array, asked for only if one is bad)
    kept. Equal to ``decode_json`` of the same records, whatever ``schema``'s nullability."""
    plan = _Plan(schema, event_time, bounds)
    if not parsed.num_rows:
        return plan.out.empty_table()
    return _finish(parsed.cast(plan.parsed), raw, plan)


def _parse(records: _Span, plan: _Plan) -> pa.Table:
    parts: list[pa.Table] = []
    for i in range(0, len(records), CHUNK):
        _decode_chunk(records[i : i + CHUNK], plan, parts)
    return pa.concat_tables(parts)
