"""The control endpoint's boundary: hostile requests against a real endpoint (a real server on a
real socket, bytes written by hand), its handlers a double that implements the Handlers contract.

Every request is answered (never a dropped connection) with the job's answer or a 4xx error
document; a handler is only ever asked with fields of the right types and ranges, a savepoint
target absolute and inside the roots; nothing reaches stderr (the job's log). The issue's
examples against a running job are in test_endpoint.py.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stateful_runtime.contract import (
    ErrorDocument,
    JobHealth,
    JobState,
    SavepointSummary,
    StopReport,
)
from stateful_runtime.runtime.endpoint import (
    MAX_BODY,
    MAX_STOP_TIMEOUT_S,
    ControlEndpoint,
    Handlers,
)

JOB = "boundary-job"


class RecordingHandlers(Handlers):
    """A job's answers without a job: records every call; a savepoint writes a file into its
    target, as the runner's does."""

    def __init__(self, roots: tuple[str, ...] = ()) -> None:
        self.job = JOB
        self.savepoint_roots = roots
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.lock = threading.Lock()

    def health(self) -> JobHealth:
        with self.lock:
            self.calls.append(("health", ()))
        return JobHealth(JOB, os.getpid(), JobState.RUNNING, time.time(), {})

    def savepoint(self, target: str | None) -> SavepointSummary:
        with self.lock:
            self.calls.append(("savepoint", (target,)))
        location = f"{target}/sp-1" if target else "/default/sp-1"
        if target and not target.startswith("s3://"):
            Path(location).mkdir(parents=True, exist_ok=True)
        return SavepointSummary("sp-1", JOB, location, {"q": 1}, {"q": 0}, 0, 0, "now", 1)

    def stop(self, savepoint: bool, target: str | None, timeout: float) -> StopReport:
        with self.lock:
            self.calls.append(("stop", (savepoint, target, timeout)))
        return StopReport(JOB, os.getpid(), JobState.RUNNING)


class Served:
    def __init__(self, tmp: Path, roots: tuple[str, ...] = ()) -> None:
        self.handlers = RecordingHandlers(roots)
        self.endpoint = ControlEndpoint(self.handlers)
        self.endpoint.start()
        self.port = self.endpoint.port
        self.token = self.endpoint.token
        self.tmp = tmp

    def raw(self, data: bytes, *, half_close: bool = True) -> tuple[int, dict[str, str], bytes]:
        """Send bytes as they are; the status, headers and body of the answer. Fails if the
        connection is dropped without an answer."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=20) as s:
            try:
                s.sendall(data)
                if half_close:
                    s.shutdown(socket.SHUT_WR)
            except OSError:
                pass  # the server answered and closed before reading everything
            chunks = []
            while True:
                try:
                    chunk = s.recv(65536)
                except ConnectionResetError:
                    break
                if not chunk:
                    break
                chunks.append(chunk)
        answer = b"".join(chunks)
        assert answer, f"no answer to {data[:200]!r}"
        head, _, body = answer.partition(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        headers = {
            k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)
        }
        return int(status_line.split()[1]), headers, body

    def post(self, path: str, body: bytes, extra: str = "") -> tuple[int, dict[str, str], bytes]:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {self.token}\r\n"
            f"Content-Length: {len(body)}\r\n{extra}\r\n"
        )
        return self.raw(head.encode() + body)


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    monkeypatch.setenv("SRT_HOME", str(tmp_path / "home"))
    s = Served(tmp_path)
    yield s
    s.endpoint.close()


def _error(status: int, headers: dict[str, str], body: bytes) -> ErrorDocument:
    assert 400 <= status < 500, (status, body)
    assert headers.get("content-type") == "application/json", headers
    doc = ErrorDocument.from_json(json.loads(body))
    assert doc.message
    return doc


def _valid_call(name: str, args: tuple[Any, ...], roots: tuple[str, ...] = ()) -> None:
    """What a handler may be asked: the boundary's promise."""
    if name == "health":
        assert args == ()
        return
    if name == "stop":
        savepoint, target, timeout = args
        assert isinstance(savepoint, bool)
        assert isinstance(timeout, float) and math.isfinite(timeout)
        assert 0 < timeout <= MAX_STOP_TIMEOUT_S
    else:
        (target,) = args
    if target is not None:
        assert isinstance(target, str)
        assert target.startswith("s3://") or (
            os.path.isabs(target) and os.path.normpath(target) == target
        )
        if roots:
            assert any(target == r or target.startswith(r.rstrip("/") + "/") for r in roots)


