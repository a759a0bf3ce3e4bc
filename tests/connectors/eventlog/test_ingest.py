"""`srt log append` / `srt log serve`: a bad line is handled alone, the sender is told, and no
accepted line is lost."""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.connectors.eventlog.ingest import (
    APPEND_BATCH,
    BLANK,
    MAX_LINE_BYTES,
    MAX_REPORTED,
    append_input,
    append_stream,
    default_producer_id,
    ingest_stream,
    key_of,
)
from stateful_runtime.connectors.eventlog.store import TopicWriter
from stateful_runtime.connectors.formats.json import MAX_DEPTH, MAX_RECORD_BYTES, parse_record
from stateful_runtime.exceptions import AppendIncompleteError, LogError, LogWriteError
from tests.helpers import VENV_BIN, poll, small_tmpfs, srt

DEEP = b'{"k":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
LONG = b'{"k":"' + b"x" * (2 * MAX_LINE_BYTES) + b'"}'


def all_records(log_dir: Path, topic: str) -> list:
    reader = EventLog(log_dir).reader(topic)
    return [r for p, e in sorted(reader.end_offsets().items()) for r in reader.read(p, 0, e)]


def good(i: int) -> bytes:
    return b'{"k": "m%d", "i": %d}' % (i % 7, i)


def test_line_limit_is_the_decoders_record_limit():
    assert MAX_LINE_BYTES == MAX_RECORD_BYTES


def test_a_deeply_nested_line_in_an_append_chunk_is_rejected_alone(tmp_path):
    """The probe: RecursionError in key extraction lost the whole 5,000-line chunk."""
    log = EventLog(tmp_path)
    log.create_topic("t", 3)
    lines = [good(i) for i in range(APPEND_BATCH)]
    lines[1234] = DEEP
    with log.writer("t") as w:
        result = ingest_stream(w, io.BytesIO(b"\n".join(lines) + b"\n"), "k")
    assert (result.appended, result.rejected, result.refused) == (APPEND_BATCH, 1, 0)
    assert [(p.line, p.appended) for p in result.problems] == [(1235, True)]
    assert result.problems[0].reason == f"nested deeper than {MAX_DEPTH} levels"
    records = all_records(tmp_path, "t")
    assert sorted(r.value for r in records) == sorted(lines)
    assert [r.key for r in records if r.value == DEEP] == [None]  # no key: the job dead-letters it
    assert all(r.key == key_of(r.value, "k") for r in records)


@pytest.mark.parametrize(
    ("line", "reason", "appended"),
    [
        (b'{"k": "a"}{"k": "b"}', "malformed JSON: Extra data", True),
        (b"not json", "malformed JSON", True),
        (b"   ", "empty record", True),
        (DEEP, "nested deeper than", True),
        (b'{"k": "\xff"}', "not valid UTF-8 (byte 7)", True),
        (b'{"k": "\\ud800"}', "lone surrogate", True),  # would fail .encode() of the key
        (b'{"k": NaN}', "NaN is not JSON", True),
        (b'{"k": 1, "k": 2}', None, None),  # a key is found; the decoder judges the rest
        (b'{"k": null}', None, None),  # no key: appended keyless, not an error of the line
        (b'{"other": 1}', None, None),
        (LONG, f"over the {MAX_LINE_BYTES}-byte limit", False),
    ],
)
def test_each_bad_line_has_an_outcome_and_its_neighbours_are_kept(tmp_path, line, reason, appended):
    log = EventLog(tmp_path)
    log.create_topic("t", 2)
    stream = io.BytesIO(good(1) + b"\n" + line + b"\r\n\n" + good(2))  # no final newline
    with log.writer("t") as w:
        result = ingest_stream(w, stream, "k")
    values = sorted(r.value for r in all_records(tmp_path, "t"))
    kept = [good(1), good(2), b""] + ([line] if appended is not False else [])
    assert values == sorted(kept)
    # Line 3 is blank: appended as an empty record, which the job's decoder dead-letters.
    assert [(p.line, p.reason, p.appended) for p in result.problems][-1] == (3, BLANK, True)
    assert parse_record(b"")[0] is None
    if reason is None:
        assert len(result.problems) == 1
    else:
        [problem, _] = result.problems
        assert (problem.line, problem.appended) == (2, appended) and reason in problem.reason
        if appended:  # the job's decoder rejects it with the same reason
            assert parse_record(line)[1] == problem.reason


