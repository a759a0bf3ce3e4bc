"""The job registry: one JSON file per job under ``$SRT_HOME/jobs`` (default ``~/.srt``).

``srt run`` registers its process there and keeps the entry's health fresh; ``srt status``,
``srt stop`` and the Dagster plugin read it. Files are replaced atomically, so a reader never
sees half an entry; a file damaged by something else (truncated, edited) is named by
:class:`CorruptEntryError` with what to do, and the other jobs keep working.

* Job names are :class:`~stateful_runtime.names.Name` s, so a read or write never leaves the
  registry directory (``srt stop ../../x`` is refused).
* ``$SRT_HOME`` and ``jobs/`` are 0700, every file in them 0600 (entries hold configs, logs
  hold output, token files the control endpoint's bearer token). Config secrets are masked
  before an entry is written (:func:`stateful_runtime.masking.mask_config`).
* An entry records its process's identity: ``pid``, ``pid_start`` (the start time in
  ``/proc/<pid>/stat``) and ``run_id`` (also in the environment of the process and of
  everything it starts, ``SRT_RUN_ID``). A pid reused by an unrelated process is never taken
  for the job (:func:`alive`, :func:`verified`), so it is never signalled.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

from stateful_runtime import masking
from stateful_runtime._process import pid_alive
from stateful_runtime.exceptions import JobError
from stateful_runtime.names import Name, check_name, contained

__all__ = [
    "CorruptEntryError",
    "alive",
    "entries",
    "home",
    "jobs_dir",
    "pid_alive",
    "process_start",
    "read",
    "require",
    "scan",
    "update",
    "verified",
    "write",
]

# Environment variable naming a job run: inherited by the JVM and Python workers, so what is
# left of a job's process group can be told from an unrelated process.
RUN_ID_ENV = "SRT_RUN_ID"


class CorruptEntryError(JobError):
    """A registry entry that cannot be read (truncated, not JSON, not an entry).

    Attributes:
        path: the entry's file.
        problem: what is wrong with it.
    """

    def __init__(self, path: Path, problem: str) -> None:
        self.path, self.problem = str(path), problem
        job = path.stem
        super().__init__(
            f"registry entry {path} is unreadable: {problem}. It was damaged or written by "
            f"something else; the other jobs are not affected (`srt status` lists them). "
            f"Remove {path} once job {job!r} is stopped (a process of it still running shows "
            f"in `ps`); its next run or launch registers it afresh."
        )


def home() -> Path:
    return Path(os.environ.get("SRT_HOME") or Path.home() / ".srt")


def jobs_dir() -> Path:
    return home() / "jobs"


def _private_dir(path: Path) -> None:
    """Create ``path`` (0700) or tighten an existing one of ours to 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) != 0o700:
        os.chmod(path, 0o700)


def ensure_home() -> Path:
    """``$SRT_HOME/jobs``, created (or tightened) 0700 with its parent."""
    _private_dir(home())
    _private_dir(jobs_dir())
    return jobs_dir()


def private_file(path: Path, mode: str = "ab") -> Any:
    """Open ``path`` for writing, created 0600 (an existing file of ours is tightened)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if "a" in mode else os.O_TRUNC)
    fd = os.open(path, flags, 0o600)
    if stat.S_IMODE(os.fstat(fd).st_mode) != 0o600:
        os.fchmod(fd, 0o600)
    return os.fdopen(fd, mode)


def job_file(job: str, suffix: str) -> Path:
    """``$SRT_HOME/jobs/<job><suffix>`` for a validated job name; never outside ``jobs/``."""
    name = check_name("job", job)
    return contained(jobs_dir(), f"{name}{suffix}", where="the job registry")


def _path(job: str) -> Path:
    return job_file(job, ".json")


def write(job: str, entry: dict[str, Any]) -> None:
    """Replace ``job``'s entry (atomically, 0600; config secrets masked)."""
    if isinstance(entry.get("config"), dict):
        entry = {**entry, "config": masking.mask_config(entry["config"])}
    path = _path(job)
    ensure_home()
    # One temporary file per writer (mkstemp: unique, 0600): two threads of one process (a
    # Dagster run and its sensor) may write the same entry at once, and the last replace wins.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(entry, indent=2, default=str))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def update(job: str, **fields: Any) -> dict[str, Any]:
    entry = read(job) or {"job": job}
    entry.update(fields)
    write(job, entry)
    return entry


