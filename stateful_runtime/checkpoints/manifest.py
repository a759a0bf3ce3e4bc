"""Savepoint manifests: the versioned description of a self-contained copy of one committed batch.

The manifest (format :data:`FORMAT_VERSION`) holds the job name, the job's *fingerprint*
(queries, their stateful operators, key fields, state names and signatures), the Spark version,
per query the batch id, source offsets, watermark and state partition count, and each file's
size and sha256. Savepoints and mirror snapshots share it, so restore has one code path.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.storage import Store
from stateful_runtime.exceptions import ConfigError, SavepointError
from stateful_runtime.names import Name, safe_relative

FORMAT_VERSION = 1
MANIFEST = "_manifest.json"
CHUNK = 1 << 20


def utc(ts: float | None = None) -> str:
    """``ts`` (default: now) as manifests and markers write times (ISO 8601, UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def fingerprint(job_name: str, queries: Iterable[Any]) -> dict[str, Any]:
    """What a restore must agree with: the job and, per query, its stateful operators."""
    return {
        "job": job_name,
        "queries": {q.name: {"path": q.path, "operators": q.state_layout} for q in queries},
    }


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return h.hexdigest()


@dataclass
class Savepoint:
    """A listed (complete) savepoint: where it is and its manifest."""

    store: Store
    id: str
    manifest: dict[str, Any]

    @property
    def location(self) -> str:
        return self.store.join(self.id) if self.id else self.store.url

    def key(self, path: str) -> str:
        """Store key of one of the savepoint's files."""
        return f"{self.id}/{path}" if self.id else path

    @property
    def job(self) -> str:
        return self.manifest["job"]

    @property
    def created_at(self) -> float:
        return float(self.manifest["created_at_epoch"])

    @property
    def size(self) -> int:
        return sum(f["size"] for f in self.manifest["files"])

    def summary(self) -> dict[str, Any]:
        m = self.manifest
        return {
            "id": self.id,
            "job": m["job"],
            "location": self.location,
            "batches": {q: v["batch"] for q, v in m["queries"].items()},
            "watermark_ms": {q: v["watermark_ms"] for q, v in m["queries"].items()},
            "size_bytes": self.size,
            "files": len(m["files"]),
            "created_at": m["created_at"],
            "format_version": m["format_version"],
            "kind": m.get("kind", "savepoint"),
        }


def query_entry(query: QueryLayout, batch: int, *, pending: bool) -> dict[str, Any]:
    """What a manifest says of one query at committed ``batch``."""
    committed = query.committed_offsets(batch) or {}
    return {
        "batch": batch,
        "watermark_ms": committed.get("watermark_ms"),
        "offsets": committed.get("sources"),
        "pending_batch": batch + 1 if pending else None,
        "state_partitions": query.state_partitions(batch),
        "checkpoint_dir": str(query.root),
    }


def new_manifest(
    kind: str, sid: str, owner: dict[str, Any], queries: dict[str, Any], files: list[dict[str, Any]]
) -> dict[str, Any]:
    """A manifest (savepoints and mirror snapshots share the shape and the restore path)."""
    from importlib.metadata import version

    now = time.time()
    return {
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "id": sid,
        "job": owner["job"],
        "fingerprint": owner.get("fingerprint"),
        "spark_version": version("pyspark"),
        "created_at": utc(now),
        "created_at_epoch": now,
        "restored_from": owner.get("restored_from"),
        "queries": queries,
        "files": files,
    }


class CorruptManifestError(SavepointError):
    """A manifest that cannot be read, or says something no manifest of ours says.

    Attributes:
        location: where the manifest is.
        problem: what is wrong with it.
    """

    def __init__(self, location: str, problem: str) -> None:
        self.location, self.problem = location, problem
        super().__init__(
            f"savepoint manifest {location} is unusable: {problem}. The other savepoints are "
            f"unaffected; restore from another one (`srt savepoint list`), and remove this one "
            f"with `srt savepoint dispose --force ID` once you no longer need to inspect it."
        )


def parse_manifest(data: bytes, location: str) -> dict[str, Any]:
    """A manifest's JSON, checked: format version, names, and every file path relative and
    inside the savepoint (a manifest is read back from storage anyone may have written to)."""
    try:
        manifest = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CorruptManifestError(location, f"not JSON ({exc})") from None
    if not isinstance(manifest, dict):
        raise CorruptManifestError(location, "not a JSON object")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise CorruptManifestError(
            location,
            f"format {manifest.get('format_version')!r}; this runtime reads format "
            f"{FORMAT_VERSION} (restore it with the version that wrote it)",
        )
    try:
        Name(manifest.get("job"), "job")
        queries, files = manifest["queries"], manifest["files"]
        if not isinstance(queries, dict) or not isinstance(files, list):
            raise ValueError("queries must be an object and files a list")
        for q in queries:
            Name(q, "query")
        for f in files:
            safe_relative(f["path"], root=location, where=f"manifest {location}")
            if Name(f["path"].split("/", 1)[0], "query") not in queries:
                raise ValueError(f"file {f['path']!r} belongs to no query of the manifest")
            int(f["size"]), str(f["sha256"])
        float(manifest["created_at_epoch"])
    except ConfigError as exc:
        raise CorruptManifestError(location, str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptManifestError(location, f"missing or malformed field ({exc})") from None
    return manifest


def read_manifest(store: Store, key: str) -> dict[str, Any]:
    """The manifest at ``key`` in ``store``, checked (:func:`parse_manifest`)."""
    return parse_manifest(store.get_bytes(key), store.join(key))
