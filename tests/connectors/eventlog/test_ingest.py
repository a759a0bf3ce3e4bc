"""`srt log append` / `srt log serve`: a bad line is handled alone, the sender is told, and no
accepted line is lost."""

from __future__ import annotations

import io
import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.connectors.eventlog import EventLog, partition_for
from stateful_runtime.connectors.eventlog.ingest import (
    APPEND_BATCH,
    MAX_LINE_BYTES,
    MAX_REPORTED,
    append_stream,
    ingest_stream,
    key_of,
)
from stateful_runtime.connectors.formats.json import MAX_DEPTH, MAX_RECORD_BYTES, parse_record
from stateful_runtime.exceptions import LogError
from tests.helpers import VENV_BIN, srt

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
    kept = [good(1), good(2)] + ([line] if appended is not False else [])
    assert values == sorted(kept)
    if reason is None:
        assert result.problems == []
    else:
        [problem] = result.problems
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
        assert append_stream(w, io.BytesIO(b"x\n" + good(1)), "k", said.append) == 2
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
    """Any lines: every non-blank line is in the log byte for byte, once, in order per
    partition, keyed as key_of says; only rejected lines are reported, all appended."""
    tmp = tmp_path_factory.mktemp("ingest")
    EventLog(tmp).create_topic("t", 2)
    data = eol.join(lines) + (eol if final_eol else b"")
    with EventLog(tmp).writer("t") as w:
        result = ingest_stream(w, io.BytesIO(data), "k")
    sent = [line.rstrip(b"\r") for line in data.split(b"\n")]
    sent = sent[:-1] if data.endswith(b"\n") else sent
    expected = [(n, line) for n, line in enumerate(sent, 1) if line]
    records = all_records(tmp, "t")
    assert sorted(r.value for r in records) == sorted(line for _, line in expected)
    for p in (0, 1):  # in order within each partition, keyed as key_of says
        assert [(r.value, r.key) for r in records if r.partition == p] == [
            (line, key_of(line, "k"))
            for _, line in expected
            if partition_for(key_of(line, "k"), line, 2) == p
        ]
    assert result.appended == len(expected) and result.refused == 0
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
    assert "2 line(s) rejected" in stderr
    assert len(all_records(log_dir, "upi")) == 51
    result = srt(args, srt_env, input=b'{"merchant_id": "M1"}\n' + LONG + b"\n{}\n")
    assert result.returncode != 0
    stderr = result.stderr.decode()
    assert "line 2: line is" in stderr and "not appended" in stderr
    assert "1 line(s) refused" in stderr and "the other 2 records were appended" in stderr
    assert len(all_records(log_dir, "upi")) == 53


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exchange(port: int, payload: bytes) -> list[dict]:
    """Send, close our side (like `nc -N`), read the server's answers to the end."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as conn:
        conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := conn.recv(1 << 16):
            data += chunk
    return [json.loads(line) for line in data.splitlines()]


@pytest.fixture
def served(tmp_path, srt_env):
    log_dir = tmp_path / "log"
    EventLog(log_dir).create_topic("socket", 2)
    port = _free_port()
    proc = subprocess.Popen(
        [
            str(VENV_BIN / "srt"),
            "log",
            "serve",
            "socket",
            "--port",
            str(port),
            "--key-field",
            "k",
            "--log-dir",
            str(log_dir),
        ],
        env=srt_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on" in proc.stdout.readline()
        yield port, log_dir
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


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
    assert answers[2] == {"done": True, "appended": 301, "rejected": 1, "refused": 1}
    records = all_records(log_dir, "socket")
    assert sorted(r.value for r in records) == sorted([*valid, DEEP])
    # The flusher survived the bad lines: a later connection's lines are appended too.
    assert _exchange(port, good(1000) + b"\n")[-1]["appended"] == 1
    assert good(1000) in [r.value for r in all_records(log_dir, "socket")]


def test_serve_over_long_line_without_newline_at_the_end(served):
    port, log_dir = served
    answers = _exchange(port, good(1) + b"\n" + LONG)
    assert answers[0]["line"] == 2 and answers[0]["appended"] is False
    assert answers[-1] == {"done": True, "appended": 1, "rejected": 0, "refused": 1}


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
        info = SimpleNamespace(name="t")

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
