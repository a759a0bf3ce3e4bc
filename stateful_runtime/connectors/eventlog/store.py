"""The embedded event log: Kafka's contract (topics, partitions, offsets, replay) on RocksDB.

Layout of a log directory::

    <log_dir>/<topic>/topic.json   {"format_version": 1, "topic": ..., "partitions": N,
                                    "key": {"field": F, "type": "str" | "int"} (a keyed topic),
                                    "schema": Spark StructType JSON (a topic with a schema)}
    <log_dir>/<topic>/store/       one RocksDB database holding every partition

Keys in the store (all big-endian so that byte order is offset order):

    b"r" + partition:u32 + offset:u64  -> record (see ``_encode``)
    b"c" + partition:u32 + offset:u64  -> a topic with a schema: the records of that partition
                                          from that offset on, parsed (an Arrow record batch)
    b"e" + partition:u32               -> next offset of the partition (its end offset)
    b"p" + producer id (utf-8)         -> last sequence appended by that idempotent producer
    b"m"                               -> {"partitions": N} as created (checked against
                                          topic.json, so an edited count is refused)

Durability: one ``append`` call is one RocksDB WriteBatch: records, end offsets and the producer
sequence land together or not at all. The WAL is written before ``append`` returns, so a
``kill -9`` of the writer loses nothing that ``append`` acknowledged. With ``fsync=True`` the WAL
is also fsynced per call, which survives power loss too (~ one disk flush per call).

Keyed topics. A topic whose first append was keyed by a JSON field (``srt log append
--key-field F``, :meth:`TopicWriter.key_by`) places each record as a job keyed by ``F`` places its
state: in the partition that owns the key's key group (``pmod(hash(key), 128)`` with Spark's
hash of the key as the job's schema types it, partition ``p`` of ``N`` owning the groups ``g``
with ``g * N // 128 == p``; :func:`key_partition`). A job keyed by ``F`` with ``N`` state
partitions then reads, decodes and runs its keyed operator in one task per partition, without a
shuffle (``runtime/dataframes.py``). Every later append must be keyed by ``F``; other topics
place records by :func:`partition_for`.

Topics with a schema. A topic created with a record schema (``srt log create --schema``,
:meth:`EventLog.create_topic`) stores each append decoded as well as byte for byte: the values
of each partition parsed once, at append, into typed Arrow columns and the reason each record
that does not fit is refused (``formats.json.parse_json``), one Arrow record batch per partition
and append (at most :data:`BLOCK_ROWS` rows), in the append's WriteBatch. A job whose source
declares the same fields and types reads those columns (:meth:`TopicReader.read_parsed`) and
parses no JSON; its required fields and event time are judged at read as before, so a record
gets the same verdict and reason either way. The schema is fixed at creation: every record of
the topic has its columns.

Concurrency: one writer process per topic (RocksDB's lock); any number of readers in other
processes, each a RocksDB *secondary* instance that tails the writer's WAL on ``catch_up``.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import time
import zlib
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.types import StructType
from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from stateful_runtime._process import process_dir
from stateful_runtime.exceptions import (
    CorruptLogError,
    LogError,
    LogWriteError,
    LogWriterBusyError,
    TopicExistsError,
    TopicNotFoundError,
)
from stateful_runtime.names import check_name

FORMAT_VERSION = 1
_META = b"m"
_PART = struct.Struct(">I")
_REC = struct.Struct(">IQ")
_OFF = struct.Struct(">Q")
_HDR = struct.Struct(">qiI")  # timestamp_ms, key length (-1 = no key), headers length
# Above this many distinct header lengths in one read, values are cut one by one in Python.
_BULK_CUTS = 8
# Below this many records too: the bulk cut's numpy and Arrow calls cost more than a slice
# each.
_BULK_MIN = 256
# Rows per stored block of parsed records (a topic with a schema): one Arrow batch of the read.
BLOCK_ROWS = 65_536


@dataclass(frozen=True)
class Record:
    """One record of a topic. ``value`` is the raw payload, exactly as appended."""

    value: bytes
    key: bytes | None = None
    timestamp_ms: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    partition: int = -1
    offset: int = -1


@dataclass(frozen=True)
class TopicKey:
    """What a keyed topic's records are placed by: JSON field ``field``, whose values are of
    ``type`` (``str`` or ``int``, the key bytes' form: a string as is, an int as JSON)."""

    field: str
    type: str

    def to_json(self) -> dict[str, str]:
        return {"field": self.field, "type": self.type}


KEY_TYPES = ("str", "int")


@dataclass(frozen=True)
class TopicInfo:
    name: str
    partitions: int
    path: Path
    key: TopicKey | None = None
    schema: StructType | None = None  # a topic with a schema (see the module doc)

    def partition_of(self, key: bytes | None, value: bytes) -> int:
        """The partition an append without one of its own puts a record in: a keyed topic's
        by its key group (:func:`key_partition`), another's by :func:`partition_for`."""
        if self.key is None:
            return partition_for(key, value, self.partitions)
        return key_partition(key, self.key, self.partitions)


def partition_for(key: bytes | None, value: bytes, partitions: int) -> int:
    """Stable partitioner: crc32 of the key (of the value when there is no key) modulo N.

    Stable across processes and Python versions (unlike ``hash()``), so a key always lands in
    the same partition of a topic.
    """
    return zlib.crc32(key if key is not None else value) % partitions


def key_partition(key: bytes | None, topic_key: TopicKey, partitions: int) -> int:
    """The partition of a keyed topic (see the module doc) that owns the key group of ``key``
    (its bytes as appended; None, a record without the field, has a null key, which Spark
    hashes to its seed)."""
    from stateful_runtime.checkpoints.keyed import key_group, owner_of

    value: bytes | int | None = key  # a string's UTF-8 bytes hash as the string does
    if key is not None and topic_key.type == "int":
        try:
            value = int(key)
        except ValueError:  # not an int: the job's decoder dead-letters the record
            value = None
    return owner_of(key_group([value]), partitions)


# An append's records of one partition: their stored bytes and their values.
_Part = tuple[list[bytes], list[bytes]]


def _parts(info: TopicInfo) -> list[_Part]:
    return [([], []) for _ in range(info.partitions)]


def _placer(info: TopicInfo) -> Callable[[bytes | None, bytes], int]:
    """:meth:`TopicInfo.partition_of` for one append (a keyed topic's once per key: a hash in
    Python)."""
    if info.key is None:
        n = info.partitions
        return lambda key, value: partition_for(key, value, n)
    placed: dict[bytes | None, int] = {}

    def place(key: bytes | None, value: bytes) -> int:
        p = placed.get(key, -1)
        if p < 0:
            p = placed[key] = info.partition_of(key, value)
        return p

    return place


_RECORD_KEY = np.dtype([("tag", "S1"), ("partition", ">u4"), ("offset", ">u8")])


def _record_keys(partition: int, first: int, n: int) -> list[bytes]:
    """The row keys of ``n`` records of ``partition`` from offset ``first``: ``r`` and
    :data:`_REC` (built in numpy: 0.12 µs a key against 0.25 for a ``pack`` each)."""
    keys = np.empty(n, _RECORD_KEY)
    keys["tag"] = b"r"
    keys["partition"] = partition
    keys["offset"] = np.arange(first, first + n, dtype=np.uint64)
    raw, size = keys.tobytes(), _RECORD_KEY.itemsize  # (a view as ``S13`` drops trailing NULs)
    return [raw[i : i + size] for i in range(0, n * size, size)]


def _encode(rec: Record, now_ms: int) -> bytes:
    headers = json.dumps(rec.headers, separators=(",", ":")).encode() if rec.headers else b""
    return _encode_raw(rec.key, rec.value, rec.timestamp_ms or now_ms, headers)


def _encode_raw(key: bytes | None, value: bytes, timestamp_ms: int, headers: bytes = b"") -> bytes:
    """A record's stored form: header (timestamp, key length or -1, headers length), key,
    headers, value."""
    klen = -1 if key is None else len(key)
    return b"".join((_HDR.pack(timestamp_ms, klen, len(headers)), key or b"", headers, value))


def _decode(raw: bytes, partition: int, offset: int) -> Record:
    ts, klen, hlen = _HDR.unpack_from(raw)
    pos = _HDR.size
    key = None
    if klen >= 0:
        key = raw[pos : pos + klen]
        pos += klen
    headers = json.loads(raw[pos : pos + hlen]) if hlen else {}
    pos += hlen
    return Record(raw[pos:], key, ts, headers, partition, offset)


def _values_of(raws: list[bytes]) -> pa.Array | None:
    """The values of stored records (:func:`_encode_raw`'s form) as one ``large_binary``
    array, or None if a record is shorter than a header. The headers are cut in bulk: key and
    headers lengths read with numpy, then one Arrow slice per distinct header length (one
    when the records' keys have one length; 0.07 µs a record with the join the decoder does,
    against 0.16 µs for a Python slice each and ``b"\\n".join``)."""
    if len(raws) < _BULK_MIN:
        if any(len(raw) < _HDR.size for raw in raws):
            return None
        return pa.array([raw[_skip(raw) :] for raw in raws], pa.large_binary())
    arr = pa.array(raws, pa.large_binary())
    n = len(arr)
    offsets = np.frombuffer(arr.buffers()[1], np.int64, n + 1)
    if int(np.diff(offsets).min()) < _HDR.size:
        return None
    data = np.frombuffer(arr.buffers()[2], np.uint8)
    lengths = data[offsets[:-1, None] + np.arange(8, _HDR.size)]  # key, headers: 4 bytes each
    klen = lengths[:, :4].copy().view(">i4")[:, 0]
    hlen = lengths[:, 4:].copy().view(">u4")[:, 0]
    skip = _HDR.size + np.maximum(klen, 0).astype(np.int64) + hlen.astype(np.int64)
    cuts = np.unique(skip)
    if len(cuts) > _BULK_CUTS:  # keys of many lengths: a slice each
        return pa.array(
            [raw[s:] for raw, s in zip(raws, skip.tolist(), strict=True)], pa.large_binary()
        )
    end = int(np.diff(offsets).max())
    parts = [pc.binary_slice(arr, int(c), end) for c in cuts]
    if len(parts) == 1:
        return parts[0]
    return pc.choose(pa.array(np.searchsorted(cuts, skip).astype(np.int8)), *parts)


def _skip(raw: bytes) -> int:
    """Where a stored record's value starts (its header, key and headers before it)."""
    _, klen, hlen = _HDR.unpack_from(raw)
    return int(_HDR.size + max(klen, 0) + hlen)


class EventLog:
    """A directory of topics. Cheap to construct; opens nothing until asked."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self.log_dir = Path(log_dir)

    def _topic_dir(self, topic: str) -> Path:
        return self.log_dir / check_name("topic", topic)

    def create_topic(
        self,
        topic: str,
        partitions: int,
        *,
        exist_ok: bool = False,
        key: TopicKey | None = None,
        schema: StructType | None = None,
    ) -> TopicInfo:
        """Create ``topic``; with ``schema``, a topic with a schema (see the module doc), whose
        fields must be of types the JSON decoder reads (``formats.json.arrow_schema``)."""
        from stateful_runtime.connectors.formats.json import parsed_schema

        if partitions < 1:
            raise LogError(f"a topic needs at least one partition, got {partitions}")
        if schema is not None:
            parsed_schema(schema)  # raises ConfigError naming a field it cannot decode
        tdir = self._topic_dir(topic)
        meta = tdir / "topic.json"
        if meta.exists():
            info = self.topic(topic)
            if exist_ok and info.partitions == partitions and same_fields(info.schema, schema):
                return info
            if exist_ok and info.partitions == partitions:
                raise LogError(
                    f"topic {topic!r} exists with schema {_shown(info.schema)}, not "
                    f"{_shown(schema)}; a topic's schema is fixed when it is created (create "
                    f"another topic, or leave --schema out to use this one as it is)"
                )
            raise TopicExistsError(str(self.log_dir), topic, info.partitions)
        tdir.mkdir(parents=True, exist_ok=True)
        # Create the store first, then publish topic.json atomically: a crash in between leaves
        # no half-made topic visible.
        db = _open_primary(topic, tdir / "store")
        db[_META] = json.dumps({"partitions": partitions}).encode()
        db.close()
        info = TopicInfo(topic, partitions, tdir, key, schema)
        _write_info(info)
        return info

    def topic(self, topic: str) -> TopicInfo:
        meta = self._topic_dir(topic) / "topic.json"
        try:
            data = json.loads(meta.read_text())
        except FileNotFoundError:
            raise TopicNotFoundError(str(self.log_dir), topic) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptLogError(topic, str(meta), f"topic.json is not JSON ({exc})") from None
        if not isinstance(data, dict):
            raise CorruptLogError(topic, str(meta), "topic.json is not a JSON object")
        if data.get("format_version") != FORMAT_VERSION:
            raise LogError(
                f"topic {topic!r} has log format {data.get('format_version')!r}; this version of "
                f"stateful_runtime reads format {FORMAT_VERSION} only"
            )
        parts = data.get("partitions")
        if (
            data.get("topic") != topic
            or not isinstance(parts, int)
            or isinstance(parts, bool)
            or parts < 1
        ):
            raise CorruptLogError(
                topic,
                str(meta),
                f"topic.json says topic {data.get('topic')!r} with {parts!r} partitions",
            )
        key = data.get("key")
        if key is not None and (
            not isinstance(key, dict)
            or not isinstance(key.get("field"), str)
            or key.get("type") not in KEY_TYPES
        ):
            raise CorruptLogError(topic, str(meta), f"topic.json's key is not one: {key!r}")
        schema = None
        if data.get("schema") is not None:
            try:
                schema = StructType.fromJson(data["schema"])
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise CorruptLogError(
                    topic, str(meta), f"topic.json's schema is not one ({exc!r})"
                ) from None
        return TopicInfo(
            topic,
            parts,
            meta.parent,
            TopicKey(key["field"], key["type"]) if key else None,
            schema,
        )

    def topics(self) -> list[TopicInfo]:
        if not self.log_dir.is_dir():
            return []
        return [
            self.topic(p.name)
            for p in sorted(self.log_dir.iterdir())
            if (p / "topic.json").exists()
        ]

    def writer(self, topic: str, *, fsync: bool = False) -> TopicWriter:
        return TopicWriter(self.topic(topic), fsync=fsync)

    def reader(self, topic: str) -> TopicReader:
        return TopicReader(self.topic(topic))


def _write_info(info: TopicInfo) -> None:
    """Publish ``topic.json`` whole (a reader sees the old or the new one)."""
    data: dict[str, object] = {
        "format_version": FORMAT_VERSION,
        "topic": info.name,
        "partitions": info.partitions,
    }
    if info.key is not None:
        data["key"] = info.key.to_json()
    if info.schema is not None:
        data["schema"] = info.schema.jsonValue()
    tmp = info.path / "topic.json.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, info.path / "topic.json")


def same_fields(a: StructType | None, b: StructType | None) -> bool:
    """Whether two record schemas parse JSON alike: the same field names and types in the same
    order (nullability aside: it is judged after parsing), or both None."""
    if a is None or b is None:
        return a is b
    return [(f.name, f.dataType) for f in a.fields] == [(f.name, f.dataType) for f in b.fields]


def _shown(schema: StructType | None) -> str:
    return "none" if schema is None else f"({schema.simpleString()[7:-1]})"


def _scan(db: Rdict, prefix: bytes) -> dict[bytes, bytes]:
    """Every key with ``prefix`` and its value, through an iterator whose status is checked:
    RocksDB's point ``get`` can answer "absent" for a key in a corrupt block, an iterator
    reports the corruption."""
    out = {}
    it = db.iter()
    it.seek(prefix)
    while it.valid() and it.key().startswith(prefix):
        out[it.key()] = it.value()
        it.next()
    it.status()
    return out


def _check_partitions(db: Rdict, info: TopicInfo) -> None:
    """topic.json's partition count must be the one the store was created with (a store made
    before the count was recorded: no end offset beyond it)."""
    where = str(info.path / "topic.json")
    try:
        meta = _scan(db, _META)
        if meta:
            created = json.loads(meta[_META])["partitions"]
        else:
            ends = [_PART.unpack_from(k, 1)[0] for k in _scan(db, b"e")]
            created = max(ends) + 1 if ends and max(ends) >= info.partitions else None
    except Exception as exc:  # rocksdict raises bare exceptions for corruption
        raise CorruptLogError(info.name, str(info.path / "store"), f"unreadable ({exc})") from None
    if created is not None and created != info.partitions:
        raise CorruptLogError(
            info.name,
            where,
            f"topic.json says {info.partitions} partitions but the store holds {created}; "
            f"put the count back to {created}",
        )


def _open_primary(topic: str, path: Path) -> Rdict:
    opts = Options(raw_mode=True)
    opts.create_if_missing(True)
    try:
        return Rdict(str(path), options=opts)
    except Exception as exc:  # rocksdict raises a bare Exception for the LOCK conflict
        if "lock" in str(exc).lower():
            raise LogWriterBusyError(topic, str(path)) from None
        if "corrupt" in str(exc).lower():
            raise CorruptLogError(topic, str(path), str(exc)) from None
        if "no space left" in str(exc).lower():
            raise LogWriteError(topic, str(path), f"opening the store: {exc}") from None
        raise LogError(f"cannot open topic {topic!r} at {path}: {exc}") from exc


class TopicWriter:
    """The single writer of a topic. Use as a context manager, or call ``close()``."""

    def __init__(self, info: TopicInfo, *, fsync: bool = False) -> None:
        self.info = info
        self._db = _open_primary(info.name, info.path / "store")
        try:
            _check_partitions(self._db, info)
        except CorruptLogError:
            self._db.close()
            raise
        self._wopts = WriteOptions()
        self._wopts.sync = fsync
        self._failed = False
        try:  # through an iterator: a point get may answer "absent" for a damaged block
            ends = _scan(self._db, b"e")
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare exceptions
            self._db.close()
            raise CorruptLogError(
                info.name, str(info.path / "store"), f"end offsets unreadable ({exc})"
            ) from None
        self._ends = [
            _OFF.unpack(ends[b"e" + _PART.pack(p)])[0] if b"e" + _PART.pack(p) in ends else 0
            for p in range(info.partitions)
        ]

    def end_offsets(self) -> dict[int, int]:
        return dict(enumerate(self._ends))

    def key_by(self, key: TopicKey) -> None:
        """Make the topic keyed by ``key`` (see the module doc): only while it holds no record
        (what is in it was placed otherwise); the same key again is no change."""
        if self.info.key == key:
            return
        if self.info.key is not None:
            raise LogError(
                f"topic {self.info.name!r} is keyed by field {self.info.key.field!r} "
                f"({self.info.key.type}); append with --key-field {self.info.key.field}"
            )
        if any(self._ends):
            raise LogError(
                f"topic {self.info.name!r} holds records placed without a key field; it "
                f"cannot become keyed by {key.field!r} (a new topic can)"
            )
        self.info = replace(self.info, key=key)
        _write_info(self.info)

    def producer_sequence(self, producer_id: str) -> int | None:
        """Last sequence number committed by an idempotent producer, or None."""
        raw = self._db.get(b"p" + producer_id.encode())
        return struct.unpack(">q", raw)[0] if raw else None

    def _encoded(self, records: Iterable[Record]) -> list[_Part]:
        """The records by partition (their own, or :meth:`TopicInfo.partition_of`'s): their
        bytes and their values, all stamped with one append time."""
        now_ms = int(time.time() * 1000)
        info = self.info
        parts = _parts(info)
        place = _placer(info)
        for rec in records:
            p = rec.partition if rec.partition >= 0 else place(rec.key, rec.value)
            if p >= len(parts):
                raise LogError(f"partition {p} out of range for topic {info.name!r}")
            raws, values = parts[p]
            raws.append(_encode(rec, now_ms))
            values.append(rec.value)
        return parts

    def append_sequenced(self, records: Iterable[Record], sequences: Mapping[str, int]) -> int:
        """Append records and set several producers' sequences in the same WriteBatch (``srt
        log serve``: one batch holds the lines of several connections, each its own producer).
        The caller has already dropped what a producer's stored sequence covers."""
        return self._write(self._encoded(records), None, None, sequences)

    def append(
        self,
        records: Iterable[Record],
        *,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> int:
        """Append records atomically; returns how many were appended.

        Records with ``partition >= 0`` go to that partition; others are placed by
        :func:`partition_for`. With ``producer_id`` and ``sequence`` the call is idempotent: a
        sequence at or below the producer's last committed one appends nothing and returns 0
        (how a re-executed micro-batch avoids writing its output twice).
        """
        return self._write(self._encoded(records), producer_id, sequence)

    def append_values(
        self,
        values: Sequence[bytes],
        keys: Sequence[bytes | None],
        *,
        producer_id: str | None = None,
        sequence: int | None = None,
    ) -> int:
        """:meth:`append` for records that are a value and a key (or None) and nothing else,
        stamped now and placed by :meth:`TopicInfo.partition_of`: the sinks' path, with no
        :class:`Record` per row (building them took 1.8 µs a row, twice the write itself), and
        records without keys, which share one header, built in one pass."""
        if len(values) != len(keys):
            raise ValueError(f"append_values: {len(values)} values but {len(keys)} keys")
        now_ms = int(time.time() * 1000)
        n_parts = self.info.partitions
        parts = _parts(self.info)
        if self.info.key is not None or any(key is not None for key in keys):
            place = _placer(self.info)
            for value, key in zip(values, keys, strict=True):
                raws, part = parts[place(key, value)]
                raws.append(_encode_raw(key, value, now_ms))
                part.append(value)
        else:
            head = _HDR.pack(now_ms, -1, 0)
            if n_parts == 1:
                parts[0] = ([head + v for v in values], list(values))
            else:
                for value in values:
                    raws, part = parts[zlib.crc32(value) % n_parts]
                    raws.append(head + value)
                    part.append(value)
        return self._write(parts, producer_id, sequence)

    def _write(
        self,
        parts: list[_Part],
        producer_id: str | None,
        sequence: int | None,
        sequences: Mapping[str, int] | None = None,
    ) -> int:
        """One WriteBatch: each partition's encoded records at its end, a topic with a
        schema's parsed blocks of their values, the new ends and the producers' sequences."""
        if (producer_id is None) != (sequence is None):
            raise LogError("append: give producer_id and sequence together, or neither")
        if producer_id is not None:
            last = self.producer_sequence(producer_id)
            if last is not None and sequence is not None and sequence <= last:
                return 0
        ends = list(self._ends)
        batch = WriteBatch(raw_mode=True)
        put, pack = batch.put, _REC.pack
        count = 0
        for p, (raws, _) in enumerate(parts):
            # (map, drained by a zero-length deque: the loop in C, ~0.2 µs a record less)
            deque(map(put, _record_keys(p, ends[p], len(raws)), raws), 0)
            ends[p] += len(raws)
            count += len(raws)
        schema = self.info.schema
        if schema is not None:
            for p, first, block in _blocks([values for _, values in parts], self._ends, schema):
                put(b"c" + pack(p, first), block)
        for p in range(len(parts)):
            if ends[p] != self._ends[p]:
                batch.put(b"e" + _PART.pack(p), _OFF.pack(ends[p]))
        if producer_id is not None:
            batch.put(b"p" + producer_id.encode(), struct.pack(">q", sequence))
        for pid, seq in (sequences or {}).items():
            batch.put(b"p" + pid.encode(), struct.pack(">q", seq))
        if count or producer_id is not None or sequences:
            try:
                self._db.write(batch, self._wopts)
            except Exception as exc:  # noqa: BLE001 - rocksdict raises bare exceptions
                self._failed = True
                raise LogWriteError(self.info.name, str(self.info.path), str(exc)) from None
        self._ends = ends
        return count

    def flush(self) -> None:
        self._db.flush_wal(True)

    def close(self) -> None:
        """Close the store. After a failed write, RocksDB's close repeats that error: it is
        not raised again (the write's :class:`LogWriteError` said it). Otherwise a failing close
        raises :class:`LogWriteError`; what ``append`` acknowledged is in the WAL all the same."""
        if self._db is not None:
            db, self._db = self._db, None  # type: ignore[assignment]
            try:
                db.close()
            except Exception as exc:  # noqa: BLE001 - rocksdict raises bare exceptions
                if not self._failed:
                    raise LogWriteError(
                        self.info.name, str(self.info.path), f"closing the store: {exc}"
                    ) from None

    def __enter__(self) -> TopicWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _blocks(
    values: list[list[bytes]], starts: list[int], schema: StructType
) -> Iterator[tuple[int, int, bytes]]:
    """Each partition's appended values parsed (``formats.json.parse_json``), as stored blocks:
    (partition, first offset, the Arrow record batch's bytes), at most BLOCK_ROWS rows each."""
    from stateful_runtime.connectors.formats.json import parse_json

    for p, part in enumerate(values):
        for lo in range(0, len(part), BLOCK_ROWS):
            parsed = parse_json(part[lo : lo + BLOCK_ROWS], schema).combine_chunks()
            yield p, starts[p] + lo, parsed.to_batches()[0].serialize().to_pybytes()


class TopicReader:
    """Reads a topic while another process may be writing it (a RocksDB secondary instance)."""

    def __init__(self, info: TopicInfo) -> None:
        self.info = info
        store = info.path / "store"
        # The secondary instance's own directory (its info log), removed on close.
        self._secondary = str(process_dir("srt-log-readers"))
        try:
            self._db = Rdict(
                str(store),
                options=Options(raw_mode=True),
                access_type=AccessType.secondary(self._secondary),
            )
        except Exception as exc:
            shutil.rmtree(self._secondary, ignore_errors=True)
            raise LogError(
                f"cannot open topic {info.name!r} for reading at {store}: {exc}"
            ) from exc
        try:
            _check_partitions(self._db, info)
            # A secondary instance that cannot load a damaged table file opens anyway, with an
            # empty view (seen with a corrupt properties block): every topic of ours has its
            # metadata key once anything was written, so an empty view of a written store is
            # damage, not an empty topic.
            if (
                self._db.latest_sequence_number() > 0
                and not _scan(self._db, _META)
                and not _scan(self._db, b"e")
            ):
                raise CorruptLogError(
                    info.name,
                    str(store),
                    f"RocksDB holds {self._db.latest_sequence_number()} "
                    f"writes but none of its table files could be loaded",
                )
        except CorruptLogError:
            self.close()
            raise
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare exceptions
            self.close()
            raise CorruptLogError(info.name, str(store), f"unreadable ({exc})") from None

    def _corrupt(self, exc: BaseException, what: str) -> CorruptLogError:
        return CorruptLogError(
            self.info.name, str(self.info.path / "store"), f"RocksDB error while {what}: {exc}"
        )

    def verify(self) -> dict[int, int]:
        """Read every record of every partition (RocksDB checks each block's checksum) and
        check offsets are dense up to the end offsets; returns the end offsets, or raises
        :class:`CorruptLogError` naming the first damage (``srt log info`` runs it)."""
        ends = self.end_offsets()
        for p, end in ends.items():
            count = 0
            for offset, _ in self._raw(p, 0, end):
                count = offset + 1
            if count != end:
                raise CorruptLogError(
                    self.info.name,
                    str(self.info.path / "store"),
                    f"partition {p} holds {count} records, its end offset says {end}",
                )
        return ends

    def catch_up(self) -> None:
        """See everything the writer has appended so far."""
        self._db.try_catch_up_with_primary()

    def end_offsets(self) -> dict[int, int]:
        try:
            self.catch_up()
            ends = _scan(self._db, b"e")
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare exceptions
            raise self._corrupt(exc, "reading end offsets") from None
        out = {}
        for p in range(self.info.partitions):
            raw = ends.get(b"e" + _PART.pack(p))
            out[p] = _OFF.unpack(raw)[0] if raw else 0
        return out

    def _raw(self, partition: int, start: int, end: int) -> Iterator[tuple[int, bytes]]:
        if start >= end:
            return
        it = self._db.iter()
        it.seek(b"r" + _REC.pack(partition, start))
        upper = b"r" + _REC.pack(partition, end)
        expected = start
        while it.valid():
            key = it.key()
            if key >= upper:
                break
            offset = _REC.unpack_from(key, 1)[1]
            if offset != expected:
                raise CorruptLogError(
                    self.info.name,
                    str(self.info.path / "store"),
                    f"partition {partition}: offset {expected} missing (found {offset})",
                )
            yield offset, it.value()
            expected += 1
            it.next()
        try:
            it.status()
        except Exception as exc:  # noqa: BLE001 - an iterator stops early on a corrupt block
            raise self._corrupt(exc, f"reading partition {partition}") from None
        if expected != end:
            raise LogError(
                f"topic {self.info.name!r} partition {partition}: asked for offsets "
                f"[{start}, {end}) but the log ends at {expected}; was the log directory replaced?"
            )

    def read(self, partition: int, start: int, end: int) -> Iterator[Record]:
        """Records of one partition with ``start <= offset < end``."""
        for offset, raw in self._raw(partition, start, end):
            yield _decode(raw, partition, offset)

    def read_values(self, partition: int, start: int, end: int) -> list[bytes]:
        """The values of ``[start, end)`` as bytes, cut one by one (plan-time alignment reads
        single records; the source's read tasks take :meth:`read_value_array`)."""
        raws = self._scan(partition, start, end)
        self._check_lengths(partition, start, raws)
        return [raw[_skip(raw) :] for raw in raws]

    def read_value_array(self, partition: int, start: int, end: int) -> pa.Array:
        """The values of ``[start, end)`` as one Arrow ``large_binary`` array, the headers cut
        in bulk (:func:`_values_of`): the hot path of the Spark source."""
        raws = self._scan(partition, start, end)
        values = _values_of(raws)
        if values is None:
            self._check_lengths(partition, start, raws)  # raises: a record is short
        assert values is not None
        return values

    def read_parsed(self, partition: int, start: int, end: int) -> pa.Table:
        """A topic with a schema: the records of ``[start, end)`` as parsed at append (the
        topic schema's fields and ``_error``, see ``formats.json.parse_json``), from the stored
        blocks: no JSON is parsed."""
        from stateful_runtime.connectors.formats.json import parsed_schema

        if self.info.schema is None:
            raise LogError(f"topic {self.info.name!r} has no schema: its records are not parsed")
        schema = parsed_schema(self.info.schema)
        if start >= end:
            return schema.empty_table()
        it = self._db.iter()
        it.seek_for_prev(b"c" + _REC.pack(partition, start))
        upper = b"c" + _REC.pack(partition, end)
        batches = []
        at = start  # the first offset not covered yet
        try:
            while it.valid() and at < end:
                key = it.key()
                if key >= upper or key[:1] != b"c":
                    break
                p, first = _REC.unpack_from(key, 1)
                if p == partition:
                    batch = pa.ipc.read_record_batch(pa.py_buffer(it.value()), schema)
                    if first > at or first + batch.num_rows <= at:  # not the block holding `at`
                        break
                    batches.append(batch.slice(at - first, end - at))
                    at = first + batch.num_rows
                it.next()
            it.status()
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare exceptions, Arrow its own
            raise self._corrupt(exc, f"reading partition {partition}'s parsed records") from None
        if at < end:
            raise CorruptLogError(
                self.info.name,
                str(self.info.path / "store"),
                f"partition {partition}: offset {at} has no parsed block (asked for "
                f"[{start}, {end}))",
            )
        return pa.Table.from_batches(batches, schema)

    def _scan(self, partition: int, start: int, end: int) -> list[bytes]:
        """The stored records of ``[start, end)``: one bounded RocksDB iteration in Rust
        (~0.3 µs/record here, against ~3.2 µs stepping an iterator from Python); a gap in the
        offsets shows up as a short count."""
        if start >= end:
            return []
        opts = ReadOptions()
        opts.set_iterate_upper_bound(b"r" + _REC.pack(partition, end))
        # Read once: its blocks would only push others out (~9% faster; rocksdict's stub
        # lacks the argument).
        opts.fill_cache(False)  # type: ignore[call-arg]
        try:
            raws = list(self._db.values(from_key=b"r" + _REC.pack(partition, start), read_opt=opts))
        except Exception as exc:  # noqa: BLE001 - rocksdict raises bare exceptions
            raise self._corrupt(exc, f"reading partition {partition}") from None
        if len(raws) != end - start:
            for _ in self._raw(partition, start, end):  # corruption, or records missing?
                pass
            raise LogError(
                f"topic {self.info.name!r} partition {partition}: asked for offsets "
                f"[{start}, {end}) but found {len(raws)} records; was the log directory replaced?"
            )
        return raws

    def _check_lengths(self, partition: int, start: int, raws: list[bytes]) -> None:
        for i, raw in enumerate(raws):
            if len(raw) < _HDR.size:
                raise CorruptLogError(
                    self.info.name,
                    str(self.info.path / "store"),
                    f"partition {partition} offset {start + i}: a record of {len(raw)} bytes, "
                    f"shorter than a record's header",
                )

    def close(self) -> None:
        self._db.close()
        shutil.rmtree(self._secondary, ignore_errors=True)


_CACHED_READERS: dict[str, TopicReader] = {}


def cached_reader(log_dir: str, topic: str) -> TopicReader:
    """One reader per (log, topic) per process: opening a secondary costs ~0.3 s."""
    key = os.path.join(os.path.abspath(log_dir), topic)
    reader = _CACHED_READERS.get(key)
    if reader is None:
        reader = _CACHED_READERS[key] = EventLog(log_dir).reader(topic)
    return reader
