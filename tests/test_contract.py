"""The runtime↔program contract: every document reads back into its class and writes the same
JSON, the module needs only the standard library, and every error the runtime raises on purpose
has its kind. (tests/runtime/test_control.py checks the same round trip on every document a real
``srt ... --json`` printed.)"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from collections.abc import Mapping
from typing import Any

import pytest

import dbt_sink
import stateful_runtime
from stateful_runtime import contract
from stateful_runtime.contract import (
    AppendReport,
    Disposed,
    ErrorDocument,
    ErrorKind,
    Explain,
    JobHealth,
    JobStatus,
    Killed,
    Launch,
    QueryHealth,
    SavepointSummary,
    SinksAccepted,
    StateCheck,
    Stopped,
    StopReport,
    Upgrade,
    Wait,
    WindowCounts,
)
from stateful_runtime.exceptions import StatefulRuntimeError

CONFIG = {"source.topic": "upi-payments", "kafka.password": "***"}
QUERIES = {
    "upi-counts": {"checkpoint_dir": "/ck/upi-counts", "path": "native", "output_mode": "update"}
}
FACTS = {
    "last_committed_batch": 4,
    "last_commit_time": 1700000000.25,
    "checkpoint_age_s": 1.5,
    "inflight_batch_age_s": None,
    "state_partitions": 2,
}
RECORDS = {"source": "payments", "input": 100, "output": 95, "dead_letters": 3, "late": 2}
HEALTH = {
    "last_batch": 4,
    "last_committed_batch": 4,
    "checkpoint_age_s": 0.1,
    "input_rows": 100,
    "input_rows_per_s": 50.0,
    "processed_rows_per_s": 200.0,
    "batch_duration_ms": 500,
    "watermark": "2024-01-01T00:00:00.000Z",
    "state_rows": 4,
    "state_bytes": 1000,
    "lag_records": 10,
    "lag_by_partition": {"0": 10, "1": 0},
    "event_time_lag_by_partition": {"payments:0": 0, "payments:1": 600_000},
    "watermark_held_by": "payments:1",
    "updated_at": "2024-01-01T00:00:05Z",
    "late_rows_dropped": 2,
    "late_rows_dropped_this_run": 2,
    "recent_batches": [[3, 50, 1700000000000, 400], [4, 100, 1700000001000, 500]],
    "recent_input_rows_per_s": 100.0,
    "recent_processed_rows_per_s": 166.667,
    "records": RECORDS,
    "mirror_batch": 4,
    "mirror_bytes_uploaded": 2048,
}
# A launcher's entry, before the job process registers.
LAUNCHED = {
    "job": "upi",
    "state": "STARTING",
    "pid": 42,
    "pid_start": None,
    "run_id": "abc",
    "job_file": "/jobs/upi.py",
    "config": CONFIG,
    "started_at": "2024-01-01T00:00:00Z",
    "log_path": "/home/.srt/jobs/upi.log",
}
# The job process's entry, as `srt status --json` shows it.
REGISTERED = {
    "job": "upi",
    "state": "DEAD",
    "pid": 42,
    "pid_start": 1234,
    "run_id": "abc",
    "control": {"url": "http://127.0.0.1:5000", "port": 5000, "token_file": "/t"},
    "job_file": "/jobs/upi.py",
    "config": CONFIG,
    "checkpoint_dir": "/ck",
    "master": "local[*]",
    "available_now": False,
    "started_at": "2024-01-01T00:00:00Z",
    "parallelism": 2,
    "savepoint_dir": "/sp",
    "mirror": None,
    "restored_from": None,
    "restore": None,
    "queries": {"upi-counts": {**QUERIES["upi-counts"], **FACTS}},
    "spark_app_id": "local-1",
    "health": {"upi-counts": HEALTH},
    "ended_at": "2024-01-01T00:10:00Z",
    "last_savepoint": {"id": "sp-1", "location": "/sp/sp-1", "created_at": "2024-01-01T00:05:00Z"},
    "registered_state": "RUNNING",
    "alive": False,
    "live": False,
    "checked_at": 1700000001.5,
    "health_source": "registry",
}
SAVEPOINT = {
    "id": "sp-1",
    "job": "upi",
    "location": "/sp/sp-1",
    "batches": {"upi-counts": 4},
    "watermark_ms": {"upi-counts": 1700000000000},
    "size_bytes": 4096,
    "files": 12,
    "created_at": "2024-01-01T00:05:00Z",
    "format_version": 1,
    "kind": "stop-with-savepoint",
}

DOCUMENTS: list[tuple[Any, Mapping[str, Any]]] = [
    (JobStatus, LAUNCHED),
    (JobStatus, {**LAUNCHED, "state": "FAILED", "ended_at": "x", "queries": QUERIES}),
    (JobStatus, {**REGISTERED, "state": "FAILED", "failure": "query q failed: boom"}),
    (JobStatus, {**REGISTERED, "log_excerpt": "[upi] upi-counts batch 3 | rows 10"}),
    (JobStatus, REGISTERED),
    (JobStatus, {**REGISTERED, "written_by_another_version": [1, 2]}),
    (QueryHealth, {}),
    (QueryHealth, HEALTH),
    (QueryHealth, {"mirror_batch": None, "mirror_bytes_uploaded": 0}),
    (
        QueryHealth,
        {
            **HEALTH,
            "dead_letter_topic": "upi-payments-dlq",
            "dead_letters_in_topic": 7,
            "dead_letter_reasons": {"malformed JSON": 2, "missing field 'amount_paise'": 1},
            "dead_letter_samples": [
                {"reason": "x", "source_partition": "1", "source_offset": 5, "value": "{no"}
            ],
        },
    ),
    (QueryHealth, {"last_committed_batch": None, "checkpoint_age_s": None, "records": RECORDS}),
    (
        JobHealth,
        {"job": "upi", "pid": 42, "state": "RUNNING", "checked_at": 1.5, "queries": {"q": HEALTH}},
    ),
    (
        Launch,
        {
            "job": "upi",
            "pid": 42,
            "launched": True,
            "log_path": "/l",
            "command": ["srt", "run", "/jobs/upi.py"],
            "plan": "query upi-counts ...",
            "config_drift": [],
            "status": LAUNCHED,
        },
    ),
    (Wait, {"reached": False, "last_committed": {"upi-counts": None}, "status": REGISTERED}),
    (Stopped, {"job": "upi", "pid": 42, "signal": "endpoint", "status": REGISTERED}),
    (Killed, {"job": "upi", "pid": 42, "signal": "none", "note": None, "status": REGISTERED}),
    (StopReport, {"job": "upi", "pid": 42, "state": "STOPPED", "savepoint": SAVEPOINT}),
    (StopReport, {"job": "upi", "pid": 42, "state": "STOPPED", "savepoint": None}),
    (
        StopReport,
        {"job": "upi", "pid": 1, "state": "FAILED", "savepoint": None, "savepoint_error": "E: x"},
    ),
    (SavepointSummary, SAVEPOINT),
    (Disposed, {"disposed": [{"id": "sp-1", "location": "/sp/sp-1"}], "kept": ["sp-2"]}),
    (Disposed, {"disposed": [{"id": "sp-1", "location": "/sp/sp-1"}]}),
    (SinksAccepted, {"job": "j", "accepted": ["sink out of query q: accepted by me"]}),
    (
        StateCheck,
        {
            "job": "upi",
            "job_file": "/f",
            "location": "/ck",
            "compatible": True,
            "not_restored": ["operator x"],
        },
    ),
    (
        Upgrade,
        {
            "job": "upi",
            "job_file": "/f",
            "pid": 43,
            "command": ["srt", "run"],
            "log_path": "/l",
            "restored_from": "/sp/sp-1",
            "savepoint": SAVEPOINT,
            "parallelism": 3,
            "state_partitions": {"upi-counts": 3},
            "last_committed": {"upi-counts": 5},
            "committed": None,
            "not_restored": [],
            "status": REGISTERED,
        },
    ),
    (
        WindowCounts,
        {
            "job": "upi",
            "query": "upi-counts",
            "batch": None,
            "window_ms": 60000,
            "watermark_ms": None,
            "windows": {},
            "records": 0,
            "good": 0,
            "dead_letters": 0,
        },
    ),
    (
        WindowCounts,
        {
            "job": "upi",
            "query": "upi-counts",
            "batch": 4,
            "window_ms": 60000,
            "watermark_ms": 120000,
            "windows": {"0": 10, "60000": 7},
            "records": 20,
            "good": 17,
            "dead_letters": 3,
            "source": "payments",
            "topic": "upi-payments",
            "source_ends": {"0": 12, "1": 8},
            "dead_letter_topic": "upi-payments-dlq",
            "dead_letter_topic_records": None,
        },
    ),
    (
        Explain,
        {
            "job": "upi",
            "parallelism": 2,
            "checkpoint_dir": "/ck",
            "text": "...",
            "queries": [
                {
                    "name": "upi-counts",
                    "path": "native",
                    "reason": "built-in aggregates",
                    "output_mode": "update",
                    "steps": ["source payments", "window 1 min"],
                    "stateful_operators": ["upi-counts"],
                }
            ],
        },
    ),
    (
        AppendReport,
        {
            "topic": "upi-payments",
            "producer_id": "file-1-2-0-ab",
            "lines_read": 10,
            "appended": 6,
            "skipped": 3,
            "dead_lettered": 1,
            "refused": 1,
            "resume_line": 11,
            "complete": True,
            "end_offsets": {"0": 4, "1": 2},
        },
    ),
    (ErrorDocument, {"error": {"type": "UpgradeError", "message": "m", "stage": "check"}}),
]


@pytest.mark.parametrize(("kind", "document"), DOCUMENTS)
def test_every_document_reads_back_and_writes_the_same_json(kind: Any, document: Mapping):
    parsed = kind.from_json(document)
    assert parsed.to_json() == document
    assert kind.from_json(parsed.to_json()) == parsed


def test_a_status_reads_as_the_entry_recorded_it():
    status = JobStatus.from_json(REGISTERED)
    assert (status.state, status.entry_state) == ("DEAD", "RUNNING")
    assert status.last_committed == {"upi-counts": 4}
    health = status.query_health("upi-counts")
    assert health.batch is not None and health.batch.lag_records == 10
    assert health.records is not None and health.records.output == 95
    assert status.query_health("another") == QueryHealth()


def test_contract_needs_only_the_standard_library():
    tree = ast.parse(inspect.getsource(contract))
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert imported <= {"__future__", "collections", "dataclasses", "enum", "json", "typing"}


def _error_classes() -> set[type]:
    for package in (stateful_runtime, dbt_sink):
        for module in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            importlib.import_module(module.name)
    found, todo = set(), [StatefulRuntimeError]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__module__.split(".")[0] in ("stateful_runtime", "dbt_sink"):
                found.add(sub)
            todo.append(sub)
    return found | {StatefulRuntimeError}


def test_every_error_the_runtime_raises_has_its_kind():
    missing = sorted(
        c.__name__ for c in _error_classes() if ErrorKind.of(c.__name__) is ErrorKind.OTHER
    )
    assert not missing, f"add these to contract.ErrorKind: {missing}"


def test_an_error_document_carries_the_errors_public_fields():
    from stateful_runtime.runtime.control import UpgradeError

    exc = UpgradeError("no", stage="relaunch", savepoint_location="/sp/1", cause="JobError")
    document = ErrorDocument.of(exc)
    assert document.kind is ErrorKind.UPGRADE_ERROR
    assert document.to_json() == {
        "error": {
            "type": "UpgradeError",
            "message": "no",
            "stage": "relaunch",
            "savepoint_location": "/sp/1",
            "differences": [],
            "cause": "JobError",
        }
    }
    other = ErrorDocument.from_json({"error": {"type": "KeyError", "message": "x"}})
    assert other.kind is ErrorKind.OTHER and other.to_json()["error"]["type"] == "KeyError"


def test_an_error_is_read_from_the_last_error_line_of_stderr_and_a_crash_is_none():
    line = '{"error": {"type": "JobLockedError", "message": "held by pid 7", "pid": 7}}'
    found = ErrorDocument.from_stderr(f'WARN something\n{{"error": 1}}\n{line}\nTraceback\n')
    assert found is not None
    assert (found.kind, found.message, found.details) == (
        contract.ErrorKind.JOB_LOCKED_ERROR,
        "held by pid 7",
        {"pid": 7},
    )
    assert ErrorDocument.from_stderr("Traceback (most recent call last):\n  boom\n") is None
    assert ErrorDocument.from_stderr('{"error": not json}') is None
    crash = ErrorDocument.of_process("srt status", 1, "x" * 5000 + "\nSegfault\n")
    assert crash.kind is contract.ErrorKind.PROCESS_ERROR
    assert crash.message.startswith("srt status failed (exit status 1):\n")
    assert crash.message.endswith("Segfault") and len(crash.message) < 4100
    assert "exit status 2, no output" in ErrorDocument.of_process("srt run", 2, "").message
