"""Topics with a schema: records parsed once, at append, and read as Arrow columns.

The read of a topic with a schema must be the read of the same records on a topic without one
(``decode_json`` of their bytes): the same rows, verdicts and reasons, whatever the records,
how they were appended, the range read, the event time and the batch's bounds.
"""

from __future__ import annotations

import json
import tempfile
from typing import Optional

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.connectors.eventlog import EventLog, Record
from stateful_runtime.connectors.eventlog.source import LogSource, decode_range
from stateful_runtime.connectors.formats import json as json_format
from stateful_runtime.connectors.formats.json import (
    TimeBounds,
    decode_json,
    schema_from_ddl,
    to_struct,
)
from stateful_runtime.exceptions import ConfigError, LogError
from tests.connectors.formats.json_records import SCHEMA, records
from tests.helpers import srt

# The topic's schema: the job's fields and types, each nullable (nullability is the job's).
TOPIC_SCHEMA = schema_from_ddl("id string, n bigint, small bigint, x double, ok boolean, ts bigint")
UPI = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def _topics(root, lines: list[bytes], chunks: list[int], partitions: int = 2):
    """The same records, appended in the same calls, to a topic with a schema and one without:
    both readers."""
    log = EventLog(root)
    log.create_topic("parsed", partitions, schema=TOPIC_SCHEMA)
    log.create_topic("plain", partitions)
    for name in ("parsed", "plain"):
        with log.writer(name) as w:
            pos = 0
            for size in [*chunks, len(lines)]:
                part = lines[pos : pos + size]
                w.append([Record(v, partition=i % partitions) for i, v in enumerate(part, pos)])
                pos += len(part)
                if pos >= len(lines):
                    break
    return log.reader("parsed"), log.reader("plain")


bounds = st.none() | st.builds(
    TimeBounds,
    floor_ms=st.none() | st.integers(-(10**13), 10**13),
    floor_why=st.just("the floor"),
    ceiling_ms=st.none() | st.integers(-(10**13), 10**13),
    ceiling_from_ms=st.integers(0, 10**13),
    ceiling_from=st.just("the batch's processing time"),
    ceiling_setting=st.just("max_ahead_of_processing_time 1:00:00"),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lines=st.lists(records(), min_size=1, max_size=60),
    chunks=st.lists(st.integers(1, 25), max_size=6),
    cut=st.tuples(st.integers(0, 30), st.integers(0, 30)),
    event_time=st.sampled_from([None, ("ts", "ms"), ("ts", "s")]),
    bound=bounds,
)
def test_a_topic_with_a_schema_reads_as_its_bytes_decode(lines, chunks, cut, event_time, bound):
    with tempfile.TemporaryDirectory() as root:
        parsed, plain = _topics(root, lines, chunks)
        for p, end in plain.end_offsets().items():
            lo, hi = sorted((min(cut[0], end), min(cut[1], end)))
            values = plain.read_value_array(p, lo, hi)
            expected = decode_json(values, SCHEMA, event_time=event_time, bounds=bound)
            for reader in (parsed, plain):
                got = decode_range(reader, p, lo, hi, SCHEMA, event_time=event_time, bounds=bound)
                assert got.equals(expected), (p, lo, hi, got.to_pylist(), expected.to_pylist())
        parsed.close()
        plain.close()


def test_a_read_of_a_topic_with_a_schema_parses_no_json(tmp_path, monkeypatch):
    lines = [b'{"id":"a","n":1,"x":1.5,"ts":1000}', b'{"id":"b","n":"2"}', b"not json"] * 500
    parsed, plain = _topics(tmp_path, lines, [700, 100])
    expected = decode_range(plain, 0, 0, 750, SCHEMA, event_time=("ts", "ms"))
    reasons = set(expected.column("_error").to_pylist())
    assert {None, "field 'n': expected int64, got string \"2\""} < reasons  # and malformed

    def no_parse(*args, **kwargs):
        raise AssertionError("JSON parsed at read")

    monkeypatch.setattr(json_format, "_parse", no_parse)
    assert decode_range(parsed, 0, 0, 750, SCHEMA, event_time=("ts", "ms")).equals(expected)
    with pytest.raises(AssertionError, match="JSON parsed at read"):
        decode_range(plain, 0, 0, 750, SCHEMA)  # the patch does bite where JSON is parsed


