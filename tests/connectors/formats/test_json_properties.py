"""Properties of the decoder over any list of byte strings (Hypothesis).

* one row per record, in order;
* a good row equals ``json.loads`` of its record under the schema;
* a bad row carries a reason and the record's bytes, and its declared columns are null;
* a record's row is the same alone as among any neighbours (no shift across records);
* a record built by ``json.dumps`` from well-typed values is good.
"""

from __future__ import annotations

import json
import math

import pyarrow as pa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.connectors.formats.json import BISECT_MIN, decode_json
from tests.connectors.formats.json_records import (
    EVENT_TIME,
    REQUIRED,
    SCHEMA,
    TS_RANGE,
    TYPES,
    encoded,
    good_objects,
    json_scalars,
    records,
)


def expected_row(line: bytes) -> dict | None:
    """What a good row must hold: json.loads of the record under the schema."""
    obj = json.loads(line.decode("utf-8"))
    assert isinstance(obj, dict)
    row = {}
    for name, tp in TYPES.items():
        value = obj.get(name)
        if value is not None and tp is float:
            value = float(value)
        if value is not None:
            assert isinstance(value, tp) and (tp is bool or not isinstance(value, bool)), (
                name,
                value,
            )
        row[name] = value
    return row


def check(lines: list[bytes], rows: list[dict], alone: list[dict]) -> None:
    assert len(rows) == len(lines)
    for line, row, single in zip(lines, rows, alone, strict=True):
        assert row == single, (line, row, single)  # the same whatever its neighbours
        if row["_error"] is None:
            assert row["_raw"] is None
            expected = expected_row(line)
            for name, value in expected.items():
                got = row[name]
                assert got == value and (
                    not isinstance(value, float)
                    or math.copysign(1, got) == math.copysign(1, value)
                    or value == 0
                ), (name, got, value)
            assert all(row[name] is not None for name in REQUIRED)
        else:
            assert isinstance(row["_error"], str) and row["_error"]
            assert row["_raw"] == line
            assert all(row[name] is None for name in TYPES)


def decode_rows(lines: list[bytes], event_time=None) -> list[dict]:
    rows = decode_json(lines, SCHEMA, event_time=event_time).to_pylist()
    # The event log hands its records over as one Arrow array: the same rows.
    as_array = decode_json(pa.array(lines, pa.binary()), SCHEMA, event_time=event_time)
    assert as_array.to_pylist() == rows
    return rows


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(records(), max_size=30), st.booleans())
def test_any_records_one_row_each_good_rows_equal_json_loads(lines, with_event_time):
    event_time = EVENT_TIME if with_event_time else None
    rows = decode_rows(lines, event_time)
    check(lines, rows, [decode_rows([line], event_time)[0] for line in lines])


# Records that make Arrow's row count differ from the record count (0 or 2 objects).
SHIFTERS = [b"", b" ", b"\r", b"{}{}", b'{"id":"a","n":1,"x":1,"ts":1}{"id":"b"}', b"{} {}"]


def background(rng, count: int) -> list[bytes]:
    return [
        json.dumps(
            {
                "id": f"r{i}",
                "n": rng.randint(-(2**63), 2**63 - 1),
                "x": rng.uniform(-1e6, 1e6),
                "ts": rng.randint(*TS_RANGE),
                "meta": {"k": [i, str(i)]},
            }
        ).encode()
        for i in range(count)
    ]


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.randoms(use_true_random=False),
    st.integers(2 * BISECT_MIN, 5 * BISECT_MIN),
    st.lists(st.tuples(st.integers(0, 10**6), records() | st.sampled_from(SHIFTERS)), max_size=6),
)
def test_large_chunks_bad_records_anywhere(rng, count, inserts):
    """Enough records for the screen, the mixed runs and the bisection to take part.

    A record's row alone is its decode on its own for the inserted records, their neighbours
    and a sample of the rest; for every other background record it is its row in the decode of
    the background without the inserts (one call, where no bad record can shift it). Decoding
    each of the hundreds of records on its own made this test minutes of CPU."""
    clean = background(rng, count)
    lines = [(line, False) for line in clean]
    for at, line in inserts:
        lines.insert(at % (len(lines) + 1), (line, True))
    near = {i + d for i, (_, inserted) in enumerate(lines) if inserted for d in (-1, 0, 1)}
    near |= set(rng.sample(range(len(lines)), min(16, len(lines))))
    clean_rows = iter(decode_rows(clean, EVENT_TIME))
    alone = []
    for i, (line, inserted) in enumerate(lines):
        row = None if inserted else next(clean_rows)
        alone.append(decode_rows([line], EVENT_TIME)[0] if i in near else row)
    plain = [line for line, _ in lines]
    check(plain, decode_rows(plain, EVENT_TIME), alone)


