"""Keyed state files in a checkpoint (the worker's RocksDB engine): the one reader and
writer of their format, and what savepoints, the mirror, recovery, rescale and ``srt state
inspect`` ask of them. The store that writes them in the Python worker is
:class:`~stateful_runtime.operators.keyed_store.KeyedStore`.

Layout under a query's checkpoint::

    keyed/<operator>/<partition>/<V>.<token>.delta      what the batch before version V changed
    keyed/<operator>/<partition>/<V>.<token>.snapshot   every row at version V
    keyed/<operator>/<V>.commit                         the token of each partition's version V

Attempts are not commits. Spark may run a task twice (a stage re-run after a fetch failure, a
zombie attempt of a batch the driver already replayed), and both attempts write their files:
each names them with a token of its own, so no attempt overwrites another's. Each task hands
its token to the driver as a row of the batch's output (:data:`COMMIT_TAG`); the driver, having
written the sinks from that output, records the tokens of the version in ``<V>.commit``
(:func:`record`) before Spark commits the batch, so the state read back is always the state of
the attempt whose output Spark committed (Spark's state store checkpoint format v2 records a
unique id per state file with the commit likewise). A file whose token the record does not name
is never read, whoever wrote it and whenever. A version without a record is of the layout
before (``<V>.delta``, ``<V>.snapshot``, each file its own commit) and is read as such.

Both are Arrow IPC files of ``(k: binary, v: binary)`` rows (``v`` null: a delete), their schema
metadata naming the format, the version and the token of the task that wrote them. Rows (the
local RocksDB holds the same), each key starting with its key group (two bytes, big-endian):

* ``<group> k <key>`` → every state of one key, a pickled dict ``state name → value`` (a map
  state's value is its dict; with processing-time TTL a value is ``(value, expires)``): a key
  touched by a batch is one row read and one written;
* ``<group> t <timestamp, 8 bytes> <key>`` → nothing: the timer index, in time order within a
  key group (unsigned big-endian, :func:`encode_ts`);
* in a delta only, ``<group> t`` → a timestamp's 8 bytes: every timer row of the group before
  that time is deleted (:func:`timers_fired`: a task fires every timer due at its batch's time,
  so their rows go as one range, not a delete each);
* ``<group> b <state name>`` → a broadcast state's dict (every group of a partition holds it).

``<key>`` is the pickled tuple of the key fields' values. The previous layout
(:data:`PREVIOUS_FORMAT`: a row ``<group> s <state name> \\0 <key>`` per state and key) is still
read: its files are turned into this layout's rows as they are read (:func:`rows`), so a
checkpoint or savepoint written by it restores, and the versions written after are this
layout's. Version
``N + 1`` is the state after batch ``N`` (Spark's numbering of its own store); the rows of
version ``V`` are the newest snapshot at or below ``V`` with the deltas after it applied in
order (:func:`state_at`).

Key groups (Flink's max parallelism): every stored key starts with its key group (two bytes,
big-endian), one of :data:`MAX_PARALLELISM`, fixed for the life of a checkpoint; partition ``p``
of ``n`` owns the contiguous range :func:`key_groups`. A rescale (:func:`rescale`) selects each
new partition's groups from the old partitions by that prefix and writes them as one snapshot:
no key is rewritten.
"""

from __future__ import annotations

import contextlib
import functools
import json
import pickle
import struct
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateful_runtime.checkpoints.storage import fill_file, read_arrow
from stateful_runtime.exceptions import StateError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

