"""Savepoint manifests: the versioned description of a self-contained copy of one committed batch.

The manifest (format :data:`FORMAT_VERSION`) holds the job name, the job's *fingerprint*
(queries, their stateful operators, key fields, state names and signatures), the Spark version,
per query the batch id, source offsets, watermark and state partition count, and each file's
size and sha256. Savepoints and mirror snapshots share it, so restore has one code path.

A manifest is never trusted over the files it describes (:func:`check`): what the files say —
the batch (the newest ``commits/N``), its offsets and watermark (``offsets/N``), the batch
planned after it, the state partition count (Spark's conf in ``offsets/N``) and the partition
directories, which queries hold state — is read from them and compared with the manifest, each
difference named with both values; every file's size and sha256 are verified when it is copied
(:func:`stateful_runtime.checkpoints.restore.materialize`), and the files a restart at the batch
needs are the files it lists. The fields no file can contradict (the job, the fingerprint, the
times, the kind) are covered by the manifest's own checksum (:data:`SEAL`, over every other
field), so a hand edit of any field is refused. Manifests written before the checksum have no
:data:`SEAL` and are checked against their files only. The checksum catches edits, not forgery:
whoever rewrites it on purpose can also recompute it.
"""

from __future__ import annotations

import hashlib
import json
import re
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.keyed import KEYED_DIR
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.storage import Store
from stateful_runtime.exceptions import ConfigError, SavepointError, StorageError
from stateful_runtime.names import Name, contained, safe_relative

FORMAT_VERSION = 1
MANIFEST = "_manifest.json"
CHUNK = 1 << 20
# The manifest's own checksum: sha256 of every other field, canonical JSON (:func:`seal`).
SEAL = "manifest_sha256"
KINDS = ("savepoint", "stop-with-savepoint", "mirror")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# The logs a manifest's per-query fields are checked against (small: read by every check).
_LOGS = ("metadata", "offsets/", "commits/")


