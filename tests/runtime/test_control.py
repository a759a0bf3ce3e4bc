"""The control commands Dagster drives, run as the real `srt` with `--json`: launch, wait,
status, reconcile, savepoint check/prune, upgrade (rescale, refusal, from a savepoint), stop and
kill, and the JSON errors a program reads. Every document printed reads back into its class of
stateful_runtime.contract and writes the same JSON (what Dagster parses is what srt wrote).

The tests share one job in a registry of their own (`srt --home`, not $SRT_HOME) and run in file
order; the module fixture kills whatever is left of it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC
from pathlib import Path
from typing import Any

import duckdb
import pytest
from upi_events import events, oracle

from stateful_runtime import contract
from tests.helpers import EXAMPLES, UpiWorkspace, append_lines, poll, read_topic, srt

pytestmark = pytest.mark.slow

JOB = "upi-per-minute"
UPI = EXAMPLES / "upi_per_minute.py"
WINDOW_MS = 60_000
# 40 events per second of event time: 4,000 span 100 s, so the watermark (newest - 5 s) closes
# the two first 1-minute windows; every 499th line is malformed (8 dead letters).
LINES = list(events(4_000, merchants=8, rate_per_s=40, disorder_ms=3_000, bad_every=499, seed=11))


def _document(args: tuple[str, ...]) -> Any:
    """The contract class of what ``srt ARGS --json`` prints (a list of them for status)."""
    command = args[0] if args[0] != "savepoint" else f"savepoint {args[1]}"
    if command == "stop":
        return contract.Killed if "--kill" in args else contract.Stopped
    return {
        "launch": contract.Launch,
        "wait": contract.Wait,
        "upgrade": contract.Upgrade,
        "reconcile": contract.WindowCounts,
        "savepoint create": contract.SavepointSummary,
        "savepoint check": contract.StateCheck,
        "savepoint prune": contract.Disposed,
        "savepoint dispose": contract.Disposed,
    }.get(command)


def _reads_back(args: tuple[str, ...], data: Any) -> None:
    if args[0] == "status":
        assert [contract.JobStatus.from_json(d).to_json() for d in data] == data
    elif (kind := _document(args)) is not None:
        assert kind.from_json(data).to_json() == data


@dataclass
class Cli:
    home: Path
    ws: UpiWorkspace
    env: dict[str, str]

    def sets(self, **more: Any) -> list[str]:
        values = {"checkpoint.interval_s": 1.0, "parallelism": 2, **more}
        return [*self.ws.sets(), *(a for k, v in values.items() for a in ("--set", f"{k}={v}"))]

    def run(self, *args: str, timeout: float = 600) -> tuple[int, Any, str]:
        """``srt --home HOME ARGS --json``: exit status, the parsed stdout, stderr."""
        out = srt(["--home", str(self.home), *args, "--json"], self.env, timeout=timeout)
        data = json.loads(out.stdout) if out.returncode == 0 else None
        return out.returncode, data, out.stderr

    def ok(self, *args: str, timeout: float = 600) -> Any:
        code, data, err = self.run(*args, timeout=timeout)
        assert code == 0, err[-4000:]
        _reads_back(args, data)
        return data

    def error(self, *args: str) -> dict[str, Any]:
        """The JSON error of a command that must fail (exit 2, one line on stderr)."""
        code, _, err = self.run(*args)
        assert code == 2, err[-4000:]
        document = json.loads(err.strip().splitlines()[-1])
        assert contract.ErrorDocument.from_json(document).to_json() == document
        return document["error"]

    def status(self) -> dict[str, Any]:
        [status] = self.ok("status", JOB)
        return status


def _job_file(path: Path, old: str, new: str) -> Path:
    text = UPI.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


@pytest.fixture(scope="module")
def cli(tmp_path_factory: pytest.TempPathFactory, srt_env: dict[str, str]) -> Iterator[Cli]:
    root = tmp_path_factory.mktemp("cli-control")
    ws = UpiWorkspace(root, partitions=2)
    from stateful_runtime.connectors.eventlog import EventLog

    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    append_lines(ws.log_dir, LINES)
    state = Cli(root / "home", ws, dict(srt_env))
    try:
        yield state
    finally:
        entry = state.home / "jobs" / f"{JOB}.json"
        if entry.exists():
            pid = json.loads(entry.read_text()).get("pid")
            if pid:
                try:
                    os.killpg(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_launch_refuses_a_file_that_builds_another_job(cli: Cli):
    err = cli.error("launch", str(UPI), *cli.sets(), "--job", "other-job")
    assert err["type"] == "ConfigError"
    assert f"builds job '{JOB}', not 'other-job'" in err["message"]
    assert cli.ok("status", JOB) == []  # nothing was registered, nothing started
    assert cli.ok("status") == []


def test_launch_wait_and_status_as_json(cli: Cli):
    since = time.time()
    launched = cli.ok("launch", str(UPI), *cli.sets(), "--job", JOB)
    pid = launched["pid"]
    assert launched["launched"] is True and launched["job"] == JOB
    assert os.getpgid(pid) == pid  # detached: its own session and process group
    assert "path: native" in launched["plan"]
    assert launched["command"][1:3] == ["run", str(UPI)]
    assert Path(launched["log_path"]) == cli.home / "jobs" / f"{JOB}.log"
    assert launched["status"]["registered_state"] == "STARTING"

    running = cli.ok("wait", JOB, "--until", "running", "--pid", str(pid), "--timeout", "240")
    assert running["reached"] and running["status"]["state"] == "RUNNING"
    committed = cli.ok("wait", JOB, "--until", "commit", "--since", repr(since), "--timeout", "240")
    assert committed["reached"] and committed["last_committed"]["upi-counts"] >= 0

    status = cli.status()
    assert (status["registered_state"], status["alive"], status["live"]) == ("RUNNING", True, True)
    query = status["queries"]["upi-counts"]
    assert query["checkpoint_dir"] == str(cli.ws.checkpoint_dir / "upi-counts")
    assert query["last_committed_batch"] >= 0 and query["state_partitions"] == 2
    assert query["checkpoint_age_s"] >= 0 and query["last_commit_time"] <= time.time()

    # A second launch reuses the live process and names what it runs differently.
    again = cli.ok("launch", str(UPI), *cli.sets(**{"checkpoint.interval_s": 2.0}), "--job", JOB)
    assert (again["launched"], again["pid"], again["command"]) == (False, pid, None)
    assert again["config_drift"] == ["checkpoint.interval_s"]


def test_reconcile_counts_the_good_records_of_closed_windows(cli: Cli):
    # Spark writes a batch's watermark before running it: the batch after the one that read
    # everything carries the watermark that closes the windows.
    def caught_up() -> dict[str, Any] | None:
        out = cli.ok("reconcile", JOB, "--query", "upi-counts", "--window", "1m")
        return out if out["records"] == len(LINES) and len(out["windows"]) >= 2 else None

    counts = poll(caught_up, 240, "a committed batch closing two windows over every record")
    assert counts["batch"] >= 0 and counts["window_ms"] == WINDOW_MS
    watermark = counts["watermark_ms"]
    per_window: Counter[int] = Counter()
    for (_, start), (payments, _) in oracle(LINES).items():  # naive UTC window starts
        start_ms = int(start.replace(tzinfo=UTC).timestamp() * 1000)
        if start_ms + WINDOW_MS <= watermark:
            per_window[start_ms] += payments
    assert len(per_window) >= 2
    assert {int(w): n for w, n in counts["windows"].items()} == dict(per_window)
    assert counts["dead_letters"] == 8 and counts["good"] == len(LINES) - 8
    assert sum(counts["source_ends"].values()) == len(LINES)

    # The sink table's closed windows (as of the same batch: it is the last one) agree.
    con = duckdb.connect(str(cli.ws.database), read_only=True)
    try:
        rows = con.execute(
            "SELECT epoch_ms(window_start), sum(payments) FROM upi_counts "
            "WHERE epoch_ms(window_end) <= ? GROUP BY 1",
            [watermark],
        ).fetchall()
    finally:
        con.close()
    assert {int(w): int(n) for w, n in rows} == dict(per_window)

    err = cli.error("reconcile", JOB, "--query", "nope", "--window", "1m")
    assert err["type"] == "JobError" and "no query 'nope'" in err["message"]


def test_savepoint_check_and_prune_as_json(cli: Cli, tmp_path: Path):
    fits = cli.ok("savepoint", "check", str(UPI), *cli.sets())
    assert fits["compatible"] is True and fits["location"] == str(cli.ws.checkpoint_dir)
    rekeyed = _job_file(
        tmp_path / "rekeyed.py", 'payments.key_by("merchant_id")', 'payments.key_by("txn_id")'
    )
    err = cli.error("savepoint", "check", str(rekeyed), *cli.sets())
    assert err["type"] == "IncompatibleSavepointError"
    assert any("txn_id" in d for d in err["differences"])

    first = cli.ok("savepoint", "create", JOB)
    second = cli.ok("savepoint", "create", JOB)
    assert first["kind"] == second["kind"] == "savepoint"
    pruned = cli.ok("savepoint", "prune", JOB, "--keep", "1")
    assert pruned == {
        "disposed": [{"id": first["id"], "location": first["location"]}],
        "kept": [second["id"]],
    }
    assert not Path(first["location"]).exists()


def test_upgrade_refuses_code_that_cannot_take_the_state(cli: Cli, tmp_path: Path):
    pid = cli.status()["pid"]
    rekeyed = _job_file(
        tmp_path / "rekeyed.py", 'payments.key_by("merchant_id")', 'payments.key_by("txn_id")'
    )
    err = cli.error("upgrade", JOB, str(rekeyed), *cli.sets())
    assert (err["type"], err["stage"], err["cause"]) == (
        "UpgradeError",
        "check",
        "IncompatibleSavepointError",
    )
    assert "the running job was left alone" in err["message"]
    assert any("keyed by" in d and "txn_id" in d for d in err["differences"])
    err = cli.error("upgrade", JOB, str(UPI), *cli.sets(), "--from-savepoint", "whatever")
    assert err["stage"] == "check" and "leave --from-savepoint out" in err["message"]
    status = cli.status()
    assert (status["pid"], status["state"]) == (pid, "RUNNING")


def test_upgrade_rescales_through_a_stop_with_savepoint(cli: Cli):
    old = cli.status()
    done = cli.ok(
        "upgrade",
        JOB,
        str(UPI),
        *cli.sets(),
        "--parallelism",
        "3",
        "--timeout",
        "240",
        "--commit-timeout",
        "240",
    )
    assert done["pid"] != old["pid"]
    assert subprocess.run(["kill", "-0", str(old["pid"])], capture_output=True).returncode != 0
    sp = done["savepoint"]
    assert sp["kind"] == "stop-with-savepoint" and done["restored_from"] == sp["location"]
    assert sp["batches"]["upi-counts"] >= old["queries"]["upi-counts"]["last_committed_batch"]
    assert (done["parallelism"], done["state_partitions"]) == (3, {"upi-counts": 3})
    assert done["committed"] is True and done["not_restored"] == []
    assert "--parallelism" in done["command"] and "--from-savepoint" in done["command"]
    status = done["status"]
    assert status["state"] == "RUNNING" and status["restored_from"] == sp["location"]


def test_stop_kill_and_an_upgrade_from_a_savepoint(cli: Cli, tmp_path: Path):
    running = cli.status()
    err = cli.error("stop", JOB, "--kill", "--pid", "1")
    assert err["type"] == "JobError" and "left alone" in err["message"]

    stopped = cli.ok("stop", JOB, "--timeout", "120")  # asked through its control endpoint
    assert (stopped["pid"], stopped["signal"]) == (running["pid"], "endpoint")
    assert stopped["status"]["registered_state"] == "STOPPED"
    assert stopped["status"]["alive"] is False
    # Its process is gone: --kill only reaps what may be left of its group.
    gone = cli.ok("stop", JOB, "--kill", "--pid", str(running["pid"]))
    assert gone["signal"] == "none"

    last = cli.ok("savepoint", "create", JOB)  # of the stopped job's final batch
    err = cli.error("upgrade", JOB, str(UPI), *cli.sets())
    assert err["stage"] == "check" and "not running (STOPPED)" in err["message"]

    v2 = _job_file(tmp_path / "upi_v2.py", "LIMIT 10", "LIMIT 5")
    done = cli.ok(
        "upgrade", JOB, str(v2), *cli.sets(), "--from-savepoint", last["id"], "--timeout", "240"
    )
    assert done["savepoint"] is None and done["restored_from"] == last["location"]
    assert done["job_file"] == str(v2) and done["committed"] is None
    assert done["parallelism"] == 3  # the rescale sticks
    status = cli.status()
    assert (status["state"], status["job_file"], status["pid"]) == ("RUNNING", str(v2), done["pid"])

    killed = cli.ok("stop", JOB, "--kill", "--pid", str(done["pid"]), "--timeout", "60")
    assert killed["signal"] in ("SIGTERM", "SIGKILL")
    assert killed["status"]["alive"] is False


def test_a_dead_or_failed_jobs_status_says_what_it_said_last(srt_home: Path, tmp_path: Path):
    """A job that ended without being asked to carries its log's last lines (secrets masked)
    and, when it recorded one, its failure: what Dagster's health check and alert show."""
    from stateful_runtime.runtime import control, registry

    gone = subprocess.Popen(["true"])
    gone.wait()
    log = tmp_path / "crashed.log"
    lines = [f"[crashed] line {i}" for i in range(100)]
    log.write_text("\n".join([*lines, "connecting to postgresql://app:hunter2@db/x"]) + "\n")
    entry = {"job": "crashed", "state": "RUNNING", "pid": gone.pid, "log_path": str(log)}
    registry.write("crashed", entry)
    [dead] = control.statuses("crashed")
    assert dead.state == "DEAD" and dead.log_excerpt is not None
    excerpt = dead.log_excerpt.splitlines()
    assert len(excerpt) == control.EXCERPT_LINES and excerpt[0] == lines[-39]
    assert "hunter2" not in dead.log_excerpt and "postgresql://app:***@db/x" in excerpt[-1]

    registry.write("crashed", {**entry, "state": "FAILED", "failure": "query q failed: boom"})
    [failed] = control.statuses("crashed")
    assert (failed.failure, failed.log_excerpt) == ("query q failed: boom", dead.log_excerpt)

    registry.write("crashed", {**entry, "state": "STOPPED", "stopped_by": "endpoint"})
    [stopped] = control.statuses("crashed")
    assert stopped.log_excerpt is None  # stopped on purpose: nothing to explain
    registry.job_file("crashed", ".json").unlink()