def test_problems_are_counted_past_the_reported_ones(tmp_path):
    EventLog(tmp_path).create_topic("t", 1)
    with EventLog(tmp_path).writer("t") as w:
        result = ingest_stream(w, io.BytesIO(b"x\n" * (MAX_REPORTED + 5)), "k")
    assert (result.appended, result.rejected, len(result.problems)) == (
        MAX_REPORTED + 5,
        MAX_REPORTED + 5,
        MAX_REPORTED,
    )


def test_append_stream_reports_and_raises_only_for_refused_lines(tmp_path):
    EventLog(tmp_path).create_topic("t", 1)
    said: list[str] = []
    with EventLog(tmp_path).writer("t") as w:
        assert append_stream(w, io.BytesIO(b"x\n" + good(1)), "k", said.append).appended == 2
        assert said[0].startswith("srt log append: line 1: malformed JSON")
        assert "1 line(s) rejected" in said[-1]
        with pytest.raises(LogError, match="1 line.s. refused .* the other 2 records were"):
            append_stream(w, io.BytesIO(good(2) + b"\n" + LONG + b"\n" + good(3)), "k", said.append)
    assert len(all_records(tmp_path, "t")) == 4


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(
            st.binary(max_size=30).map(lambda b: b.replace(b"\n", b"")),
            st.builds(
                lambda k, i: json.dumps({"k": k, "i": i}).encode(),
                st.text(max_size=5),
                st.integers(),
            ),
            st.sampled_from([b"", b"\r", DEEP[:300] + b"]" * 200, b'{"k": "\\udfff"}', b"{}{}"]),
        ),
        max_size=40,
    ),
    st.sampled_from([b"\n", b"\r\n"]),
    st.booleans(),
)
def test_every_line_is_appended_or_reported(tmp_path_factory, lines, eol, final_eol):
    """Any lines: every line is in the log byte for byte (a blank one as an empty record),
    once, in order per partition, keyed as key_of says; only rejected lines are reported, all
    appended."""
    tmp = tmp_path_factory.mktemp("ingest")
    EventLog(tmp).create_topic("t", 2)
    data = eol.join(lines) + (eol if final_eol else b"")
    with EventLog(tmp).writer("t") as w:
        result = ingest_stream(w, io.BytesIO(data), "k")
    sent = [line.rstrip(b"\r") for line in data.split(b"\n")]
    sent = sent[:-1] if data.endswith(b"\n") or not data else sent
    expected = list(enumerate(sent, 1))
    records = all_records(tmp, "t")
    assert sorted(r.value for r in records) == sorted(line for _, line in expected)
    place = EventLog(tmp).topic("t").partition_of  # keyed by "k" if its first line had one
    for p in (0, 1):  # in order within each partition, keyed as key_of says
        assert [(r.value, r.key) for r in records if r.partition == p] == [
            (line, key_of(line, "k")) for _, line in expected if place(key_of(line, "k"), line) == p
        ]
    assert result.appended == len(expected) == result.lines and result.refused == 0
    rejected = [n for n, line in expected if parse_record(line)[0] is None]
    assert [p.line for p in result.problems] == rejected


def test_cli_append_counts_rejected_lines_and_fails_only_for_refused(tmp_path, srt_env):
    log_dir = tmp_path / "log"
    assert (
        srt(
            ["log", "create", "upi", "--partitions", "2", "--log-dir", str(log_dir)], srt_env
        ).returncode
        == 0
    )
    lines = [b'{"merchant_id": "M%d", "n": %d}' % (i % 3, i) for i in range(50)]
    lines[10] = b'{"merchant_id": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    args = ["log", "append", "upi", "--key-field", "merchant_id", "--log-dir", str(log_dir)]
    result = srt(args, srt_env, input=b"\n".join(lines) + b"\nnot json\n\n")
    assert result.returncode == 0, result.stderr
    stderr = result.stderr.decode()
    assert "line 11: nested deeper than" in stderr and "line 51: malformed JSON" in stderr
    assert "line 52: empty line" in stderr  # dead-lettered by the job, as documented
    assert "3 line(s) rejected" in stderr
    assert len(all_records(log_dir, "upi")) == 52
    result = srt(args, srt_env, input=b'{"merchant_id": "M1"}\n' + LONG + b"\n{}\n")
    assert result.returncode != 0
    stderr = result.stderr.decode()
    assert "line 2: line is" in stderr and "not appended" in stderr
    assert "1 line(s) refused" in stderr and "the other 2 records were appended" in stderr
    assert len(all_records(log_dir, "upi")) == 54


