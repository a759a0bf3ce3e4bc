"""The job process's control endpoint (Flink's JobManager REST, in small) and its client.

The job process (``srt run``) serves HTTP on 127.0.0.1 at an ephemeral port, recorded in its
registry entry (``control``), from a daemon thread (the standard library's
``ThreadingHTTPServer``). Every request needs ``Authorization: Bearer <token>``; the token is
new for each run and lives in ``$SRT_HOME/jobs/<job>.token`` (0600). A wrong or missing token
gets 401 and nothing is done.

=====================  ===========================================================
``GET /health``        the health the runner keeps (JSON): state, pid, per query the
                       last committed batch, checkpoint age, rates, lag, watermark,
                       state rows/bytes, records
``GET /metrics``       the same as Prometheus text (``prometheus_client``)
``POST /savepoint``    ``{"target": ROOT?}``: a savepoint of the last committed batch,
                       taken by the job process; answers its summary
``POST /stop``         ``{"savepoint": bool, "target": ROOT?}``: stop (the batch in
                       flight commits), with a savepoint of the final batch if asked
                       (stop-with-savepoint); answers once the job has stopped
=====================  ===========================================================

Answers are documents of :mod:`stateful_runtime.contract` (``JobHealth``,
``SavepointSummary``, ``StopReport``); errors are its ``ErrorDocument``
(``{"error": {"type", "message"}}``) with 400 (bad request), 401, 404, 409 (the job cannot do
it now) or 500. :func:`call` is the client ``srt`` uses; it talks to the endpoint
only of a process whose identity the registry verified (pid and start time).
"""

from __future__ import annotations

import hmac
import json
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from stateful_runtime import masking
from stateful_runtime.contract import (
    EndpointAddress,
    ErrorDocument,
    ErrorKind,
    JobHealth,
    QueryHealth,
    SavepointSummary,
    StopReport,
)
from stateful_runtime.exceptions import JobError, StatefulRuntimeError
from stateful_runtime.runtime import registry

HOST = "127.0.0.1"
# A request body is a small JSON object; anything bigger is refused unread.
MAX_BODY = 64 * 1024
# A client that stops reading cannot hold a handler thread (and the job's exit) longer.
SOCKET_TIMEOUT_S = 30.0


class EndpointUnavailable(JobError):
    """The job has no control endpoint, or it did not answer (the process may be starting
    or gone); callers fall back to the registry and files."""


class EndpointError(JobError):
    """The endpoint answered with an error.

    Attributes:
        status: HTTP status.
        kind: the job process's error type.
    """

    def __init__(self, message: str, *, status: int, kind: ErrorKind) -> None:
        self.status, self.kind = status, kind
        super().__init__(message)


class Handlers:
    """What the endpoint asks the job process (the runner implements it)."""

    job: str

    def health(self) -> JobHealth:
        raise NotImplementedError

    def savepoint(self, target: str | None) -> SavepointSummary:
        raise NotImplementedError

    def stop(self, savepoint: bool, target: str | None, timeout: float) -> StopReport:
        raise NotImplementedError


def token_path(job: str) -> Path:
    return registry.job_file(job, ".token")


