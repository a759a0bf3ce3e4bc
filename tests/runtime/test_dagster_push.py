"""The job process's push of its commits to Dagster, against an HTTP server on loopback that
answers as Dagster's ``/report_asset_materialization/`` does (the real webserver:
tests/dagster_defs/test_push.py): the listener never waits, batches queued behind a slow post
go in one report, a server that is down is said once and the batches are left to the sensor."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from stateful_runtime.contract import BatchHealth, QueryHealth
from stateful_runtime.runtime import dagster_push
from stateful_runtime.runtime.runner import BatchCommitted
from tests.helpers import free_port, poll


class _Dagster:
    """Records each POST (path, JSON body); ``gate`` holds answers while cleared."""

    def __init__(self, port: int) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.gate = threading.Event()
        self.gate.set()
        seen = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.gate.wait(30)
                seen.posts.append((self.path, body))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.gate.set()
        self.server.shutdown()
        self.server.server_close()


def _batch(batch_id: int, rows: int, query: str = "counts") -> BatchCommitted:
    health = QueryHealth(batch=BatchHealth(batch_id, watermark="2026-01-01T00:01:00.000Z"))
    return BatchCommitted("job", query, batch_id, rows, 1.0, rows, health, {})


def test_no_url_no_push(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(dagster_push.URL_ENV, raising=False)
    assert dagster_push.from_env("job", print) is None
    monkeypatch.setenv(dagster_push.URL_ENV, "")
    assert dagster_push.from_env("job", print) is None


def test_each_batch_is_reported_once_and_batches_behind_a_slow_post_go_together(
    monkeypatch: pytest.MonkeyPatch,
):
    port = free_port()
    dagster = _Dagster(port)
    try:
        monkeypatch.setenv(dagster_push.URL_ENV, f"http://127.0.0.1:{port}/")
        monkeypatch.setenv(dagster_push.ASSETS_ENV, json.dumps({"counts": [["wh", "t 1"]]}))
        said: list[str] = []
        push = dagster_push.from_env("job", said.append)
        assert push is not None
        push(_batch(0, 5))
        poll(lambda: len(dagster.posts) == 1, 30, "batch 0 reported")
        dagster.gate.clear()  # Dagster slow: batch 1's post hangs ...
        push(_batch(1, 7))
        push(_batch(99, 1, query="not-a-sink-query"))  # no asset: nothing to report
        poll(lambda: push.pending.empty(), 30, "batch 1 taken")
        push(_batch(2, 11))  # ... and these queue behind it
        push(_batch(3, 13))
        dagster.gate.set()
        poll(lambda: len(dagster.posts) == 3, 30, "batches 1-3 reported")
        path, body = dagster.posts[0]
        assert path == "/report_asset_materialization/wh/t%201"
        md = body["metadata"]
        assert (md["first batch"], md["last batch"], md["rows written"]) == (0, 0, 5)
        assert md["reported by"] == "job process" and md["query"] == "counts"
        assert md["watermark"] == "2026-01-01T00:01:00.000Z"
        ranges = [
            (b["metadata"]["first batch"], b["metadata"]["last batch"]) for _, b in dagster.posts
        ]
        assert ranges == [(0, 0), (1, 1), (2, 3)]
        assert dagster.posts[2][1]["metadata"]["rows written"] == 24
        push(_batch(3, 13))  # a batch reported is never reported again
        push(_batch(4, 1))
        poll(lambda: len(dagster.posts) == 4, 30, "batch 4 reported")
        assert dagster.posts[3][1]["metadata"]["first batch"] == 4
        assert said == []
    finally:
        dagster.close()


def test_dagster_down_blocks_no_batch_is_said_once_and_batches_age_out(
    monkeypatch: pytest.MonkeyPatch,
):
    port = free_port()  # nothing listens there yet
    monkeypatch.setenv(dagster_push.URL_ENV, f"http://127.0.0.1:{port}")
    monkeypatch.setenv(dagster_push.ASSETS_ENV, json.dumps({"counts": [["t"]]}))
    monkeypatch.setattr(dagster_push, "PUSH_WINDOW_S", dagster_push.REQUEST_TIMEOUT_S + 1.0)
    said: list[str] = []
    push = dagster_push.from_env("job", said.append)
    assert push is not None
    started = time.monotonic()
    for b in range(5):
        push(_batch(b, 1))
    assert time.monotonic() - started < dagster_push.REQUEST_TIMEOUT_S  # queued, not posted
    poll(lambda: said, 30, "the failure said")
    poll(lambda: push.pending.empty(), 30, "the batches taken")
    # Old enough to be the sensor's: dropped, not posted once Dagster is back.
    poll(
        lambda: time.monotonic() - started > dagster_push.PUSH_WINDOW_S + 1,
        30,
        "the batches to age out of the window",
    )
    dagster = _Dagster(port)
    try:
        push(_batch(5, 2))
        poll(lambda: dagster.posts, 30, "batch 5 reported")
        assert [b["metadata"]["first batch"] for _, b in dagster.posts] == [5]
        assert len([s for s in said if "could not report" in s]) == 1, said
        poll(lambda: any("again" in s for s in said), 30, "the recovery said")
    finally:
        dagster.close()
