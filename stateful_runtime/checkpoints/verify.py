"""Verification: every damaged or missing file a restart of a query would read.

Spark's own errors name none of them usefully, and some damage it would read without noticing:
:func:`verify` parses the offset, commit and metadata files as Spark does, checks each file
against its Hadoop checksum file, changelogs for a whole LZ4 stream and snapshots for a readable
zip. :mod:`~stateful_runtime.checkpoints.recovery` decides what to do about what it finds.
:func:`disk_full` says why a checkpoint write failed when the disk is full.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.layout import (
    QueryLayout,
    crc_sidecar,
    partition_needs,
    state_version,
)

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
    if path.suffix in (keyed.DELTA, keyed.SNAPSHOT, keyed.COMMIT):
        return keyed.problem(path)
    if path.suffix == ".changelog":
        return _lz4_problem(data)
    if path.suffix == ".zip":
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
    q: QueryLayout,
    path: Path,
    kind: str,
    batch: int | None,
    out: list[Problem],
    *,
    required: bool = True,
) -> bool:
    """Check one file; append its problem to ``out``; True if it is sound (or absent and not
    required)."""
    rel = q.relative(path)
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
    whole LZ4 stream and snapshots for a readable zip; and the keyed state files that rebuild
    that version (``keyed/``: the snapshot and deltas, each a whole Arrow file). Files of later
    batches are not read.
    """
    q = QueryLayout(query_dir)
    if batch is None:
        committed = q.last_committed()
        batch = -1 if committed is None else committed
    out: list[Problem] = []
    _check(q, q.metadata, "metadata", None, out, required=False)
    sound = True
    if batch >= 0:
        _check(q, q.commit(batch), "commits", batch, out)
        sound = _check(q, q.offsets(batch), "offsets", batch, out)
    if pending and q.offsets(batch + 1).exists():
        _check(q, q.offsets(batch + 1), "offsets", batch + 1, out)
    elif batch >= 1:
        _check(q, q.offsets(batch - 1), "offsets", batch - 1, out)
    if batch < 0 or not q.holds_state:
        return out
    # The partition count is in every offsets file; a damaged newest one has older neighbours.
    partitions = None
    for b in range(batch, -1, -1) if not sound else [batch]:
        try:
            partitions = q.state_partitions(b)
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
    for op in q.operators():
        for meta in q.operator_metadata(op):  # operator metadata: Spark's format
            _check(q, meta, "state", None, out)
        for part in q.partitions(op, partitions):
            try:
                files, missing = partition_needs(part, batch + 1)
            except (zipfile.BadZipFile, KeyError, ValueError, IndexError, OSError) as exc:
                snap = max((p for p in part.glob("*.zip")), default=part)
                out.append(
                    Problem(q.relative(snap), f"snapshot unreadable ({exc})", "state", batch + 1)
                )
                continue
            for v in missing:
                out.append(Problem(f"{q.relative(part)}/{v}.changelog", "missing", "state", v))
            for f in files:
                _check(q, f, "state", state_version(f), out)
    for op in keyed.operators(q.root):
        # The commit records first: a damaged one leaves unknown which files are its version.
        records = [
            (r, rv)
            for r in op.glob(f"*{keyed.COMMIT}")
            if (rv := keyed.version_of(r, keyed.COMMIT)) is not None and rv <= batch + 1
        ]
        if not all([_check(q, r, "state", rv, out) for r, rv in records]):
            continue
        for part in keyed.partitions(op, partitions):
            files, missing = keyed.needs(part, batch + 1)
            for v in missing:
                out.append(Problem(f"{q.relative(part)}/{v}{keyed.DELTA}", "missing", "state", v))
            for f in files:
                _check(q, f, "state", state_version(f), out)
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