# --------------------------------------------------------------- the issue's own examples


def test_the_issues_malformed_requests_get_4xx_documents(served: Served, capfd):
    auth = f"Authorization: Bearer {served.token}\r\n"
    cases = {
        "Content-Length abc": f"POST /stop HTTP/1.1\r\n{auth}Content-Length: abc\r\n\r\n".encode(),
        "Content-Length -1": (
            f"POST /stop HTTP/1.1\r\n{auth}Content-Length: -1\r\n\r\n".encode() + b"x" * 200_000
        ),
        "Content-Length over the limit": (
            f"POST /stop HTTP/1.1\r\n{auth}Content-Length: {MAX_BODY + 1}\r\n\r\n".encode()
        ),
        "Content-Length huge": (
            f"POST /stop HTTP/1.1\r\n{auth}Content-Length: {'9' * 40}\r\n\r\n".encode()
        ),
        "chunked": (
            f"POST /stop HTTP/1.1\r\n{auth}Transfer-Encoding: chunked\r\n\r\n"
            "5\r\nhello\r\n0\r\n\r\n"
        ).encode(),
    }
    for what, data in cases.items():
        status, headers, body = served.raw(data)
        assert _error(status, headers, body).message, what
    for body in (
        {"timeout": "abc"},
        {"timeout": -5},
        {"timeout": 0},
        {"timeout": True},
        {"savepoint": "yes"},
        {"target": "../../x"},
        {"target": "relative/dir"},
        {"target": "/proc"},
        {"target": "file:///tmp/x"},
        {"savepoint": True, "tiemout": 5},
    ):
        status, headers, raw = served.post("/stop", json.dumps(body).encode())
        doc = _error(status, headers, raw)
        assert status == 400, (body, doc)
    for raw_body in (b'{"timeout": NaN}', b'{"timeout": Infinity}', b"[" * 50_000, b"\xff\xfe"):
        status, headers, raw = served.post("/stop", raw_body)
        assert status == 400, raw
    assert served.handlers.calls == []  # nothing was stopped
    # Nothing created under the working directory for a relative target.
    assert not Path("x").exists() and not Path("relative").exists()
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err


