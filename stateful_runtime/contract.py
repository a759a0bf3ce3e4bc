"""What the runtime tells programs: the documents of ``srt ... --json`` and the control endpoint.

The runtime builds these objects and writes them with ``to_json()``; a program (Dagster's
``StreamingRuntime``) reads the same documents back with ``from_json()``. Each JSON key is
spelled once, here. Standard library only, so either side imports it without the other's
dependencies.

==========================  ==========================================================
:class:`CheckpointFacts`    what a query's checkpoint says now: last committed batch, its
                            age, the batch in flight, state partitions
:class:`RecordCounts`       where a query's source records went, this run
:class:`QueryHealth`        one query as the job process last reported it
:class:`JobHealth`          ``GET /health`` of the control endpoint
:class:`SavepointRef`       a job's last savepoint, as its registry entry records it
==========================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class CheckpointFacts:
    """What one query's checkpoint says now, read from its files (so it does not go stale when
    the job process hangs, as the process's own health report does).

    Attributes:
        last_committed_batch: the last micro-batch with a commit marker (None: none yet).
        last_commit_time: when that marker was written (epoch seconds).
        checkpoint_age_s: seconds since then, when the facts were read.
        inflight_batch_age_s: seconds the batch after it has been planned (None: none is).
        state_partitions: state partitions at the last committed batch (None: no state).
    """

    last_committed_batch: int | None = None
    last_commit_time: float | None = None
    checkpoint_age_s: float | None = None
    inflight_batch_age_s: float | None = None
    state_partitions: int | None = None

    def committed(self) -> CheckpointFacts:
        """Only the last committed batch and its age: what a health report carries."""
        return CheckpointFacts(self.last_committed_batch, checkpoint_age_s=self.checkpoint_age_s)

    def to_json(self) -> dict[str, Any]:
        return {
            "last_committed_batch": self.last_committed_batch,
            "last_commit_time": self.last_commit_time,
            "checkpoint_age_s": self.checkpoint_age_s,
            "inflight_batch_age_s": self.inflight_batch_age_s,
            "state_partitions": self.state_partitions,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointFacts:
        return cls(
            last_committed_batch=_int(data.get("last_committed_batch")),
            last_commit_time=_float(data.get("last_commit_time")),
            checkpoint_age_s=_float(data.get("checkpoint_age_s")),
            inflight_batch_age_s=_float(data.get("inflight_batch_age_s")),
            state_partitions=_int(data.get("state_partitions")),
        )


@dataclass(frozen=True)
class RecordCounts:
    """Where the records a query read from its source went, this run: ``input`` (read) =
    ``output`` (into the job's operators or sinks) + ``dead_letters`` (rejected, to the
    dead-letter topic) + ``late`` (behind the watermark: dropped and counted, or to a late
    side output).

    Attributes:
        source: the source's name.
        input: records read.
        output: records into the job's operators or sinks.
        dead_letters: records rejected to the dead-letter topic.
        late: records behind the watermark.
    """

    source: str
    input: int = 0
    output: int = 0
    dead_letters: int = 0
    late: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "input": self.input,
            "output": self.output,
            "dead_letters": self.dead_letters,
            "late": self.late,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordCounts:
        return cls(
            source=str(data.get("source")),
            input=int(data.get("input") or 0),
            output=int(data.get("output") or 0),
            dead_letters=int(data.get("dead_letters") or 0),
            late=int(data.get("late") or 0),
        )


@dataclass(frozen=True)
class BatchHealth:
    """A query's last micro-batch, from Spark's progress report of it.

    Attributes:
        last_batch: the batch's id.
        input_rows: records it read.
        input_rows_per_s: the input rate.
        processed_rows_per_s: the processing rate.
        batch_duration_ms: how long the batch took (trigger to commit).
        watermark: the event-time watermark after it (ISO 8601), None for a stateless query.
        state_rows: rows in the state store (every stateful operator).
        state_bytes: memory the state store uses.
        lag_records: records in the source not yet read (None: the source does not say).
        lag_by_partition: the same per source partition.
        updated_at: when the report was read (ISO 8601, UTC).
        late_rows_dropped: records of this batch behind the watermark (dropped, or to a late
            side output), counted one by one.
        late_rows_dropped_this_run: the same, every batch of this run.
    """

    last_batch: int | None
    input_rows: int | None = None
    input_rows_per_s: float | None = None
    processed_rows_per_s: float | None = None
    batch_duration_ms: int | None = None
    watermark: str | None = None
    state_rows: int = 0
    state_bytes: int = 0
    lag_records: int | None = None
    lag_by_partition: Mapping[str, int] | None = None
    updated_at: str | None = None
    late_rows_dropped: int = 0
    late_rows_dropped_this_run: int = 0


@dataclass(frozen=True)
class MirrorHealth:
    """What the checkpoint mirror last uploaded.

    Attributes:
        batch: the query's last batch in the mirror.
        bytes_uploaded: bytes that sync uploaded (every query's).
    """

    batch: int | None
    bytes_uploaded: int


@dataclass(frozen=True)
class QueryHealth:
    """One query as the job process reports it (``srt status``'s ``health``, ``GET /health``).

    Each part is None until the process knows it: ``batch`` until the query's first
    micro-batch, ``checkpoint`` and ``records`` where a report does not carry them, ``mirror``
    without a checkpoint mirror (or before its first upload). On the wire the parts are one flat
    object, and a part that is None leaves its keys out.

    Attributes:
        batch: the last micro-batch.
        checkpoint: the query's checkpoint (only its last committed batch and age are shown).
        records: where the source's records went, this run.
        mirror: the checkpoint mirror's last upload.
    """

    batch: BatchHealth | None = None
    checkpoint: CheckpointFacts | None = None
    records: RecordCounts | None = None
    mirror: MirrorHealth | None = None

    @property
    def last_committed_batch(self) -> int | None:
        return None if self.checkpoint is None else self.checkpoint.last_committed_batch

    @property
    def checkpoint_age_s(self) -> float | None:
        return None if self.checkpoint is None else self.checkpoint.checkpoint_age_s

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        b, c = self.batch, self.checkpoint
        if b is not None:
            out["last_batch"] = b.last_batch
        if c is not None:
            out["last_committed_batch"] = c.last_committed_batch
            out["checkpoint_age_s"] = c.checkpoint_age_s
        if b is not None:
            out.update(
                input_rows=b.input_rows,
                input_rows_per_s=b.input_rows_per_s,
                processed_rows_per_s=b.processed_rows_per_s,
                batch_duration_ms=b.batch_duration_ms,
                watermark=b.watermark,
                state_rows=b.state_rows,
                state_bytes=b.state_bytes,
                lag_records=b.lag_records,
                lag_by_partition=None if b.lag_by_partition is None else dict(b.lag_by_partition),
                updated_at=b.updated_at,
                late_rows_dropped=b.late_rows_dropped,
                late_rows_dropped_this_run=b.late_rows_dropped_this_run,
            )
        if self.records is not None:
            out["records"] = self.records.to_json()
        if self.mirror is not None:
            out["mirror_batch"] = self.mirror.batch
            out["mirror_bytes_uploaded"] = self.mirror.bytes_uploaded
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueryHealth:
        batch = None
        if "last_batch" in data:
            lag = data.get("lag_by_partition")
            batch = BatchHealth(
                last_batch=_int(data.get("last_batch")),
                input_rows=_int(data.get("input_rows")),
                input_rows_per_s=_float(data.get("input_rows_per_s")),
                processed_rows_per_s=_float(data.get("processed_rows_per_s")),
                batch_duration_ms=_int(data.get("batch_duration_ms")),
                watermark=_str(data.get("watermark")),
                state_rows=int(data.get("state_rows") or 0),
                state_bytes=int(data.get("state_bytes") or 0),
                lag_records=_int(data.get("lag_records")),
                lag_by_partition=None if lag is None else {str(p): int(n) for p, n in lag.items()},
                updated_at=_str(data.get("updated_at")),
                late_rows_dropped=int(data.get("late_rows_dropped") or 0),
                late_rows_dropped_this_run=int(data.get("late_rows_dropped_this_run") or 0),
            )
        checkpoint = None
        if "last_committed_batch" in data or "checkpoint_age_s" in data:
            checkpoint = CheckpointFacts(
                last_committed_batch=_int(data.get("last_committed_batch")),
                checkpoint_age_s=_float(data.get("checkpoint_age_s")),
            )
        records = data.get("records")
        mirror = None
        if "mirror_batch" in data or "mirror_bytes_uploaded" in data:
            mirror = MirrorHealth(
                _int(data.get("mirror_batch")), int(data.get("mirror_bytes_uploaded") or 0)
            )
        return cls(
            batch=batch,
            checkpoint=checkpoint,
            records=None if records is None else RecordCounts.from_json(records),
            mirror=mirror,
        )


@dataclass(frozen=True)
class JobHealth:
    """``GET /health`` of a job process's control endpoint.

    Attributes:
        job: the job's name.
        pid: the job process.
        state: STARTING, RUNNING, STOPPED, FINISHED or FAILED.
        checked_at: when the process answered (epoch seconds).
        queries: each query's health.
    """

    job: str
    pid: int
    state: str
    checked_at: float
    queries: Mapping[str, QueryHealth]

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "pid": self.pid,
            "state": self.state,
            "checked_at": self.checked_at,
            "queries": {q: h.to_json() for q, h in self.queries.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobHealth:
        return cls(
            job=str(data["job"]),
            pid=int(data["pid"]),
            state=str(data["state"]),
            checked_at=float(data["checked_at"]),
            queries={q: QueryHealth.from_json(h) for q, h in (data.get("queries") or {}).items()},
        )


@dataclass(frozen=True)
class SavepointRef:
    """A savepoint as a job's registry entry records it (``last_savepoint``).

    Attributes:
        id: its id (a directory name under its root).
        location: directory or ``s3://`` URL.
        created_at: when it was taken (ISO 8601, UTC).
    """

    id: str
    location: str
    created_at: str

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "location": self.location, "created_at": self.created_at}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SavepointRef:
        return cls(str(data["id"]), str(data["location"]), str(data["created_at"]))
