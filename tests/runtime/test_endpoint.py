"""The job process's control endpoint and the secrets of a launched job, with real processes.

One UPI job is launched through Dagster (``materialize``, in process, as tests/dagster_defs do)
with a Kafka password and a password inside a PostgreSQL DSN in its config (the log source and
DuckDB sink leave both unused, so the job runs without a broker or a database), and shared by
the tests in file order: secrets nowhere, 401 without the token, health and metrics moving as
batches commit, a savepoint taken by the job process, `srt stop` through the endpoint; then a
second launch (`srt launch`, secrets through the environment) is stopped with a savepoint by
``POST /stop``. The module fixture kills whatever is left.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from upi_events import START_MS, events

from stateful_runtime.contract import JobHealth, SavepointSummary, StopReport
from tests.helpers import EXAMPLES, ROOT, UpiWorkspace, append_lines, poll, srt

pytestmark = pytest.mark.slow

JOB = "upi-per-minute"
UPI = EXAMPLES / "upi_per_minute.py"
KAFKA_SECRET = "kafka-Pa55word-7731"
DSN_SECRET = "dsn-Pa55word-4410"
DSN = f"postgresql://srt:{DSN_SECRET}@127.0.0.1:1/nowhere"
SECRETS = (KAFKA_SECRET, DSN_SECRET)


@dataclass
class Job:
    home: Path
    ws: UpiWorkspace
    env: dict[str, str]
    metadata: dict[str, Any]
    run_text: str
    pids: list[int] = field(default_factory=list)

    @property
    def entry(self) -> dict[str, Any]:
        return json.loads((self.home / "jobs" / f"{JOB}.json").read_text())

    def token(self) -> str:
        return (self.home / "jobs" / f"{JOB}.token").read_text()

    def request(
        self,
        method: str,
        path: str,
        body: dict[str, Any] | None = None,
        token: str | None = "",
        timeout: float = 300,
    ) -> tuple[int, bytes]:
        """One HTTP request to the job's endpoint: its status and body. ``token=""``: the
        job's own token; None: no Authorization header."""
        token = self.token() if token == "" else token
        headers = {} if token is None else {"Authorization": f"Bearer {token}"}
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.entry['control']['port']}{path}",
            data=data,
            method=method,
            headers=headers,
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def ok(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        code, raw = self.request(method, path, body)
        assert code == 200, raw
        if path == "/metrics":
            return raw.decode()
        answer = json.loads(raw)
        # The answers are documents of the contract: they read back and write the same JSON.
        kind = {"/health": JobHealth, "/savepoint": SavepointSummary, "/stop": StopReport}[path]
        assert kind.from_json(answer).to_json() == answer
        return answer

    def srt(self, *args: str, env: dict[str, str] | None = None) -> Any:
        out = srt(["--home", str(self.home), *args, "--json"], env or self.env, timeout=600)
        assert out.returncode == 0, out.stderr[-4000:]
        self.run_text += out.stdout + out.stderr
        return json.loads(out.stdout)


def _feed(ws: UpiWorkspace, count: int, seed: int, start_ms: int) -> None:
    append_lines(
        ws.log_dir,
        list(
            events(
                count, merchants=8, rate_per_s=40, disorder_ms=2_000, seed=seed, start_ms=start_ms
            )
        ),
    )


def _job_config(ws: UpiWorkspace) -> dict[str, Any]:
    return {
        "source.log_dir": str(ws.log_dir),
        "checkpoint.dir": str(ws.checkpoint_dir),
        "checkpoint.interval_s": 1.0,
        "parallelism": 2,
        "kafka.sasl.password": KAFKA_SECRET,
        "sink.dsn": DSN,
    }


def _group(pid: int) -> list[int]:
    from stateful_runtime.runtime import registry

    return registry.group_members(pid)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory, srt_env: dict[str, str]) -> Iterator[Job]:
    from dagster import AssetKey, materialize

    from dagster_defs import (
        DuckDBWarehouse,
        StreamingJobSpec,
        StreamingRuntime,
        build_definitions,
    )
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.runtime import launcher

    root = tmp_path_factory.mktemp("endpoint")
    ws = UpiWorkspace(root, partitions=2)
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    _feed(ws, 1_500, seed=5, start_ms=START_MS)
    home = root / "home"  # created by the launch
    saved = os.environ.get("SRT_HOME")
    os.environ["SRT_HOME"] = str(home)
    spec = StreamingJobSpec(
        name=JOB,
        job_file=str(UPI),
        config=_job_config(ws),
        config_from_resources={"sink.database": "warehouse.path"},
    )
    resources = {
        "streaming_runtime": StreamingRuntime(
            home=str(home), working_directory=str(ROOT), launch_timeout_s=400, commit_timeout_s=400
        ),
        "warehouse": DuckDBWarehouse(path=str(ws.database)),
    }
    defs = build_definitions([spec], resources=resources)
    state = Job(home, ws, {**srt_env, "SRT_HOME": str(home)}, {}, "")
    try:
        result = materialize(
            list(defs.assets),  # type: ignore[arg-type]
            selection=[AssetKey(["upi_per_minute"])],
            resources={**defs.resources},
        )
        [event] = result.get_asset_materialization_events()
        state.metadata = {k: v.value for k, v in event.materialization.metadata.items()}
        state.pids.append(int(state.metadata["pid"]))
        # Everything the Dagster run logged (messages, metadata, the run's events).
        state.run_text = "\n".join(str(e) for e in result.all_events)
        yield state
    finally:
        last = state.entry.get("pid") if (home / "jobs" / f"{JOB}.json").exists() else None
        for pid in {*state.pids, last} - {None}:
            launcher.signal_group(int(pid), signal.SIGKILL)  # type: ignore[arg-type]
        if saved is None:
            os.environ.pop("SRT_HOME", None)
        else:
            os.environ["SRT_HOME"] = saved


