"""Checkpoint directories: who owns them and what they have committed.

Layout::

    <checkpoint.dir>/_job.json          owner marker: format version, job name, queries
    <checkpoint.dir>/<query>/           Spark's checkpoint of one query:
        offsets/<batch>                 source offsets + watermark of each planned batch
        commits/<batch>                 written after the batch's sink write and state commit
        state/                          RocksDB state (changelog checkpointing)
        metadata                        query id

A batch is *committed* when ``commits/<batch>`` exists; restart resumes after the last one.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

from stateful_runtime.exceptions import CheckpointOwnershipError, ConfigError

FORMAT_VERSION = 1
MARKER = "_job.json"


def claim(directory: str | Path, job: str, queries: Sequence[str]) -> Path:
    """Bind ``directory`` to ``job`` (first run) or check that it is bound to ``job``."""
    path = Path(directory).resolve()
    path.mkdir(parents=True, exist_ok=True)
    marker = path / MARKER
    if marker.exists():
        data = json.loads(marker.read_text())
        if data.get("format_version") != FORMAT_VERSION:
            raise ConfigError(
                f"checkpoint {path} has format {data.get('format_version')!r}; this runtime "
                f"reads format {FORMAT_VERSION}. Restore it with the version that wrote it."
            )
        if data.get("job") != job:
            raise CheckpointOwnershipError(str(path), str(data.get("job")), job)
        return path
    # A Spark checkpoint with no marker was not made by us: refuse rather than adopt it.
    foreign = [p.name for p in path.iterdir() if (p / "offsets").is_dir() or p.name == "offsets"]
    if foreign:
        raise ConfigError(
            f"checkpoint directory {path} holds Spark checkpoints ({', '.join(foreign)}) but no "
            f"{MARKER}: it was not written by job {job!r}. Use an empty directory."
        )
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps({
        "format_version": FORMAT_VERSION, "job": job, "queries": list(queries),
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }, indent=2))
    os.replace(tmp, marker)
    return path


def _numbered(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit())


def committed_batches(query_dir: str | Path) -> list[int]:
    return _numbered(Path(query_dir) / "commits")


def last_committed(query_dir: str | Path) -> int | None:
    batches = committed_batches(query_dir)
    return batches[-1] if batches else None


def last_commit_time(query_dir: str | Path) -> float | None:
    """Wall-clock time (epoch seconds) of the last commit marker, or None."""
    batch = last_committed(query_dir)
    if batch is None:
        return None
    return (Path(query_dir) / "commits" / str(batch)).stat().st_mtime


def committed_offsets(query_dir: str | Path, batch: int | None = None) -> dict | None:
    """Source offsets of a committed batch (default: the last), as Spark logged them."""
    batch = last_committed(query_dir) if batch is None else batch
    if batch is None:
        return None
    lines = (Path(query_dir) / "offsets" / str(batch)).read_text().splitlines()
    # offsets/<n>: "v1", then batch metadata JSON (watermark), then one line per source.
    meta = json.loads(lines[1])
    return {"batch": batch, "watermark_ms": meta.get("batchWatermarkMs"),
            "sources": [json.loads(s) if s.startswith("{") else s for s in lines[2:]]}
