"""Checkpoint directories: who owns them and what they have committed.

Layout::

    <checkpoint.dir>/_job.json          owner marker: format version, job name, queries
    <checkpoint.dir>/<query>/           Spark's checkpoint of one query:
        offsets/<batch>                 source offsets + watermark of each planned batch
        commits/<batch>                 written after the batch's sink write and state commit
        state/                          RocksDB state (changelog checkpointing)
        metadata                        query id

A batch is *committed* when ``commits/<batch>`` exists; restart resumes after the last one.
:func:`verify` names every damaged or missing file a restart would read (Spark's own errors
name none of them usefully, and some damage it would read without noticing);
:mod:`~stateful_runtime.checkpoints.restore` decides what to do about them.
"""

from __future__ import annotations

import json
import os
import re
import struct
import time
import zipfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from stateful_runtime.exceptions import CheckpointOwnershipError, ConfigError
from stateful_runtime.names import Name

FORMAT_VERSION = 1
MARKER = "_job.json"


def claim(
    directory: str | Path, job: str, queries: Sequence[str], fingerprint: dict | None = None
) -> Path:
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
        foreign = [
            p.name for p in path.iterdir() if (p / "offsets").is_dir() or p.name == "offsets"
        ]
        if foreign:
            raise ConfigError(
                f"checkpoint directory {path} holds Spark checkpoints ({', '.join(foreign)}) but "
                f"no {MARKER}: it was not written by job {job!r}. Use an empty directory."
            )
        data = {
            "format_version": FORMAT_VERSION,
            "job": job,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
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
            f"(`srt run JOB_FILE --from-savepoint ID` / `--restore-from LOCATION`)"
        ) from None
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
    return {
        "batch": batch,
        "watermark_ms": meta.get("batchWatermarkMs"),
        "sources": [json.loads(s) if s.startswith("{") else s for s in lines[2:]],
    }


# State file names in a partition directory: "<version>.changelog", "<version>.zip", and the
# same with "_<unique id>" after the version (Spark's checkpoint format v2).
_STATE_FILE = re.compile(r"^(\d+)(?:_[^.]+)?\.(changelog|zip|delta|snapshot)$")


def _state_partition_files(part_dir: Path, version: int) -> list[Path]:
    """The files RocksDB needs to load ``version`` of one state partition: the newest snapshot
    at or below it, the SST files that snapshot lists, and the changelogs after it."""
    files, missing = _partition_needs(part_dir, version)
    if missing:
        raise ConfigError(
            f"state partition {part_dir} lacks changelogs for versions {missing}: "
            f"the checkpoint is incomplete"
        )
    return files


def _partition_needs(part_dir: Path, version: int) -> tuple[list[Path], list[int]]:
    """(files needed to load ``version`` of one state partition, changelog versions missing)."""
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
        out += [
            part_dir / "SSTs" / f["dfsSstFileName"] for f in json.loads(meta).get("sstFiles", [])
        ]
    deltas = by_kind["changelog"] or by_kind["delta"]
    out += [deltas[v] for v in sorted(deltas) if v > base]
    missing = [v for v in range(base + 1, version + 1) if v not in deltas]
    out += [
        p for p in (part_dir / "_metadata").glob("*") if p.is_file() and not p.name.startswith(".")
    ]
    return out, missing


def _numbered_upto(directory: Path, batch: int) -> list[Path]:
    """Files of an operator metadata dir whose name starts with a batch id <= ``batch``."""
    out = []
    for p in directory.rglob("*"):
        head = p.name.split("_", 1)[0]
        if (
            p.is_file()
            and not p.name.startswith(".")
            and (not head.isdigit() or int(head) <= batch)
        ):
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


# -- verification ---------------------------------------------------------------------------------

# Hadoop's local file system writes ".<name>.crc" next to every file Spark writes: "crc\0", the
# bytes per checksum (big-endian int, 512), then one CRC-32 (zlib's) per chunk. Hadoop checks it
# on read, so a file that no longer matches fails the restart even when its text still parses.
_CRC_MAGIC = b"crc\0"
# lz4-java's LZ4BlockOutputStream (Spark's state changelogs): each block is "LZ4Block", a token
# byte, compressed and original length (int32 LE), a checksum, the data; an empty block ends it.
_LZ4_MAGIC = b"LZ4Block"
_LZ4_HEADER = len(_LZ4_MAGIC) + 1 + 4 + 4 + 4


@dataclass(frozen=True)
class Problem:
    """A file a restart of a query would read that is damaged or missing.

    Attributes:
        path: relative to the query's checkpoint directory (``offsets/7``,
            ``state/0/1/8.changelog``).
        problem: what is wrong with it.
        kind: ``metadata``, ``offsets``, ``commits`` or ``state``.
        batch: the batch of an offsets/commits file, the state version of a state file.
    """

    path: str
    problem: str
    kind: str
    batch: int | None = None

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}"


