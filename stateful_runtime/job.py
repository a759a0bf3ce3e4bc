"""A streaming job: its name, checkpointing, parallelism, sources and sinks.

A job file is a Python module with ``DEFAULTS`` (every configurable key and its default) and
``build(config) -> StreamJob``; :mod:`stateful_runtime.runtime.loader` loads it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from stateful_runtime.connectors.base import Source
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.names import check_name
from stateful_runtime.streams import DataStream, SinkNode, SourceNode
from stateful_runtime.watermarks import WatermarkStrategy

# Units a numeric config key's name may end in (its value is a duration in that unit), and the
# longest duration each accepts (about 30 years: beyond it timedelta overflows, and it is a typo).
DURATION_UNITS: Mapping[str, tuple[str, float]] = {
    "_ms": ("milliseconds", 1e12),
    "_s": ("seconds", 1e9),
    "_seconds": ("seconds", 1e9),
    "_minutes": ("minutes", 1e9 / 60),
    "_hours": ("hours", 1e9 / 3600),
    "_days": ("days", 1e9 / 86400),
}
# Numeric keys that count something (never below 0) besides durations.
_COUNT_WORDS = ("parallelism", "partitions", "max_", "threshold", "limit", "retries")


def check_number(key: str, value: Any) -> Any:
    """A numeric config value as the job may use it: finite, and for a duration (a key ending
    in a unit: ``_s``, ``_ms``...) or a count (``parallelism``, ``..._partitions``,
    ``max_...``) at least 0 and below an overflow. :class:`ConfigError` in the key's own units
    otherwise; other values pass unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    unit = next((u for suffix, u in DURATION_UNITS.items() if key.endswith(suffix)), None)
    if unit is not None:
        name, most = unit
        if not math.isfinite(value) or not 0 <= value <= most:
            raise ConfigError(
                f"{key}={value!r}: a duration in {name} must be a finite number from 0 to "
                f"{most:g} {name}; give e.g. {key}=2"
            )
        return value
    if not math.isfinite(value):
        raise ConfigError(f"{key}={value!r}: give a finite number")
    if value < 0 and any(w in key for w in _COUNT_WORDS):
        raise ConfigError(f"{key}={value!r}: a count cannot be negative; give 0 or more")
    if value < 1 and "max_records" in key:  # a batch of at most 0 records never moves on
        raise ConfigError(f"{key}={value!r}: a batch must take at least 1 record; give 1 or more")
    return value


def seconds(key: str, value: Any) -> timedelta:
    """A duration config value in seconds (``checkpoint.interval_s``) as a timedelta;
    :class:`ConfigError` in seconds for a non-number, NaN, infinity or a negative."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{key}={value!r}: give a number of seconds, e.g. {key}=2")
    return timedelta(seconds=check_number(key if key.endswith("_s") else f"{key}_s", value))


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often a job checkpoints.

    Every micro-batch is a checkpoint: Spark writes the batch's source offsets, then its state
    (RocksDB, changelog checkpointing) and then a commit marker, all under ``dir``. ``interval``
    is the micro-batch trigger interval, so it is also the checkpoint interval.
    """

    dir: str
    interval: timedelta = timedelta(seconds=5)
    # After each committed batch, upload what it added here (a directory or s3://bucket/prefix)
    # so the job can come back on an empty disk (``srt run --restore-from``).
    mirror: str | None = None
    # Where `srt savepoint create` writes by default (None: $SRT_HOME/savepoints).
    savepoint_dir: str | None = None
    # Where the control endpoint may write a savepoint a request names (empty: any absolute
    # directory or s3:// URL): absolute directories or s3://bucket/prefix.
    savepoint_roots: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.dir:
            raise ConfigError("checkpoint dir must be set (checkpoint.dir)")
        if not isinstance(self.interval, timedelta) or self.interval < timedelta(0):
            shown = (
                f"{self.interval.total_seconds():g} s"
                if isinstance(self.interval, timedelta)
                else repr(self.interval)
            )
            raise ConfigError(
                f"checkpoint interval must be 0 s or more (checkpoint.interval_s), got {shown}"
            )
        if self.mirror and str(self.dir).startswith("s3://"):
            raise ConfigError(
                f"checkpoint.mirror copies a checkpoint on a disk to durable storage; the "
                f"checkpoint {self.dir} is on S3 already: drop checkpoint.mirror (savepoints, "
                f"`srt savepoint create`, copy it elsewhere)"
            )
        for root in self.savepoint_roots:
            if not (root.startswith("s3://") or root.startswith("/")):
                raise ConfigError(
                    f"savepoint.roots: {root!r} is not absolute; give absolute directories or "
                    f"s3://bucket/prefix, comma-separated"
                )