def _parse(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise CorruptEntryError(path, "it is not text") from None
    if not text.strip():
        raise CorruptEntryError(path, "it is empty")
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CorruptEntryError(
            path,
            f"it is not valid JSON ({exc.msg}: line {exc.lineno}, column {exc.colno}; truncated?)",
        ) from None
    if not isinstance(entry, dict):
        raise CorruptEntryError(path, f"it holds a JSON {type(entry).__name__}, not an object")
    if entry.get("job") != path.stem:
        raise CorruptEntryError(path, f"it names job {entry.get('job')!r}, not {path.stem!r}")
    pid = entry.get("pid")
    if pid is not None and (not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0):
        raise CorruptEntryError(path, f"its pid {pid!r} is not a process id")
    return entry


def read(job: str) -> dict[str, Any] | None:
    """``job``'s entry, None if there is none; :class:`CorruptEntryError` if it is damaged."""
    path = _path(job)
    try:
        return _parse(path)
    except FileNotFoundError:
        return None


def require(job: str) -> dict[str, Any]:
    entry = read(job)
    if entry is None:
        known = ", ".join(e["job"] for e in entries()) or "none"
        raise JobError(f"no job named {job!r} in {jobs_dir()} (known: {known})")
    return entry


def scan() -> tuple[list[dict[str, Any]], list[CorruptEntryError]]:
    """Every readable entry, and an error naming each damaged one."""
    directory = jobs_dir()
    if not directory.is_dir():
        return [], []
    good, bad = [], []
    for p in sorted(directory.glob("*.json")):
        try:
            Name(p.stem, "job")
            good.append(_parse(p))
        except CorruptEntryError as exc:
            bad.append(exc)
        except (OSError, ValueError) as exc:  # an invalid name, an unreadable file
            bad.append(CorruptEntryError(p, str(exc)))
    return good, bad


def entries() -> list[dict[str, Any]]:
    """Every readable entry (damaged ones are skipped: :func:`scan` names them)."""
    return scan()[0]


# ----------------------------------------------------------------------------- identity


def process_start(pid: int | None) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22);
    None if there is no such process."""
    if not pid:
        return None
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError, ValueError):
        return None
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def verified(entry: dict[str, Any] | None) -> bool:
    """True only if the entry's pid is alive *and* is the process the entry recorded (same
    start time): the one condition under which a signal may be sent to it."""
    if not entry or not entry.get("pid") or entry.get("pid_start") is None:
        return False
    pid = int(entry["pid"])
    return pid_alive(pid) and process_start(pid) == entry["pid_start"]


def alive(entry: dict[str, Any] | None) -> bool:
    """True if the entry's process is alive. With a recorded start time (every entry this
    version writes) the pid must be the same process; an older entry without one is judged
    by its pid only (and is never signalled: :func:`verified`)."""
    if not entry or not entry.get("pid"):
        return False
    if entry.get("pid_start") is None:
        return pid_alive(int(entry["pid"]))
    return verified(entry)


def running(entry: dict[str, Any]) -> bool:
    return entry.get("state") == "RUNNING" and alive(entry)


def _stat_fields(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        fields = _stat_fields(int(d))
        if fields and len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            out.append(int(d))
    return out


def carries_run(pid: int, run_id: str) -> bool:
    """True if process ``pid`` was started by the job run ``run_id`` (its environment)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read().split(b"\0")
    except OSError:
        return False
    return f"{RUN_ID_ENV}={run_id}".encode() in env


def protected_locations() -> set[str]:
    """Savepoints a registered job was restored from: retention never deletes them."""
    return {e["restored_from"] for e in entries() if e.get("restored_from")}