def crc_sidecar(path: Path) -> Path:
    return path.with_name(f".{path.name}.crc")


def _crc_problem(path: Path, data: bytes) -> str | None:
    """Does ``data`` (the content of ``path``) match its Hadoop checksum file, if it has one?"""
    side = crc_sidecar(path)
    try:
        raw = side.read_bytes()
    except FileNotFoundError:
        return None
    if len(raw) < 8 or raw[:4] != _CRC_MAGIC or (len(raw) - 8) % 4:
        return f"its checksum file {side.name} is damaged"
    chunk = struct.unpack(">i", raw[4:8])[0]
    if chunk <= 0:
        return f"its checksum file {side.name} is damaged"
    sums = struct.unpack(f">{(len(raw) - 8) // 4}I", raw[8:])
    chunks = max(1, -(-len(data) // chunk))
    if len(sums) != chunks:
        return (
            f"{len(data)} bytes, but its checksum file covers "
            f"{(len(sums) - 1) * chunk + 1}-{len(sums) * chunk} bytes (truncated or extended)"
        )
    for i, want in enumerate(sums):
        if zlib.crc32(data[i * chunk : (i + 1) * chunk]) != want:
            return f"checksum mismatch in bytes {i * chunk}-{min(len(data), (i + 1) * chunk)}"
    return None


def _read(path: Path) -> tuple[bytes | None, str | None]:
    try:
        return path.read_bytes(), None
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"


def _json_object(line: str) -> dict:
    value = json.loads(line)
    if not isinstance(value, dict):
        raise ValueError("not a JSON object")
    return value


def _log_problem(kind: str, data: bytes) -> str | None:
    """Parse an offsets/commits/metadata file as Spark does; what is wrong, or None."""
    if not data:
        return "empty (0 bytes)"
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return "not text (binary garbage)"
    lines = text.split("\n")
    try:
        if kind == "metadata":
            if "id" not in _json_object(text.strip()):
                return "no query id"
            return None
        if not re.fullmatch(r"v\d+", lines[0].strip()):
            return f"no version line (starts with {lines[0][:20]!r})"
        if kind == "commits":
            if len(lines) > 1 and lines[1].strip():
                _json_object(lines[1])
            return None
        if len(lines) < 2:
            return "truncated after the version line"
        _json_object(lines[1])
        sources = [s for s in lines[2:] if s.strip()]
        if not sources:
            return "truncated: no source offsets"
        for s in sources:
            if s.strip() != "-":
                json.loads(s)
    except ValueError as exc:
        return f"malformed JSON ({exc})"
    return None


def _lz4_problem(data: bytes) -> str | None:
    """A changelog must be whole LZ4 blocks ending with the empty end block."""
    pos = 0
    while True:
        if pos + _LZ4_HEADER > len(data):
            return f"truncated at byte {len(data)} (no end block)"
        if data[pos : pos + len(_LZ4_MAGIC)] != _LZ4_MAGIC:
            return f"not an LZ4 block at byte {pos}"
        compressed, original = struct.unpack_from("<ii", data, pos + len(_LZ4_MAGIC) + 1)
        if compressed < 0 or original < 0:
            return f"bad LZ4 block header at byte {pos}"
        end = pos + _LZ4_HEADER + compressed
        if end > len(data):
            return f"truncated at byte {len(data)} inside a block ending at byte {end}"
        if original == 0:
            return None if end == len(data) else f"{len(data) - end} bytes after the end block"
        pos = end


def _state_problem(path: Path, data: bytes) -> str | None:
    if not data:
        return "empty (0 bytes)"
    problem = _crc_problem(path, data)
    if problem:
        return problem
    if path.suffix == ".changelog":
        return _lz4_problem(data)
    if path.suffix == ".zip":
        import io

        try:
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                bad = z.testzip()
                z.read("metadata")
        except (zipfile.BadZipFile, KeyError, OSError) as exc:
            return f"not a readable snapshot ({exc})"
        if bad:
            return f"snapshot entry {bad} is corrupt"
    return None


def _check(
    q: Path, rel: str, kind: str, batch: int | None, out: list[Problem], *, required: bool = True
) -> bool:
    """Check one file; append its problem to ``out``; True if it is sound (or absent and not
    required)."""
    path = q / rel
    data, problem = _read(path)
    if data is None:
        if problem == "missing" and not required:
            return True
        out.append(Problem(rel, problem or "missing", kind, batch))
        return False
    if kind == "state":
        problem = _state_problem(path, data)
    else:
        problem = _log_problem(kind, data) or _crc_problem(path, data)
    if problem:
        out.append(Problem(rel, problem, kind, batch))
    return problem is None


def last_planned(query_dir: str | Path) -> int | None:
    """The newest batch in the offset log (planned; committed or not)."""
    batches = _numbered(Path(query_dir) / "offsets")
    return batches[-1] if batches else None


def verify(
    query_dir: str | Path, batch: int | None = None, *, pending: bool = True
) -> list[Problem]:
    """Every damaged or missing file a restart of the query at committed ``batch`` would read
    (default: the last committed batch; ``-1``: none committed); empty if it can restart.

    What a restart reads, as Spark 4.3 does: the query ``metadata``; ``commits/<batch>`` and
    ``offsets/<batch>``; the batch it re-runs, ``offsets/<batch + 1>`` if it exists and
    ``pending`` (else Spark reads ``offsets/<batch - 1>`` as well); and per stateful operator
    and partition the files RocksDB loads for state version ``batch + 1`` (snapshot, its SST
    files, changelogs), each checked against its Hadoop ``.crc`` file, changelogs also for a
    whole LZ4 stream and snapshots for a readable zip. Files of later batches are not read.
    """
    q = Path(query_dir)
    if batch is None:
        committed = last_committed(q)
        batch = -1 if committed is None else committed
    out: list[Problem] = []
    _check(q, "metadata", "metadata", None, out, required=False)
    sound = True
    if batch >= 0:
        _check(q, f"commits/{batch}", "commits", batch, out)
        sound = _check(q, f"offsets/{batch}", "offsets", batch, out)
    if pending and (q / "offsets" / str(batch + 1)).exists():
        _check(q, f"offsets/{batch + 1}", "offsets", batch + 1, out)
    elif batch >= 1:
        _check(q, f"offsets/{batch - 1}", "offsets", batch - 1, out)
    if batch < 0 or not (q / "state").is_dir():
        return out
    # The partition count is in every offsets file; a damaged newest one has older neighbours.
    partitions = None
    for b in range(batch, -1, -1) if not sound else [batch]:
        try:
            partitions = state_partitions(q, b)
            break
        except (OSError, ValueError, IndexError):
            continue
    if partitions is None:
        out.append(
            Problem(
                "state",
                "not checked: no readable offsets file gives the state partition count",
                "state",
                batch + 1,
            )
        )
        return out
    for op in sorted(p for p in (q / "state").iterdir() if p.is_dir()):
        for meta in sorted((op / "_metadata").rglob("*")):  # operator metadata: Spark's format
            if meta.is_file() and not meta.name.startswith("."):
                _check(q, meta.relative_to(q).as_posix(), "state", None, out)
        # A rescale leaves the partitions above the new count behind, unused.
        for part in sorted(
            p for p in op.iterdir() if p.name.isdigit() and int(p.name) < partitions
        ):
            try:
                files, missing = _partition_needs(part, batch + 1)
            except (zipfile.BadZipFile, KeyError, ValueError, IndexError, OSError) as exc:
                snap = max((p for p in part.glob("*.zip")), default=part)
                out.append(
                    Problem(
                        snap.relative_to(q).as_posix(),
                        f"snapshot unreadable ({exc})",
                        "state",
                        batch + 1,
                    )
                )
                continue
            for v in missing:
                out.append(
                    Problem(
                        f"{part.relative_to(q).as_posix()}/{v}.changelog", "missing", "state", v
                    )
                )
            for f in files:
                m = _STATE_FILE.match(f.name)
                _check(q, f.relative_to(q).as_posix(), "state", int(m.group(1)) if m else None, out)
    return out


def state_files_after(query_dir: str | Path, version: int) -> list[Path]:
    """State files of versions after ``version`` (written by batches not committed), with their
    checksum files: what a restart at an earlier batch must not find (RocksDB would prefer a
    stale snapshot of a version the re-run writes again)."""
    out = []
    state = Path(query_dir) / "state"
    for p in state.rglob("*") if state.is_dir() else []:
        m = _STATE_FILE.match(p.name)
        if m and p.is_file() and int(m.group(1)) > version:
            out.append(p)
            if crc_sidecar(p).exists():
                out.append(crc_sidecar(p))
    return out


# Below this, a checkpoint write of one batch (offsets, commit, a changelog per partition,
# dead-letter splits: tens of KB to a few MB) may fail: the disk counts as full.
LOW_SPACE_BYTES = 8 << 20


def disk_full(directory: str | Path) -> str | None:
    """A sentence naming the full disk under a checkpoint directory, or None if it has room:
    what a job says when a query fails (Spark's own error buries "No space left on device"
    deep in a stack trace)."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if free >= LOW_SPACE_BYTES:
        return None
    return (
        f"the disk holding checkpoint {directory} is full ({free:,} of {total:,} bytes "
        f"free): free space there and restart the job. Committed batches are kept; a batch "
        f"torn by the full disk is moved aside at the restart and run again"
    )
