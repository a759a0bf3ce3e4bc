"""JSON decoding into a declared schema: every record gets a row, bad ones a reason."""

from __future__ import annotations

import json
from typing import Optional

import pytest

from stateful_runtime.connectors.formats.json import CHUNK, decode_json, to_struct
from stateful_runtime.connectors.ranges import limit_offsets
from stateful_runtime.exceptions import ConfigError

SCHEMA = to_struct({"id": str, "n": int, "x": float, "ok": Optional[bool]})  # noqa: UP045


def good(i: int) -> bytes:
    return json.dumps({"id": f"r{i}", "n": i, "x": i / 2, "ok": i % 2 == 0}).encode()


def test_good_records_decode_to_typed_columns():
    table = decode_json([good(i) for i in range(10)], SCHEMA)
    assert table.column("n").to_pylist() == list(range(10))
    assert table.column("x").to_pylist() == [i / 2 for i in range(10)]
    assert table.column("_error").null_count == 10
    assert table.column("_raw").null_count == 10


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b"{not json", "malformed JSON"),
        (b"", "malformed JSON"),
        (b"[1, 2]", "expected a JSON object, got list"),
        (b'{"n": 1, "x": 1.5}', "missing field 'id'"),
        (b'{"id": "a", "n": "one", "x": 1}', "field 'n': expected int64, got str"),
        (b'{"id": "a", "n": 1.5, "x": 1}', "field 'n': expected int64, got float"),
        (b'{"id": "a", "n": true, "x": 1}', "field 'n': expected int64, got bool"),
        (b'{"id": 7, "n": 1, "x": 1}', "field 'id': expected string, got int"),
        (b"\xff\xfe", "malformed JSON"),
        (b'{"id": "a", "n": 1, "x": 1, "ok": "yes"}', "field 'ok': expected bool, got str"),
    ],
)
def test_each_bad_record_is_kept_with_its_reason(line, reason):
    lines = [good(0), line, good(2)]
    rows = decode_json(lines, SCHEMA).to_pylist()
    assert [r["_error"] is None for r in rows] == [True, False, True]
    assert reason in rows[1]["_error"]
    assert rows[1]["_raw"] == line
    assert rows[2]["n"] == 2  # the good neighbours still decode


def test_optional_fields_may_be_missing_and_int_is_a_valid_float():
    rows = decode_json([b'{"id": "a", "n": 1, "x": 3}'], SCHEMA).to_pylist()
    assert rows[0]["_error"] is None and rows[0]["ok"] is None and rows[0]["x"] == 3.0


def test_fast_and_slow_paths_agree():
    lines = [good(i) for i in range(CHUNK + 10)]
    clean = decode_json(lines, SCHEMA)
    dirty = decode_json([*lines[:5], b"{bad", *lines[5:]], SCHEMA)
    assert dirty.num_rows == clean.num_rows + 1
    keep = [i for i in range(dirty.num_rows) if i != 5]
    assert dirty.take(keep).select(["id", "n", "x", "ok"]).equals(
        clean.select(["id", "n", "x", "ok"]))


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
    assert limit_offsets({"0": 0, "1": 0}, {"0": 1, "1": 1}, 1) in ({"0": 1, "1": 0},
                                                                    {"0": 0, "1": 1})