def test_secrets_are_nowhere_and_srt_home_is_private(job: Job):
    md = job.metadata
    pid = int(md["pid"])
    assert md["launched"] is True and job.entry["state"] == "RUNNING"
    assert md["config"]["kafka.sasl.password"] == "***"
    assert md["config"]["sink.dsn"] == "postgresql://srt:***@127.0.0.1:1/nowhere"
    shown = {
        "Dagster metadata": json.dumps(md, default=str),
        "Dagster run events": job.run_text,
        "registry entry": (job.home / "jobs" / f"{JOB}.json").read_text(),
        "launcher log": (job.home / "jobs" / f"{JOB}.log").read_text(),
        "srt status --json": json.dumps(job.srt("status")),
        "srt status": srt(["--home", str(job.home), "status"], job.env).stdout,
    }
    # `ps`: the job's argv, and every process of its group (JVM, Python workers).
    members = _group(pid)
    assert pid in members
    for member in members:
        shown[f"/proc/{member}/cmdline"] = _cmdline(member).decode(errors="replace")
    # explain, with the secrets given on its own command line (it warns, and masks them).
    explained = srt(
        [
            "--home",
            str(job.home),
            "explain",
            str(UPI),
            "--no-spark",
            "--json",
            "--set",
            f"kafka.sasl.password={KAFKA_SECRET}",
            "--set",
            f"sink.dsn={DSN}",
        ],
        job.env,
    )
    assert explained.returncode == 0, explained.stderr
    assert "given on the command line" in explained.stderr
    shown["srt explain"] = explained.stdout + explained.stderr
    for where, text in shown.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret} shown in {where}"

    # The secrets did reach the job (through its environment, read and removed at start).
    assert "postgresql://srt:***@127.0.0.1:1/nowhere" in shown["registry entry"]
    assert "(+ kafka.sasl.password, sink.dsn from the environment)" in shown["launcher log"]

    assert stat.S_IMODE(job.home.stat().st_mode) == 0o700
    assert stat.S_IMODE((job.home / "jobs").stat().st_mode) == 0o700
    files = sorted((job.home / "jobs").iterdir())
    assert {p.suffix for p in files} >= {".json", ".log", ".token", ".lock"}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o600 for p in files}


def test_a_wrong_or_missing_token_gets_401_and_nothing_happens(job: Job):
    for token in (None, "wrong", job.token() + "x"):
        for method, path, body in (
            ("GET", "/health", None),
            ("GET", "/metrics", None),
            ("POST", "/savepoint", {}),
            ("POST", "/stop", {"savepoint": True}),
        ):
            code, raw = job.request(method, path, body, token=token)
            assert code == 401, (method, path, raw)
            assert json.loads(raw)["error"]["type"] == "Unauthorized"
    [status] = job.srt("status", JOB)
    assert (status["registered_state"], status["alive"]) == ("RUNNING", True)
    assert status["pid"] == int(job.metadata["pid"])
    assert job.srt("savepoint", "list", JOB) == []
    code, _ = job.request("GET", "/nothing")
    assert code == 404