def _epoch(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def metrics_text(health: JobHealth) -> bytes:
    """Prometheus text exposition of a :meth:`Handlers.health` report."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    job = health.job
    queries = health.queries

    def watermark(h: QueryHealth) -> float | None:
        return None if h.batch is None else _epoch(h.batch.watermark)

    def of_batch(attribute: str) -> Callable[[QueryHealth], Any]:
        return lambda h: None if h.batch is None else getattr(h.batch, attribute)

    class _Collector:
        def collect(self) -> Any:
            up = GaugeMetricFamily(
                "srt_job_running", "1 while the job's queries run", labels=["job", "state"]
            )
            up.add_metric([job, str(health.state)], 1.0 if health.state == "RUNNING" else 0.0)
            yield up
            gauges: list[tuple[str, str, Callable[[QueryHealth], Any], float]] = [
                (
                    "srt_last_committed_batch",
                    "last committed micro-batch",
                    lambda h: h.last_committed_batch,
                    1.0,
                ),
                (
                    "srt_checkpoint_age_seconds",
                    "seconds since the last committed batch",
                    lambda h: h.checkpoint_age_s,
                    1.0,
                ),
                (
                    "srt_input_rows_per_second",
                    "input rate of the last batch",
                    of_batch("input_rows_per_s"),
                    1.0,
                ),
                (
                    "srt_processed_rows_per_second",
                    "processing rate of the last batch",
                    of_batch("processed_rows_per_s"),
                    1.0,
                ),
                (
                    "srt_batch_duration_seconds",
                    "duration of the last batch",
                    of_batch("batch_duration_ms"),
                    0.001,
                ),
                (
                    "srt_lag_records",
                    "records in the source not yet processed",
                    of_batch("lag_records"),
                    1.0,
                ),
                ("srt_state_rows", "rows in the state store", of_batch("state_rows"), 1.0),
                ("srt_state_bytes", "memory used by the state store", of_batch("state_bytes"), 1.0),
                (
                    "srt_watermark_seconds",
                    "event-time watermark (epoch seconds)",
                    watermark,
                    1.0,
                ),
            ]
            for name, doc, read, scale in gauges:
                family = GaugeMetricFamily(name, doc, labels=["job", "query"])
                for q, h in sorted(queries.items()):
                    value = read(h)
                    if isinstance(value, int | float) and not isinstance(value, bool):
                        family.add_metric([job, q], float(value) * scale)
                yield family
            records = [
                ("srt_records_input", "records read from the source (this run)", "input"),
                ("srt_records_output", "records into the job's operators and sinks", "output"),
                (
                    "srt_records_dead_letters",
                    "records rejected to the dead-letter topic",
                    "dead_letters",
                ),
                (
                    "srt_records_late",
                    "records behind the watermark (dropped or to a late side output)",
                    "late",
                ),
            ]
            for name, doc, attribute in records:
                counter = CounterMetricFamily(name, doc, labels=["job", "query", "source"])
                for q, h in sorted(queries.items()):
                    if h.records is not None:
                        value = getattr(h.records, attribute)
                        counter.add_metric([job, q, h.records.source], float(value))
                yield counter
            late = CounterMetricFamily(
                "srt_late_rows_dropped",
                "rows dropped by the native window's watermark (this run)",
                labels=["job", "query"],
            )
            for q, h in sorted(queries.items()):
                if h.batch is not None:
                    late.add_metric([job, q], float(h.batch.late_rows_dropped_this_run))
            yield late

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector())
    return generate_latest(reg)


class _Server(ThreadingHTTPServer):
    # Handler threads are joined on close, so a /stop answer is sent before the process ends.
    daemon_threads = False
    block_on_close = True


def _handler(handlers: Handlers, token: str) -> type[BaseHTTPRequestHandler]:
    expected = f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        server_version = "srt-control"
        timeout = SOCKET_TIMEOUT_S

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass  # requests are not the job's output

        def _send(self, status: int, body: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Cache-Control", "no-store")
            if status == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="srt"')
            self.end_headers()
            self.wfile.write(body)

        def _json(self, status: int, value: Any) -> None:
            body = json.dumps(masking.mask_data(value), default=str).encode()
            self._send(status, body, "application/json")

        def _error(self, status: int, kind: str, message: str) -> None:
            self._json(status, ErrorDocument(kind, message).to_json())

        def _authorised(self) -> bool:
            given = (self.headers.get("Authorization") or "").encode()
            if hmac.compare_digest(given, expected):
                return True
            self._error(
                401,
                ErrorKind.UNAUTHORIZED,
                "a valid bearer token is required (the job's token file in $SRT_HOME/jobs)",
            )
            return False

        def _body(self) -> dict[str, Any] | None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY:
                self._error(400, ErrorKind.BAD_REQUEST, f"body larger than {MAX_BODY} bytes")
                return None
            raw = self.rfile.read(length) if length else b""
            try:
                data = json.loads(raw) if raw.strip() else {}
            except ValueError:
                self._error(400, ErrorKind.BAD_REQUEST, "the body must be a JSON object")
                return None
            if not isinstance(data, dict):
                self._error(400, ErrorKind.BAD_REQUEST, "the body must be a JSON object")
                return None
            return data

        def _dispatch(self, work: Callable[[], Any]) -> None:
            try:
                self._json(200, work())
            except StatefulRuntimeError as exc:
                self._error(409, type(exc).__name__, masking.mask_text(str(exc)))
            except Exception as exc:  # the job keeps running; the caller learns why
                self._error(500, type(exc).__name__, masking.mask_text(str(exc)))

        def do_GET(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            if self.path == "/health":
                self._dispatch(lambda: handlers.health().to_json())
            elif self.path == "/metrics":
                try:
                    text = metrics_text(handlers.health())
                except Exception as exc:
                    self._error(500, type(exc).__name__, str(exc))
                    return
                self._send(200, text, "text/plain; version=0.0.4; charset=utf-8")
            else:
                self._error(404, ErrorKind.NOT_FOUND, f"no {self.path}: GET /health or /metrics")

        def do_POST(self) -> None:  # noqa: N802
            if not self._authorised():
                return
            body = self._body()
            if body is None:
                return
            target = body.get("target")
            if target is not None and not isinstance(target, str):
                self._error(400, ErrorKind.BAD_REQUEST, "target must be a string")
                return
            if self.path == "/savepoint":
                self._dispatch(lambda: handlers.savepoint(target).to_json())
            elif self.path == "/stop":
                timeout = float(body.get("timeout") or 300.0)
                self._dispatch(
                    lambda: handlers.stop(bool(body.get("savepoint")), target, timeout).to_json()
                )
            else:
                self._error(404, ErrorKind.NOT_FOUND, f"no {self.path}: POST /savepoint or /stop")

    return Handler


class ControlEndpoint:
    """The endpoint of one job run: a new token (0600 file), a server thread."""

    def __init__(self, handlers: Handlers) -> None:
        self.handlers = handlers
        self.token = secrets.token_urlsafe(32)
        self.token_file = token_path(handlers.job)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> EndpointAddress:
        """Write the token file, start serving; the ``control`` field of the registry entry."""
        registry.ensure_home()
        tmp = self.token_file.with_suffix(f".token.{id(self)}.tmp")
        with registry.private_file(tmp, "w") as f:
            f.write(self.token)
        tmp.replace(self.token_file)
        self._server = _Server((HOST, 0), _handler(self.handlers, self.token))
        # A short poll interval: close() waits for the serving loop to see the shutdown.
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            args=(0.05,),
            name="srt-control-endpoint",
            daemon=True,
        )
        self._thread.start()
        return self.info

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def info(self) -> EndpointAddress:
        return EndpointAddress(f"http://{HOST}:{self.port}", self.port, str(self.token_file))

    def close(self) -> None:
        """Stop serving (answers in progress are sent first) and remove the token file."""
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        self._server = None
        try:
            if self.token_file.read_text() == self.token:  # not a newer run's
                self.token_file.unlink()
        except OSError:
            pass


# ----------------------------------------------------------------------------- client


def call(
    entry: Mapping[str, Any],
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    timeout: float = 30.0,
) -> Any:
    """One request to the endpoint of a registry entry's process. Only for a process the
    registry verified (pid and start time); :class:`EndpointUnavailable` if the entry has no
    endpoint or it does not answer, :class:`EndpointError` if it answers with an error."""
    control = entry.get("control") or {}
    job = entry.get("job")
    if not control.get("port") or not registry.verified(dict(entry)):
        raise EndpointUnavailable(f"job {job!r} has no live control endpoint")
    try:
        token = token_path(str(job)).read_text().strip()
    except OSError as exc:
        raise EndpointUnavailable(f"job {job!r}: cannot read its token file ({exc})") from None
    data = None if body is None else json.dumps(dict(body)).encode()
    request = urllib.request.Request(
        f"http://{HOST}:{int(control['port'])}{path}",
        data=data,
        method=method,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            kind = response.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        try:
            err = ErrorDocument.from_json(json.loads(exc.read()))
        except (ValueError, KeyError, TypeError, AttributeError):
            err = ErrorDocument(ErrorKind.HTTP_ERROR, str(exc))
        raise EndpointError(f"job {job!r}: {err.message}", status=exc.code, kind=err.kind) from None
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise EndpointUnavailable(
            f"job {job!r}: its control endpoint did not answer ({exc})"
        ) from None
    return json.loads(raw) if kind.startswith("application/json") else raw.decode()


def wait_gone(entry: Mapping[str, Any], timeout: float) -> bool:
    """Wait until the entry's process has exited (identity-checked: a reused pid counts as
    gone); True if it did in time."""
    deadline = time.monotonic() + timeout
    while registry.alive(dict(entry)):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