def _exchange(port: int, payload: bytes) -> list[dict]:
    """Send, close our side (like `nc -N`), read the server's answers to the end."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(1 << 16):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


def test_serve_answers_an_over_long_line_and_keeps_the_connections_other_lines(served):
    port, log_dir = served
    valid = [good(i) for i in range(300)]
    payload = (
        b"".join(v + b"\n" for v in valid[:150])
        + LONG
        + b"\n"
        + DEEP
        + b"\n"
        + b"".join(v + b"\r\n" for v in valid[150:])
    )
    answers = _exchange(port, payload)
    assert answers[0] == {
        "line": 151,
        "appended": False,
        "error": f"line is {len(LONG)} bytes, over the {MAX_LINE_BYTES}-byte limit",
    }
    assert answers[1] == {
        "line": 152,
        "appended": True,
        "error": f"nested deeper than {MAX_DEPTH} levels",
    }
    # The summary comes once every line of the connection is in the log: an acknowledgement.
    assert answers[2] == {
        "done": True,
        "appended": 301,
        "rejected": 1,
        "refused": 1,
        "lines_read": 302,
        "skipped": 0,
        "resume_line": 303,
    }
    records = all_records(log_dir, "socket")
    assert sorted(r.value for r in records) == sorted([*valid, DEEP])
    # The flusher survived the bad lines: a later connection's lines are appended too.
    assert _exchange(port, good(1000) + b"\n")[-1]["appended"] == 1
    assert good(1000) in [r.value for r in all_records(log_dir, "socket")]


def test_serve_over_long_line_without_newline_at_the_end(served):
    port, log_dir = served
    answers = _exchange(port, good(1) + b"\n" + LONG)
    assert answers[0]["line"] == 2 and answers[0]["appended"] is False
    assert answers[-1] == {
        "done": True,
        "appended": 1,
        "rejected": 0,
        "refused": 1,
        "lines_read": 2,
        "skipped": 0,
        "resume_line": 3,
    }


def test_serve_senders_that_never_read_do_not_lose_lines(served):
    """Clients like plain `nc` close without reading the answers."""
    port, log_dir = served
    for batch in range(3):
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(
                b"".join(good(batch * 100 + i) + b"\n" for i in range(100)) + b"not json\n"
            )
    deadline = time.monotonic() + 30
    while len(all_records(log_dir, "socket")) < 303:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    values = [r.value for r in all_records(log_dir, "socket")]
    assert sorted(values) == sorted([good(i) for i in range(300)] + [b"not json"] * 3)


def test_serve_stops_with_an_error_when_the_store_fails_never_silently():
    """A failing append (the store, not a line) stops the server with LogError; before, the
    flusher task died and later lines were read, never appended, and nobody was told."""
    import asyncio
    from types import SimpleNamespace

    from stateful_runtime.connectors.eventlog.ingest import _serve

    class BrokenWriter:
        info = SimpleNamespace(name="t", key=None)

        def end_offsets(self):
            return {0: 1}  # not empty: an append does not key it

        def append(self, records):
            raise OSError("disk full")

    answers: list[bytes] = []

    async def scenario() -> None:
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        server = asyncio.create_task(_serve(BrokenWriter(), "127.0.0.1", 0, "k", ready.set_result))
        port = await ready
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(good(1) + b"\n" + good(2) + b"\n")
        writer.write_eof()
        answers.append(await reader.read())
        writer.close()
        await server

    with pytest.raises(LogError, match="appending to topic 't' failed .disk full"):
        asyncio.run(scenario())
    if answers[0]:  # the sender may still get its answer before the server closes
        assert json.loads(answers[0])["done"] is False


# ---------------------------------------------------------------- exactly once across failures


class FailingWriter(TopicWriter):
    """The real writer, with a fault injected into chosen append calls: ``before`` refuses the
    write (a full disk: nothing of it lands), ``after`` lands it and then raises (the write
    reached the store's log but the writer never heard back: an fsync or close failing, or a
    kill between the write and the report)."""

    def __init__(self, info, faults: dict[int, str]) -> None:
        super().__init__(info)
        self.faults, self.calls = faults, 0

    def append(self, records, **kw):
        self.calls += 1
        fault = self.faults.get(self.calls)
        if fault == "before":
            raise LogWriteError(self.info.name, str(self.info.path), "No space left on device")
        n = super().append(records, **kw)
        if fault == "after":
            raise LogWriteError(self.info.name, str(self.info.path), "No space left on device")
        return n


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.one_of(st.builds(good, st.integers(0, 10**6)), st.sampled_from([b"", b"x", LONG])),
        max_size=40,
    ),
    st.integers(1, 7),
    st.lists(
        st.dictionaries(st.integers(1, 8), st.sampled_from(["before", "after"]), max_size=3),
        max_size=6,
    ),
)
def test_retries_of_the_same_input_append_each_line_exactly_once(
    tmp_path_factory, lines, batch, attempts
):
    """Any input, any sequence of failed attempts (the store refusing a batch, or taking it
    without the writer hearing back), then a retry that succeeds: every line is in the topic
    exactly once, in order per partition, and each failure's resume line is exactly where the
    topic's content ends."""
    tmp = tmp_path_factory.mktemp("retry")
    log = EventLog(tmp)
    log.create_topic("t", 2)
    data = b"".join(line + b"\n" for line in lines)
    kept = [line for line in lines if line != LONG]
    for faults in [*attempts, {}]:
        writer = FailingWriter(log.topic("t"), faults)
        try:
            result = ingest_stream(writer, io.BytesIO(data), "k", "p1", batch_size=batch)
        except AppendIncompleteError as exc:
            # Lines before resume_line are in (perhaps more, after an "after" fault: the
            # retry's stored sequence knows), none is in twice.
            # The topic holds a prefix of the input, each line once, at least up to the line
            # before resume_line (more after an "after" fault: the stored sequence knows).
            values = sorted(r.value for r in all_records(tmp, "t"))
            assert any(
                values == sorted(line for line in lines[:k] if line != LONG)
                for k in range(exc.resume_line - 1, len(lines) + 1)
            )
            continue
        finally:
            writer.close()
        assert result.lines == len(lines) and result.acked >= len(lines)
    records = all_records(tmp, "t")
    assert sorted(r.value for r in records) == sorted(kept)
    place = log.topic("t").partition_of
    for p in (0, 1):
        assert [r.value for r in records if r.partition == p] == [
            line for line in kept if place(key_of(line, "k"), line) == p
        ]
    with log.writer("t") as w:  # one more retry: nothing to do, everything skipped
        again = ingest_stream(w, io.BytesIO(data), "k", "p1", batch_size=batch)
    assert (again.appended, again.skipped, again.acked) == (0, len(lines), len(lines))
    assert len(all_records(tmp, "t")) == len(kept)


