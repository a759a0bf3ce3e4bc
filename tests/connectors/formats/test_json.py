"""JSON decoding into a declared schema: every record gets a row, bad ones a reason."""

from __future__ import annotations

import json
from typing import Optional

import pytest

from stateful_runtime.connectors.formats.json import (
    BISECT_MIN,
    CHUNK,
    MAX_DEPTH,
    MAX_RECORD_BYTES,
    decode_json,
    parse_record,
    to_struct,
)
from stateful_runtime.connectors.ranges import limit_offsets
from stateful_runtime.exceptions import ConfigError

SCHEMA = to_struct({"id": str, "n": int, "x": float, "ok": Optional[bool]})  # noqa: UP045
FIELDS = ["id", "n", "x", "ok"]


def good(i: int) -> bytes:
    return json.dumps({"id": f"r{i}", "n": i, "x": i / 2, "ok": i % 2 == 0}).encode()


GOOD = b'{"id": "a", "n": 1, "x": 1.5}'


def nested(depth: int) -> bytes:
    return b'{"id": "a", "n": 1, "x": 1, "z": ' + b"[" * (depth - 1) + b"]" * (depth - 1) + b"}"


def test_good_records_decode_to_typed_columns():
    table = decode_json([good(i) for i in range(10)], SCHEMA)
    assert table.column("n").to_pylist() == list(range(10))
    assert table.column("x").to_pylist() == [i / 2 for i in range(10)]
    assert table.column("_error").null_count == 10
    assert table.column("_raw").null_count == 10


