"""A streaming job: its name, checkpointing, parallelism, sources and sinks.

A job file is a Python module with ``DEFAULTS`` (every configurable key and its default) and
``build(config) -> StreamJob``; :mod:`stateful_runtime.runtime.loader` loads it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from stateful_runtime.connectors.base import Source
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.names import check_name
from stateful_runtime.streams import DataStream, SinkNode, SourceNode
from stateful_runtime.watermarks import WatermarkStrategy


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

    def __post_init__(self) -> None:
        if not self.dir:
            raise ConfigError("checkpoint dir must be set (checkpoint.dir)")
        if not isinstance(self.interval, timedelta) or self.interval < timedelta(0):
            raise ConfigError(
                f"checkpoint interval must be a timedelta >= 0, got {self.interval!r}"
            )


@dataclass
class StreamJob:
    """Flink's execution environment + job: build the graph, then ``srt run`` the file.

    Args:
        name: stable job name; the checkpoint directory is bound to it.
        checkpoint: checkpoint directory and interval.
        parallelism: number of state partitions (Spark shuffle partitions). Fixed by the first
            run of a checkpoint; change it through a savepoint.
    """

    name: str
    checkpoint: CheckpointConfig
    parallelism: int = 4
    sinks: list[SinkNode] = field(default_factory=list)
    sources: list[SourceNode] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.name = check_name("job", self.name)
        if self.parallelism < 1:
            raise ConfigError(f"parallelism must be >= 1, got {self.parallelism}")

    @classmethod
    def from_config(cls, name: str, config: Mapping[str, Any]) -> StreamJob:
        """A job from the standard job-file keys ``checkpoint.dir``, ``checkpoint.interval_s``
        (seconds), ``parallelism`` (optional, default 4) and the :data:`RUNTIME_KEYS` every job
        file accepts (``checkpoint.mirror``, ``savepoint.dir``)."""
        return cls(
            name,
            CheckpointConfig(
                config["checkpoint.dir"],
                timedelta(seconds=config.get("checkpoint.interval_s", 5.0)),
                mirror=config.get("checkpoint.mirror") or None,
                savepoint_dir=config.get("savepoint.dir") or None,
            ),
            parallelism=config.get("parallelism", 4),
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


# Keys every job file accepts with --set, whatever its DEFAULTS say ("" = not set).
RUNTIME_KEYS: Mapping[str, Any] = {"checkpoint.mirror": "", "savepoint.dir": ""}