MAX_PARALLELISM = 128
KEYED_DIR = "keyed"
DELTA = ".delta"
SNAPSHOT = ".snapshot"
COMMIT = ".commit"
# The ``_tag`` of the output row by which a task hands its version's token to the driver.
COMMIT_TAG = "srt:keyed-commit"
COMMIT_FORMAT = "srt-keyed-commit-1"
# Deltas may hold timer ranges (``<group> t`` rows); files of "srt-keyed-2" have the same rows
# without them and are read as they are.
FORMAT = "srt-keyed-3"
_SAME_ROWS = ("srt-keyed-2", FORMAT)
# A row per state and key (``<group> s <name> \0 <key>``): read, never written.
PREVIOUS_FORMAT = "srt-keyed-1"
# Bytes of the key group at the start of every stored key.
GROUP_BYTES = 2
# The tag after the key group: a key's states, a timer, a broadcast state.
STATE_ROW, TIMER_ROW, BROADCAST_ROW = b"k", b"t", b"b"
_PREVIOUS_STATE_ROW = b"s"
_PICKLE = pickle.HIGHEST_PROTOCOL
_TS_OFFSET = 2**63  # timestamps as unsigned big-endian: byte order is time order
_BATCH_ROWS = 65_536


# -- key groups: Spark's hash in Python ---------------------------------------------------------
def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & 0xFFFFFFFF


def _mix_k1(k1: int) -> int:
    k1 = (k1 & 0xFFFFFFFF) * 0xCC9E2D51 & 0xFFFFFFFF
    return _rotl(k1, 15) * 0x1B873593 & 0xFFFFFFFF


def _mix_h1(h1: int, k1: int) -> int:
    return (_rotl(h1 ^ k1, 13) * 5 + 0xE6546B64) & 0xFFFFFFFF


def _fmix(h1: int, length: int) -> int:
    h1 ^= length
    h1 ^= h1 >> 16
    h1 = h1 * 0x85EBCA6B & 0xFFFFFFFF
    h1 ^= h1 >> 13
    h1 = h1 * 0xC2B2AE35 & 0xFFFFFFFF
    return h1 ^ (h1 >> 16)


def _signed(h: int) -> int:
    return h - (1 << 32) if h & 0x80000000 else h


def _hash_int(value: int, seed: int) -> int:
    return _fmix(_mix_h1(seed, _mix_k1(value)), 4)


def _hash_long(value: int, seed: int) -> int:
    h1 = _mix_h1(seed, _mix_k1(value & 0xFFFFFFFF))
    return _fmix(_mix_h1(h1, _mix_k1((value >> 32) & 0xFFFFFFFF)), 8)


def _hash_bytes(data: bytes, seed: int) -> int:
    """Spark's ``Murmur3_x86_32.hashUnsafeBytes``: whole little-endian words, then each byte
    left over on its own (sign-extended), unlike the reference Murmur3's tail."""
    h1 = seed
    aligned = len(data) - len(data) % 4
    for i in range(0, aligned, 4):
        h1 = _mix_h1(h1, _mix_k1(int.from_bytes(data[i : i + 4], "little")))
    for b in data[aligned:]:
        h1 = _mix_h1(h1, _mix_k1(b - 256 if b > 127 else b))
    return _fmix(h1, len(data))


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's ``hash(<int column>)`` (Murmur3_x86_32.hashInt), a signed 32-bit int."""
    return _signed(_hash_int(value, seed))


def spark_hash(values: Sequence[Any], seed: int = 42) -> int:
    """Spark's ``hash(<columns>)`` of a row's values as the job's schema types them (``str``
    a string, ``int`` a bigint, ``float`` a double, ``bool`` a boolean; a null leaves the
    hash as it is), a signed 32-bit int."""
    h = seed
    for v in values:
        if v is None:
            continue
        if isinstance(v, bool):
            h = _hash_int(int(v), h)
        elif isinstance(v, int):
            h = _hash_long(v, h)
        elif isinstance(v, float):
            bits = struct.unpack("<q", struct.pack("<d", 0.0 if v == 0 else v))[0]
            h = _hash_long(bits, h)
        elif isinstance(v, str):
            h = _hash_bytes(v.encode(), h)
        elif isinstance(v, bytes):
            h = _hash_bytes(v, h)
        else:
            raise TypeError(f"a key field of type {type(v).__name__}: use str, int, float, bool")
    return _signed(h)