# Every input class of the decoder's docstring table: (record, None if good else the reason).
CLASSES = [
    pytest.param(b"{not json", "malformed JSON", id="malformed"),
    pytest.param(b"", "empty record", id="empty"),
    pytest.param(b" \t ", "empty record", id="whitespace-only"),
    pytest.param(b"[1, 2]", "expected a JSON object, got array", id="top-level-array"),
    pytest.param(b'"s"', "expected a JSON object, got string", id="top-level-string"),
    pytest.param(b"5", "expected a JSON object, got number", id="top-level-number"),
    pytest.param(b"null", "expected a JSON object, got null", id="top-level-null"),
    pytest.param(b"true", "expected a JSON object, got boolean", id="top-level-bool"),
    pytest.param(GOOD + GOOD, "malformed JSON: Extra data", id="concatenated"),
    pytest.param(GOOD + b" " + GOOD, "malformed JSON: Extra data", id="concatenated-space"),
    pytest.param(b'{"n": 1, "x": 1.5}', "missing field 'id'", id="missing-field"),
    pytest.param(b'{"id": null, "n": 1, "x": 1.5}', "missing field 'id'", id="null-field"),
    pytest.param(b'{"id": "a", "n": 1, "x": 1, "ok": null}', None, id="null-optional"),
    pytest.param(
        b'{"id": "a", "n": "one", "x": 1}',
        "field 'n': expected int64, got string",
        id="string-for-int",
    ),
    pytest.param(
        b'{"id": "a", "n": 1.5, "x": 1}',
        "field 'n': expected int64, got number 1.5",
        id="float-for-int",
    ),
    pytest.param(
        b'{"id": "a", "n": true, "x": 1}',
        "field 'n': expected int64, got boolean",
        id="bool-for-int",
    ),
    pytest.param(
        b'{"id": 7, "n": 1, "x": 1}', "field 'id': expected string, got number", id="int-for-string"
    ),
    pytest.param(
        b'{"id": {"a": 1}, "n": 1, "x": 1}',
        "field 'id': expected string, got object",
        id="object-for-string",
    ),
    pytest.param(
        b'{"id": "a", "n": 1, "x": 1, "ok": "yes"}',
        "field 'ok': expected bool",
        id="string-for-bool",
    ),
    pytest.param(
        b'{"id": "a", "n": 9223372036854775808, "x": 1}', "does not fit int64", id="int64-overflow"
    ),
    pytest.param(
        b'{"id": "a", "n": 1, "x": 1e400}',
        "1e400 is out of range for a double",
        id="double-overflow",
    ),
    pytest.param(
        b'{"id": "a", "n": 1, "x": 1' + b"0" * 400 + b"}",
        "out of range for a double",
        id="huge-int-for-double",
    ),
    pytest.param(b'{"id": "a", "n": 1, "x": NaN}', "NaN is not JSON", id="nan"),
    pytest.param(b'{"id": "a", "n": 1, "x": -Infinity}', "-Infinity is not JSON", id="-infinity"),
    pytest.param(
        b'{"id": "a", "n": 1, "x": 1, "z": Infinity}',
        "Infinity is not JSON",
        id="infinity-in-unknown-field",
    ),
    pytest.param(b'{"id": "a", "n": 1, "x": Inf}', "malformed JSON", id="inf"),
    pytest.param(
        b'{"id": "a", "id": "b", "n": 1, "x": 1}', "field 'id' appears twice", id="duplicate-field"
    ),
    pytest.param(
        b'{"id": "a", "z": 1, "z": 2, "n": 1, "x": 1}', None, id="duplicate-unknown-field"
    ),
    pytest.param(
        b'{"id": "a\xff", "n": 1, "x": 1}', "not valid UTF-8 (byte 9)", id="invalid-utf8-in-string"
    ),
    pytest.param(b"\xff\xfe", "not valid UTF-8", id="invalid-utf8"),
    pytest.param(
        b'{"id": "\xed\xa0\x80", "n": 1, "x": 1}', "not valid UTF-8", id="utf8-encoded-surrogate"
    ),
    pytest.param(
        b'{"id": "\\ud800", "n": 1, "x": 1}', "lone surrogate escape \\ud800", id="lone-surrogate"
    ),
    pytest.param(
        b'{"id": "a", "n": 1, "x": 1, "z": {"\\udc00": 1}}',
        "lone surrogate",
        id="lone-surrogate-in-unknown-key",
    ),
    pytest.param(b'{"id": "\\ud83d\\ude00", "n": 1, "x": 1}', None, id="surrogate-pair"),
    pytest.param(b'{"id": "a\\u0000b", "n": 1, "x": 1}', None, id="escaped-nul"),
    pytest.param(
        b'{"id": "a\x00b", "n": 1, "x": 1}', "Invalid control character", id="raw-nul-in-string"
    ),
    pytest.param(GOOD + b"\x00", "malformed JSON", id="raw-nul-after"),
    pytest.param(GOOD + b"\r\n", None, id="crlf"),
    pytest.param(b"  " + GOOD + b"\t", None, id="surrounding-whitespace"),
    pytest.param(b"\xef\xbb\xbf" + GOOD, "byte-order mark", id="bom"),
    pytest.param(b'{"id": "a",\n "n": 1, "x": 1}', None, id="newline-inside"),
    pytest.param(nested(MAX_DEPTH), None, id="depth-at-limit"),
    pytest.param(
        nested(MAX_DEPTH + 1), f"nested deeper than {MAX_DEPTH} levels", id="depth-over-limit"
    ),
    pytest.param(nested(100_000), f"nested deeper than {MAX_DEPTH} levels", id="depth-100k"),
    pytest.param(
        b'{"id": "' + b"[{" * 500 + b'", "n": 1, "x": 1}', None, id="brackets-inside-a-string"
    ),
    pytest.param(
        b'{"id": "' + b"a" * (10 << 20) + b'", "n": 1, "x": 1}',
        f"over the {MAX_RECORD_BYTES}-byte limit",
        id="10MB",
    ),
]