def test_a_failed_append_says_what_went_in_and_where_to_resume(tmp_path):
    log = EventLog(tmp_path)
    log.create_topic("t", 1)
    data = b"".join(good(i) + b"\n" for i in range(10))
    writer = FailingWriter(log.topic("t"), {2: "before"})
    with pytest.raises(AppendIncompleteError) as caught:
        ingest_stream(writer, io.BytesIO(data), "k", "p1", batch_size=4)
    writer.close()
    exc = caught.value
    assert (exc.appended, exc.resume_line, exc.disk_full) == (4, 5, True)
    assert "Lines 1-4 are in the topic" in str(exc) and "resumes at line 5" in str(exc)
    assert "Free space on that disk" in str(exc)
    with log.writer("t") as w:
        result = ingest_stream(w, io.BytesIO(data), "k", "p1", batch_size=4)
    assert (result.skipped, result.appended, result.acked) == (4, 6, 10)
    assert [r.value for r in all_records(tmp_path, "t")] == [good(i) for i in range(10)]
    # Without a producer id the message says how to resume by hand.
    writer = FailingWriter(log.topic("t"), {1: "before"})
    with pytest.raises(AppendIncompleteError, match=r"tail -n \+1 FILE"):
        ingest_stream(writer, io.BytesIO(data), "k", None, batch_size=4)
    writer.close()