def test_launch_skip_is_given_to_the_launched_run_and_a_wrong_one_refused_first(
    tmp_path: Path, srt_env: dict[str, str]
):
    """``srt launch --skip SOURCE:PARTITION:OFFSET`` is ``srt run --skip`` in the launched
    process: the record goes to the dead-letter topic with step "skip" (once), the rest is
    counted; a skip naming no source of the job is refused before anything starts."""
    from stateful_runtime.connectors.eventlog import EventLog

    ws = UpiWorkspace(tmp_path, partitions=1)
    EventLog(ws.log_dir).create_topic("upi-payments", 1)
    lines = list(events(400, merchants=4, rate_per_s=40, disorder_ms=1_000, seed=5))
    append_lines(ws.log_dir, lines)
    home = tmp_path / "home"
    base = ["--home", str(home), "launch", str(UPI), *ws.sets(), "--json"]
    wrong = srt([*base, "--skip", "payments:0:3"], srt_env)
    assert wrong.returncode == 2, wrong.stderr[-3000:]
    error = json.loads(wrong.stderr.strip().splitlines()[-1])["error"]
    assert error["type"] == "ConfigError" and "its sources: upi-source" in error["message"]
    assert not (home / "jobs" / f"{JOB}.json").exists()  # nothing was started

    launched = srt([*base, "--skip", "upi-source:0:3"], srt_env)
    assert launched.returncode == 0, launched.stderr[-3000:]
    doc = json.loads(launched.stdout)
    assert doc["command"][-2:] == ["--skip", "upi-source:0:3"]
    try:

        def skipped() -> list:
            return read_topic(ws.log_dir, "upi-payments-dlq")

        [letter] = poll(skipped, timeout=300, what="the skipped record in the dead-letter topic")
        assert letter.headers["step"] == "skip" and str(letter.headers["source.offset"]) == "3"
        assert json.loads(letter.value)["txn_id"] == json.loads(lines[3])["txn_id"]
    finally:
        stop = srt(["--home", str(home), "stop", JOB, "--timeout", "120"], srt_env)
        assert stop.returncode == 0, stop.stderr[-3000:]
