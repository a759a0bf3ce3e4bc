"""Detached job processes: launch ``srt run`` in a session of its own, wait for it, kill it.

A streaming job outlives whatever started it (a Dagster run, a sensor tick, a shell), so the
launcher starts ``srt run`` as a new session leader (its pid is its process group id: one
``killpg`` reaches the driver, the JVM and the Python workers) with stdout and stderr appended
to ``$SRT_HOME/jobs/<job>.log`` (0600), next to the job's registry entry. The launch is
serialised per job by a lock file, so two launchers never start the same job twice; a job whose
entry is STARTING or RUNNING with a live pid is reused, not relaunched.

Secrets never reach the child's argv (``ps`` shows argv to every user): ``--set`` overrides
holding one travel in the child's environment (:func:`stateful_runtime.masking.child_env`).

Stop and savepoint go through the job's control endpoint while the process answers; a
signal is sent only to a process whose identity the registry verified (pid *and* start time),
or to what is left of its process group when a member still carries the run's id.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from stateful_runtime import masking
from stateful_runtime.checkpoints import savepoints
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.contract import (
    JobState,
    JobStatus,
    SavepointSummary,
    StopReport,
    StopSignal,
)
from stateful_runtime.exceptions import JobError
from stateful_runtime.names import check_name
from stateful_runtime.runtime import endpoint, registry

LIVE_STATES = ("STARTING", "RUNNING")
# Registry entries and checkpoints are plain files; polling them at this rate costs nothing.
POLL_S = 0.5
# Enough of a log to show a Python traceback or Spark's error, not the whole run.
TAIL_BYTES = 6000


@dataclass(frozen=True)
class Launch:
    """The outcome of :func:`ensure_running`.

    Attributes:
        job: job name (its registry key).
        pid: pid of the ``srt run`` process (also its process group id when launched here).
        launched: True if this call started the process, False if a live one was reused.
        log_path: the file the process writes its output to.
        command: the command line that was started (None when reused).
        entry: the registry entry as of the call.
    """

    job: str
    pid: int
    launched: bool
    log_path: Path
    command: list[str] | None = None
    entry: dict[str, Any] = field(default_factory=dict)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def log_path(job: str) -> Path:
    """Where a launched job's stdout and stderr go: next to its registry entry."""
    return registry.job_file(job, ".log")


def live(entry: dict[str, Any] | None) -> bool:
    """True if the entry's process is alive (the same process: pid and start time) and
    starting or running."""
    if not entry:
        return False
    return entry.get("state") in LIVE_STATES and registry.alive(entry)


def srt_command() -> list[str]:
    """The ``srt`` console script of this environment (``python -m`` when it is not installed)."""
    script = Path(sys.executable).with_name("srt")
    return [str(script)] if script.exists() else [sys.executable, "-m", "stateful_runtime.cli"]


def set_args(config: Mapping[str, Any]) -> list[str]:
    """``--set KEY=VALUE`` arguments for the overrides that hold no secret (the others go
    through the environment: :func:`masking.split_overrides`)."""
    public, _ = masking.split_overrides(config)
    return [arg for k, v in public.items() for arg in ("--set", f"{k}={v}")]