def test_the_default_producer_id_is_the_input_files_identity(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(good(1) + b"\n" + good(2) + b"\n")
    with path.open("rb") as a, path.open("rb") as b:
        assert default_producer_id(a) == default_producer_id(b) is not None
        b.readline()  # read from another position: another input
        assert default_producer_id(b) != default_producer_id(a)
    with path.open("rb") as f:
        before = default_producer_id(f)
    with path.open("ab") as f:  # appended to: the same input, grown
        f.write(good(3) + b"\n")
    with path.open("rb") as f:
        assert default_producer_id(f) == before
    with path.open("r+b") as f:  # rewritten in place with another first line
        f.write(good(9))
    with path.open("rb") as f:
        assert default_producer_id(f) != before
    read, write = os.pipe()
    with os.fdopen(read, "rb") as r, os.fdopen(write, "wb"):
        assert default_producer_id(r) is None
    assert default_producer_id(io.BytesIO(b"x")) is None


def test_cli_append_retry_of_the_same_file_does_not_duplicate(tmp_path, srt_env):
    log_dir = tmp_path / "log"
    EventLog(log_dir).create_topic("t", 2)
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(good(i) + b"\n" for i in range(100)) + b"\n")
    args = [str(VENV_BIN / "srt"), "log", "append", "t", "--log-dir", str(log_dir), "--json"]
    outs = []
    for _ in range(2):
        with path.open("rb") as stdin:
            done = subprocess.run(args, env=srt_env, stdin=stdin, capture_output=True)
        assert done.returncode == 0, done.stderr
        outs.append(json.loads(done.stdout))
    assert outs[0]["appended"] == 101 and outs[0]["dead_lettered"] == 1  # the blank line 101
    assert outs[0]["resume_line"] == 102 and outs[0]["complete"] is True
    assert (outs[1]["appended"], outs[1]["skipped"], outs[1]["resume_line"]) == (0, 101, 102)
    assert outs[0]["producer_id"] == outs[1]["producer_id"] is not None
    assert len(all_records(log_dir, "t")) == 101
    # The same file appended again on purpose: a new producer id.
    with path.open("rb") as stdin:
        done = subprocess.run(
            [*args, "--producer-id", "second"], env=srt_env, stdin=stdin, capture_output=True
        )
    assert json.loads(done.stdout)["appended"] == 101
    assert len(all_records(log_dir, "t")) == 202


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs."""
    with small_tmpfs(tmp_path / "disk", "2m") as mnt:
        yield mnt


def test_cli_append_on_a_full_disk_says_where_to_resume_and_the_retry_completes_once(
    tmp_path, small_disk, srt_env
):
    """The probe: a raw traceback, and the retry appended every record a second time."""
    log_dir = small_disk / "log"
    EventLog(log_dir).create_topic("t", 2)
    path = tmp_path / "in.jsonl"
    lines = [b'{"k": "m%d", "pad": "%s", "i": %d}' % (i % 7, b"x" * 60, i) for i in range(40_000)]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    args = [str(VENV_BIN / "srt"), "log", "append", "t", "--log-dir", str(log_dir)]

    def append(*extra: str) -> subprocess.CompletedProcess[str]:
        with path.open("rb") as stdin:
            return subprocess.run(
                [*args, *extra], env=srt_env, stdin=stdin, capture_output=True, text=True
            )

    failed = append()
    assert failed.returncode == 2, failed.stderr
    assert "Traceback" not in failed.stderr
    assert "the disk holding the topic is full" in failed.stderr
    assert "Free space on that disk, then run the same command again" in failed.stderr
    in_topic = len(all_records(log_dir, "t"))
    assert 0 < in_topic < len(lines)
    assert f"Lines 1-{in_topic} are in the topic" in failed.stderr
    assert f"resumes at line {in_topic + 1}" in failed.stderr
    again = append("--json")  # still full: the same answer, nothing doubled
    assert again.returncode == 2 and "Traceback" not in again.stderr
    error = json.loads(again.stderr.strip().splitlines()[-1])["error"]
    assert error["disk_full"] is True
    assert len(all_records(log_dir, "t")) == in_topic
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    done = append("--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["skipped"] == in_topic and report["appended"] == len(lines) - in_topic
    assert report["resume_line"] == len(lines) + 1 and report["complete"] is True
    assert sorted(r.value for r in all_records(log_dir, "t")) == sorted(lines)


def test_serve_a_reconnecting_producer_resumes_without_duplicates(served):
    port, log_dir = served
    lines = [good(i) for i in range(50)]
    answers = _exchange(port, b"@producer app-1\n" + b"".join(x + b"\n" for x in lines[:30]))
    assert answers[0] == {"producer_id": "app-1", "resume_line": 1}
    assert answers[-1]["resume_line"] == 31 and answers[-1]["producer_id"] == "app-1"
    # The client lost the answer and resends everything: the first 30 are skipped.
    answers = _exchange(port, b"@producer app-1\n" + b"".join(x + b"\n" for x in lines))
    assert answers[0] == {"producer_id": "app-1", "resume_line": 31}
    assert answers[-1]["skipped"] == 30 and answers[-1]["appended"] == 20
    assert answers[-1]["resume_line"] == 51
    # Or resends from a later line: numbered from there.
    answers = _exchange(port, b"@producer app-1 49\n" + lines[48] + b"\n" + good(50) + b"\n")
    assert (answers[-1]["skipped"], answers[-1]["appended"], answers[-1]["resume_line"]) == (
        2,
        0,
        51,
    )
    assert sorted(r.value for r in all_records(log_dir, "socket")) == sorted(lines)
    # A gap is refused, not appended.
    answers = _exchange(port, b"@producer app-1 60\n" + good(60) + b"\n")
    assert answers == [{"done": False, "error": answers[0]["error"]}]
    assert "lines 51-59 out" in answers[0]["error"]
    assert len(all_records(log_dir, "socket")) == 50


def test_cli_append_killed_mid_input_then_retried_appends_each_line_once(tmp_path, srt_env):
    """kill -9 of `srt log append` part-way through a piped input, then the same input again
    with the same --producer-id: each line exactly once."""
    log_dir = tmp_path / "log"
    EventLog(log_dir).create_topic("t", 3)
    lines = [good(i) for i in range(30_000)]
    args = [str(VENV_BIN / "srt"), "log", "append", "t", "--log-dir", str(log_dir)]
    args += ["--key-field", "k", "--producer-id", "feed-1"]
    proc = subprocess.Popen(args, env=srt_env, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdin is not None
    try:
        proc.stdin.write(b"".join(x + b"\n" for x in lines[:12_000]))
        proc.stdin.flush()
        # Two batches of APPEND_BATCH are in; the rest waits for more input (the pipe is open).
        poll(lambda: len(all_records(log_dir, "t")) >= 2 * APPEND_BATCH, 60, "two batches")
    finally:
        proc.kill()
        proc.wait(timeout=30)
    in_topic = len(all_records(log_dir, "t"))
    assert in_topic == 2 * APPEND_BATCH
    done = srt([*args[1:], "--json"], srt_env, input=b"".join(x + b"\n" for x in lines))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["skipped"], report["appended"]) == (in_topic, len(lines) - in_topic)
    assert sorted(r.value for r in all_records(log_dir, "t")) == sorted(lines)


def test_a_close_failing_after_every_line_went_in_says_so_and_the_retry_adds_nothing(tmp_path):
    """The issue's case: every record was in, closing failed, exit 1, and the retry appended
    everything again."""

    class CloseFails(TopicWriter):
        def close(self) -> None:
            super().close()
            raise LogWriteError(self.info.name, str(self.info.path), "No space left on device")

    class Log(EventLog):
        def writer(self, topic: str, *, fsync: bool = False) -> TopicWriter:
            return CloseFails(self.topic(topic), fsync=fsync)

    log = Log(tmp_path)
    log.create_topic("t", 2)
    data = b"".join(good(i) + b"\n" for i in range(20))
    with pytest.raises(AppendIncompleteError, match="every line is in topic 't'") as caught:
        append_input(log, "t", io.BytesIO(data), "k", producer_id="p", report=lambda _: None)
    assert (caught.value.appended, caught.value.resume_line) == (20, 21)
    assert "running the same command again appends nothing" in str(caught.value)
    report = append_input(EventLog(tmp_path), "t", io.BytesIO(data), "k", producer_id="p")
    assert (report.appended, report.skipped, report.resume_line) == (0, 20, 21)
    assert len(all_records(tmp_path, "t")) == 20


def test_serve_one_open_connection_per_producer_id(served):
    port, log_dir = served
    with socket.create_connection(("127.0.0.1", port), timeout=60) as first:
        first.sendall(b"@producer twin\n" + good(1) + b"\n")
        answer = first.makefile("rb").readline()
        assert json.loads(answer) == {"producer_id": "twin", "resume_line": 1}
        second = _exchange(port, b"@producer twin\n" + good(1) + b"\n")
        assert second[0]["done"] is False and "in use by another open connection" in str(
            second[0]["error"]
        )
        first.shutdown(socket.SHUT_WR)
        while first.recv(1 << 16):
            pass
    assert [r.value for r in all_records(log_dir, "socket")] == [good(1)]
    # Once it is closed, the id is free again (and line 1 is already in).
    assert _exchange(port, b"@producer twin\n" + good(1) + b"\n")[-1]["skipped"] == 1
