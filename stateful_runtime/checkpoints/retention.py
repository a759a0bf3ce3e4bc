"""Savepoint retention: which savepoints of a job to keep, and disposing of the others."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from stateful_runtime.checkpoints.manifest import Savepoint
from stateful_runtime.checkpoints.savepoints import cleanup_incomplete, dispose, list_savepoints
from stateful_runtime.checkpoints.storage import open_store


@dataclass
class Retention:
    """Which savepoints to keep: at most ``max_count``, none older than ``max_age``; the newest
    one and any a running job was restored from are always kept."""

    max_count: int | None = None
    max_age: timedelta | None = None
    protected: set[str] = field(default_factory=set)

    def expired(self, savepoints: list[Savepoint], now: float | None = None) -> list[Savepoint]:
        now = time.time() if now is None else now
        newest_first = sorted(savepoints, key=lambda s: s.created_at, reverse=True)
        out = []
        for i, sp in enumerate(newest_first):
            if i == 0 or sp.id in self.protected or sp.location in self.protected:
                continue
            too_many = self.max_count is not None and i >= self.max_count
            too_old = (
                self.max_age is not None and now - sp.created_at > self.max_age.total_seconds()
            )
            if too_many or too_old:
                out.append(sp)
        return out


def apply_retention(
    root: str | Path, job: str, retention: Retention, protected: Iterable[str] = ()
) -> list[Savepoint]:
    """Dispose of the savepoints of ``job`` under ``root`` that ``retention`` lets go (never one
    in ``protected``: the savepoints registered jobs were restored from)."""
    cleanup_incomplete(open_store(root))
    retention.protected |= set(protected)
    gone = retention.expired(list_savepoints(root, job))
    for sp in gone:
        dispose(sp)
    return gone
