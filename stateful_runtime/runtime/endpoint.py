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
(``{"error": {"type", "message"}}``) with 400 (bad request), 401, 404, 405, 409 (the job cannot
do it now), 411, 413 or 500. :func:`call` is the client ``srt`` uses; it talks to the endpoint
only of a process whose identity the registry verified (pid and start time).

Every request is checked at this boundary before the job is asked anything
(:func:`parse_content_length`, :func:`parse_body`, :func:`check_target`): the body's length
(decimal digits, at most :data:`MAX_BODY`, whatever the headers say), a JSON object without
NaN or Infinity, only the fields of its path with their types and ranges (``savepoint`` a
boolean, ``timeout`` a finite number of seconds in (0, :data:`MAX_STOP_TIMEOUT_S`]), and a
savepoint ``target`` that is an absolute path or ``s3://bucket/prefix``, inside the job's
``savepoint.roots`` when that is set, and writable (probed before a stop begins). A request
that fails any check gets a 4xx error document saying what to send instead; nothing reaches
the job's log, and the connection is answered, never dropped.
"""

from __future__ import annotations

import hmac
import json
import math
import os
import secrets
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from stateful_runtime import masking
from stateful_runtime.contract import (
    CALL_BUCKETS_MS,
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
# The longest a POST /stop may wait for the job to stop (a day), and its default.
MAX_STOP_TIMEOUT_S = 86_400.0
DEFAULT_STOP_TIMEOUT_S = 300.0
# The fields each POST accepts; anything else is refused, so a typo is never ignored.
FIELDS: Mapping[str, frozenset[str]] = {
    "/savepoint": frozenset({"target"}),
    "/stop": frozenset({"savepoint", "target", "timeout"}),
}


class Refused(Exception):
    """A request the endpoint refuses at its boundary: the status and what to send instead.
    Internal to this module (the client sees an :class:`EndpointError`)."""

    def __init__(self, status: int, message: str, kind: str = ErrorKind.BAD_REQUEST) -> None:
        self.status, self.kind = status, kind
        super().__init__(message)


def parse_content_length(value: str | None, transfer_encoding: str | None = None) -> int:
    """The body's length from its headers: decimal digits, at most :data:`MAX_BODY`; no
    header is an empty body. :class:`Refused` for anything else (a sign, spaces inside, hex,
    a chunked body)."""
    if transfer_encoding is not None and transfer_encoding.strip():
        raise Refused(
            411,
            "a chunked (Transfer-Encoding) body is not accepted; send the JSON object with "
            "a Content-Length header",
            ErrorKind.LENGTH_REQUIRED,
        )
    if value is None:
        return 0
    text = value.strip()
    if not (text.isascii() and text.isdigit()):
        raise Refused(
            400, f"Content-Length must be a number of bytes (0-{MAX_BODY}), got {value[:40]!r}"
        )
    if len(text) > 12 or int(text) > MAX_BODY:
        raise Refused(
            413,
            f"body of {text[:20]} bytes refused: at most {MAX_BODY} bytes (a small JSON object)",
            ErrorKind.PAYLOAD_TOO_LARGE,
        )
    return int(text)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse_body(path: str, raw: bytes) -> dict[str, Any]:
    """The fields of a POST body for ``path`` (``{}`` when empty), checked: a JSON object of
    known fields, ``savepoint`` a boolean, ``timeout`` a finite number of seconds in
    (0, :data:`MAX_STOP_TIMEOUT_S`], ``target`` a string (checked by :func:`check_target`)."""
    if not raw.strip():
        return {}
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        raise Refused(400, 'the body must be a JSON object, e.g. {"savepoint": true}')
    allowed = FIELDS[path]
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise Refused(
            400,
            f"unknown field(s) {', '.join(repr(k[:40]) for k in unknown[:5])} for POST {path}; "
            f"it takes {', '.join(sorted(allowed))}",
        )
    out: dict[str, Any] = {}
    if data.get("target") is not None:
        if not isinstance(data["target"], str):
            raise Refused(400, "target must be a string: an absolute directory or s3://bucket/p")
        out["target"] = data["target"]
    if data.get("savepoint") is not None:
        if not isinstance(data["savepoint"], bool):
            raise Refused(400, "savepoint must be true or false")
        out["savepoint"] = data["savepoint"]
    if data.get("timeout") is not None:
        timeout = data["timeout"]
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or not 0 < timeout <= MAX_STOP_TIMEOUT_S
        ):
            raise Refused(
                400,
                f"timeout must be a number of seconds above 0 and at most "
                f"{MAX_STOP_TIMEOUT_S:g}, got {json.dumps(timeout)[:40]}; nothing was stopped",
            )
        out["timeout"] = float(timeout)
    return out


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_target(target: str, roots: tuple[str, ...] = ()) -> str:
    """A savepoint target the job may write: ``s3://bucket/prefix``, or an absolute local
    directory (normalised, never resolved against the job's working directory) that exists or
    can be created and takes a file. Inside one of ``roots`` when any are set. The normalised
    target, or :class:`Refused` saying what to give instead."""
    hint = "give an absolute directory (or s3://bucket/prefix)"
    if roots:
        hint += f" inside the job's savepoint.roots ({', '.join(roots)})"
    if not target or any(ord(c) < 32 for c in target):
        raise Refused(400, f"savepoint target {target[:80]!r} is not a path; {hint}")
    if target.startswith("s3://"):
        bucket = target.removeprefix("s3://").partition("/")[0]
        if not bucket:
            raise Refused(400, f"savepoint target {target[:80]!r} names no bucket; {hint}")
        if roots and not any(_inside(target.rstrip("/"), r) for r in roots):
            raise Refused(400, f"savepoint target {target[:80]!r} is outside the roots; {hint}")
        return target
    if "://" in target:
        raise Refused(400, f"savepoint target {target[:80]!r}: unsupported scheme; {hint}")
    if not os.path.isabs(target):
        raise Refused(
            400,
            f"savepoint target {target[:80]!r} is relative (it would land under the job's "
            f"working directory); {hint}",
        )
    path = os.path.normpath(target)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")
    if roots and not any(_inside(path, os.path.normpath(r)) for r in roots if "://" not in r):
        raise Refused(400, f"savepoint target {path[:80]!r} is outside the roots; {hint}")
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".srt-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise Refused(
            400,
            f"savepoint target {path[:80]!r} cannot be written ({reason}); {hint} that this "
            f"job's user can write; nothing was saved or stopped",
        ) from None
    return path


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
    # Savepoint targets a request may name must lie inside one of these (empty: anywhere
    # absolute); the job's ``savepoint.roots``.
    savepoint_roots: tuple[str, ...] = ()

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
            yield from _call_metrics(job, queries)

    reg = CollectorRegistry(auto_describe=False)
    reg.register(_Collector())
    return generate_latest(reg)


def _call_metrics(job: str, queries: Mapping[str, QueryHealth]) -> Iterator[Any]:
    """The ``map_async`` steps' calls this run: counters and a latency histogram."""
    from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily

    labels = ["job", "query", "step"]
    counters = {
        "calls": CounterMetricFamily(
            "srt_step_calls", "service calls made (this run)", labels=labels
        ),
        "retries": CounterMetricFamily(
            "srt_step_call_retries", "calls that retried a failed one (this run)", labels=labels
        ),
        "failed": CounterMetricFamily(
            "srt_step_call_failures",
            "records whose last call failed (this run)",
            labels=labels,
        ),
    }
    latency = HistogramMetricFamily(
        "srt_step_call_seconds", "service call latency (this run)", labels=labels
    )
    for q, h in sorted(queries.items()):
        for step, calls in sorted((h.calls or {}).items()):
            for attribute, family in counters.items():
                family.add_metric([job, q, step], float(getattr(calls, attribute)))
            running, buckets = 0, []
            for bound, n in zip((*CALL_BUCKETS_MS, math.inf), calls.buckets, strict=True):
                running += n
                buckets.append((str(bound / 1000) if bound != math.inf else "+Inf", running))
            latency.add_metric([job, q, step], buckets, sum_value=None)
    yield from counters.values()
    yield latency


class _Server(ThreadingHTTPServer):
    # Handler threads are joined on close, so a /stop answer is sent before the process ends.
    daemon_threads = False
    block_on_close = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that went away mid-answer is no fault of the job: nothing in its log
        # (socketserver would print a traceback to stderr).
        pass


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

        def send_error(
            self, code: int, message: str | None = None, explain: str | None = None
        ) -> None:
            # The standard library's own refusals (a malformed request line, headers too long,
            # an unsupported method) as error documents too, not HTML.
            if code == 501:  # an unsupported method is the client's: 405
                code, message = 405, f"method not allowed: {self.command!r}; GET or POST"
            kind = {404: ErrorKind.NOT_FOUND, 405: ErrorKind.METHOD_NOT_ALLOWED}.get(
                code, ErrorKind.BAD_REQUEST
            )
            self.close_connection = True
            try:
                self._error(code, kind, message or explain or "bad request")
            except OSError:
                pass

        def _refuse(self, exc: Refused) -> None:
            self.close_connection = True  # an unread body must not be taken as a request
            self._error(exc.status, exc.kind, str(exc))

        def _guarded(self, handle: Callable[[], None]) -> None:
            # Every request gets an answer: a refusal, the job's answer, or a 500 document.
            try:
                handle()
            except Refused as exc:
                self._refuse(exc)
            except OSError:
                self.close_connection = True  # the client went away: nothing to answer
            except Exception as exc:
                self.close_connection = True
                try:
                    self._error(500, type(exc).__name__, masking.mask_text(str(exc)))
                except OSError:
                    pass

        def _body(self) -> bytes:
            length = parse_content_length(
                self.headers.get("Content-Length"), self.headers.get("Transfer-Encoding")
            )
            raw = self.rfile.read(length) if length else b""
            if len(raw) < length:
                raise Refused(400, f"the body ended after {len(raw)} of {length} bytes")
            return raw

        def _dispatch(self, work: Callable[[], Any]) -> None:
            try:
                answer = work()
            except Refused:
                raise
            except StatefulRuntimeError as exc:
                self._error(409, type(exc).__name__, masking.mask_text(str(exc)))
                return
            except Exception as exc:  # the job keeps running; the caller learns why
                self._error(500, type(exc).__name__, masking.mask_text(str(exc)))
                return
            self._json(200, answer)

        def do_GET(self) -> None:  # noqa: N802
            self._guarded(self._get)

        def do_POST(self) -> None:  # noqa: N802
            self._guarded(self._post)

        def _get(self) -> None:
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

        def _post(self) -> None:
            if not self._authorised():
                return
            if self.path not in FIELDS:
                self.close_connection = True
                self._error(404, ErrorKind.NOT_FOUND, f"no {self.path}: POST /savepoint or /stop")
                return
            body = parse_body(self.path, self._body())
            target = body.get("target")
            if target is not None:
                target = check_target(target, tuple(handlers.savepoint_roots))
            if self.path == "/savepoint":
                self._dispatch(lambda: handlers.savepoint(target).to_json())
            else:
                timeout = body.get("timeout", DEFAULT_STOP_TIMEOUT_S)
                savepoint = body.get("savepoint", False)
                self._dispatch(lambda: handlers.stop(savepoint, target, timeout).to_json())

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