@pytest.mark.parametrize(("line", "reason"), CLASSES)
def test_each_input_class_has_its_outcome_whatever_its_neighbours(line, reason):
    """The same outcome alone, between good records, next to a blank record and a
    concatenated one (the probe's row shift), and in a chunk big enough to bisect."""
    alone = decode_json([line], SCHEMA).to_pylist()[0]
    if reason is None:
        assert alone["_error"] is None and alone["_raw"] is None
    else:
        assert reason in alone["_error"] and alone["_raw"] == line
        assert all(alone[f] is None for f in FIELDS)
    company = [
        [good(0), line, good(2)],
        [b"", line, GOOD + GOOD],
        [line, b""],
        [GOOD + GOOD, line],
        [*[good(i) for i in range(3 * BISECT_MIN)], line, *[good(i) for i in range(5)]],
    ]
    for lines in company:
        rows = decode_json(lines, SCHEMA).to_pylist()
        assert len(rows) == len(lines)
        i = lines.index(line)
        assert rows[i] == alone
        for j, other in enumerate(lines):
            if j != i:
                assert rows[j] == decode_json([other], SCHEMA).to_pylist()[0]


def test_blank_record_next_to_concatenated_objects_does_not_shift_rows():
    """The probe: Arrow splits on newlines, so "" + "{a}{b}" gave two good rows."""
    a, b = b'{"id": "a", "n": 1, "x": 1}', b'{"id": "b", "n": 2, "x": 2}'
    rows = decode_json([a, b"", a + b, b], SCHEMA).to_pylist()
    assert [r["_error"] is None for r in rows] == [True, False, False, True]
    assert [r["id"] for r in rows] == ["a", None, None, "b"]
    assert rows[1]["_error"] == "empty record" and rows[2]["_raw"] == a + b
    # A record split over two (each half alone is no object) is two dead letters, not one row.
    rows = decode_json([b'{"id": "a", "n":', b'1, "x": 1}', a + b], SCHEMA).to_pylist()
    assert [r["_error"] is None for r in rows] == [False, False, False]


def test_optional_fields_may_be_missing_and_int_is_a_valid_float():
    rows = decode_json([b'{"id": "a", "n": 1, "x": 3}'], SCHEMA).to_pylist()
    assert rows[0]["_error"] is None and rows[0]["ok"] is None and rows[0]["x"] == 3.0


def test_fast_and_slow_paths_agree():
    lines = [good(i) for i in range(CHUNK + 10)]
    clean = decode_json(lines, SCHEMA)
    dirty = decode_json([*lines[:5], b"{bad", *lines[5:]], SCHEMA)
    assert dirty.num_rows == clean.num_rows + 1
    keep = [i for i in range(dirty.num_rows) if i != 5]
    assert dirty.take(keep).select(FIELDS).equals(clean.select(FIELDS))


def test_records_needing_the_per_record_path_everywhere_still_decode():
    lines = [good(i) + b"\r\n" for i in range(CHUNK + 3)]  # CRLF on every record
    table = decode_json(lines, SCHEMA)
    assert table.column("_error").null_count == len(lines)
    assert table.column("n").to_pylist() == list(range(len(lines)))


def test_nested_records_stay_on_the_fast_path_and_deep_ones_are_found():
    def rec(i: int) -> bytes:
        return json.dumps(
            {"id": str(i), "n": i, "x": 1.0, "meta": {"d": {"os": "android", "v": [1, [2, [3]]]}}}
        ).encode()

    lines = [rec(i) for i in range(CHUNK)]
    lines[1000] = nested(MAX_DEPTH + 1)
    rows = decode_json(lines, SCHEMA).to_pylist()
    assert [i for i, r in enumerate(rows) if r["_error"]] == [1000]
    assert rows[1001]["n"] == 1001


EVENT_SCHEMA = to_struct({"id": str, "ts": int, "t": Optional[str], "s": Optional[float]})  # noqa: UP045


