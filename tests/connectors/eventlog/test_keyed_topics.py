"""Keyed topics (``store.py``, "Keyed topics"): a topic whose first append is keyed by a field
places every record in the partition that owns its key's key group, as a job keyed by that
field places its state, and takes appends keyed by that field only."""

from __future__ import annotations

import io
import json

import pyarrow as pa
import pytest

from stateful_runtime.checkpoints.keyed import key_group, key_groups
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.connectors.eventlog.ingest import ingest_stream
from stateful_runtime.connectors.eventlog.sink import LogSink
from stateful_runtime.connectors.eventlog.store import TopicKey
from stateful_runtime.exceptions import ConfigError, LogError


def _append(log: EventLog, topic: str, lines: list[bytes], key_field: str | None) -> None:
    with log.writer(topic) as w:
        ingest_stream(w, io.BytesIO(b"\n".join(lines) + b"\n"), key_field)


@pytest.mark.parametrize(
    ("values", "kind"),
    [([f"M{i:03d}" for i in range(300)], "str"), ([i * 7919 for i in range(300)], "int")],
)
def test_a_topic_first_appended_keyed_is_placed_by_the_key_groups_of_its_field(
    tmp_path, values, kind
):
    log = EventLog(tmp_path)
    log.create_topic("t", 3)
    lines = [json.dumps({"k": v, "n": n}).encode() for n, v in enumerate(values * 2)]
    lines.insert(5, b"not json")  # no key: where Spark's hash of a null key puts it
    _append(log, "t", lines, "k")
    assert log.topic("t").key == TopicKey("k", kind)
    placed = _placed_raw(log, "t")
    for p, value in placed:
        k = json.loads(value)["k"] if value != b"not json" else None
        assert key_group([k]) in key_groups(p, 3), (p, value)
    assert len({p for p, _ in placed}) == 3 and len(placed) == len(lines)
    # a later append keyed by the field goes on the same way; any other is refused, whole
    _append(log, "t", [json.dumps({"k": values[0], "n": -1}).encode()], "k")
    before = log.reader("t").end_offsets()
    for other in ("n", None):
        with pytest.raises(LogError, match="keyed by field 'k'"):
            _append(log, "t", [json.dumps({"k": values[1], "n": -2}).encode()], other)
    assert log.reader("t").end_offsets() == before


def _placed_raw(log: EventLog, topic: str) -> list[tuple[int, bytes]]:
    reader = log.reader(topic)
    return [(p, r.value) for p, end in reader.end_offsets().items() for r in reader.read(p, 0, end)]


def test_a_topic_that_holds_records_placed_otherwise_stays_unkeyed(tmp_path):
    log = EventLog(tmp_path)
    log.create_topic("t", 2)
    _append(log, "t", [b'{"k": "a"}'], None)
    _append(log, "t", [b'{"k": "b"}', b'{"k": "c"}'], "k")
    assert log.topic("t").key is None
    with log.writer("t") as w, pytest.raises(LogError, match="cannot become keyed"):
        w.key_by(TopicKey("k", "str"))
    # a float or a missing first value keys nothing either
    log.create_topic("f", 2)
    _append(log, "f", [b'{"k": 1.5}', b'{"k": "x"}'], "k")
    assert log.topic("f").key is None


@pytest.mark.parametrize(
    ("values", "kind"),
    [([f"M{i:03d}" for i in range(200)], "str"), ([i * 7919 for i in range(200)], "int")],
)
def test_a_log_sink_places_its_rows_in_a_keyed_topic_by_the_key_groups_of_its_field(
    tmp_path, values, kind
):
    """A job's output into a keyed topic lands where a job keyed by that field reads it
    without a shuffle; a sink keyed otherwise is refused at its open, before it writes."""
    log = EventLog(tmp_path)
    log.create_topic("t", 3)
    _append(log, "t", [json.dumps({"k": values[0], "n": -1}).encode()], "k")
    sink = LogSink(str(tmp_path), "t", key_field="k", partitions=3)
    sink.open("job", "q")
    try:
        sink.write_batch(pa.table({"k": values + [None], "n": list(range(len(values) + 1))}), 0)
    finally:
        sink.close()
    placed = _placed_raw(log, "t")
    assert len(placed) == len(values) + 2 and len({p for p, _ in placed}) == 3
    for p, value in placed:
        assert key_group([json.loads(value)["k"]]) in key_groups(p, 3), (p, value)
    before = log.reader("t").end_offsets()
    for other in ("n", None):
        with pytest.raises(ConfigError, match="keyed by field 'k'.*key_field='k'"):
            LogSink(str(tmp_path), "t", key_field=other, partitions=3).open("job", "q")
    assert log.reader("t").end_offsets() == before
    # a key that is no column of the output is refused before any batch, whatever the topic
    output = pa.schema([("k", pa.string()), ("n", pa.int64())])
    LogSink(str(tmp_path), "any", key_field="k").check_schema(output)
    with pytest.raises(ConfigError, match="key_field 'key' is not a column.*k, n"):
        LogSink(str(tmp_path), "any", key_field="key").check_schema(output)
