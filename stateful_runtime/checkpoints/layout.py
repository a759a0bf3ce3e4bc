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
import re
import time
import zipfile
from collections.abc import Sequence
from pathlib import Path

from stateful_runtime.exceptions import CheckpointOwnershipError, ConfigError
from stateful_runtime.names import Name

FORMAT_VERSION = 1
MARKER = "_job.json"


def claim(directory: str | Path, job: str, queries: Sequence[str],
          fingerprint: dict | None = None) -> Path:
    """Bind ``directory`` to ``job`` (first run) or check that it is bound to ``job``; record the
    running code's queries and state fingerprint (what a savepoint of it will carry)."""
    path = Path(directory).resolve()
    path.mkdir(parents=True, exist_ok=True)
    marker = path / MARKER
    if marker.exists():
        data = _read_marker(marker)
        if data.get("format_version") != FORMAT_VERSION:
            raise ConfigError(
                f"checkpoint {path} has format {data.get('format_version')!r}; this runtime "
                f"reads format {FORMAT_VERSION}. Restore it with the version that wrote it."
            )
        if data.get("job") != job:
            raise CheckpointOwnershipError(str(path), str(data.get("job")), job)
    else:
        # A Spark checkpoint with no marker was not made by us: refuse rather than adopt it.
        foreign = [p.name for p in path.iterdir()
                   if (p / "offsets").is_dir() or p.name == "offsets"]
        if foreign:
            raise ConfigError(
                f"checkpoint directory {path} holds Spark checkpoints ({', '.join(foreign)}) but "
                f"no {MARKER}: it was not written by job {job!r}. Use an empty directory."
            )
        data = {"format_version": FORMAT_VERSION, "job": job,
                "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    data["queries"] = list(queries)
    if fingerprint is not None:
        data["fingerprint"] = fingerprint
    write_marker(path, data)
    return path


def owner(directory: str | Path) -> dict:
    """The marker of a job checkpoint directory."""
    marker = Path(directory) / MARKER
    if not marker.exists():
        raise ConfigError(f"{directory} is not a job checkpoint (no {MARKER})")
    return _read_marker(marker)


def write_marker(directory: Path, data: dict) -> None:
    """Write the ownership marker (atomically): the one place it is written."""
    tmp = directory / f".{MARKER}.tmp"
    tmp.write_text(json.dumps(data, indent=2))
    os.replace(tmp, directory / MARKER)


def _read_marker(marker: Path) -> dict:
    """The marker's JSON, or a :class:`ConfigError` naming the file and what to do."""
    try:
        data = json.loads(marker.read_text())
        if not isinstance(data, dict):
            raise ValueError("not a JSON object")
        data["job"] = Name(data.get("job"), "job")
        data["queries"] = [Name(q, "query") for q in data.get("queries", [])]
    except (ValueError, UnicodeDecodeError, ConfigError) as exc:
        raise ConfigError(
            f"checkpoint marker {marker} is corrupt ({exc}): the checkpoint's ownership cannot "
            f"be proved. Restore the job from a savepoint or the mirror into an empty directory "
            f"(`srt run JOB_FILE --from-savepoint ID` / `--restore-from LOCATION`)") from None
    return data


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


# State file names in a partition directory: "<version>.changelog", "<version>.zip", and the
# same with "_<unique id>" after the version (Spark's checkpoint format v2).
_STATE_FILE = re.compile(r"^(\d+)(?:_[^.]+)?\.(changelog|zip|delta|snapshot)$")


def _state_partition_files(part_dir: Path, version: int) -> list[Path]:
    """The files RocksDB needs to load ``version`` of one state partition: the newest snapshot
    at or below it, the SST files that snapshot lists, and the changelogs after it."""
    by_kind: dict[str, dict[int, Path]] = {"changelog": {}, "zip": {}, "delta": {}, "snapshot": {}}
    for p in part_dir.iterdir():
        m = _STATE_FILE.match(p.name)
        if m and int(m.group(1)) <= version:
            by_kind[m.group(2)][int(m.group(1))] = p
    snaps = by_kind["zip"] or by_kind["snapshot"]
    base = max(snaps) if snaps else 0
    out = [snaps[base]] if snaps else []
    if by_kind["zip"] and base:
        meta = zipfile.ZipFile(snaps[base]).read("metadata").decode().splitlines()[1]
        out += [part_dir / "SSTs" / f["dfsSstFileName"]
                for f in json.loads(meta).get("sstFiles", [])]
    deltas = by_kind["changelog"] or by_kind["delta"]
    out += [deltas[v] for v in sorted(deltas) if v > base]
    missing = [v for v in range(base + 1, version + 1) if v not in deltas]
    if missing:
        raise ConfigError(f"state partition {part_dir} lacks changelogs for versions {missing}: "
                          f"the checkpoint is incomplete")
    out += [p for p in (part_dir / "_metadata").glob("*")
            if p.is_file() and not p.name.startswith(".")]
    return out


def _numbered_upto(directory: Path, batch: int) -> list[Path]:
    """Files of an operator metadata dir whose name starts with a batch id <= ``batch``."""
    out = []
    for p in directory.rglob("*"):
        head = p.name.split("_", 1)[0]
        if p.is_file() and not p.name.startswith(".") and (not head.isdigit()
                                                           or int(head) <= batch):
            out.append(p)
    return out


def batch_files(query_dir: str | Path, batch: int, *, pending: bool = True) -> list[str]:
    """Paths (relative to ``query_dir``) of every file a restart at committed ``batch`` reads:
    the query metadata, offsets and commits of ``batch`` and the one before it (Spark reads
    both), the planned-but-uncommitted batch after it when ``pending`` (so a restore replays
    exactly its range), and, per stateful operator and partition, what state version
    ``batch + 1`` needs. Hadoop's ``.crc`` side files are left out (Spark does not need them).
    """
    q = Path(query_dir)
    files = [q / "metadata"]
    for b in (batch - 1, batch):
        if b >= 0:
            files += [q / "offsets" / str(b), q / "commits" / str(b)]
    if pending and (q / "offsets" / str(batch + 1)).exists():
        files.append(q / "offsets" / str(batch + 1))
    files += [p for p in (q / "sources").rglob("*") if p.is_file() and not p.name.startswith(".")]
    state = q / "state"
    # A rescale leaves the partitions above the new count behind, unused.
    partitions = state_partitions(q, batch) or 0
    for op in sorted(state.iterdir()) if state.is_dir() else []:
        for meta in ("_metadata", "_stateSchema"):
            files += _numbered_upto(op / meta, batch)
        for part in sorted(op.iterdir()):
            if part.name.isdigit() and int(part.name) < partitions:
                files += _state_partition_files(part, batch + 1)
    return [p.relative_to(q).as_posix() for p in files]


def state_partitions(query_dir: str | Path, batch: int) -> int | None:
    """Number of state partitions the query ran with at ``batch`` (Spark's shuffle partitions,
    fixed in the offset log), or None for a query without state."""
    q = Path(query_dir)
    if not (q / "state").is_dir():
        return None
    conf = json.loads((q / "offsets" / str(batch)).read_text().splitlines()[1]).get("conf", {})
    n = conf.get("spark.sql.shuffle.partitions")
    return int(n) if n else None