def test_a_job_schema_with_other_fields_or_types_parses_the_bytes(tmp_path):
    lines = [b'{"id":"a","n":1,"x":1.5,"ts":1000,"small":7}', b'{"id":"b","n":2.5}'] * 10
    parsed, _ = _topics(tmp_path, lines, [])
    for schema in (
        to_struct({"id": str, "n": int}),  # fewer fields
        to_struct({"id": str, "n": float, "small": Optional[int], "x": float, "ok": bool}),  # noqa: UP045
    ):
        values = parsed.read_value_array(1, 0, 10)
        assert decode_range(parsed, 1, 0, 10, schema).equals(decode_json(values, schema))


def test_the_parsed_blocks_span_appends_and_partitions(tmp_path):
    log = EventLog(tmp_path)
    log.create_topic("t", 3, schema=TOPIC_SCHEMA)
    with log.writer("t") as w:
        for i in range(0, 3000, 7):  # many small appends over three partitions
            w.append([Record(json.dumps({"id": str(j), "n": j}).encode()) for j in range(i, i + 7)])
    reader = log.reader("t")
    ends = reader.end_offsets()
    ids = []
    for p, end in ends.items():
        table = reader.read_parsed(p, 0, end)
        assert table.num_rows == end
        ids += table.column("id").to_pylist()
        assert (
            reader.read_parsed(p, 5, 9).column("id").to_pylist()
            == (table.column("id").to_pylist()[5:9])
        )
    assert sorted(ids, key=int) == [str(j) for j in range(3003)]


def test_a_schema_is_checked_and_fixed_at_creation(tmp_path):
    log = EventLog(tmp_path)
    with pytest.raises(ConfigError, match="JSON decoding supports"):
        log.create_topic("t", 1, schema=to_struct({"b": bytes}))
    log.create_topic("t", 1, schema=TOPIC_SCHEMA)
    assert log.create_topic("t", 1, schema=TOPIC_SCHEMA, exist_ok=True).schema == TOPIC_SCHEMA
    with pytest.raises(LogError, match="fixed when it is created"):
        log.create_topic("t", 1, schema=to_struct({"id": str}), exist_ok=True)
    with pytest.raises(LogError, match="fixed when it is created"):
        log.create_topic("t", 1, exist_ok=True)
    with pytest.raises(LogError, match="has no schema"):
        log.create_topic("u", 1)
        log.reader("u").read_parsed(0, 0, 0)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("id string, n", "each field is 'name type'"),
        ("id varchar", "has type 'varchar'"),
        ("id string, id bigint", "named twice"),
        ("id string null", "each field is 'name type'"),
    ],
)
def test_a_schema_string_that_is_not_one_is_refused(text, error):
    with pytest.raises(ConfigError, match=error):
        schema_from_ddl(text)


def test_srt_log_create_with_a_schema_and_a_job_that_reads_its_columns(tmp_path, srt_env):
    log_dir = str(tmp_path / "log")
    ddl = "txn_id string, merchant_id string, amount_paise bigint, ts_ms bigint NOT NULL"
    made = srt(
        ["log", "create", "p", "--partitions", "2", "--schema", ddl, "--log-dir", log_dir], srt_env
    )
    assert made.returncode == 0, made.stderr
    info = json.loads(srt(["log", "info", "p", "--log-dir", log_dir], srt_env).stdout)
    assert (
        info["schema"]
        == "struct<txn_id:string,merchant_id:string,amount_paise:bigint,ts_ms:bigint>"
    )
    other = srt(
        ["log", "create", "p", "--partitions", "2", "--exist-ok", "--log-dir", log_dir], srt_env
    )
    assert other.returncode != 0 and "fixed when it is created" in other.stderr
    wrong = srt(
        ["log", "create", "q", "--partitions", "1", "--schema", "a blob", "--log-dir", log_dir],
        srt_env,
    )
    assert wrong.returncode != 0 and "has type 'blob'" in wrong.stderr
    assert "records parsed at append" in LogSource(log_dir, "p", UPI).describe()
    assert "JSON parsed at read" in LogSource(log_dir, "p", {"txn_id": str}).describe()