DEAD_LETTER, FAIL = "dead_letter", "fail"


@dataclass(frozen=True)
class ErrorPolicy:
    """What a step does with a record its user function cannot process (it raised, or
    returned what the step's output cannot hold): Kafka Connect's ``errors.tolerance``.

    With ``dead_letter`` (the default) the record goes to the source's dead-letter topic with
    the step and the reason, and the rest of its batch commits. With ``fail`` the batch fails
    and the job stops, naming the record's source, partition and offset and the
    ``srt run --skip`` command that passes it. A step that rejects ``max_consecutive``
    records in a row, or more than ``max_fraction`` of a task's records in a batch (once it
    rejected ``min_rejects``), stops the job as ``fail`` does: a function that fails for every
    record is a bug to fix, not a stream of dead letters.

    Job-file keys: ``errors.policy``, ``errors.max_consecutive``, ``errors.max_fraction``.
    """

    policy: str = DEAD_LETTER
    max_consecutive: int = 100
    max_fraction: float = 0.1
    min_rejects: int = 10

    def __post_init__(self) -> None:
        if self.policy not in (DEAD_LETTER, FAIL):
            raise ConfigError(
                f"errors.policy={self.policy!r}: give {DEAD_LETTER!r} (a record a step cannot "
                f"process goes to the dead-letter topic) or {FAIL!r} (the job stops)"
            )
        if isinstance(self.max_consecutive, bool) or not isinstance(self.max_consecutive, int):
            raise ConfigError(
                f"errors.max_consecutive={self.max_consecutive!r}: give a whole number, e.g. 100"
            )
        if self.max_consecutive < 1:
            raise ConfigError(
                f"errors.max_consecutive={self.max_consecutive}: give 1 or more (records in a "
                f"row a step may reject before the job stops)"
            )
        fraction = self.max_fraction
        if isinstance(fraction, bool) or not isinstance(fraction, int | float):
            raise ConfigError(f"errors.max_fraction={fraction!r}: give a number from 0 to 1")
        if not (math.isfinite(fraction) and 0 <= fraction <= 1):
            raise ConfigError(
                f"errors.max_fraction={fraction!r}: give a number from 0 to 1 (the share of a "
                f"task's records in a batch a step may reject; 1: no bound)"
            )

    @classmethod
    def from_config(cls, config: Mapping[str, Any], base: ErrorPolicy | None = None) -> ErrorPolicy:
        """The policy from the ``errors.*`` keys set in ``config`` (others from ``base``)."""
        base = base or cls()
        policy = str(config.get("errors.policy") or base.policy).strip()
        consecutive = _number("errors.max_consecutive", config, base.max_consecutive, int)
        fraction = _number("errors.max_fraction", config, base.max_fraction, float)
        return cls(policy, consecutive, fraction, base.min_rejects)


def _machine() -> tuple[int, int]:
    """Physical memory (MiB) and cores of this machine."""
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return pages // (1 << 20), os.cpu_count() or 1


