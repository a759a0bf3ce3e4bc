"""The embedded, durable event log (topics and partitions on RocksDB)."""

from stateful_runtime.connectors.eventlog.store import (
    EventLog,
    Record,
    TopicInfo,
    TopicReader,
    TopicWriter,
    cached_reader,
    partition_for,
)

__all__ = [
    "EventLog",
    "Record",
    "TopicInfo",
    "TopicReader",
    "TopicWriter",
    "cached_reader",
    "partition_for",
]
