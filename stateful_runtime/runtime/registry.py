"""The job registry: one JSON file per job under ``$SRT_HOME/jobs`` (default ``~/.srt``).

``srt run`` registers its process there and keeps the entry's health fresh; ``srt status``,
``srt stop`` and the Dagster plugin read it. Files are replaced atomically, so a reader never
sees half an entry.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from stateful_runtime._process import pid_alive
from stateful_runtime.exceptions import JobError


def home() -> Path:
    return Path(os.environ.get("SRT_HOME") or Path.home() / ".srt")


def _path(job: str) -> Path:
    return home() / "jobs" / f"{job}.json"


def redacted(config: dict[str, Any]) -> dict[str, Any]:
    """Job config as entries keep it: secret values (``kafka.sasl.password``...) masked, unless
    given as ``env:NAME`` (a reference, not the secret)."""
    from stateful_runtime.connectors.kafka.client import is_secret

    return {k: ("***" if is_secret(k) and v and not str(v).startswith("env:")
                else _URL_PASSWORD.sub(r"\1***@", v) if isinstance(v, str) else v)
            for k, v in config.items()}


# A password inside a URL (``sink.dsn=postgresql://user:pw@host/db``): masked, ``env:`` too.
_URL_PASSWORD = re.compile(r"(\w[\w+.-]*://[^:/@\s]*:)[^@\s]+@")


def write(job: str, entry: dict[str, Any]) -> None:
    """Replace ``job``'s entry (atomically; config secrets masked)."""
    if isinstance(entry.get("config"), dict):
        entry = {**entry, "config": redacted(entry["config"])}
    path = _path(job)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(entry, indent=2, default=str))
    os.replace(tmp, path)


def update(job: str, **fields: Any) -> dict[str, Any]:
    entry = read(job) or {"job": job}
    entry.update(fields)
    write(job, entry)
    return entry


def read(job: str) -> dict[str, Any] | None:
    try:
        return json.loads(_path(job).read_text())
    except FileNotFoundError:
        return None


def require(job: str) -> dict[str, Any]:
    entry = read(job)
    if entry is None:
        known = ", ".join(e["job"] for e in entries()) or "none"
        raise JobError(f"no job named {job!r} in {home() / 'jobs'} (known: {known})")
    return entry


def entries() -> list[dict[str, Any]]:
    directory = home() / "jobs"
    if not directory.is_dir():
        return []
    out = []
    for p in sorted(directory.glob("*.json")):
        try:
            out.append(json.loads(p.read_text()))
        except (OSError, ValueError):
            continue
    return out


def running(entry: dict[str, Any]) -> bool:
    return entry.get("state") == "RUNNING" and pid_alive(entry.get("pid"))


def protected_locations() -> set[str]:
    """Savepoints a registered job was restored from: retention never deletes them."""
    return {e["restored_from"] for e in entries() if e.get("restored_from")}