def tail(path: str | Path, max_bytes: int = TAIL_BYTES) -> str:
    """The end of a log file ('' if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def ensure_running(
    job: str,
    job_file: str | Path,
    config: Mapping[str, Any],
    *,
    cwd: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    master: str | None = None,
    from_savepoint: str | None = None,
    parallelism: int | None = None,
    extra_args: Sequence[str] = (),
) -> Launch:
    """Reuse the job's live process, or start ``srt run JOB_FILE --set ...`` detached.

    This is the one place that builds a launched job's ``srt run`` command line.

    Args:
        job: the job's name, as its job file names it (the registry key).
        job_file: path of the job file.
        config: ``--set`` overrides of the job file's DEFAULTS.
        cwd: working directory of the process (relative paths in the config resolve there).
        env: environment of the process (default: this process's); ``SRT_HOME`` is set to
            this registry's home.
        master: Spark master URL (default: the runner's, ``$SRT_SPARK_MASTER`` or local[*]).
        from_savepoint: start from this savepoint (id, directory or s3:// URL) instead of
            resuming the checkpoint (``--from-savepoint``).
        parallelism: state partitions (``--parallelism``); with ``from_savepoint`` it rescales.
        extra_args: more ``srt run`` arguments.
    """
    job = check_name("job", job)
    registry.ensure_home()
    log = log_path(job)
    with registry.private_file(registry.job_file(job, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        entry = registry.read(job)
        if entry is not None and live(entry):
            return Launch(job, int(entry["pid"]), False, log, None, entry)
        _, hidden = masking.split_overrides(config)
        command = [*srt_command(), "run", str(job_file), *set_args(config)]
        if master:
            command += ["--master", master]
        if from_savepoint:
            command += ["--from-savepoint", str(from_savepoint)]
        if parallelism is not None:
            command += ["--parallelism", str(int(parallelism))]
        command += list(extra_args)
        penv = dict(os.environ if env is None else env)
        penv["SRT_HOME"] = str(registry.home())
        penv.setdefault("PYTHONUNBUFFERED", "1")
        penv.pop(masking.ENV_VAR, None)
        penv.update(masking.child_env(hidden))
        run_id = uuid.uuid4().hex
        penv[registry.RUN_ID_ENV] = run_id
        shown = masking.mask_text(shlex.join(command))
        if hidden:
            shown += f"  (+ {', '.join(sorted(hidden))} from the environment)"
        with registry.private_file(log, "ab") as out:
            out.write(f"\n--- {_now()} launching: {shown}\n".encode())
            out.flush()
            proc = subprocess.Popen(
                command,
                cwd=cwd,
                env=penv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        # Reap the child when it exits, so a long-lived launcher (a sensor's process) keeps no
        # zombie; the process itself does not depend on this thread.
        threading.Thread(target=proc.wait, name=f"srt-reaper-{proc.pid}", daemon=True).start()
        # The runner needs > 1 s (imports) before it registers itself; until then this entry
        # says who is starting, so a concurrent launcher or `srt status` sees it.
        current = registry.read(job)
        if current is None or current.get("pid") != proc.pid:
            # Where the last run checkpointed stays visible (health checks, reconciliation)
            # even if this process dies before it registers its own queries.
            last = JobStatus.from_json(entry) if entry else JobStatus(job)
            current = JobStatus(
                job=job,
                state=JobState.STARTING,
                pid=proc.pid,
                pid_start=registry.process_start(proc.pid),
                run_id=run_id,
                job_file=str(job_file),
                config=dict(config),
                started_at=_now(),
                checkpoint_dir=last.checkpoint_dir,
                queries=last.queries,
                log_path=str(log),
            ).to_json()
            registry.write(job, current)
        return Launch(job, proc.pid, True, log, [masking.mask_text(c) for c in command], current)


def _failure(job: str, pid: int, what: str, entry: dict[str, Any] | None = None) -> JobError:
    """The job's end as its waiter reports it: the error its entry recorded with the state (a
    failed start writes it before it prints it: the log may not hold it yet), then the log."""
    log = log_path(job)
    error = (entry or {}).get("error") or {}
    why = f": {error['message']}" if isinstance(error, dict) and error.get("message") else ""
    return JobError(f"job {job!r} (pid {pid}) {what}{why}; its log {log} ends with:\n{tail(log)}")


def wait_until(
    job: str,
    pid: int,
    ready: Callable[[dict[str, Any]], bool],
    *,
    timeout: float,
    what: str,
    raise_on_timeout: bool = True,
) -> dict[str, Any] | None:
    """Poll the job's entry until ``ready(entry)``; raise if the process ends, and when time
    runs out raise (or return None with ``raise_on_timeout=False``)."""
    deadline = time.monotonic() + timeout
    while True:
        entry = registry.read(job) or {}
        if entry.get("pid") == pid:
            if ready(entry):
                return entry
            if entry.get("state") in ("FAILED", "FINISHED", "STOPPED"):
                raise _failure(job, pid, f"ended with state {entry['state']} before {what}", entry)
        if not registry.pid_alive(pid):
            if entry.get("pid") == pid and entry.get("state") == "STARTING":
                # It died before registering itself (bad config, missing topic): say so, or the
                # entry would claim STARTING forever.
                registry.update(job, state="FAILED", ended_at=_now())
            raise _failure(job, pid, f"exited before {what}")
        if time.monotonic() > deadline:
            if not raise_on_timeout:
                return None
            raise _failure(job, pid, f"is still alive but not {what} after {timeout:.0f} s")
        time.sleep(POLL_S)


def wait_running(job: str, pid: int, *, timeout: float) -> dict[str, Any]:
    """Wait until the process has started all its queries (state RUNNING)."""
    entry = wait_until(
        job, pid, lambda e: e.get("state") == "RUNNING", timeout=timeout, what="RUNNING"
    )
    assert entry is not None
    return entry


def last_committed(entry: dict[str, Any]) -> dict[str, int | None]:
    """Last committed batch of each of the entry's queries, read from the checkpoints."""
    return {
        q: QueryLayout(info["checkpoint_dir"]).last_committed()
        for q, info in (entry.get("queries") or {}).items()
    }


def wait_committed(
    job: str, pid: int, *, since: float, timeout: float
) -> dict[str, int | None] | None:
    """Wait until one of the job's queries commits a batch at or after ``since`` (epoch s);
    None if the job is still running but committed nothing in ``timeout`` (no input)."""

    def fresh(entry: dict[str, Any]) -> bool:
        times = [
            QueryLayout(info["checkpoint_dir"]).last_commit_time()
            for info in (entry.get("queries") or {}).values()
        ]
        return any(t is not None and t >= since for t in times)

    entry = wait_until(
        job, pid, fresh, timeout=timeout, what="committing a micro-batch", raise_on_timeout=False
    )
    return None if entry is None else last_committed(entry)


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pid``, or to ``pid`` alone if it leads no
    group. No identity check: callers use :func:`signal_job`."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def signal_job(entry: dict[str, Any], sig: int) -> bool:
    """Send ``sig`` to a job's process group (its driver, JVM and Python workers) only if it
    is the job's: the entry's pid is the process it recorded (same start time), or, once the
    driver is gone, a member of its group still carries the run's id (``SRT_RUN_ID``). A pid
    reused by an unrelated process is never signalled. True if a signal was sent."""
    pid = entry.get("pid")
    if not pid:
        return False
    pid = int(pid)
    if registry.verified(entry):
        signal_group(pid, sig)
        return True
    run_id = entry.get("run_id")
    if registry.pid_alive(pid) or not run_id:
        return False  # another process has the pid now, or nothing names the run
    if any(registry.carries_run(m, str(run_id)) for m in registry.group_members(pid)):
        # The group id stays taken while a member lives, so this group is the job's.
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return False
        return True
    return False


def not_the_job(entry: dict[str, Any]) -> str:
    """Why a live pid in the entry is not taken for the job's process."""
    pid = entry.get("pid")
    if entry.get("pid_start") is None:
        return (
            f"pid {pid} cannot be verified as the job's process (its entry records no "
            f"start time: written by an older srt); nothing was signalled — stop it "
            f"yourself if it is the job"
        )
    return (
        f"pid {pid} is now another process (it started at {registry.process_start(pid)}, "
        f"the job's at {entry.get('pid_start')} clock ticks after boot): the job is gone "
        f"and its entry is stale; nothing was signalled"
    )


def terminate(entry: dict[str, Any], *, grace: float) -> str:
    """Stop a job process: SIGTERM (a clean stop, like ``srt stop``), then after ``grace``
    seconds SIGKILL to its whole process group; only if the entry's process is verified.
    Returns the signal that ended it ("none" if it was not the job's or already gone)."""
    if not signal_job(entry, signal.SIGTERM):
        return "none"
    pid = int(entry["pid"])
    deadline = time.monotonic() + grace
    while registry.alive(entry) and time.monotonic() < deadline:
        time.sleep(0.2)
    if not registry.alive(entry):
        # The JVM and Python workers end with the driver; SIGKILL whatever is left of them.
        signal_job(entry, signal.SIGKILL)
        return "SIGTERM"
    signal_group(pid, signal.SIGKILL)  # verified above; the same process is still there
    deadline = time.monotonic() + 30
    while registry.alive(entry) and time.monotonic() < deadline:
        time.sleep(0.1)
    return "SIGKILL"


@dataclass(frozen=True)
class StopOutcome:
    """How :func:`stop` stopped a job.

    Attributes:
        signal: through its control endpoint, or SIGTERM (it did not answer).
        savepoint: the stop-with-savepoint taken, if one was asked for.
    """

    signal: StopSignal
    savepoint: SavepointSummary | None = None


def stop(
    job: str, *, timeout: float, savepoint: bool = False, target: str | None = None
) -> tuple[dict[str, Any], StopOutcome]:
    """Stop a running job cleanly (the batch in flight commits, queries stop, sinks close) and
    wait for its process to exit. Through its control endpoint (``POST /stop``, with a
    savepoint of the final batch if asked) while it answers; else SIGTERM, only to a
    verified process. Returns its final registry entry and how it stopped."""
    entry = registry.require(job)
    if entry.get("state") not in LIVE_STATES or not registry.pid_alive(entry.get("pid")):
        raise JobError(f"job {job!r} is not running (state {entry.get('state')})")
    if not registry.verified(entry):
        raise JobError(f"job {job!r} is not running: {not_the_job(entry)}")
    outcome = StopOutcome(StopSignal.ENDPOINT)
    error = None
    try:
        answer = endpoint.call(
            entry,
            "POST",
            "/stop",
            {"savepoint": savepoint, "target": target, "timeout": timeout},
            timeout=timeout + 30,
        )
        report = StopReport.from_json(answer)
        outcome, error = StopOutcome(StopSignal.ENDPOINT, report.savepoint), report.savepoint_error
    except endpoint.EndpointUnavailable:
        # Starting (no endpoint yet) or not answering: the signal does the same, with the
        # savepoint taken from the files once the process is gone.
        signal_job(entry, signal.SIGTERM)
        outcome = StopOutcome(StopSignal.SIGTERM)
    if not endpoint.wait_gone(entry, timeout):
        raise JobError(
            f"job {job!r} (pid {entry['pid']}) did not stop within {timeout} s; "
            f"check it, or kill it: it restarts from its last checkpoint"
        )
    if savepoint and outcome.signal is StopSignal.SIGTERM:
        taken = _savepoint_from_files(job, target, "stop-with-savepoint")
        outcome = StopOutcome(StopSignal.SIGTERM, taken)
    if error:
        raise JobError(
            f"job {job!r} stopped, but its savepoint failed: {error}; its state is in its "
            f"checkpoint (`srt savepoint create {job}` takes one from it)"
        )
    return registry.require(job), outcome


def _savepoint_from_files(job: str, target: str | None, kind: str) -> SavepointSummary:
    entry = registry.require(job)
    root = target or entry.get("savepoint_dir") or str(registry.home() / "savepoints")
    sp = savepoints.create(entry["checkpoint_dir"], root, kind=kind)
    summary = SavepointSummary.from_json(sp.summary())
    registry.update(job, last_savepoint=summary.ref().to_json())
    return summary


# ``savepoint``'s ``stop`` flag shadows the function inside it.
_stop_job = stop


def savepoint(
    job: str, *, target: str | None = None, stop: bool = False, timeout: float = 120.0
) -> SavepointSummary:
    """Savepoint of a job known to the registry (running or not): its summary. A running job
    takes it itself (``POST /savepoint`` to its endpoint); with ``stop``, stop-with-savepoint
    (the batch in flight commits, then the final batch is saved). A job that is not running
    (or does not answer) is saved from its checkpoint files. The registry entry records it as
    ``last_savepoint``."""
    entry = registry.require(job)
    if stop:
        _, outcome = _stop_job(job, timeout=timeout, savepoint=True, target=target)
        assert outcome.savepoint is not None  # asked for; a failure raised
        return outcome.savepoint
    if registry.running(entry):
        try:
            answer = endpoint.call(entry, "POST", "/savepoint", {"target": target}, timeout=timeout)
            return SavepointSummary.from_json(answer)
        except endpoint.EndpointUnavailable:
            pass
    return _savepoint_from_files(job, target, "savepoint")