def _metrics(text: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    return {
        (s.name, s.labels.get("query", "")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_health_and_metrics_move_as_batches_commit(job: Job):
    before = job.ok("GET", "/health")
    assert before["job"] == JOB and before["pid"] == int(job.metadata["pid"])
    assert before["state"] == "RUNNING"
    q = "upi-counts"
    first = before["queries"][q]
    m1 = _metrics(job.ok("GET", "/metrics"))
    assert m1[("srt_job_running", "")] == 1.0
    assert m1[("srt_records_input_total", q)] == first["records"]["input"]
    assert m1[("srt_last_committed_batch", q)] == first["last_committed_batch"]

    _feed(job.ws, 800, seed=6, start_ms=START_MS + 60_000)

    def moved() -> dict[str, Any] | None:
        h = job.ok("GET", "/health")["queries"][q]
        return (
            h
            if (
                h["last_committed_batch"] > first["last_committed_batch"]
                and h["records"]["input"] >= first["records"]["input"] + 800
            )
            else None
        )

    after = poll(moved, 400, "a batch committing the new records")
    m2 = _metrics(job.ok("GET", "/metrics"))
    assert m2[("srt_records_input_total", q)] > m1[("srt_records_input_total", q)]
    assert (
        m2[("srt_records_output_total", q)]
        + m2[("srt_records_dead_letters_total", q)]
        + m2[("srt_records_late_total", q)]
        == m2[("srt_records_input_total", q)]
    )
    assert m2[("srt_last_committed_batch", q)] >= after["last_committed_batch"]
    for name in (
        "srt_checkpoint_age_seconds",
        "srt_state_rows",
        "srt_state_bytes",
        "srt_input_rows_per_second",
        "srt_processed_rows_per_second",
        "srt_batch_duration_seconds",
        "srt_lag_records",
        "srt_watermark_seconds",
    ):
        assert (name, q) in m2, name
    assert m2[("srt_state_rows", q)] > 0 and m2[("srt_checkpoint_age_seconds", q)] >= 0

    # srt status (and so Dagster's status) reads the same health from the endpoint.
    [status] = job.srt("status", JOB)
    assert status["health_source"] == "endpoint"
    assert status["health"][q]["last_committed_batch"] >= after["last_committed_batch"]


def test_post_savepoint_is_taken_by_the_job_and_listed(job: Job, tmp_path: Path):
    taken = job.ok("POST", "/savepoint")
    assert taken["job"] == JOB and taken["kind"] == "savepoint"
    assert taken["batches"]["upi-counts"] >= 0
    listed = job.srt("savepoint", "list", JOB)
    assert [s["id"] for s in listed] == [taken["id"]]
    assert job.entry["last_savepoint"]["id"] == taken["id"]

    elsewhere = job.ok("POST", "/savepoint", {"target": str(tmp_path / "sp")})
    assert elsewhere["location"].startswith(str(tmp_path / "sp"))
    assert [
        s["id"] for s in job.srt("savepoint", "list", JOB, "--target", str(tmp_path / "sp"))
    ] == [elsewhere["id"]]
    # srt savepoint create asks the running job too.
    again = job.srt("savepoint", "create", JOB)
    assert again["kind"] == "savepoint" and again["id"] not in (taken["id"], elsewhere["id"])


def _raw(port: int, data: bytes) -> tuple[int, bytes]:
    """Bytes sent as they are; the answer's status and body (fails on a dropped connection)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # answered and closed before the whole body was sent
        chunks = []
        try:
            while chunk := s.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass  # closed with unread bytes: the answer was read first
        answer = b"".join(chunks)
    assert answer, f"no answer to {data[:100]!r}"
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def test_malformed_requests_get_4xx_and_the_job_runs_on(job: Job, tmp_path: Path):
    port, token = job.entry["control"]["port"], job.token()
    auth = f"Authorization: Bearer {token}\r\n"
    for length in ("abc", "-1", "99999999999999999999"):
        data = f"POST /stop HTTP/1.1\r\n{auth}Content-Length: {length}\r\n\r\n".encode()
        code, raw = _raw(port, data + b'{"savepoint": true}' + b" " * 100_000)
        assert 400 <= code < 500 and json.loads(raw)["error"]["message"], (length, raw)
    relative = ROOT / "../../srt-endpoint-relative"
    for body in (
        {"timeout": "abc"},
        {"timeout": -5},
        {"timeout": float("nan")},
        {"target": "../../srt-endpoint-relative"},
        {"target": "/proc"},
        {"savepoint": True, "target": "/proc"},
        {"savepoint": "yes"},
        {"unknown": 1},
    ):
        code, raw = job.request("POST", "/stop", body)
        assert code == 400, (body, raw)
        assert json.loads(raw)["error"]["type"] == "BadRequest"
    code, raw = job.request("POST", "/savepoint", {"target": "/proc"})
    assert code == 400 and b"cannot be written" in raw, raw
    assert not relative.exists()
    # Still running, nothing stopped, no traceback in its log.
    assert job.ok("GET", "/health")["state"] == "RUNNING"
    assert job.entry["state"] == "RUNNING"
    assert "Traceback" not in (job.home / "jobs" / f"{JOB}.log").read_text()


def test_srt_stop_goes_through_the_endpoint(job: Job):
    pid = int(job.metadata["pid"])
    stopped = job.srt("stop", JOB, "--timeout", "300")
    assert (stopped["pid"], stopped["signal"]) == (pid, "endpoint")
    status = stopped["status"]
    assert (status["registered_state"], status["alive"]) == ("STOPPED", False)
    assert not (job.home / "jobs" / f"{JOB}.token").exists()
    poll(lambda: not _group(pid), 60, "the job's processes to end")


def test_post_stop_with_a_savepoint(job: Job):
    from stateful_runtime.masking import child_env

    public = {
        k: v for k, v in _job_config(job.ws).items() if k not in ("kafka.sasl.password", "sink.dsn")
    }
    sets = [
        a
        for k, v in {**public, "sink.database": str(job.ws.database)}.items()
        for a in ("--set", f"{k}={v}")
    ]
    env = {**job.env, **child_env({"kafka.sasl.password": KAFKA_SECRET, "sink.dsn": DSN})}
    since = time.time()
    launched = job.srt("launch", str(UPI), *sets, "--job", JOB, env=env)
    pid = launched["pid"]
    job.pids.append(pid)
    assert launched["launched"] is True
    job.srt("wait", JOB, "--until", "running", "--pid", str(pid), "--timeout", "400")
    _feed(job.ws, 200, seed=7, start_ms=START_MS + 120_000)
    assert job.srt("wait", JOB, "--until", "commit", "--since", repr(since), "--timeout", "400")[
        "reached"
    ]
    for member in _group(pid):
        assert not any(s.encode() in _cmdline(member) for s in SECRETS)
    assert job.entry["config"]["kafka.sasl.password"] == "***"

    answer = job.ok("POST", "/stop", {"savepoint": True})
    assert answer["state"] == "STOPPED" and answer["pid"] == pid
    sp = answer["savepoint"]
    assert sp["kind"] == "stop-with-savepoint"
    assert sp["batches"]["upi-counts"] >= 0
    poll(lambda: not _group(pid), 120, "the job's processes to end")
    entry = job.entry
    assert entry["state"] == "STOPPED" and entry["last_savepoint"]["id"] == sp["id"]
    assert sp["id"] in [s["id"] for s in job.srt("savepoint", "list", JOB)]
    # Nothing was committed after the savepoint: it holds the final batch.
    [status] = job.srt("status", JOB)
    assert status["queries"]["upi-counts"]["last_committed_batch"] == sp["batches"]["upi-counts"]


def test_a_map_async_steps_calls_are_prometheus_counters_and_a_latency_histogram():
    from prometheus_client.parser import text_string_to_metric_families

    from stateful_runtime.contract import (
        CALL_BUCKETS_MS,
        CallStats,
        JobHealth,
        JobState,
        QueryHealth,
    )
    from stateful_runtime.runtime.endpoint import metrics_text

    buckets = [0] * (len(CALL_BUCKETS_MS) + 1)
    buckets[CALL_BUCKETS_MS.index(20)], buckets[-1] = 9, 1  # 9 calls of 10-20 ms, 1 past 30 s
    calls = CallStats(calls=10, retries=3, failed=1, buckets=tuple(buckets))
    health = JobHealth("j", 1, JobState.RUNNING, 0.0, {"q": QueryHealth(calls={"score": calls})})
    samples = {
        (s.name, s.labels.get("le")): s.value
        for f in text_string_to_metric_families(metrics_text(health).decode())
        for s in f.samples
        if s.labels.get("step") == "score"
    }
    assert samples[("srt_step_calls_total", None)] == 10
    assert samples[("srt_step_call_retries_total", None)] == 3
    assert samples[("srt_step_call_failures_total", None)] == 1
    assert samples[("srt_step_call_seconds_bucket", "0.01")] == 0
    assert samples[("srt_step_call_seconds_bucket", "0.02")] == 9
    assert samples[("srt_step_call_seconds_bucket", "+Inf")] == 10