def test_an_unwritable_target_says_what_to_do(served: Served, tmp_path: Path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for target in (str(blocker), str(blocker / "below"), "/proc/sp", "/proc"):
        status, headers, raw = served.post("/savepoint", json.dumps({"target": target}).encode())
        doc = _error(status, headers, raw)
        assert "cannot be written" in doc.message and "absolute directory" in doc.message
    assert served.handlers.calls == []
    # A good absolute target, written through `..`, reaches the job normalised.
    good = tmp_path / "sp"
    status, _, raw = served.post(
        "/savepoint", json.dumps({"target": f"{tmp_path}/x/../sp"}).encode()
    )
    assert status == 200, raw
    assert served.handlers.calls == [("savepoint", (str(good),))]


def test_targets_outside_the_configured_roots_are_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("SRT_HOME", str(tmp_path / "home"))
    root = tmp_path / "savepoints"
    s = Served(tmp_path, roots=(str(root), "s3://bucket/sp"))
    try:
        for target in (
            str(tmp_path / "elsewhere"),
            f"{root}/../escape",
            f"{root}-sibling",
            "s3://bucket/other",
            "s3://bucket/sp-sibling",
        ):
            status, headers, raw = s.post("/savepoint", json.dumps({"target": target}).encode())
            assert "outside the roots" in _error(status, headers, raw).message
        for target in (str(root / "a"), "s3://bucket/sp/a"):
            status, _, raw = s.post("/savepoint", json.dumps({"target": target}).encode())
            assert status == 200, raw
        assert [c[1][0] for c in s.handlers.calls] == [str(root / "a"), "s3://bucket/sp/a"]
    finally:
        s.endpoint.close()


def test_a_valid_stop_reaches_the_job_with_its_fields(served: Served):
    status, _, raw = served.post("/stop", b'{"savepoint": true, "timeout": 12}')
    assert status == 200, raw
    status, _, raw = served.post("/stop", b"")
    assert status == 200, raw
    assert served.handlers.calls == [
        ("stop", (True, None, 12.0)),
        ("stop", (False, None, 300.0)),
    ]


# --------------------------------------------------------------- generated hostile requests

_json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
_targets = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["/proc", "/proc/x", "../../x", ".", "", "s3://", "s3://b/p", "//x", "/"]),
    st.builds(lambda p: "/tmp/srt-boundary-" + p, st.text("abc./", max_size=10)),
)
_bodies = st.fixed_dictionaries(
    {},
    optional={
        "savepoint": _json_values,
        "target": st.one_of(_targets, _json_values),
        "timeout": st.one_of(
            _json_values,
            st.floats(),
            st.sampled_from([-5, 0, 1e-9, 5, MAX_STOP_TIMEOUT_S, MAX_STOP_TIMEOUT_S + 1, "5"]),
        ),
        "extra": _json_values,
    },
)


def _encode(body: dict[str, Any]) -> bytes:
    return json.dumps(body, allow_nan=True).encode()


_lengths = st.one_of(
    st.none(),
    st.sampled_from(["-1", "abc", "", " ", "+5", "0x10", "1e3", "５", str(MAX_BODY + 1), "9" * 30]),
    st.integers(min_value=0, max_value=MAX_BODY * 2).map(str),
    st.text(max_size=10).filter(lambda t: "\r" not in t and "\n" not in t),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "BREW", "get"]),
    path=st.sampled_from(["/stop", "/savepoint", "/health", "/metrics", "/", "/stop?x=1", "/x"]),
    body=st.one_of(_bodies.map(_encode), st.binary(max_size=300)),
    length=_lengths,
    auth=st.sampled_from(["good", "none", "bad"]),
)
def test_any_request_is_answered_and_only_valid_ones_reach_the_job(
    served: Served, capfd, method: str, path: str, body: bytes, length: str | None, auth: str
):
    lines = [f"{method} {path} HTTP/1.1", "Host: x"]
    if auth != "none":
        lines.append(f"Authorization: Bearer {served.token if auth == 'good' else 'nope'}")
    if length is not None:
        lines.append(f"Content-Length: {length}")
    data = ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body
    before = len(served.handlers.calls)
    status, headers, raw = served.raw(data)
    calls = served.handlers.calls[before:]
    if status == 200:
        assert headers["content-type"].startswith(("application/json", "text/plain"))
    else:
        assert status != 500, raw
        if method != "HEAD":
            _error(status, headers, raw)
        assert not [c for c in calls if c[0] != "health"], (status, raw, calls)
    for name, args in calls:
        _valid_call(name, args)
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(path=st.sampled_from(["/stop", "/savepoint"]), body=_bodies)
def test_a_json_body_is_refused_or_reaches_the_job_checked(
    served: Served, capfd, path: str, body: dict[str, Any]
):
    before = len(served.handlers.calls)
    status, headers, raw = served.post(path, _encode(body))
    calls = served.handlers.calls[before:]
    if status == 200:
        [(name, args)] = calls
        _valid_call(name, args)
        assert "extra" not in body
        if path == "/savepoint":
            assert set(body) <= {"target"}
    else:
        assert status == 400, raw
        _error(status, headers, raw)
        assert calls == []
    out, err = capfd.readouterr()
    assert "Traceback" not in out + err, err
