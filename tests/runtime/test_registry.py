"""The job registry under attack, with real processes and the real `srt` (no Spark): damaged
entries are named and do not hide the others, names never leave the registry, file modes, and
a pid reused by an unrelated process is never signalled (by `srt stop`, `srt stop --kill` or
Dagster's kill path)."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from stateful_runtime.runtime import registry
from tests.helpers import poll, srt


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("SRT_HOME", str(home))
    return home


def _srt(home: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return srt(["--home", str(home), *args], env, timeout=120)


def _error(out: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert out.returncode == 2, out.stderr
    return json.loads(out.stderr.strip().splitlines()[-1])["error"]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# An unrelated process that writes down every catchable signal it gets (SIGKILL ends it).
_SIGNAL_LOG = """
import signal, sys, time
log = open(sys.argv[1], "a", buffering=1)
def note(signum, frame):
    log.write(signal.Signals(signum).name + "\\n")
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGRTMIN):
    signal.signal(s, note)
log.write("ready\\n")
while True:
    time.sleep(60)
"""


@pytest.fixture
def sleeper(tmp_path: Path) -> Iterator[subprocess.Popen]:
    """An unrelated process whose pid a registry entry will claim; it notes the signals it
    gets in ``sleeper.signals`` (a file)."""
    import sys

    signals = tmp_path / "signals"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_LOG, str(signals)], start_new_session=True
    )
    proc.signals = signals  # type: ignore[attr-defined]
    try:
        poll(lambda: signals.exists() and "ready" in signals.read_text(), 30, "the sleeper")
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _never_signalled(proc: subprocess.Popen) -> None:
    """``proc`` got no signal: alive, and a marker sent now arrives alone. The marker is a
    real-time signal, numbered above every other it notes, and Python runs pending handlers
    in signal order: one sent before it would be noted first. SIGKILL would have ended it."""
    assert proc.poll() is None
    os.kill(proc.pid, signal.SIGRTMIN)
    got = poll(
        lambda: "SIGRTMIN" in (t := proc.signals.read_text()) and t,  # type: ignore[attr-defined]
        30,
        "the marker signal",
    )
    assert got.split() == ["ready", "SIGRTMIN"], got


def test_home_is_private_and_entries_mask_secrets(home: Path):
    registry.write(
        "job-a",
        {
            "job": "job-a",
            "config": {
                "kafka.sasl.password": "reg-secret-1",
                "sink.dsn": "postgresql://u:reg-secret-2@h/db",
            },
        },
    )
    entry = home / "jobs" / "job-a.json"
    assert (_mode(home), _mode(home / "jobs"), _mode(entry)) == (0o700, 0o700, 0o600)
    text = entry.read_text()
    assert "reg-secret-1" not in text and "reg-secret-2" not in text
    assert "postgresql://u:***@h/db" in text
    # An existing home of ours that others could read is tightened on the next write.
    os.chmod(home, 0o755)
    registry.update("job-a", state="STOPPED")
    assert _mode(home) == 0o700


def test_concurrent_writers_of_one_entry_never_collide(home: Path):
    """A Dagster run and its sensor (two threads of one process) update one entry at once: every
    write lands whole, none fails on another's temporary file."""

    def write_many(n: int) -> None:
        for i in range(200):
            registry.update("job-a", writer=n, i=i)

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write_many, range(4)))
    assert registry.read("job-a")["i"] == 199
    assert [p.name for p in (home / "jobs").iterdir()] == ["job-a.json"]


def test_a_damaged_entry_is_named_and_the_others_keep_working(home: Path, srt_env: dict[str, str]):
    registry.write("good-job", {"job": "good-job", "state": "STOPPED", "pid": None})
    bad = home / "jobs" / "bad-job.json"
    bad.write_text('{"job": "bad-job", "state": "RUNN')  # truncated mid-write by something
    (home / "jobs" / "wrong.json").write_text('{"job": "someone-else"}')

    human = _srt(home, srt_env, "status")
    assert human.returncode == 0, human.stderr
    assert "good-job: STOPPED" in human.stdout
    assert str(bad) in human.stderr and "not valid JSON" in human.stderr
    assert f"Remove {bad} once job 'bad-job' is stopped" in human.stderr
    assert "names job 'someone-else', not 'wrong'" in human.stderr

    listed = _srt(home, srt_env, "status", "--json")
    assert [e["job"] for e in json.loads(listed.stdout)] == ["good-job"]

    err = _error(_srt(home, srt_env, "status", "bad-job", "--json"))
    assert err["type"] == "CorruptEntryError" and err["path"] == str(bad)
    assert "truncated?" in err["problem"]
    err = _error(_srt(home, srt_env, "stop", "bad-job", "--json"))
    assert err["type"] == "CorruptEntryError"
    assert bad.read_text() == '{"job": "bad-job", "state": "RUNN'  # left for the user