def _default_block_cache_mb() -> int:
    """The seeds' production block cache (256 MiB; RocksDB's own 8 MiB is far too small), at
    most an eighth of the memory per core: a local master runs a Python worker per core."""
    memory_mb, cores = _machine()
    return max(8, min(256, memory_mb // (8 * cores)))


@dataclass(frozen=True)
class RocksDBMemory:
    """The memory of the RocksDB that keeps keyed state in each Python worker, in MiB: the
    block cache (one per worker, shared by the
    stores it opens, index and filter blocks charged to it) and the memtables (each of
    ``write_buffer_mb``, at most ``write_buffers`` before writes wait for a flush). A worker's
    RocksDB holds at most :attr:`bound_mb`; state larger than that lives on disk.

    Job-file keys: ``state.rocksdb.block_cache_mb``, ``state.rocksdb.write_buffer_mb``,
    ``state.rocksdb.write_buffers``. Defaults (:meth:`default`): the seeds' figures (block cache
    256 MiB, memtables 64 MiB × 2), smaller on a machine with less than 2 GiB a core.
    """

    block_cache_mb: int
    write_buffer_mb: int = 64
    write_buffers: int = 2

    def __post_init__(self) -> None:
        memory_mb, _ = _machine()
        for key, value, least, what in (
            (BLOCK_CACHE_KEY, self.block_cache_mb, 1, "MiB of block cache per Python worker"),
            (WRITE_BUFFER_KEY, self.write_buffer_mb, 1, "MiB per memtable"),
            (WRITE_BUFFERS_KEY, self.write_buffers, 2, "memtables: one fills while one flushes"),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ConfigError(
                    f"{key}={value!r}: give a whole number of {least} or more ({what})"
                )
        if self.bound_mb > memory_mb:
            raise ConfigError(
                f"{BLOCK_CACHE_KEY}={self.block_cache_mb} with {WRITE_BUFFER_KEY}="
                f"{self.write_buffer_mb} x {WRITE_BUFFERS_KEY}={self.write_buffers}: "
                f"{self.bound_mb:,} MiB per Python worker, more than this machine's "
                f"{memory_mb:,} MiB; give smaller values"
            )

    @property
    def bound_mb(self) -> int:
        """The most a worker's RocksDB holds in memory: block cache plus memtables (MiB)."""
        return self.block_cache_mb + self.write_buffer_mb * self.write_buffers

    @classmethod
    def default(cls) -> RocksDBMemory:
        cache = _default_block_cache_mb()
        return cls(cache, min(64, max(4, cache // 4)), 2)

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], base: RocksDBMemory | None = None
    ) -> RocksDBMemory:
        """The settings from the ``state.rocksdb.*`` keys set in ``config`` (others from
        ``base``, else :meth:`default`)."""
        base = base or cls.default()
        return cls(
            _number(BLOCK_CACHE_KEY, config, base.block_cache_mb, int),
            _number(WRITE_BUFFER_KEY, config, base.write_buffer_mb, int),
            _number(WRITE_BUFFERS_KEY, config, base.write_buffers, int),
        )

    def describe(self) -> str:
        return (
            f"block cache {self.block_cache_mb} MiB, memtables {self.write_buffer_mb} MiB x "
            f"{self.write_buffers}: at most {self.bound_mb} MiB per Python worker"
        )


BLOCK_CACHE_KEY = "state.rocksdb.block_cache_mb"
WRITE_BUFFER_KEY = "state.rocksdb.write_buffer_mb"
WRITE_BUFFERS_KEY = "state.rocksdb.write_buffers"
ROCKSDB_KEYS = (BLOCK_CACHE_KEY, WRITE_BUFFER_KEY, WRITE_BUFFERS_KEY)


def _number(key: str, config: Mapping[str, Any], default: Any, kind: type) -> Any:
    raw = config.get(key)
    if raw is None or raw == "":
        return default
    try:
        value = kind(raw)
    except (TypeError, ValueError):
        what = "a whole number" if kind is int else "a number"
        raise ConfigError(f"{key}={raw!r}: give {what}, e.g. {key}={default}") from None
    if kind is int and isinstance(raw, float) and raw != value:
        raise ConfigError(f"{key}={raw!r}: give a whole number, e.g. {key}={default}")
    return value


@dataclass
class StreamJob:
    """Flink's execution environment + job: build the graph, then ``srt run`` the file.

    Args:
        name: stable job name; the checkpoint directory is bound to it.
        checkpoint: checkpoint directory and interval.
        parallelism: number of state partitions (Spark shuffle partitions). Fixed by the first
            run of a checkpoint; change it through a savepoint.
        errors: what a step does with a record its user function cannot process
            (:class:`ErrorPolicy`; job-file keys ``errors.*``).
        rocksdb: the memory of the keyed state's RocksDB in each Python worker
            (:class:`RocksDBMemory`; job-file keys ``state.rocksdb.*``).
    """

    name: str
    checkpoint: CheckpointConfig
    parallelism: int = 4
    errors: ErrorPolicy = field(default_factory=ErrorPolicy)
    sinks: list[SinkNode] = field(default_factory=list)
    sources: list[SourceNode] = field(default_factory=list)
    rocksdb: RocksDBMemory = field(default_factory=RocksDBMemory.default)

    def __post_init__(self) -> None:
        self.name = check_name("job", self.name)
        if self.parallelism < 1:
            raise ConfigError(f"parallelism must be >= 1, got {self.parallelism}")

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> StreamJob:
        """A job from the standard job-file keys ``checkpoint.dir``, ``checkpoint.interval_s``
        (seconds), ``parallelism`` (optional, default 4) and the :data:`RUNTIME_KEYS` every job
        file accepts (``checkpoint.mirror``, ``savepoint.dir``, ``savepoint.roots``)."""
        roots = str(config.get("savepoint.roots") or "")
        check_state_backend(str(config.get("state.backend") or ""))
        return cls(
            name,
            CheckpointConfig(
                config["checkpoint.dir"],
                seconds("checkpoint.interval_s", config.get("checkpoint.interval_s", 5.0)),
                mirror=config.get("checkpoint.mirror") or None,
                savepoint_dir=config.get("savepoint.dir") or None,
                savepoint_roots=tuple(r.strip() for r in roots.split(",") if r.strip()),
            ),
            parallelism=config.get("parallelism", 4),
            errors=ErrorPolicy.from_config(config),
            rocksdb=RocksDBMemory.from_config(config),
        )

    def from_source(self, source: Source, watermark: WatermarkStrategy, name: str) -> DataStream:
        if not isinstance(source, Source):
            raise ConfigError(f"from_source takes a Source, got {type(source).__name__}")
        if watermark.timestamp_field is None:
            raise ConfigError(
                f"source {name!r}: the watermark strategy needs a timestamp field: "
                f"WatermarkStrategy...with_timestamp_field('ts_ms')"
            )
        node = SourceNode(source, watermark, check_name("source", name))
        self.sources.append(node)
        return DataStream(self, node)

    def _add_sink(self, node: SinkNode) -> None:
        if any(s.name == node.name for s in self.sinks):
            raise ConfigError(f"two sinks are named {node.name!r}; give each sink_to a name")
        self.sinks.append(node)

    def apply_event_time_settings(self, config: Mapping[str, Any]) -> None:
        """Apply the ``event_time.*`` keys of ``config`` (:data:`EVENT_TIME_KEYS`) to the
        sources' event-time policies: ``event_time.<setting>`` to every source,
        ``event_time.<source>.<setting>`` to one (it wins). ``""`` keeps what the job file
        set; ``off`` switches a bound off."""
        names = {s.name for s in self.sources}
        per_source: dict[str | None, dict[str, Any]] = {}
        for key, raw in config.items():
            if not key.startswith(EVENT_TIME_PREFIX) or raw in ("", None):
                continue
            rest = key[len(EVENT_TIME_PREFIX) :]
            source, _, setting = rest.rpartition(".")
            if setting not in EVENT_TIME_KEYS:
                continue  # the loader refused unknown keys already
            if source and source not in names:
                raise ConfigError(
                    f"{key}: job {self.name!r} has no source {source!r}; its sources: "
                    f"{', '.join(sorted(names)) or '(none)'}"
                )
            attr, value = _event_time_setting(key, setting, raw)
            per_source.setdefault(source or None, {})[attr] = value
        for node in self.sources:
            given = {**per_source.get(None, {}), **per_source.get(node.name, {})}
            if given:
                wm = node.watermark
                # SourceNode is frozen for the graph's sake; its nodes hold it by reference.
                object.__setattr__(
                    node,
                    "watermark",
                    replace(wm, event_time_policy=replace(wm.event_time_policy, **given)),
                )


EVENT_TIME_PREFIX = "event_time."
# The event-time policy's settings as job-file keys (``event_time.<key>`` for every source,
# ``event_time.<source>.<key>`` for one) → the EventTimePolicy attribute.
EVENT_TIME_KEYS: Mapping[str, str] = {
    "floor": "floor",
    "max_ahead_s": "max_ahead_of_processing_time",
    "max_ahead_of_watermark_s": "max_ahead_of_watermark",
    "max_ahead_of_stream_s": "max_ahead_of_stream",
}


def _event_time_setting(key: str, setting: str, raw: Any) -> tuple[str, Any]:
    """(EventTimePolicy attribute, value) of one ``event_time.*`` key's value."""
    attr = EVENT_TIME_KEYS[setting]
    text = str(raw).strip()
    if text.lower() in ("off", "none"):
        return attr, None
    if setting == "floor":
        try:
            t = datetime.fromisoformat(text)
        except ValueError:
            raise ConfigError(
                f"{key}={text!r}: give an ISO-8601 instant (e.g. {key}=2020-01-01T00:00:00Z; "
                f"no zone means UTC) or {key}=off"
            ) from None
        return attr, t if t.tzinfo else t.replace(tzinfo=UTC)
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(
            f"{key}={text!r}: give a number of seconds (e.g. {key}=3600) or off"
        ) from None
    return attr, seconds(key, value)


def is_event_time_key(key: str) -> bool:
    """Whether ``key`` names an event-time setting (``event_time.[<source>.]<setting>``)."""
    return key.startswith(EVENT_TIME_PREFIX) and key.rpartition(".")[2] in EVENT_TIME_KEYS


# The one engine's name, which state.backend may still give (the setting chose between two).
ENGINE = "rocksdb_local"


def check_state_backend(value: str) -> None:
    """``state.backend``, kept so that the job files and commands of the two engines' time say
    what became of them: empty or ``rocksdb_local`` (the one engine) run; ``spark``, removed,
    is refused with where its state went; anything else is refused."""
    if value in ("", ENGINE):
        return
    if value == "spark":
        raise ConfigError(
            "state.backend=spark was removed: keyed state lives in a RocksDB in each Python "
            "worker, always. Drop the setting from the job file and the command; a checkpoint "
            "or savepoint it wrote is moved into the worker's RocksDB when the job starts "
            "(docs/savepoints.md, 'State of the removed spark backend')"
        )
    raise ConfigError(
        f"state.backend={value!r}: keyed state lives in a RocksDB in each Python worker, the "
        f"one engine; drop the setting (or give state.backend={ENGINE})"
    )


# Keys every job file accepts with --set, whatever its DEFAULTS say ("" = not set).
RUNTIME_KEYS: Mapping[str, Any] = {
    "state.backend": "",
    **dict.fromkeys(ROCKSDB_KEYS, ""),
    "checkpoint.mirror": "",
    "savepoint.dir": "",
    "savepoint.roots": "",
    "errors.policy": "",
    "errors.max_consecutive": "",
    "errors.max_fraction": "",
    **{f"{EVENT_TIME_PREFIX}{k}": "" for k in EVENT_TIME_KEYS},
}