@pytest.mark.parametrize(
    ("record", "event_time", "reason"),
    [
        ({"id": "a", "ts": 1_767_225_600_000}, ("ts", "ms"), None),
        ({"id": "a", "ts": -1_000}, ("ts", "ms"), None),  # 1969: an instant like any other
        ({"id": "a", "ts": -62_135_596_800_000}, ("ts", "ms"), "is outside 0001-01-02..9999-01-01"),
        ({"id": "a", "ts": 10**16}, ("ts", "ms"), "is outside"),  # Spark: DATETIME_OVERFLOW
        ({"id": "a", "ts": 2**63 - 1}, ("ts", "ms"), "is outside"),
        ({"id": "a", "ts": 1_767_225_600}, ("ts", "s"), None),
        ({"id": "a", "ts": 10**13}, ("ts", "s"), "is outside"),
        ({"id": "a", "ts": 1, "s": 1.7e9}, ("s", "s"), None),
        ({"id": "a", "ts": 1}, ("s", "s"), "missing field 's'"),  # the event time is required
        ({"id": "a", "ts": 1, "s": 1e300}, ("s", "s"), "is outside"),
        ({"id": "a", "ts": 1, "t": "2026-01-01T10:00:05Z"}, ("t", "timestamp"), None),
        ({"id": "a", "ts": 1, "t": "2026-01-01 10:00:05.123+05:30"}, ("t", "timestamp"), None),
        ({"id": "a", "ts": 1, "t": "2026-01-01"}, ("t", "timestamp"), None),
        ({"id": "a", "ts": 1, "t": "garbage"}, ("t", "timestamp"), "is not an ISO-8601"),
        ({"id": "a", "ts": 1, "t": "2026-02-30"}, ("t", "timestamp"), "is not a valid timestamp"),
        (
            {"id": "a", "ts": 1, "t": "2026-01-01T10:00+05:30"},
            ("t", "timestamp"),
            "is not an ISO-8601",
        ),  # Spark's cast refuses a zone without seconds
        ({"id": "a", "ts": 1, "t": "0001-01-01T00:00:00"}, ("t", "timestamp"), "is outside"),
        ({"id": "a", "ts": 1}, ("kafka_timestamp_ms", "ms"), None),  # not a record field
    ],
)
def test_event_time_outside_what_spark_and_python_hold_is_a_dead_letter(record, event_time, reason):
    line = json.dumps(record).encode()
    for lines in (
        [line],
        [line, *[json.dumps({**record, "id": str(i)}).encode() for i in range(3)]],
    ):
        row = decode_json(lines, EVENT_SCHEMA, event_time=event_time).to_pylist()[0]
        if reason is None:
            assert row["_error"] is None
        else:
            assert reason in row["_error"] and row["_raw"] == line


def test_parse_record_never_raises_on_what_json_loads_refuses_to_survive():
    assert parse_record(nested(500_000))[1] == f"nested deeper than {MAX_DEPTH} levels"
    assert parse_record(b"1" * 5000)[1].startswith("malformed JSON")  # int digit limit
    assert parse_record(b'{"a": 1' + b"0" * 5000 + b"}")[1].startswith("malformed JSON")
    assert parse_record(b'\x00{\x00"\x00a\x00"\x00:\x001\x00}')[0] is None  # UTF-16 is not ours


def test_unsupported_field_type_is_a_config_error():
    with pytest.raises(ConfigError, match="unsupported type"):
        to_struct({"when": complex})


def test_read_limit_is_shared_in_proportion_to_backlog():
    start = {"0": 0, "1": 10, "2": 0}
    ends = {"0": 1000, "1": 510, "2": 2000}
    out = limit_offsets(start, ends, 350)
    assert sum(out[p] - start[p] for p in out) == 350
    # Each partition advances by the same fraction of its backlog (1/10 here), so partitions
    # covering the same event-time span stay aligned in event time.
    assert [out[p] - start[p] for p in "012"] == [100, 50, 200]
    assert limit_offsets(start, ends, 10_000) == ends
    assert limit_offsets({"0": 0, "1": 0}, {"0": 1, "1": 1}, 1) in (
        {"0": 1, "1": 0},
        {"0": 0, "1": 1},
    )