def test_names_never_leave_the_registry(home: Path, tmp_path: Path, srt_env: dict[str, str]):
    # A file that looks like an entry, outside the registry.
    (tmp_path / "x.json").write_text(json.dumps({"job": "x", "state": "RUNNING", "pid": 1}))
    for args in (
        ["stop", "../x"],
        ["stop", "../../x", "--kill"],
        ["status", "../x"],
        ["savepoint", "create", "../x"],
        ["wait", "/etc/passwd"],
        ["launch", "examples/upi_per_minute.py", "--job", "../x"],
    ):
        err = _error(_srt(home, srt_env, *args, "--json"))
        assert err["type"] == "InvalidNameError", args
    from stateful_runtime.names import InvalidNameError

    with pytest.raises(InvalidNameError):
        registry.read("../x")


def _entry(job: str, pid: int, **more: Any) -> None:
    registry.write(
        job,
        {
            "job": job,
            "state": "RUNNING",
            "pid": pid,
            "run_id": "run-1",
            "control": {"port": 9, "url": "http://127.0.0.1:9"},
            **more,
        },
    )


def test_a_reused_pid_is_never_signalled(
    home: Path, srt_env: dict[str, str], sleeper: subprocess.Popen
):
    from dagster_defs import StreamingRuntime
    from dagster_defs.errors import SrtCommandError

    pid = sleeper.pid
    real_start = registry.process_start(pid)
    assert real_start is not None
    _entry("reused", pid, pid_start=real_start - 1)  # the job's process started earlier

    [status] = json.loads(_srt(home, srt_env, "status", "reused", "--json").stdout)
    assert (status["state"], status["alive"], status["live"]) == ("DEAD", False, False)

    err = _error(_srt(home, srt_env, "stop", "reused", "--json"))
    assert err["type"] == "JobError" and "nothing was signalled" in err["message"]
    killed = json.loads(
        _srt(
            home, srt_env, "stop", "reused", "--kill", "--pid", str(pid), "--timeout", "1", "--json"
        ).stdout
    )
    assert killed["signal"] == "none" and "is now another process" in killed["note"]
    err = _error(_srt(home, srt_env, "savepoint", "create", "reused", "--stop", "--json"))
    assert "nothing was signalled" in err["message"]

    # Dagster's kill path (the health sensor restarts a dead job through it).
    runtime = StreamingRuntime(home=str(home))
    ended = runtime.kill("reused", pid=pid, grace=1)
    assert ended.signal == "none" and ended.status.alive is False
    with pytest.raises(SrtCommandError):
        runtime.stop("reused", timeout=5)

    _never_signalled(sleeper)  # the unrelated process lives on


def test_an_entry_without_a_start_time_is_not_signalled(
    home: Path, srt_env: dict[str, str], sleeper: subprocess.Popen
):
    _entry("legacy", sleeper.pid)  # written by an older srt: no pid_start
    err = _error(_srt(home, srt_env, "stop", "legacy", "--json"))
    assert "cannot be verified" in err["message"]
    killed = json.loads(
        _srt(home, srt_env, "stop", "legacy", "--kill", "--timeout", "1", "--json").stdout
    )
    assert killed["signal"] == "none"
    _never_signalled(sleeper)


def _orphaned_group(run_id: str) -> tuple[int, int]:
    """A process group whose leader exited, leaving a `sleep` (like a job's JVM after its
    driver died); its group id and the sleep's pid."""
    env = {**os.environ, registry.RUN_ID_ENV: run_id}
    leader = subprocess.Popen(
        ["bash", "-c", "sleep 600 & echo $!"],
        stdout=subprocess.PIPE,
        env=env,
        start_new_session=True,
        text=True,
    )
    child = int(leader.stdout.readline())  # type: ignore[union-attr]
    leader.wait()
    return leader.pid, child


def _alive(pid: int) -> bool:
    return registry.pid_alive(pid)


def test_kill_reaps_only_the_jobs_own_leftovers(home: Path, srt_env: dict[str, str]):
    ours_group, ours = _orphaned_group("run-1")
    theirs_group, theirs = _orphaned_group("someone-else")
    try:
        _entry("left", ours_group, pid_start=1)
        _entry("foreign", theirs_group, pid_start=1)
        out = json.loads(_srt(home, srt_env, "stop", "left", "--kill", "--json").stdout)
        assert out["signal"] == "none" and "left of its process group" in out["note"]
        deadline = time.monotonic() + 30
        while _alive(ours) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(ours)
        out = json.loads(_srt(home, srt_env, "stop", "foreign", "--kill", "--json").stdout)
        assert out["signal"] == "none" and out["note"] is None
        assert _alive(theirs)
    finally:
        for pid in (ours, theirs):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
