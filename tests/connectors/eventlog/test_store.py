"""The embedded event log: partitions, offsets, idempotent producers, concurrency, durability."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.connectors.eventlog import EventLog, Record, partition_for
from stateful_runtime.exceptions import (
    LogError,
    LogWriterBusyError,
    TopicExistsError,
    TopicNotFoundError,
)
from stateful_runtime.names import InvalidNameError
from tests.helpers import poll, srt


def test_create_append_read_by_offset_range(tmp_path):
    log = EventLog(tmp_path)
    log.create_topic("t", 3)
    with log.writer("t") as w:
        n = w.append(Record(f"v{i}".encode(), f"k{i % 5}".encode()) for i in range(100))
    assert n == 100
    reader = log.reader("t")
    ends = reader.end_offsets()
    assert sum(ends.values()) == 100 and set(ends) == {0, 1, 2}
    for p, end in ends.items():
        records = list(reader.read(p, 0, end))
        assert [r.offset for r in records] == list(range(end))
        assert all(partition_for(r.key, r.value, 3) == p for r in records)
    # A sub-range is exactly that range.
    p = max(ends, key=ends.get)
    assert [r.offset for r in reader.read(p, 2, 5)] == [2, 3, 4]
    # The source's fast path returns exactly the values of the same range.
    assert reader.read_values(p, 1, 4) == [r.value for r in reader.read(p, 1, 4)]
    # Reading past the end is an error, not a silent short read.
    with pytest.raises(LogError, match="log ends at"):
        list(reader.read(p, 0, ends[p] + 1))
    with pytest.raises(LogError, match="log ends at"):
        reader.read_values(p, 0, ends[p] + 1)


@pytest.mark.parametrize("key_lengths", [[5], [None, 0, 3, 7], list(range(12))])
def test_values_read_in_bulk_are_the_records_values_whatever_their_keys(tmp_path, key_lengths):
    # One header length, a few (cut in bulk) and more than _BULK_CUTS (cut one by one).
    log = EventLog(tmp_path)
    log.create_topic("t", 1)
    records = [
        Record(
            f'{{"n":{i}}}'.encode() * (i % 3),
            None if (k := key_lengths[i % len(key_lengths)]) is None else b"k" * k,
            headers={"h": "x" * (i % 4)} if i % 5 == 0 and len(key_lengths) > 1 else {},
            partition=0,
        )
        for i in range(300)
    ]
    with log.writer("t") as w:
        w.append(records)
    reader = log.reader("t")
    assert reader.read_values(0, 0, 300) == [r.value for r in records]
    assert reader.read_value_array(0, 7, 9).to_pylist() == [r.value for r in records[7:9]]


def test_partitioning_is_stable_across_processes(tmp_path):
    keys = [f"M{i:03d}".encode() for i in range(50)]
    here = [partition_for(k, b"", 7) for k in keys]
    code = (
        "from stateful_runtime.connectors.eventlog import partition_for; import json; "
        "print(json.dumps("
        "[partition_for(('M%03d' % i).encode(), b'', 7) for i in range(50)]))"
    )
    there = json.loads(subprocess.check_output([sys.executable, "-c", code]))
    assert here == there and len(set(here)) > 1


def test_topic_errors_say_what_to_do(tmp_path):
    log = EventLog(tmp_path)
    with pytest.raises(TopicNotFoundError, match="srt log create missing"):
        log.topic("missing")
    log.create_topic("t", 2)
    with pytest.raises(TopicExistsError):
        log.create_topic("t", 3)
    assert log.create_topic("t", 2, exist_ok=True).partitions == 2
    for bad in ("a/b", "..", ".hidden"):
        with pytest.raises(InvalidNameError, match="topic name"):
            log.create_topic(bad, 1)


def test_idempotent_producer_appends_a_sequence_once(tmp_path):
    log = EventLog(tmp_path)
    log.create_topic("out", 1)
    with log.writer("out") as w:
        assert w.append([Record(b"a"), Record(b"b")], producer_id="job/q", sequence=0) == 2
        assert w.append([Record(b"a"), Record(b"b")], producer_id="job/q", sequence=0) == 0
        assert w.append([Record(b"c")], producer_id="job/q", sequence=1) == 1
        assert w.append([Record(b"x")], producer_id="other", sequence=0) == 1
    with log.writer("out") as w:  # the sequence survives reopening
        assert w.producer_sequence("job/q") == 1
        assert w.append([Record(b"c")], producer_id="job/q", sequence=1) == 0
    assert log.reader("out").end_offsets() == {0: 4}


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.binary(max_size=20), st.none() | st.binary(max_size=8)), max_size=30),
    st.sampled_from([1, 3]),
    st.booleans(),
)
def test_append_values_writes_what_append_of_the_same_records_writes(
    tmp_path, pairs, partitions, keyless
):
    """The sinks' fast path (value and key, no Record per row; records without keys in one
    pass) places and encodes every record as append does, from any offset, and is
    idempotent per producer sequence the same way."""
    if keyless:
        pairs = [(v, None) for v, _ in pairs]
    log = EventLog(tmp_path / f"log-{len(os.listdir(tmp_path))}")
    log.create_topic("a", partitions)
    log.create_topic("b", partitions)
    wa, wb = log.writer("a"), log.writer("b")
    try:
        for sequence in (4, 5):  # the second append starts at the first's ends
            assert (
                wa.append([Record(v, k) for v, k in pairs], producer_id="p", sequence=sequence)
                == wb.append_values(
                    [v for v, _ in pairs],
                    [k for _, k in pairs],
                    producer_id="p",
                    sequence=sequence,
                )
                == len(pairs)
            )
        assert wb.append_values([b"x"], [None], producer_id="p", sequence=5) == 0  # a replay
        assert wa.end_offsets() == wb.end_offsets()
    finally:
        wa.close()
        wb.close()
    ra, rb = log.reader("a"), log.reader("b")
    for p, end in ra.end_offsets().items():
        assert [(r.key, r.value, r.headers, r.offset) for r in ra.read(p, 0, end)] == [
            (r.key, r.value, r.headers, r.offset) for r in rb.read(p, 0, end)
        ]


def test_one_writer_per_topic(tmp_path):
    log = EventLog(tmp_path)
    log.create_topic("t", 1)
    with log.writer("t"):
        holder = subprocess.run(
            [
                sys.executable,
                "-c",
                "from stateful_runtime.connectors.eventlog import EventLog; "
                f"EventLog({str(tmp_path)!r}).writer('t')",
            ],
            capture_output=True,
            text=True,
        )
    assert holder.returncode != 0
    assert "LogWriterBusyError" in holder.stderr and "only one writer" in holder.stderr
    with pytest.raises(LogWriterBusyError):
        with log.writer("t"):
            log.writer("t")


WRITER = textwrap.dedent("""
    import sys
    from stateful_runtime.connectors.eventlog import EventLog, Record
    w = EventLog(sys.argv[1]).writer("t")
    n = 0
    while True:
        w.append([Record(b"%d" % (n + i)) for i in range(100)])
        n += 100
        print(n, flush=True)
