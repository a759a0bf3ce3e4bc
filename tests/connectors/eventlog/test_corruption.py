"""A damaged or contradictory topic is named as such (file, problem, what to do), never read
as if it were fine and never reported as something else."""

from __future__ import annotations

import json

import pytest
from rocksdict import Options, Rdict

from stateful_runtime.connectors.eventlog import EventLog, Record
from stateful_runtime.exceptions import CorruptLogError


def _topic(tmp_path, partitions=4, n=2000):
    log = EventLog(tmp_path)
    log.create_topic("t", partitions)
    with log.writer("t") as w:
        w.append(
            [Record(b'{"i": %d, "pad": "%s"}' % (i, b"x" * 200), str(i).encode()) for i in range(n)]
        )
    # Flush the memtable into SST files, as a long-running writer eventually does.
    db = Rdict(str(tmp_path / "t" / "store"), options=Options(raw_mode=True))
    db.flush()
    db.close()
    return log


@pytest.mark.parametrize(
    "text",
    [
        "",
        '{"format_version": 1, "topic": "t", "partit',
        "[]",
        '{"format_version": 1, "topic": "t", "partitions": "4"}',
        '{"format_version": 1, "topic": "t", "partitions": 0}',
        '{"format_version": 1, "topic": "other", "partitions": 4}',
    ],
)
def test_a_damaged_topic_json_is_named(tmp_path, text):
    log = _topic(tmp_path)
    (tmp_path / "t" / "topic.json").write_text(text)
    with pytest.raises(CorruptLogError, match=r"topic\.json"):
        log.reader("t")
    with pytest.raises(CorruptLogError):
        log.writer("t")


@pytest.mark.parametrize("edited", [2, 8])
def test_an_edited_partition_count_is_refused(tmp_path, edited):
    log = _topic(tmp_path, partitions=4)
    meta = tmp_path / "t" / "topic.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "partitions": edited}))
    for open_ in (log.reader, log.writer):
        with pytest.raises(CorruptLogError, match=rf"says {edited} partitions.*holds 4"):
            open_("t")


@pytest.mark.parametrize("which", ["smallest", "largest"])
def test_a_corrupt_sst_is_reported_as_corruption_by_reads_and_verify(tmp_path, which):
    """The smallest table file holds the topic's metadata (a secondary instance opens with an
    empty view when it is damaged); the largest holds records (a block checksum fails)."""
    log = _topic(tmp_path)
    ssts = sorted((tmp_path / "t" / "store").glob("*.sst"), key=lambda p: p.stat().st_size)
    assert len(ssts) >= 2, "the test needs data in SST files"
    target = ssts[0] if which == "smallest" else ssts[-1]
    data = bytearray(target.read_bytes())
    mid = len(data) // 3
    data[mid : mid + 64] = b"\x00" * 64  # damage a data block, keep the file's footer
    target.write_bytes(bytes(data))
    with pytest.raises(CorruptLogError, match="damaged"):
        log.reader("t").verify()
    with pytest.raises(CorruptLogError):
        reader = log.reader("t")
        ends = reader.end_offsets()
        for p in range(4):
            reader.read_values(p, 0, ends[p])
    with pytest.raises(CorruptLogError):
        reader = log.reader("t")
        ends = reader.end_offsets()
        for p in range(4):
            list(reader.read(p, 0, ends[p]))
    if which == "smallest":  # metadata damaged: the writer must not start at offset 0
        with pytest.raises(CorruptLogError):
            log.writer("t")


def test_a_sound_topic_verifies(tmp_path):
    log = _topic(tmp_path, n=500)
    assert sum(log.reader("t").verify().values()) == 500