def key_group(values: Sequence[Any]) -> int:
    """The key group of a key (its fields' values): ``pmod(hash(key fields), 128)``, what the
    JVM computes for each record of the job (``runtime/dataframes.py``)."""
    return spark_hash(values) % MAX_PARALLELISM


def column_key_groups(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The key group of each value of a single-field key column (a string, or an integer
    hashed as a bigint; a null hashes to Spark's seed), as :func:`key_group` gives one, over
    the whole column at once (numpy: ~50 ns a value where :func:`key_group` takes µs)."""
    import numpy as np
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    seed = np.uint32(42)
    if pa.types.is_integer(column.type):
        values = column.cast(pa.int64()).fill_null(0).to_numpy(zero_copy_only=False)
        words = values.astype(np.uint64)
        h = _np_mix_h1(
            np.full(len(values), seed), _np_mix_k1((words & 0xFFFFFFFF).astype(np.uint32))
        )
        h = _np_fmix(_np_mix_h1(h, _np_mix_k1((words >> 32).astype(np.uint32))), 8)
    else:
        column = column.cast(pa.large_binary())
        _, offsets_buf, data_buf = column.buffers()
        offsets = np.frombuffer(offsets_buf, np.int64)[
            column.offset : column.offset + len(column) + 1
        ]
        data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
        data = np.concatenate([data, np.zeros(4, np.uint8)])
        starts, lengths = offsets[:-1], np.diff(offsets)
        last = len(data) - 4  # (rows past their value's end read anything, and drop it)
        h = np.full(len(column), seed)
        for w in range(int(lengths.max(initial=0)) // 4):
            at = np.minimum(starts + 4 * w, last)
            word = (
                data[at].astype(np.uint32)
                | data[at + 1].astype(np.uint32) << 8
                | data[at + 2].astype(np.uint32) << 16
                | data[at + 3].astype(np.uint32) << 24
            )
            whole = lengths >= 4 * (w + 1)
            h = np.where(whole, _np_mix_h1(h, _np_mix_k1(word)), h)
        aligned = lengths - lengths % 4
        for t in range(3):  # each byte left over on its own, sign-extended
            left = aligned + t < lengths
            byte = data[np.where(left, starts + aligned + t, 0)].astype(np.int8)
            k1 = byte.astype(np.int32).astype(np.uint32)
            h = np.where(left, _np_mix_h1(h, _np_mix_k1(k1)), h)
        h = _np_fmix(h, lengths.astype(np.uint32))
    if column.null_count:  # a null leaves the hash at the seed
        h = np.where(column.is_null().to_numpy(zero_copy_only=False), seed, h)
    # pmod(hash, 128) of the signed hash is its low bits: 2^32 is a multiple of 128
    return (h & np.uint32(MAX_PARALLELISM - 1)).astype(np.int32)


def _np_rotl(x: np.ndarray, r: int) -> np.ndarray:
    import numpy as np

    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def _np_mix_k1(k1: np.ndarray) -> np.ndarray:
    import numpy as np

    return _np_rotl(k1 * np.uint32(0xCC9E2D51), 15) * np.uint32(0x1B873593)


def _np_mix_h1(h1: np.ndarray, k1: np.ndarray) -> np.ndarray:
    import numpy as np

    return _np_rotl(h1 ^ k1, 13) * np.uint32(5) + np.uint32(0xE6546B64)


def _np_fmix(h1: np.ndarray, length: Any) -> np.ndarray:
    import numpy as np

    h1 = h1 ^ np.uint32(length) if isinstance(length, int) else h1 ^ length
    h1 ^= h1 >> np.uint32(16)
    h1 = h1 * np.uint32(0x85EBCA6B)
    h1 ^= h1 >> np.uint32(13)
    h1 = h1 * np.uint32(0xC2B2AE35)
    return h1 ^ (h1 >> np.uint32(16))


def key_groups(partition: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> range:
    """The key groups partition ``partition`` of ``parallelism`` owns (Flink's assignment:
    ``group * parallelism // max_parallelism == partition``)."""
    lo = -(-partition * max_parallelism // parallelism)
    hi = -(-(partition + 1) * max_parallelism // parallelism)
    return range(lo, hi)


def owner_of(group: int, parallelism: int, max_parallelism: int = MAX_PARALLELISM) -> int:
    """The partition of ``parallelism`` that owns key group ``group`` (see :func:`key_groups`)."""
    return group * parallelism // max_parallelism


def key_partition(value: str | int | None, partitions: int) -> int:
    """The partition of ``partitions`` that owns the key group of a single-field key
    ``value`` (a string, or an int read as a bigint; None hashes to Spark's seed): where a
    keyed topic places a record, so that a job keyed by that field reads each partition in
    the task that keeps its state (an event-log topic keyed at its first append, a Kafka
    topic its producers place so: ``KafkaSink(partition_by=...)``, or ``produce(...,
    partition=key_partition(record[field], n))``)."""
    return owner_of(key_group([value]), partitions)


def group_prefix(group: int) -> bytes:
    """The first bytes of every stored key of key group ``group``."""
    return group.to_bytes(GROUP_BYTES, "big")


def group_of(key: bytes) -> int:
    """The key group a stored key belongs to."""
    return int.from_bytes(key[:GROUP_BYTES], "big")


def encode_ts(ts: int) -> bytes:
    """A timestamp (ms) as the 8 bytes of a timer row (byte order is time order)."""
    return (ts + _TS_OFFSET).to_bytes(8, "big")


def decode_ts(raw: bytes) -> int:
    return int.from_bytes(raw, "big") - _TS_OFFSET


def encode_states(states: dict[str, Any]) -> bytes | None:
    """A key's row value: its states (None: no state, the row is deleted)."""
    return pickle.dumps(states, _PICKLE) if states else None


def decode_states(raw: bytes) -> dict[str, Any]:
    return pickle.loads(raw)


def parse_row(row: bytes) -> tuple[int, bytes, bytes]:
    """A stored row's key as (key group, tag, rest): for :data:`STATE_ROW` the rest is the
    pickled key, for :data:`TIMER_ROW` the timestamp's 8 bytes then the pickled key, for
    :data:`BROADCAST_ROW` the state's name."""
    return group_of(row), row[GROUP_BYTES : GROUP_BYTES + 1], row[GROUP_BYTES + 1 :]


def timers_fired(group: int, upto: int) -> tuple[bytes, bytes]:
    """A delta's row deleting every timer row of ``group`` at or before ``upto``."""
    return group_prefix(group) + TIMER_ROW, encode_ts(upto + 1)


def is_timer_range(row: bytes) -> bool:
    """Whether ``row`` is a delta's :func:`timers_fired` row."""
    return len(row) == GROUP_BYTES + 1 and row[GROUP_BYTES:] == TIMER_ROW


def timer_range(row: bytes, bound: bytes) -> tuple[bytes, bytes]:
    """The keys a :func:`timers_fired` row deletes: ``start <= key < stop``."""
    return row, row + bound


# -- files ---------------------------------------------------------------------------------------
def version_of(path: Path, suffix: str) -> int | None:
    """The version of a ``<V>.<token><suffix>`` (or ``<V><suffix>``) file, or None for any
    other name."""
    name = path.name
    if not name.endswith(suffix) or name.startswith("."):
        return None
    stem = name[: -len(suffix)].split(".", 1)[0]
    return int(stem) if stem.isdigit() else None


def file(directory: Path, version: int, suffix: str, token: str | None = None) -> Path:
    """The ``suffix`` file (:data:`DELTA` or :data:`SNAPSHOT`) of ``version`` in a partition's
    directory, written by the attempt ``token`` (None: the layout before tokens)."""
    return directory / (f"{version}.{token}{suffix}" if token else f"{version}{suffix}")


def record_path(operator: Path, version: int) -> Path:
    """The commit record of ``version`` of an operator's partitions."""
    return operator / f"{version}{COMMIT}"


def _parse_record(raw: bytes, version: int | None) -> dict[str, str]:
    """A commit record's tokens by partition; ValueError saying what is wrong with it."""
    try:
        doc = json.loads(raw)
        if doc.get("format") != COMMIT_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, not {COMMIT_FORMAT}")
        if version is not None and int(doc["version"]) != version:
            raise ValueError(f"holds version {doc['version']}")
        return {str(p): str(t) for p, t in doc["tokens"].items()}
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"no {exc}") from None


def recorded(operator: Path, version: int) -> dict[str, str] | None:
    """The tokens the commit record of ``version`` names, by partition (None: no record)."""
    try:
        raw = record_path(operator, version).read_bytes()
    except FileNotFoundError:
        return None
    try:
        return _parse_record(raw, version)
    except ValueError as exc:
        raise StateError(
            f"keyed state commit record {record_path(operator, version)} is damaged ({exc}); "
            f"restore the job from a savepoint (srt savepoint list, then srt run "
            f"--from-savepoint <id>)"
        ) from None


def committed(directory: Path, version: int, suffix: str) -> Path | None:
    """The ``suffix`` file of ``version`` that the commit record names for this partition
    (``directory``), if it exists; for a version without a record, the file of the layout
    before tokens, if it exists. None: the version has no committed such file."""
    tokens = recorded(directory.parent, version)
    if tokens is None:
        path = file(directory, version, suffix)
    else:
        tok = tokens.get(directory.name)
        if tok is None:
            return None
        path = file(directory, version, suffix, tok)
    return path if path.exists() else None


def committed_token(directory: Path, version: int) -> str | None:
    """The token of this partition's committed ``version`` ("" for version 0; None when the
    version has no committed delta)."""
    if version <= 0:
        return ""
    tokens = recorded(directory.parent, version)
    if tokens is not None:
        return tokens.get(directory.name)
    return token(file(directory, version, DELTA))


def record(operator: Path, version: int, tokens: Mapping[int, str] | Mapping[str, str]) -> Path:
    """Record ``tokens`` (partition → token) as the committed attempts of ``version``: synced,
    then renamed into place (a batch run again records its own attempts)."""
    operator.mkdir(parents=True, exist_ok=True)
    doc = {
        "format": COMMIT_FORMAT,
        "version": version,
        "tokens": {str(p): t for p, t in tokens.items()},
    }
    return fill_file(
        record_path(operator, version), lambda tmp: tmp.write_bytes(json.dumps(doc).encode())
    )


def versions(directory: Path, suffix: str) -> list[int]:
    """The versions of a partition's committed ``suffix`` files, oldest first."""
    if not directory.is_dir():
        return []
    found = {version_of(p, suffix) for p in directory.iterdir()}
    return sorted(v for v in found if v is not None and committed(directory, v, suffix))


def needs(directory: Path, version: int) -> tuple[list[Path], list[int]]:
    """(the files that rebuild ``version`` of a partition: the newest committed snapshot at
    or below it, then the committed deltas after it, in order; the versions whose committed
    delta is missing). A partition without a directory misses every version."""
    if version <= 0:
        return [], []
    base = max((v for v in versions(directory, SNAPSHOT) if v <= version), default=0)
    base_file = committed(directory, base, SNAPSHOT) if base else None
    files = [base_file] if base_file else []
    missing = []
    for v in range(base + 1, version + 1):
        delta = committed(directory, v, DELTA)
        if delta is None:
            missing.append(v)
        else:
            files.append(delta)
    return files, missing


def records_of(files: Iterable[Path]) -> list[Path]:
    """The commit records that name ``files`` (tokened state files of one or more partitions):
    what a copy of those files (a savepoint, the mirror) must carry with them."""
    out: dict[Path, None] = {}
    for path in files:
        suffix = DELTA if path.name.endswith(DELTA) else SNAPSHOT
        v = version_of(path, suffix)
        if v is not None and path.name != file(path.parent, v, suffix).name:
            out[record_path(path.parent.parent, v)] = None
    return list(out)


def prune_records(operator: Path, parallelism: int) -> None:
    """Remove the commit records older than every state file the operator's partitions still
    hold (their files before were cleaned: nothing reads those versions any more)."""
    oldest = None
    for part in partitions(operator, parallelism):
        for p in part.iterdir() if part.is_dir() else ():
            v = version_of(p, DELTA) or version_of(p, SNAPSHOT)
            if v is not None and (oldest is None or v < oldest):
                oldest = v
    if oldest is None:
        return
    for p in operator.glob(f"*{COMMIT}"):
        v = version_of(p, COMMIT)
        if v is not None and v < oldest:
            p.unlink(missing_ok=True)


@functools.cache
def schema() -> pa.Schema:
    """The columns of every keyed state file: key and value, binary. (pyarrow is imported
    where a file is read or written: what reads a checkpoint's layout alone, as `srt status`
    and `srt savepoint list` do through :mod:`stateful_runtime.checkpoints.layout`, does not
    load it.)"""
    import pyarrow as pa

    return pa.schema([("k", pa.binary()), ("v", pa.binary())])


def write(
    directory: Path, version: int, suffix: str, token: str, batches: Iterable[pa.RecordBatch]
) -> Path:
    """Write ``batches`` as the ``suffix`` file of ``version`` by attempt ``token``: to a
    temporary name, synced, then renamed (read only once a commit record names ``token``)."""
    import pyarrow as pa

    directory.mkdir(parents=True, exist_ok=True)
    columns = schema().with_metadata({"format": FORMAT, "version": str(version), "token": token})

    def fill(tmp: Path) -> None:
        with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, columns) as writer:
            for batch in batches:
                writer.write_batch(batch)

    return fill_file(file(directory, version, suffix, token), fill)


def token(path: Path) -> str | None:
    """The token of the task that wrote ``path`` (None if there is no such file)."""
    import pyarrow as pa

    if not path.exists():
        return None
    with read_arrow(path) as f:
        meta = pa.ipc.open_file(f).schema.metadata or {}
    return meta.get(b"token", b"").decode()


def problem(path: Path) -> str | None:
    """What makes a keyed state file or commit record unreadable (a truncated or foreign
    file), or None."""
    import pyarrow as pa

    if path.name.endswith(COMMIT):
        try:
            _parse_record(path.read_bytes(), version_of(path, COMMIT))
        except (ValueError, OSError) as exc:
            return f"not a readable commit record ({exc})"
        return None
    try:
        with read_arrow(path) as source:
            reader = pa.ipc.open_file(source)
            if not reader.schema.equals(schema()):
                return f"not a keyed state file (columns {reader.schema.names})"
            meta = reader.schema.metadata or {}
            if meta.get(b"format") not in (
                *(f.encode() for f in _SAME_ROWS),
                PREVIOUS_FORMAT.encode(),
            ):
                return f"format {meta.get(b'format')!r}, not {FORMAT}"
            if version_of(path, path.suffix) not in (None, int(meta.get(b"version", b"-1"))):
                return f"holds version {meta.get(b'version', b'?').decode()}"
            for i in range(reader.num_record_batches):
                reader.get_batch(i).validate(full=True)
    except (pa.ArrowInvalid, OSError, ValueError) as exc:
        return f"not a readable Arrow file ({exc})"
    return None


def rows(
    path: Path, current: Callable[[bytes], bytes | None] | None = None
) -> Iterator[tuple[list[bytes], list[bytes | None]]]:
    """The rows of one file, a record batch at a time: (keys, values; None deletes, and a
    delta's :func:`timers_fired` rows, each before the rows it may precede), in this
    layout. A file of the previous layout is turned into this one's rows as it is read: a
    state row merges into its key's row as ``current`` holds it (the rows applied so far;
    apply each batch before reading the next)."""
    import pyarrow as pa

    try:
        with read_arrow(path) as source:
            reader = pa.ipc.open_file(source)
            previous = (reader.schema.metadata or {}).get(b"format") == PREVIOUS_FORMAT.encode()
            for i in range(reader.num_record_batches):
                batch = reader.get_batch(i)
                keys, values = batch.column(0).to_pylist(), batch.column(1).to_pylist()
                if previous:
                    keys, values = _upgrade(keys, values, current or (lambda _: None))
                yield keys, values
    except (pa.ArrowInvalid, OSError) as exc:
        raise StateError(
            f"keyed state file {path} cannot be read ({exc}); restore the job from a "
            f"savepoint (srt savepoint list, then srt run --from-savepoint <id>)"
        ) from None


def _upgrade(
    keys: list[bytes], values: list[bytes | None], current: Callable[[bytes], bytes | None]
) -> tuple[list[bytes], list[bytes | None]]:
    """Rows of the previous layout as this layout's: each ``<group> s <name> \\0 <key>`` row
    set (or removed) in its key's row, as ``current`` holds it; other rows as they are."""
    out_keys: list[bytes] = []
    out_values: list[bytes | None] = []
    merged: dict[bytes, dict[str, Any]] = {}
    for k, v in zip(keys, values, strict=True):
        if k[GROUP_BYTES : GROUP_BYTES + 1] != _PREVIOUS_STATE_ROW:
            out_keys.append(k)
            out_values.append(v)
            continue
        name, _, key = k[GROUP_BYTES + 1 :].partition(b"\x00")
        row = k[:GROUP_BYTES] + STATE_ROW + key
        states = merged.get(row)
        if states is None:
            raw = current(row)
            states = merged[row] = {} if raw is None else decode_states(raw)
        if v is None:
            states.pop(name.decode(), None)
        else:
            states[name.decode()] = pickle.loads(v)
    for row, states in merged.items():
        out_keys.append(row)
        out_values.append(encode_states(states))
    return out_keys, out_values


def state_at(
    directory: Path, version: int, groups: Iterable[int] | None = None
) -> dict[bytes, bytes]:
    """Every row of a partition at ``version`` (of ``groups`` only, when given), rebuilt from
    its checkpoint files. Raises :class:`StateError` when a file it needs is missing or
    unreadable."""
    files, missing = needs(directory, version)
    if missing:
        raise StateError(
            f"keyed state {directory} cannot be rebuilt at version {version}: the changes of "
            f"version(s) {missing[:5]} are missing; restore the job from a savepoint "
            f"(srt savepoint list, then srt run --from-savepoint <id>)"
        )
    wanted = None if groups is None else {group_prefix(g) for g in groups}
    out: dict[bytes, bytes] = {}
    timers: dict[bytes, set[bytes]] = {}  # each group's timer rows in ``out``, for the ranges
    for path in files:
        for keys, values in rows(path, out.get):
            for k, v in zip(keys, values, strict=True):
                if wanted is not None and k[:GROUP_BYTES] not in wanted:
                    continue
                timer = k[GROUP_BYTES : GROUP_BYTES + 1] == TIMER_ROW
                if timer and v is not None and is_timer_range(k):
                    start, stop = timer_range(k, v)
                    gone = {t for t in timers.get(start, ()) if t < stop}
                    for t in gone:
                        del out[t]
                    if gone:
                        timers[start] -= gone
                elif v is None:
                    out.pop(k, None)
                    if timer:
                        timers.get(k[: GROUP_BYTES + 1], set()).discard(k)
                else:
                    out[k] = v
                    if timer:
                        timers.setdefault(k[: GROUP_BYTES + 1], set()).add(k)
    return out


def as_batches(items: dict[bytes, bytes]) -> Iterator[pa.RecordBatch]:
    """Rows as record batches of :func:`schema`, in key order (one, empty, for no rows)."""
    import pyarrow as pa

    keys = sorted(items)
    for start in range(0, max(1, len(keys)), _BATCH_ROWS):
        chunk = keys[start : start + _BATCH_ROWS]
        yield pa.record_batch(
            [pa.array(chunk, pa.binary()), pa.array([items[k] for k in chunk], pa.binary())],
            schema=schema(),
        )


# -- a query's keyed state -----------------------------------------------------------------------
def operators(query_root: Path) -> list[Path]:
    """The keyed state directory of each operator of a query (``keyed/<operator>``), sorted."""
    root = query_root / KEYED_DIR
    return sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []


def partitions(operator: Path, count: int) -> list[Path]:
    """An operator's partition directories below ``count`` (a rescale to fewer partitions
    leaves those above behind, unused), whether or not they exist: every partition commits
    every batch, so a missing one is a damaged checkpoint, which :func:`needs` reports."""
    return [operator / str(p) for p in range(count)]


_STAGED = ".rescale"


def rescale(query_root: Path, old: int, new: int, version: int, into: int) -> list[Path]:
    """Give every keyed operator of a query ``new`` partitions: partition ``p``'s key groups
    (:func:`key_groups`) at ``version``, selected by prefix from the ``old`` partitions that held
    them, become its snapshot of version ``into`` — staged, read by nobody until
    :func:`publish` (after Spark committed its redistribution batch). Returns the staged
    files.

    Both ranges ascend, so the old partitions a new one draws from follow each other, and one
    that straddles two new partitions is the last one read: each old partition is rebuilt
    once, and one at a time is in memory."""
    staged: list[Path] = []
    stamp = uuid.uuid4().hex
    try:
        for op in operators(query_root):
            staged.append(record(op / _STAGED, into, dict.fromkeys(range(new), stamp)))
            last: dict[int, dict[bytes, bytes]] = {}

            def rebuilt(q: int, op: Path = op, last: dict = last) -> dict[bytes, bytes]:
                if q not in last:
                    last.clear()
                    last[q] = state_at(op / str(q), version)
                return last[q]

            def drawn(p: int, rebuilt: Callable = rebuilt) -> Iterator[pa.RecordBatch]:
                mine = key_groups(p, new)
                for q in range(old):
                    theirs = key_groups(q, old)
                    overlap = range(max(mine.start, theirs.start), min(mine.stop, theirs.stop))
                    if overlap:
                        wanted = {group_prefix(g) for g in overlap}
                        rows = rebuilt(q)
                        yield from as_batches(
                            {k: v for k, v in rows.items() if k[:GROUP_BYTES] in wanted}
                        )

            for p in range(new):
                staged.append(write(op / str(p) / _STAGED, into, SNAPSHOT, stamp, drawn(p)))
    except BaseException:
        discard(staged)
        raise
    return staged


def publish(staged: list[Path]) -> None:
    """Put staged rescale snapshots, then their commit records, in place. A start that finds
    only some in place (a crash half way) sees the others' versions missing and falls back to
    the batch before the rescale, moving these aside (their version is a later one)."""
    for path in sorted(staged, key=lambda p: p.name.endswith(COMMIT)):
        path.replace(path.parent.parent / path.name)  # (a rename; on S3 a copy and a delete)
        with contextlib.suppress(OSError):
            path.parent.rmdir()


def discard(staged: list[Path]) -> None:
    """Remove staged rescale snapshots (the rescale did not commit)."""
    for path in staged:
        path.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            path.parent.rmdir()