""")


@pytest.mark.faults
def test_reader_in_another_process_follows_a_live_writer_and_kill_9_loses_no_ack(tmp_path):
    log = EventLog(tmp_path)
    log.create_topic("t", 1)
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    reader = log.reader("t")
    seen = []
    acked = 0
    try:
        while acked < 5_000:
            acked = int(proc.stdout.readline())
            end = reader.end_offsets()[0]
            assert end >= min(seen[-1:] or [0])  # end offsets only move forward
            seen.append(end)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()
    assert len(set(seen)) > 1, "the reader never saw the writer's progress"
    # Everything the writer acknowledged before the kill is there, in order, once.
    after = EventLog(tmp_path).reader("t")
    end = after.end_offsets()[0]
    assert end >= acked
    values = [int(r.value) for r in after.read(0, 0, end)]
    assert values == list(range(end))


def test_append_from_stdin_via_cli(tmp_path, srt_env):
    log_dir = tmp_path / "log"
    assert (
        srt(
            ["log", "create", "upi", "--partitions", "2", "--log-dir", str(log_dir)], srt_env
        ).returncode
        == 0
    )
    lines = b"".join(b'{"merchant_id": "M%d", "n": %d}\n' % (i % 3, i) for i in range(50))
    result = srt(
        ["log", "append", "upi", "--key-field", "merchant_id", "--log-dir", str(log_dir)],
        srt_env,
        input=lines + b"not json\n\n",
    )
    assert result.returncode == 0, result.stderr
    reader = EventLog(log_dir).reader("upi")
    records = [r for p, e in reader.end_offsets().items() for r in reader.read(p, 0, e)]
    # The bad line and the blank one (an empty record) are kept for the job's dead letters.
    assert len(records) == 52
    assert [r.key for r in records if r.value == b""] == [None]
    assert {r.key for r in records if r.value.startswith(b"{")} == {b"M0", b"M1", b"M2"}
    assert [r.key for r in records if r.value == b"not json"] == [None]


def test_serve_accepts_nc_style_lines_and_stops_cleanly(served):
    port, log_dir = served
    for batch in range(3):  # three connections, like three `nc` sessions
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(
                b"".join(b'{"k": "a%d", "i": %d}\n' % (i, batch * 100 + i) for i in range(100))
            )
    reader = EventLog(log_dir).reader("socket")
    poll(lambda: sum(reader.end_offsets().values()) >= 300, 30, "300 records in the topic")
    values = sorted(
        json.loads(r.value)["i"]
        for p, e in reader.end_offsets().items()
        for r in reader.read(p, 0, e)
    )
    assert values == list(range(300))


@pytest.mark.faults
def test_readers_leave_no_directories_behind_even_when_their_process_is_killed(tmp_path):
    """Each reader keeps a RocksDB secondary directory under the temp dir. Spark's Python
    workers end by ``os._exit`` or SIGKILL (no ``atexit``, no ``close``): the next process's
    first reader removes the directories of processes that are gone."""
    log = EventLog(tmp_path / "log")
    log.create_topic("t", 2)
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp)}
    script = textwrap.dedent(f"""
        import os, sys
        from stateful_runtime.connectors.eventlog import EventLog
        reader = EventLog({str(tmp_path / "log")!r}).reader("t")
        print(reader._secondary, flush=True)
        if sys.argv[1] == "exit":
            os._exit(0)
        if sys.argv[1] == "close":
            reader.close()
            print(len(os.listdir(os.path.dirname(reader._secondary))), flush=True)
    """)

    def run(how: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-c", script, how],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return out.stdout.split()

    (gone,) = run("exit")
    assert os.path.isdir(gone)  # left behind by os._exit
    secondary, left = run("close")
    assert not os.path.exists(gone), "a dead process's directory was not removed"
    assert not os.path.exists(secondary) and left == "0"
    (normal,) = run("normal")  # ends without close: atexit removes it
    assert not os.path.exists(normal)
    assert [p.name for p in tmp.iterdir()] == [f"srt-log-readers-{os.getuid()}"]