def utc(ts: float | None = None) -> str:
    """``ts`` (default: now) as manifests and markers write times (ISO 8601, UTC, seconds)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def fingerprint(job_name: str, queries: Iterable[Any]) -> dict[str, Any]:
    """What a restore must agree with: the job and, per query, its stateful operators and the
    sources it reads (Spark's offset log holds one line per source, by position)."""
    return {
        "job": job_name,
        "queries": {
            q.name: {"path": q.path, "operators": q.state_layout, "sources": q.source_names}
            for q in queries
        },
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
    return seal(
        {
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
    )


def _canonical(manifest: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: v for k, v in manifest.items() if k != SEAL}, sort_keys=True, separators=(",", ":")
    ).encode()


def seal(manifest: dict[str, Any]) -> dict[str, Any]:
    """``manifest`` with its own checksum (:data:`SEAL`) over every other field."""
    return {**manifest, SEAL: hashlib.sha256(_canonical(manifest)).hexdigest()}


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


class ManifestMismatchError(CorruptManifestError):
    """A manifest that contradicts the files it describes, or whose own checksum does not
    match its fields (edited after it was written).

    Attributes:
        mismatches: each field, what the manifest says and what the files say
            (:meth:`Mismatch.to_json` documents).
    """

    def __init__(self, location: str, mismatches: list[Mismatch]) -> None:
        self.mismatches = [m.to_json() for m in mismatches]
        found = "; ".join(m.describe() for m in mismatches)
        super().__init__(location, f"it contradicts the files it describes ({found})")
        # One message for a damaged file and an edited field (which of the two cannot be told)
        self.args = (
            f"savepoint {location} is corrupt: {found}. A restore lays out the checksummed "
            f"files and never trusts the manifest over them: if the manifest was edited by hand, "
            f"put the value back; else restore from another savepoint (`srt savepoint list`), "
            f"and remove this one with `srt savepoint dispose --force ID` once you no longer "
            f"need to inspect it.",
        )


@dataclass(frozen=True)
class Mismatch:
    """One manifest field that the files (or the manifest's checksum) contradict.

    Attributes:
        field: the field's path in the manifest (``queries.upi-counts.batch``).
        manifest: what the manifest says (JSON text).
        files: what the files say (JSON text), or why the field cannot be believed.
    """

    field: str
    manifest: str
    files: str

    def describe(self) -> str:
        return f"{self.field}: the manifest says {self.manifest}, the files say {self.files}"

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "manifest": self.manifest, "files": self.files}


def _text(value: Any) -> str:
    return "(missing)" if value is _ABSENT else json.dumps(value, sort_keys=True)


_ABSENT: Any = object()


def _same(a: Any, b: Any) -> bool:
    """Equal as JSON values, types included (``1`` is not ``true`` nor ``1.0``)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def seal_mismatch(manifest: dict[str, Any]) -> Mismatch | None:
    """The manifest's checksum, if it does not match its fields (None: it matches, or the
    manifest was written before manifests carried one)."""
    if SEAL not in manifest:
        return None
    actual = hashlib.sha256(_canonical(manifest)).hexdigest()
    if manifest[SEAL] == actual:
        return None
    return Mismatch(
        SEAL,
        _text(manifest[SEAL]),
        f"{json.dumps(actual)} (a field was changed after the manifest was written)",
    )


def derived(files: Iterable[dict[str, Any]], logs: Path) -> dict[str, dict[str, Any]]:
    """Per query, what a manifest's per-query fields must say, read from the files: ``logs``
    holds the query's metadata, offset and commit logs laid out as a checkpoint (by
    :func:`check`, or the restored checkpoint itself)."""
    out: dict[str, dict[str, Any]] = {}
    paths: dict[str, list[str]] = {}
    for f in files:
        q, _, rel = f["path"].partition("/")
        paths.setdefault(q, []).append(rel)
    for q, rels in paths.items():
        query = QueryLayout(logs / q)
        batch = query.last_committed()
        state = [r.split("/") for r in rels if r.startswith(("state/", f"{KEYED_DIR}/"))]
        partitions: dict[str, list[int]] = {}
        for parts in state:
            if len(parts) > 3 and parts[2].isdigit():
                # Spark's operators by number, keyed operators as keyed/<name>
                op = parts[1] if parts[0] == "state" else f"{parts[0]}/{parts[1]}"
                partitions.setdefault(op, [])
                if int(parts[2]) not in partitions[op]:
                    partitions[op].append(int(parts[2]))
        entry: dict[str, Any] = {"batch": batch, "stateful": bool(state)}
        entry["partition_dirs"] = {op: sorted(ps) for op, ps in partitions.items()}
        if batch is not None and query.offsets(batch).is_file():
            committed = query.committed_offsets(batch) or {}
            entry["watermark_ms"] = committed.get("watermark_ms")
            entry["offsets"] = committed.get("sources")
            entry["pending_batch"] = batch + 1 if query.offsets(batch + 1).is_file() else None
            conf = json.loads(query.offsets(batch).read_text().splitlines()[1]).get("conf", {})
            n = conf.get("spark.sql.shuffle.partitions")
            entry["state_partitions"] = int(n) if n and state else None
        out[q] = entry
    return out


def _fingerprint_shape(fp: Any) -> list[Mismatch]:
    """The fingerprint's fields that are not what :func:`fingerprint` writes (a job name, per
    query a path and per operator a kind, key fields and state signatures)."""

    def names(value: Any) -> bool:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)

    def signatures(value: Any) -> bool:
        return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())

    if not isinstance(fp, dict) or not isinstance(fp.get("queries"), dict):
        return [Mismatch("fingerprint", _text(fp), "the job and its queries (an object)")]
    out = []
    for q, query in fp["queries"].items():
        ops = query.get("operators") if isinstance(query, dict) else None
        if not isinstance(query, dict) or not isinstance(ops, dict):
            out.append(Mismatch(f"fingerprint.queries.{q}", _text(query), "a query's operators"))
            continue
        for op, o in ops.items():
            if not (
                isinstance(o, dict)
                and isinstance(o.get("kind"), str)
                and names(o.get("keys"))
                and signatures(o.get("states"))
            ):
                out.append(
                    Mismatch(
                        f"fingerprint.queries.{q}.operators.{op}",
                        _text(o),
                        "an operator's kind, key fields and state signatures",
                    )
                )
    return out


def check(sp: Savepoint, *, keyed_files: bool = False) -> list[Mismatch]:
    """Every field of ``sp``'s manifest checked against the files it describes (their logs
    read from its store, their checksums verified) and against its own checksum; an empty list
    when the manifest is true. With ``keyed_files`` (``srt savepoint check``), the keyed state
    files of the worker's RocksDB are read too: their checksums, and each a whole
    Arrow file of its version. The state files themselves are verified when a restore copies
    them (:func:`~stateful_runtime.checkpoints.restore.materialize`)."""
    m = json.loads(json.dumps(sp.manifest))  # as stored (a fresh one holds str subclasses)
    out: list[Mismatch] = []

    def differs(field: str, said: Any, truth: Any, why: str = "") -> None:
        if not _same(said, truth):
            out.append(Mismatch(field, _text(said), _text(truth) + why))

    stored = {o.key: o.size for o in sp.store.list(sp.key(""))}
    with tempfile.TemporaryDirectory(prefix="srt-manifest-") as tmp:
        for f in m["files"]:
            rel = f["path"].partition("/")[2]
            if sp.key(f["path"]) not in stored:
                out.append(Mismatch(f"files[{f['path']}]", "a file of the savepoint", "missing"))
                continue
            if stored[sp.key(f["path"])] != f["size"]:
                out.append(
                    Mismatch(
                        f"files[{f['path']}].size",
                        _text(f["size"]),
                        _text(stored[sp.key(f["path"])]),
                    )
                )
                continue
            is_keyed = keyed_files and rel.startswith(f"{KEYED_DIR}/")
            if not rel.startswith(_LOGS) and not is_keyed:
                continue  # verified (sha256) as a restore copies it
            local = contained(tmp, f["path"], where=f"savepoint {sp.location}")
            try:
                sp.store.get_file(sp.key(f["path"]), local)
            except StorageError as exc:
                out.append(Mismatch(f"files[{f['path']}]", "a file of the savepoint", str(exc)))
                continue
            size, digest = local.stat().st_size, sha256_file(local)
            if size != f["size"] or digest != f["sha256"]:
                out.append(
                    Mismatch(
                        f"files[{f['path']}]",
                        f"{f['size']} bytes, sha256 {f['sha256']}",
                        f"{size} bytes, sha256 {digest}",
                    )
                )
                local.unlink()
            elif is_keyed and (bad := keyed.problem(local)) is not None:
                out.append(Mismatch(f"files[{f['path']}]", "a keyed state file", bad))
        truth = derived(m["files"], Path(tmp))
    if sp.id:
        # A savepoint directory holds its files and nothing else (a mirror location holds
        # several batches): a file it holds that the manifest does not list was dropped from
        # the list — some of Spark's files are found by listing, not by name.
        listed = {sp.key(f["path"]) for f in m["files"]}
        unlisted = sorted(k for k in stored if k.count("/") > 1 and k not in listed)
        if unlisted:
            out.append(
                Mismatch(
                    "files",
                    f"{len(listed)} files",
                    f"{len(listed) + len(unlisted)}: also "
                    + ", ".join(k.partition("/")[2] for k in unlisted[:5])
                    + (" …" if len(unlisted) > 5 else ""),
                )
            )
    out += _fingerprint_shape(m.get("fingerprint", _ABSENT))
    fp: dict[str, Any] = m["fingerprint"] if isinstance(m.get("fingerprint"), dict) else {}
    differs("job", m.get("job", _ABSENT), fp.get("job", _ABSENT), " (the fingerprint's job)")
    differs(
        "kind",
        m.get("kind", _ABSENT),
        m.get("kind") if m.get("kind") in KINDS else "one of " + ", ".join(KINDS),
    )
    try:
        created = utc(float(m["created_at_epoch"]))
    except (KeyError, TypeError, ValueError, OverflowError):
        created = "a time (created_at_epoch is not one)"
    differs("created_at", m.get("created_at", _ABSENT), created, " (created_at_epoch)")
    fp_queries: dict[str, Any] = fp["queries"] if isinstance(fp.get("queries"), dict) else {}
    differs("fingerprint.queries", sorted(fp_queries), sorted(m["queries"]), " (the queries)")
    for q, said in m["queries"].items():
        files = truth.get(q, {"batch": None, "stateful": False, "partition_dirs": {}})
        where = f"queries.{q}"
        said = said if isinstance(said, dict) else {}
        if files["batch"] is None:
            out.append(Mismatch(f"{where}.batch", _text(said.get("batch", _ABSENT)), "no commit"))
            continue
        for field in ("batch", "watermark_ms", "offsets", "pending_batch", "state_partitions"):
            differs(
                f"{where}.{field}",
                said.get(field, _ABSENT),
                files.get(field, _ABSENT),
                f" (offsets/{files['batch']})" if field != "batch" else " (the newest commit)",
            )
        n = files.get("state_partitions") or 0
        for op, parts in files["partition_dirs"].items():
            if parts != list(range(n)):
                out.append(
                    Mismatch(
                        "files",
                        f"state partitions {parts} of operator {op} of query {q}",
                        f"{n} state partitions (offsets/{files['batch']})",
                    )
                )
        q_fp = fp_queries.get(q)
        ops = q_fp.get("operators") if isinstance(q_fp, dict) else None
        operators = sorted(ops) if isinstance(ops, dict) else []
        # Operators with state and no state files is a contradiction; state files without
        # fingerprinted operators is not (not every stateful Spark operator is fingerprinted).
        if operators and not files["stateful"]:
            out.append(
                Mismatch(f"fingerprint.queries.{q}.operators", _text(operators), "no state files")
            )
    if (sealed := seal_mismatch(m)) is not None:
        out.append(sealed)
    return out


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
            if type(f["size"]) is not int or f["size"] < 0:
                raise ValueError(f"file {f['path']!r}: size {f['size']!r} is not a byte count")
            if not isinstance(f["sha256"], str) or not _SHA256.fullmatch(f["sha256"]):
                raise ValueError(f"file {f['path']!r}: sha256 {f['sha256']!r} is not a digest")
        float(manifest["created_at_epoch"])
    except ConfigError as exc:
        raise CorruptManifestError(location, str(exc)) from None
    except (KeyError, TypeError, ValueError) as exc:
        raise CorruptManifestError(location, f"missing or malformed field ({exc})") from None
    return manifest


def read_manifest(store: Store, key: str) -> dict[str, Any]:
    """The manifest at ``key`` in ``store``, checked (:func:`parse_manifest`)."""
    return parse_manifest(store.get_bytes(key), store.join(key))