@settings(max_examples=200, deadline=None)
@given(st.lists(encoded(good_objects()), min_size=1, max_size=20))
def test_well_typed_records_are_good(lines):
    rows = decode_rows(lines, EVENT_TIME)
    assert [r["_error"] for r in rows] == [None] * len(lines)
    check(lines, rows, rows)


row_values = (
    json_scalars | st.floats() | st.datetimes() | st.dates() | st.decimals() | st.binary(max_size=6)
)


@given(st.dictionaries(st.text(max_size=6), row_values, max_size=6))
@settings(max_examples=300, deadline=None)
def test_sinks_encode_a_record_as_json_dumps_does(row):
    """The sinks' shared encoder writes each record byte for byte as ``json.dumps`` with the
    sinks' options (a Kafka sink hashes the key's bytes to a partition: a different byte
    would move a key to another partition across an upgrade). The one exception: an integral
    decimal (a wide sum's ``decimal(38,0)``) is a JSON integer, exact at any size, where
    ``default=str`` wrote a string."""
    from decimal import Decimal

    from stateful_runtime.connectors.formats.json import encode_record

    def plain(v):
        if isinstance(v, Decimal) and v.is_finite() and v == v.to_integral_value():
            if v.as_tuple().exponent >= 0:
                return int(v)
        return str(v)

    assert encode_record(row) == json.dumps(row, default=plain, separators=(",", ":")).encode()


@given(st.lists(st.integers(-(10**38) + 1, 10**38 - 1) | st.none(), max_size=8))
@settings(max_examples=200, deadline=None)
def test_a_wide_sum_is_written_as_the_exact_integer(values):
    """A ``decimal(38,0)`` column (an integral sum) reaches JSON as the integer, digit for
    digit, on the column path and the row path alike; Python's json reads it back whole."""
    from decimal import Decimal

    import pyarrow as pa

    from stateful_runtime.connectors.formats.json import encode_record, encode_records

    table = pa.table({"total": pa.array(values, pa.decimal128(38, 0))})
    lines = encode_records(table)
    assert lines == [encode_record(r) for r in table.to_pylist()]
    assert [json.loads(line)["total"] for line in lines] == values
    assert all(Decimal not in map(type, json.loads(line).values()) for line in lines)


def _column(kind: str):
    import pyarrow as pa

    plain = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=6)
    values = {
        "string": (plain | st.text(max_size=6), pa.string()),
        "int": (st.integers(-(2**63), 2**63 - 1), pa.int64()),
        "bool": (st.booleans(), pa.bool_()),
        "float": (st.floats(), pa.float64()),
        "timestamp": (st.datetimes(), pa.timestamp("us")),
    }[kind]
    return values


@st.composite
def sink_tables(draw):
    import pyarrow as pa

    rows = draw(st.integers(0, 6))
    names, arrays = [], []
    for _ in range(draw(st.integers(0, 4))):
        names.append(draw(st.sampled_from(["k", "v"]) | st.text(max_size=4)))
        kind = draw(
            st.sampled_from(["string", "string", "int", "bool", "float", "timestamp", "null"])
        )
        if kind == "null":
            arrays.append(pa.nulls(rows))
            continue
        values, tp = _column(kind)
        arrays.append(
            pa.array(draw(st.lists(st.none() | values, min_size=rows, max_size=rows)), tp)
        )
    return pa.Table.from_arrays(arrays, names=names) if names else pa.table({}).slice(0, 0)


@given(sink_tables())
@settings(max_examples=300, deadline=None)
def test_sinks_encode_a_table_as_json_dumps_does_each_row(table):
    """The column-at-a-time encoder the sinks use writes every row as the row encoder (so as
    ``json.dumps``) does, whatever the columns hold: escapes, non-ASCII, nulls, duplicate
    names and types Arrow prints differently (floats, timestamps) included."""
    from stateful_runtime.connectors.formats.json import encode_records

    want = [json.dumps(r, default=str, separators=(",", ":")).encode() for r in table.to_pylist()]
    assert encode_records(table) == want
