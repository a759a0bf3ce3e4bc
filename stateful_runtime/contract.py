"""What the runtime tells programs: the documents of ``srt ... --json`` and the control endpoint.

The runtime builds these objects and writes them with ``to_json()``; a program (Dagster's
``StreamingRuntime``) reads the same documents back with ``from_json()``. Each JSON key is
spelled once, here. Standard library only, so either side imports it without the other's
dependencies. ``from_json`` is lenient (a missing key is its default), ``to_json`` writes what
this version of the runtime writes.

==========================  ==========================================================
:class:`CheckpointFacts`    what a query's checkpoint says now: last committed batch, its
                            age, the batch in flight, state partitions
:class:`RecordCounts`       where a query's source records went, this run
:class:`QueryHealth`        one query as the job process last reported it
:class:`JobHealth`          ``GET /health`` of the control endpoint
:class:`JobStatus`          a job's registry entry; ``srt status --json`` adds liveness and
                            each query's checkpoint facts
:class:`Launch`             ``srt launch --json``
:class:`Wait`               ``srt wait --json``
:class:`Stopped`            ``srt stop --json`` (:class:`Killed`: with ``--kill``)
:class:`StopReport`         ``POST /stop`` of the control endpoint
:class:`SavepointSummary`   a savepoint (``srt savepoint create --json``, ``POST /savepoint``)
:class:`Disposed`           ``srt savepoint prune/dispose --json``
:class:`StateCheck`         ``srt savepoint check --json``
:class:`Upgrade`            ``srt upgrade --json``
:class:`WindowCounts`       ``srt reconcile --json``
:class:`AppendReport`       ``srt log append --json``, a ``srt log serve`` connection's summary
:class:`Explain`            ``srt explain --no-spark --json``
:class:`ErrorDocument`      a failure: ``{"error": {"type", "message", ...}}`` on stderr, or an
                            endpoint's error answer; :class:`ErrorKind` names its type
==========================  ==========================================================
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _batches(value: Any) -> dict[str, int | None]:
    """``{query: batch}`` (a batch may be None: nothing committed)."""
    return {str(q): _int(b) for q, b in (value or {}).items()}


def _strings(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value or ())


# ----------------------------------------------------------------------------- states


class JobState(StrEnum):
    """Where a job process is in its lifecycle, as its registry entry records it."""

    STARTING = "STARTING"
    RUNNING = "RUNNING"
    STOPPED = "STOPPED"  # stopped on purpose (srt stop, SIGTERM): resumes from its checkpoint
    FINISHED = "FINISHED"  # --available-now read everything
    FAILED = "FAILED"
    # Shown by ``srt status`` only: the entry says RUNNING, but its process is gone.
    DEAD = "DEAD"


class HealthSource(StrEnum):
    """Where ``srt status`` got a job's health from."""

    ENDPOINT = "endpoint"  # the job process answered just now
    REGISTRY = "registry"  # its last report, written to the registry entry


class StopSignal(StrEnum):
    """How a job process was asked to stop: by ``srt stop`` (and what it sent), or by a signal
    from elsewhere (a registry entry's ``stopped_by``)."""

    ENDPOINT = "endpoint"  # a clean stop through its control endpoint
    SIGTERM = "SIGTERM"  # a clean stop by the signal (the process did not answer; or timeout,
    # systemd, Kubernetes, kill)
    SIGINT = "SIGINT"  # a clean stop by Ctrl-C
    SIGKILL = "SIGKILL"  # killed (--kill, after the grace period)
    NONE = "none"  # nothing was signalled (already gone, or not the job's process)


# How much of a crashed srt command's stderr its error keeps.
STDERR_TAIL = 4000


class ErrorKind(StrEnum):
    """The type of a failure a program reads (:class:`ErrorDocument`): an error the runtime
    raises on purpose (its class name), or a refusal of the control endpoint, or what a client
    saw when the runtime could not say (a crash, a timeout)."""

    STATEFUL_RUNTIME_ERROR = "StatefulRuntimeError"
    CONFIG_ERROR = "ConfigError"
    CHECKPOINT_OWNERSHIP_ERROR = "CheckpointOwnershipError"
    CORRUPT_CHECKPOINT_ERROR = "CorruptCheckpointError"
    INVALID_NAME_ERROR = "InvalidNameError"
    PATH_ESCAPE_ERROR = "PathEscapeError"
    PLAN_ERROR = "PlanError"
    USER_FUNCTION_ERROR = "UserFunctionError"
    LOG_ERROR = "LogError"
    TOPIC_NOT_FOUND_ERROR = "TopicNotFoundError"
    TOPIC_EXISTS_ERROR = "TopicExistsError"
    CORRUPT_LOG_ERROR = "CorruptLogError"
    LOG_WRITER_BUSY_ERROR = "LogWriterBusyError"
    LOG_WRITE_ERROR = "LogWriteError"
    APPEND_INCOMPLETE_ERROR = "AppendIncompleteError"
    SOURCE_DATA_LOST_ERROR = "SourceDataLostError"
    SINK_ERROR = "SinkError"
    SINK_DATA_LOST_ERROR = "SinkDataLostError"
    JOB_ERROR = "JobError"
    CORRUPT_ENTRY_ERROR = "CorruptEntryError"
    ENDPOINT_UNAVAILABLE = "EndpointUnavailable"
    ENDPOINT_ERROR = "EndpointError"
    UPGRADE_ERROR = "UpgradeError"
    STORAGE_ERROR = "StorageError"
    STATE_ERROR = "StateError"
    ALREADY_EXISTS_ERROR = "AlreadyExistsError"
    SAVEPOINT_ERROR = "SavepointError"
    INCOMPATIBLE_SAVEPOINT_ERROR = "IncompatibleSavepointError"
    CORRUPT_MANIFEST_ERROR = "CorruptManifestError"
    MANIFEST_MISMATCH_ERROR = "ManifestMismatchError"
    JOB_LOCKED_ERROR = "JobLockedError"
    UNSAFE_CHECKPOINT_DIR_ERROR = "UnsafeCheckpointDirError"
    # The control endpoint's refusals.
    BAD_REQUEST = "BadRequest"
    UNAUTHORIZED = "Unauthorized"
    NOT_FOUND = "NotFound"
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    LENGTH_REQUIRED = "LengthRequired"
    PAYLOAD_TOO_LARGE = "PayloadTooLarge"
    # What a client saw without the runtime saying why.
    HTTP_ERROR = "HTTPError"
    PROCESS_ERROR = "ProcessError"  # an srt command failed without a JSON error (a crash)
    TIMEOUT = "Timeout"  # an srt command did not finish in time
    # Any other type (an error class of user code, an unexpected Python error): the
    # document's ``type`` names it.
    OTHER = "Other"

    @classmethod
    def of(cls, type_name: str) -> ErrorKind:
        """The kind of an error type's name; :attr:`OTHER` for a name this contract lacks."""
        try:
            return cls(type_name)
        except ValueError:
            return cls.OTHER


@dataclass(frozen=True)
class ErrorDocument:
    """A failure as a program reads it: ``{"error": {"type", "message", ...details}}``, the last
    line ``srt ... --json`` writes to stderr, and the body of a control endpoint's error.

    Attributes:
        type: the error's type: an :class:`ErrorKind` or, for :attr:`ErrorKind.OTHER`, the
            name of the class that was raised.
        message: what went wrong and what to do.
        details: the error's public fields (``differences``, ``stage``, ``savepoint_location``...).
    """

    type: str
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> ErrorKind:
        return ErrorKind.of(self.type)

    @classmethod
    def of(cls, exc: BaseException) -> ErrorDocument:
        """An exception's document: its class name, message and JSON-able public fields."""
        details = {}
        for key, value in vars(exc).items():
            if key.startswith("_") or key in ("type", "message"):
                continue
            try:
                json.dumps(value)
            except (TypeError, ValueError):
                continue
            details[key] = value
        return cls(type(exc).__name__, str(exc), details)

    def to_json(self) -> dict[str, Any]:
        return {"error": {"type": str(self.type), "message": self.message, **self.details}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ErrorDocument:
        error = data["error"]
        details = {k: v for k, v in error.items() if k not in ("type", "message")}
        return cls(str(error.get("type")), str(error.get("message")), details)

    @classmethod
    def from_stderr(cls, stderr: str) -> ErrorDocument | None:
        """The error a failed ``srt ... --json`` reported: its last stderr line that is one
        JSON object ``{"error": {"type", "message", ...fields}}``; None if it wrote none (a
        crash)."""
        for line in reversed(stderr.strip().splitlines()):
            if not line.startswith('{"error"'):
                continue
            try:
                return cls.from_json(json.loads(line))
            except (ValueError, KeyError, TypeError, AttributeError):
                return None
        return None

    @classmethod
    def of_process(cls, what: str, returncode: int, stderr: str) -> ErrorDocument:
        """What a failed ``srt ... --json`` command reported (:meth:`from_stderr`), else a
        :attr:`ErrorKind.PROCESS_ERROR` holding its stderr's tail (a crash)."""
        found = cls.from_stderr(stderr)
        if found is not None:
            return found
        tail = stderr.strip()[-STDERR_TAIL:] or f"exit status {returncode}, no output"
        return cls(
            ErrorKind.PROCESS_ERROR.value, f"{what} failed (exit status {returncode}):\n{tail}"
        )


# ----------------------------------------------------------------------------- health


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


# The upper bounds (ms) of the latency buckets a map_async step counts its calls in; the last
# bucket holds every call past the last bound.
CALL_BUCKETS_MS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000)


@dataclass(frozen=True)
class CallStats:
    """A ``map_async`` step's calls to its service, this run (summed over its tasks; a task
    Spark ran twice counts twice).

    Attributes:
        calls: calls made (every attempt).
        retries: calls that were a retry of a failed one.
        failed: records whose last attempt failed (dead-lettered, or the job stopped).
        buckets: calls per latency bucket (:data:`CALL_BUCKETS_MS`, then one past the last).
        rate_per_s: calls a second since the query's previous batch (None: its first).
    """

    calls: int = 0
    retries: int = 0
    failed: int = 0
    buckets: tuple[int, ...] = (0,) * (len(CALL_BUCKETS_MS) + 1)
    rate_per_s: float | None = None

    def __add__(self, other: CallStats) -> CallStats:
        return CallStats(
            self.calls + other.calls,
            self.retries + other.retries,
            self.failed + other.failed,
            tuple(a + b for a, b in zip(self.buckets, other.buckets, strict=True)),
        )

    def percentile_ms(self, q: float) -> float | None:
        """The upper bound of the bucket holding the ``q`` quantile of the calls' latency
        (None: no call; past the last bound: the last bound)."""
        if not self.calls:
            return None
        rank, seen = q * sum(self.buckets), 0
        for bound, n in zip((*CALL_BUCKETS_MS, CALL_BUCKETS_MS[-1]), self.buckets, strict=True):
            seen += n
            if seen >= rank and n:
                return float(bound)
        return float(CALL_BUCKETS_MS[-1])

    def to_json(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "retries": self.retries,
            "failed": self.failed,
            "p50_ms": self.percentile_ms(0.5),
            "p99_ms": self.percentile_ms(0.99),
            "buckets": list(self.buckets),
            "rate_per_s": self.rate_per_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CallStats:
        buckets = tuple(int(n) for n in data.get("buckets") or ())
        return cls(
            int(data.get("calls") or 0),
            int(data.get("retries") or 0),
            int(data.get("failed") or 0),
            buckets if len(buckets) == len(CALL_BUCKETS_MS) + 1 else cls().buckets,
            _float(data.get("rate_per_s")),
        )


@dataclass(frozen=True)
class RecordCounts:
    """Where the records a query read from its source went, this run: ``input`` (read) =
    ``output`` (into the job's operators or sinks) + ``dead_letters`` (rejected, to the
    dead-letter topic) + ``late`` (behind the watermark: dropped and counted, or to a late
    side output).

    Attributes:
        source: the source's name (a union's: its inputs' names joined by ``+``).
        input: records read.
        output: records into the job's operators or sinks.
        dead_letters: records rejected to the dead-letter topic.
        late: records behind the watermark.
        by_source: a union's counts per input (its sources' own dead letters and late
            records; the records the steps after the union rejected are in the totals only).
    """

    source: str
    input: int = 0
    output: int = 0
    dead_letters: int = 0
    late: int = 0
    by_source: tuple[RecordCounts, ...] = ()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.source,
            "input": self.input,
            "output": self.output,
            "dead_letters": self.dead_letters,
            "late": self.late,
        }
        if self.by_source:
            out["by_source"] = [s.to_json() for s in self.by_source]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RecordCounts:
        return cls(
            source=str(data.get("source")),
            input=int(data.get("input") or 0),
            output=int(data.get("output") or 0),
            dead_letters=int(data.get("dead_letters") or 0),
            late=int(data.get("late") or 0),
            by_source=tuple(cls.from_json(s) for s in data.get("by_source") or ()),
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
        event_time_lag_by_partition: per source partition (``<source>:<partition>``), how far
            its newest event time trails its source's newest partition's (ms): a partition far
            behind holds the watermark back (None: a stateless query).
        watermark_held_by: the partition whose event time the watermark follows, when one
            partition of several holds it (None: none, or the source's newest).
        updated_at: when the report was read (ISO 8601, UTC).
        late_rows_dropped: records of this batch behind the watermark (dropped, or to a late
            side output), counted one by one.
        late_rows_dropped_this_run: the same, every batch of this run.
        recent: the last :data:`RATE_BATCHES` batches of this run that ran, oldest first:
            what the two rates over time are computed from.
        recent_input_rows_per_s: the input rate over time: the records the recent batches
            read ÷ the wall time from the first one's trigger to the last one's commit
            (idle time between them included).
        recent_processed_rows_per_s: the processing rate over time: the records the recent
            batches read ÷ the time they ran (the sum of their durations).
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
    event_time_lag_by_partition: Mapping[str, int] | None = None
    watermark_held_by: str | None = None
    updated_at: str | None = None
    late_rows_dropped: int = 0
    late_rows_dropped_this_run: int = 0
    recent: tuple[RecentBatch, ...] = ()
    recent_input_rows_per_s: float | None = None
    recent_processed_rows_per_s: float | None = None


# Batches the rates over time (BatchHealth.recent_*) are computed over.
RATE_BATCHES = 10


@dataclass(frozen=True)
class RecentBatch:
    """One batch that ran, as the rates over time count it.

    Attributes:
        batch: its id.
        rows: records it read (Spark's ``numInputRows``).
        started_ms: its trigger's start (epoch ms, Spark's ``timestamp``).
        duration_ms: trigger to commit (Spark's ``triggerExecution``).
    """

    batch: int
    rows: int
    started_ms: int
    duration_ms: int

    def to_json(self) -> list[int]:
        return [self.batch, self.rows, self.started_ms, self.duration_ms]

    @classmethod
    def from_json(cls, data: Sequence[Any]) -> RecentBatch:
        batch, rows, started, duration = (int(x) for x in data)
        return cls(batch, rows, started, duration)


def recent_rates(recent: Sequence[RecentBatch]) -> tuple[float | None, float | None]:
    """(input rate, processing rate) in records/s over ``recent`` (see :class:`BatchHealth`);
    None where there is no time to divide by."""
    if not recent:
        return None, None
    rows = sum(b.rows for b in recent)
    wall_ms = recent[-1].started_ms + recent[-1].duration_ms - recent[0].started_ms
    ran_ms = sum(b.duration_ms for b in recent)
    return (
        round(rows * 1000 / wall_ms, 3) if wall_ms > 0 else None,
        round(rows * 1000 / ran_ms, 3) if ran_ms > 0 else None,
    )


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
class DeadLetterSample:
    """One rejected record as the job published it to its dead-letter topic.

    Attributes:
        reason: why it was rejected (the decoder's message).
        source_partition: where it came from in the source.
        source_offset: its offset there.
        value: the record's bytes as text, cut at :data:`SAMPLE_CHARS` characters.
    """

    reason: str
    source_partition: str
    source_offset: int
    value: str

    def to_json(self) -> dict[str, Any]:
        return {
            "reason": self.reason,
            "source_partition": self.source_partition,
            "source_offset": self.source_offset,
            "value": self.value,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeadLetterSample:
        return cls(
            str(data.get("reason")),
            str(data.get("source_partition")),
            int(data.get("source_offset") or 0),
            str(data.get("value") or ""),
        )


# A dead letter's value as a health report carries it.
SAMPLE_CHARS = 200


@dataclass(frozen=True)
class DeadLetterView:
    """The dead letters a query's job published, as its health report shows them.

    Attributes:
        topic: the dead-letter topic (where ``srt log read`` or a Kafka consumer finds all).
        in_topic: records the topic holds (every run's).
        by_reason: records published this run per kind of reason (a reason's text up to its
            first ``": "``: ``malformed JSON``, ``missing field 'amount_paise'``).
        samples: the newest published this run, oldest first.
    """

    topic: str
    in_topic: int = 0
    by_reason: Mapping[str, int] = field(default_factory=dict)
    samples: tuple[DeadLetterSample, ...] = ()


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
        dead_letters: the query's dead letters (None: it owns no dead-letter topic).
        calls: its ``map_async`` steps' calls this run, by step (None: it has none).
    """

    batch: BatchHealth | None = None
    checkpoint: CheckpointFacts | None = None
    records: RecordCounts | None = None
    mirror: MirrorHealth | None = None
    dead_letters: DeadLetterView | None = None
    calls: Mapping[str, CallStats] | None = None

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
                event_time_lag_by_partition=(
                    None
                    if b.event_time_lag_by_partition is None
                    else dict(b.event_time_lag_by_partition)
                ),
                watermark_held_by=b.watermark_held_by,
                updated_at=b.updated_at,
                late_rows_dropped=b.late_rows_dropped,
                late_rows_dropped_this_run=b.late_rows_dropped_this_run,
                recent_batches=[r.to_json() for r in b.recent],
                recent_input_rows_per_s=b.recent_input_rows_per_s,
                recent_processed_rows_per_s=b.recent_processed_rows_per_s,
            )
        if self.records is not None:
            out["records"] = self.records.to_json()
        if self.mirror is not None:
            out["mirror_batch"] = self.mirror.batch
            out["mirror_bytes_uploaded"] = self.mirror.bytes_uploaded
        d = self.dead_letters
        if d is not None:
            out["dead_letter_topic"] = d.topic
            out["dead_letters_in_topic"] = d.in_topic
            out["dead_letter_reasons"] = dict(d.by_reason)
            out["dead_letter_samples"] = [x.to_json() for x in d.samples]
        if self.calls is not None:
            out["calls"] = {step: c.to_json() for step, c in self.calls.items()}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueryHealth:
        batch = None
        if "last_batch" in data:
            lag = data.get("lag_by_partition")
            behind = data.get("event_time_lag_by_partition")
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
                event_time_lag_by_partition=(
                    None if behind is None else {str(p): int(n) for p, n in behind.items()}
                ),
                watermark_held_by=_str(data.get("watermark_held_by")),
                updated_at=_str(data.get("updated_at")),
                late_rows_dropped=int(data.get("late_rows_dropped") or 0),
                late_rows_dropped_this_run=int(data.get("late_rows_dropped_this_run") or 0),
                recent=tuple(RecentBatch.from_json(r) for r in data.get("recent_batches") or ()),
                recent_input_rows_per_s=_float(data.get("recent_input_rows_per_s")),
                recent_processed_rows_per_s=_float(data.get("recent_processed_rows_per_s")),
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
        dead = None
        if "dead_letter_topic" in data:
            dead = DeadLetterView(
                str(data["dead_letter_topic"]),
                int(data.get("dead_letters_in_topic") or 0),
                {str(k): int(v) for k, v in (data.get("dead_letter_reasons") or {}).items()},
                tuple(DeadLetterSample.from_json(x) for x in data.get("dead_letter_samples") or ()),
            )
        return cls(
            batch=batch,
            checkpoint=checkpoint,
            records=None if records is None else RecordCounts.from_json(records),
            mirror=mirror,
            dead_letters=dead,
            calls=None
            if data.get("calls") is None
            else {str(k): CallStats.from_json(v) for k, v in data["calls"].items()},
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
    state: JobState
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
            state=JobState(data["state"]),
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


@dataclass(frozen=True)
class SavepointSummary:
    """A savepoint (``srt savepoint create --json``, ``POST /savepoint``, ``srt savepoint
    list --json``).

    Attributes:
        id: its id (a directory name under its root).
        job: the job it holds the state of.
        location: directory or ``s3://`` URL.
        batches: committed batch per query.
        watermark_ms: watermark per query at that batch.
        size_bytes: total size of its files.
        files: number of files.
        created_at: when it was taken (ISO 8601, UTC).
        format_version: the manifest's format.
        kind: savepoint or stop-with-savepoint.
    """

    id: str
    job: str
    location: str
    batches: Mapping[str, int | None]
    watermark_ms: Mapping[str, int | None]
    size_bytes: int
    files: int
    created_at: str
    format_version: int | None = None
    kind: str = "savepoint"

    @property
    def root(self) -> str:
        """The savepoint root it lies in (``<root>/<id>``)."""
        return self.location.rstrip("/").rpartition("/")[0]

    def ref(self) -> SavepointRef:
        """What a job's registry entry records of it."""
        return SavepointRef(self.id, self.location, self.created_at)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "job": self.job,
            "location": self.location,
            "batches": dict(self.batches),
            "watermark_ms": dict(self.watermark_ms),
            "size_bytes": self.size_bytes,
            "files": self.files,
            "created_at": self.created_at,
            "format_version": self.format_version,
            "kind": self.kind,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SavepointSummary:
        return cls(
            id=str(data["id"]),
            job=str(data["job"]),
            location=str(data["location"]),
            batches=_batches(data.get("batches")),
            watermark_ms=_batches(data.get("watermark_ms")),
            size_bytes=int(data["size_bytes"]),
            files=int(data["files"]),
            created_at=str(data["created_at"]),
            format_version=_int(data.get("format_version")),
            kind=str(data.get("kind") or "savepoint"),
        )


# ----------------------------------------------------------------------------- status


@dataclass(frozen=True)
class EndpointAddress:
    """Where a job process serves its control endpoint (its registry entry's ``control``).

    Attributes:
        url: ``http://127.0.0.1:<port>``.
        port: the port.
        token_file: the file holding the bearer token (0600).
    """

    url: str
    port: int
    token_file: str

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "port": self.port, "token_file": self.token_file}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EndpointAddress:
        return cls(str(data.get("url")), int(data["port"]), str(data.get("token_file")))


@dataclass(frozen=True)
class QueryStatus:
    """One query of a job: where its checkpoint is and how it was planned; with ``srt status``,
    what that checkpoint says now.

    Attributes:
        checkpoint_dir: its Spark checkpoint.
        path: native or process (``srt explain`` says why).
        output_mode: Spark's output mode (append, update).
        checkpoint: its checkpoint's facts when the status was taken (None in the registry).
    """

    checkpoint_dir: str
    path: str | None = None
    output_mode: str | None = None
    checkpoint: CheckpointFacts | None = None

    @property
    def last_committed_batch(self) -> int | None:
        return None if self.checkpoint is None else self.checkpoint.last_committed_batch

    def to_json(self) -> dict[str, Any]:
        out = {
            "checkpoint_dir": self.checkpoint_dir,
            "path": self.path,
            "output_mode": self.output_mode,
        }
        if self.checkpoint is not None:
            out.update(self.checkpoint.to_json())
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueryStatus:
        return cls(
            checkpoint_dir=str(data["checkpoint_dir"]),
            path=_str(data.get("path")),
            output_mode=_str(data.get("output_mode")),
            checkpoint=CheckpointFacts.from_json(data) if "last_committed_batch" in data else None,
        )


# Keys of a registry entry the job process writes when it registers, all at once (null where
# it has nothing to say: no mirror, not restored).
_REGISTERED = (
    "control",
    "checkpoint_dir",
    "master",
    "available_now",
    "parallelism",
    "savepoint_dir",
    "mirror",
    "restored_from",
    "restore",
    "queries",
)


@dataclass(frozen=True)
class JobStatus:
    """A job as the registry knows it: its entry (``$SRT_HOME/jobs/<job>.json``) and, from
    ``srt status --json``, its liveness, health and each query's checkpoint facts.

    A launcher writes the first fields (up to ``started_at``, and ``log_path``) before the job
    process starts; the process writes the rest when it registers (``control`` on), then
    ``spark_app_id``, ``health``, ``ended_at`` and ``last_savepoint`` as they happen.

    Attributes:
        job: the job's name.
        state: its state; with ``srt status``, DEAD for a RUNNING entry whose process is gone
            (``registered_state`` keeps the entry's).
        pid: the job process (the leader of its process group when launched detached).
        pid_start: when that process started (clock ticks after boot): its identity.
        run_id: the run's id (``SRT_RUN_ID`` in the environment of everything it started).
        job_file: the file it runs.
        config: its config (secrets masked).
        started_at: when the process started (ISO 8601, UTC).
        control: its control endpoint, once it registered.
        checkpoint_dir: the job's checkpoint directory.
        master: Spark master URL.
        available_now: it reads what its sources hold, then finishes.
        parallelism: its state partitions.
        savepoint_dir: where its savepoints go by default.
        mirror: where its checkpoint is mirrored (None: no mirror).
        restored_from: the savepoint its checkpoint came from, if any.
        restore: what this run's restore laid out (None: it resumed its checkpoint).
        queries: its queries.
        spark_app_id: Spark application id.
        health: each query's health, as last reported.
        ended_at: when the process ended, if it did.
        stopped_by: what asked a STOPPED job to stop (its control endpoint, or a signal).
        failure: why a FAILED job process failed (the query's exception, or the error that
            ended it), as it recorded it.
        last_savepoint: the last savepoint taken of it.
        log_path: the launched process's output (a launcher's entry, until the process
            registers).
        error: why a FAILED run ended, when the runtime refused or stopped it on purpose (a
            sink table that lost batches: ``SinkDataLostError`` with its ways back...).
        registered_state: ``srt status``: the entry's own state.
        alive: ``srt status``: the pid is a live process, the one the entry recorded.
        live: ``srt status``: alive and STARTING or RUNNING: the job runs.
        checked_at: ``srt status``: when the status was taken (epoch seconds).
        health_source: ``srt status``: where ``health`` comes from.
        log_excerpt: ``srt status``: the last lines of the job's log (secrets masked) when the
            process ended without being asked to (DEAD or FAILED): what it said before it died.
        extra: keys of the entry this version does not know (written by another), kept.
    """

    job: str
    state: JobState | None = None
    pid: int | None = None
    pid_start: int | None = None
    run_id: str | None = None
    job_file: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    control: EndpointAddress | None = None
    checkpoint_dir: str | None = None
    master: str | None = None
    available_now: bool | None = None
    parallelism: int | None = None
    savepoint_dir: str | None = None
    mirror: str | None = None
    restored_from: str | None = None
    restore: Mapping[str, Any] | None = None
    queries: Mapping[str, QueryStatus] = field(default_factory=dict)
    spark_app_id: str | None = None
    health: Mapping[str, QueryHealth] | None = None
    ended_at: str | None = None
    stopped_by: StopSignal | None = None
    failure: str | None = None
    last_savepoint: SavepointRef | None = None
    log_path: str | None = None
    error: ErrorDocument | None = None
    registered_state: JobState | None = None
    alive: bool | None = None
    live: bool | None = None
    checked_at: float | None = None
    health_source: HealthSource | None = None
    log_excerpt: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def entry_state(self) -> JobState | None:
        """The state the entry records (``state`` says DEAD for a RUNNING job that is gone)."""
        return self.state if self.registered_state is None else self.registered_state

    @property
    def last_committed(self) -> dict[str, int | None]:
        """Last committed batch of each query (``srt status``: read from its checkpoint)."""
        return {q: s.last_committed_batch for q, s in self.queries.items()}

    def query_health(self, query: str) -> QueryHealth:
        """The query's health (empty before its first report)."""
        return (self.health or {}).get(query) or QueryHealth()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "state": self.state,
            "pid": self.pid,
            "pid_start": self.pid_start,
            "run_id": self.run_id,
            "job_file": self.job_file,
            "config": dict(self.config),
            "started_at": self.started_at,
        }
        queries = {q: s.to_json() for q, s in self.queries.items()}
        if self.control is not None:
            registered = {
                "control": self.control.to_json(),
                "checkpoint_dir": self.checkpoint_dir,
                "master": self.master,
                "available_now": self.available_now,
                "parallelism": self.parallelism,
                "savepoint_dir": self.savepoint_dir,
                "mirror": self.mirror,
                "restored_from": self.restored_from,
                "restore": None if self.restore is None else dict(self.restore),
                "queries": queries,
            }
            assert tuple(registered) == _REGISTERED
            out.update(registered)
        else:  # a launcher's entry keeps where the last run checkpointed
            if self.checkpoint_dir is not None:
                out["checkpoint_dir"] = self.checkpoint_dir
            if self.queries:
                out["queries"] = queries
        later = {
            "spark_app_id": self.spark_app_id,
            "health": None
            if self.health is None
            else {q: h.to_json() for q, h in self.health.items()},
            "ended_at": self.ended_at,
            "stopped_by": self.stopped_by,
            "failure": self.failure,
            "last_savepoint": None
            if self.last_savepoint is None
            else self.last_savepoint.to_json(),
            "log_path": self.log_path,
            "error": None if self.error is None else self.error.to_json()["error"],
        }
        out.update({k: v for k, v in later.items() if v is not None})
        if self.checked_at is not None:
            out.update(
                registered_state=self.registered_state,
                alive=self.alive,
                live=self.live,
                checked_at=self.checked_at,
                health_source=self.health_source,
            )
            if self.log_excerpt is not None:
                out["log_excerpt"] = self.log_excerpt
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobStatus:
        control, health, last = data.get("control"), data.get("health"), data.get("last_savepoint")
        restore, state = data.get("restore"), data.get("state")
        registered, source = data.get("registered_state"), data.get("health_source")
        return cls(
            job=str(data["job"]),
            state=None if state is None else JobState(state),
            pid=_int(data.get("pid")),
            pid_start=_int(data.get("pid_start")),
            run_id=_str(data.get("run_id")),
            job_file=_str(data.get("job_file")),
            config=dict(data.get("config") or {}),
            started_at=_str(data.get("started_at")),
            control=EndpointAddress.from_json(control) if isinstance(control, Mapping) else None,
            checkpoint_dir=_str(data.get("checkpoint_dir")),
            master=_str(data.get("master")),
            available_now=None
            if data.get("available_now") is None
            else bool(data["available_now"]),
            parallelism=_int(data.get("parallelism")),
            savepoint_dir=_str(data.get("savepoint_dir")),
            mirror=_str(data.get("mirror")),
            restored_from=_str(data.get("restored_from")),
            restore=None if restore is None else dict(restore),
            queries={
                q: QueryStatus.from_json(info) for q, info in (data.get("queries") or {}).items()
            },
            spark_app_id=_str(data.get("spark_app_id")),
            health=None
            if health is None
            else {q: QueryHealth.from_json(h or {}) for q, h in health.items()},
            ended_at=_str(data.get("ended_at")),
            stopped_by=None if not data.get("stopped_by") else StopSignal(data["stopped_by"]),
            failure=_str(data.get("failure")),
            last_savepoint=None if not last else SavepointRef.from_json(last),
            log_path=_str(data.get("log_path")),
            error=ErrorDocument.from_json({"error": data["error"]})
            if isinstance(data.get("error"), Mapping)
            else None,
            registered_state=None if registered is None else JobState(registered),
            alive=None if data.get("alive") is None else bool(data["alive"]),
            live=None if data.get("live") is None else bool(data["live"]),
            checked_at=_float(data.get("checked_at")),
            health_source=None if source is None else HealthSource(source),
            log_excerpt=_str(data.get("log_excerpt")),
            extra={k: v for k, v in data.items() if k not in _KNOWN},
        )


_KNOWN = frozenset(
    {
        "job",
        "state",
        "pid",
        "pid_start",
        "run_id",
        "job_file",
        "config",
        "started_at",
        *_REGISTERED,
        "spark_app_id",
        "health",
        "ended_at",
        "stopped_by",
        "failure",
        "last_savepoint",
        "error",
        "log_path",
        "registered_state",
        "alive",
        "live",
        "checked_at",
        "health_source",
        "log_excerpt",
    }
)


# ----------------------------------------------------------------------------- control


@dataclass(frozen=True)
class Launch:
    """``srt launch --json``: the job's process, started now or reused.

    Attributes:
        job: the job's name (as its file builds it).
        pid: its process.
        launched: True if this call started it, False if a live process was reused.
        log_path: the file the process writes its output to.
        command: the ``srt run`` command line started (None when reused).
        plan: the planned queries, as ``srt explain --no-spark`` prints them.
        config_drift: config keys (and ``job_file``) a reused process runs with other values.
        status: the job's status right after the call.
    """

    job: str
    pid: int
    launched: bool
    log_path: str
    command: tuple[str, ...] | None
    plan: str
    config_drift: tuple[str, ...]
    status: JobStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "pid": self.pid,
            "launched": self.launched,
            "log_path": self.log_path,
            "command": None if self.command is None else list(self.command),
            "plan": self.plan,
            "config_drift": list(self.config_drift),
            "status": self.status.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Launch:
        command = data.get("command")
        return cls(
            job=str(data["job"]),
            pid=int(data["pid"]),
            launched=bool(data["launched"]),
            log_path=str(data["log_path"]),
            command=None if command is None else _strings(command),
            plan=str(data.get("plan") or ""),
            config_drift=_strings(data.get("config_drift")),
            status=JobStatus.from_json(data["status"]),
        )


@dataclass(frozen=True)
class Wait:
    """``srt wait --json``: whether the process got there, and where the job is now.

    Attributes:
        reached: RUNNING / a commit happened in time.
        last_committed: last committed batch per query.
        status: the job's status when the wait ended.
    """

    reached: bool
    last_committed: Mapping[str, int | None]
    status: JobStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "reached": self.reached,
            "last_committed": dict(self.last_committed),
            "status": self.status.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Wait:
        return cls(
            bool(data["reached"]),
            _batches(data.get("last_committed")),
            JobStatus.from_json(data["status"]),
        )


@dataclass(frozen=True)
class Stopped:
    """``srt stop --json``: how the process ended.

    Attributes:
        job: the job's name.
        pid: the process that was stopped.
        signal: how it was stopped.
        status: the job's status afterwards.
    """

    job: str
    pid: int | None
    signal: StopSignal
    status: JobStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "pid": self.pid,
            "signal": self.signal,
            "status": self.status.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stopped:
        return cls(
            str(data["job"]),
            _int(data.get("pid")),
            StopSignal(data["signal"]),
            JobStatus.from_json(data["status"]),
        )


@dataclass(frozen=True)
class Killed(Stopped):
    """``srt stop --kill --json``: SIGTERM, then SIGKILL to the process group after a grace
    period (``signal``: the one that ended it, or none: it was already gone).

    Attributes:
        note: what else was found (the pid is another process now; leftovers killed).
    """

    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        status = out.pop("status")
        return {**out, "note": self.note, "status": status}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Killed:
        return cls(
            str(data["job"]),
            _int(data.get("pid")),
            StopSignal(data["signal"]),
            JobStatus.from_json(data["status"]),
            _str(data.get("note")),
        )


@dataclass(frozen=True)
class StopReport:
    """``POST /stop``: the job process's answer once it stopped.

    Attributes:
        job: the job's name.
        pid: its process.
        state: its final state.
        savepoint: the stop-with-savepoint taken (None: none asked for, or it failed).
        savepoint_error: why the savepoint failed (its state is in the checkpoint).
    """

    job: str
    pid: int
    state: JobState
    savepoint: SavepointSummary | None = None
    savepoint_error: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "pid": self.pid,
            "state": self.state,
            "savepoint": None if self.savepoint is None else self.savepoint.to_json(),
        }
        if self.savepoint_error is not None:
            out["savepoint_error"] = self.savepoint_error
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StopReport:
        sp = data.get("savepoint")
        return cls(
            str(data["job"]),
            int(data["pid"]),
            JobState(data["state"]),
            None if not sp else SavepointSummary.from_json(sp),
            _str(data.get("savepoint_error")),
        )


@dataclass(frozen=True)
class Disposed:
    """``srt savepoint prune/dispose --json``: the savepoints disposed of.

    Attributes:
        disposed: (id, location) of each savepoint disposed of.
        kept: ids of the job's savepoints left (prune only; None for dispose).
    """

    disposed: tuple[tuple[str, str], ...]
    kept: tuple[str, ...] | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"disposed": [{"id": i, "location": loc} for i, loc in self.disposed]}
        if self.kept is not None:
            out["kept"] = list(self.kept)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Disposed:
        kept = data.get("kept")
        return cls(
            tuple((str(d["id"]), str(d["location"])) for d in data.get("disposed") or ()),
            None if kept is None else _strings(kept),
        )


@dataclass(frozen=True)
class SinksAccepted:
    """``srt sink accept --json``: the sinks whose lost batches an operator accepted.

    Attributes:
        job: the job.
        accepted: one line per sink: what it lacked, who accepted it and when (as the ledger
            records it).
    """

    job: str
    accepted: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"job": self.job, "accepted": list(self.accepted)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SinksAccepted:
        return cls(str(data["job"]), _strings(data.get("accepted") or ()))


@dataclass(frozen=True)
class StateCheck:
    """``srt savepoint check --json``: the job file's code takes the state of ``location``
    (an incompatible one is an ``IncompatibleSavepointError`` listing its differences).

    Attributes:
        job: the job the file builds.
        job_file: the file.
        location: the savepoint, or the job's checkpoint directory.
        compatible: always True (a refusal is an error).
        not_restored: state the new code leaves behind (``--allow-non-restored-state``).
    """

    job: str
    job_file: str
    location: str
    compatible: bool
    not_restored: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "job_file": self.job_file,
            "location": self.location,
            "compatible": self.compatible,
            "not_restored": list(self.not_restored),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StateCheck:
        return cls(
            str(data["job"]),
            str(data["job_file"]),
            str(data["location"]),
            bool(data["compatible"]),
            _strings(data.get("not_restored")),
        )


@dataclass(frozen=True)
class Upgrade:
    """``srt upgrade --json``: the job runs its (new) file from a savepoint.

    Attributes:
        job: the job's name.
        job_file: the file it runs now.
        pid: the new process.
        command: its ``srt run`` command line.
        log_path: its log.
        restored_from: the savepoint it started from.
        savepoint: the stop-with-savepoint taken (None when started from a given one).
        parallelism: its state partitions.
        state_partitions: per query, the partitions at its last committed batch.
        last_committed: last committed batch per query.
        committed: it committed a batch of its own (or caught up) in time; None if the
            command was not asked to wait for that.
        not_restored: state left behind (``allow_non_restored_state``).
        status: the job's status afterwards.
    """

    job: str
    job_file: str
    pid: int
    command: tuple[str, ...]
    log_path: str
    restored_from: str
    savepoint: SavepointSummary | None
    parallelism: int | None
    state_partitions: Mapping[str, int | None]
    last_committed: Mapping[str, int | None]
    committed: bool | None
    not_restored: tuple[str, ...]
    status: JobStatus

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "job_file": self.job_file,
            "pid": self.pid,
            "command": list(self.command),
            "log_path": self.log_path,
            "restored_from": self.restored_from,
            "savepoint": None if self.savepoint is None else self.savepoint.to_json(),
            "parallelism": self.parallelism,
            "state_partitions": dict(self.state_partitions),
            "last_committed": dict(self.last_committed),
            "committed": self.committed,
            "not_restored": list(self.not_restored),
            "status": self.status.to_json(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Upgrade:
        sp = data.get("savepoint")
        committed = data.get("committed")
        return cls(
            job=str(data["job"]),
            job_file=str(data["job_file"]),
            pid=int(data["pid"]),
            command=_strings(data.get("command")),
            log_path=str(data["log_path"]),
            restored_from=str(data["restored_from"]),
            savepoint=None if not sp else SavepointSummary.from_json(sp),
            parallelism=_int(data.get("parallelism")),
            state_partitions=_batches(data.get("state_partitions")),
            last_committed=_batches(data.get("last_committed")),
            committed=None if committed is None else bool(committed),
            not_restored=_strings(data.get("not_restored")),
            status=JobStatus.from_json(data["status"]),
        )


@dataclass(frozen=True)
class WindowCounts:
    """``srt reconcile --json``: the source's good records per closed event-time window up to
    one committed batch of a query.

    Attributes:
        job: the job's name.
        query: the query (the one writing the sink table).
        batch: the committed batch (None: the query has committed none, and the source was not
            read: the fields from ``source`` on are None).
        window_ms: the window size.
        watermark_ms: that batch's watermark: windows ending at or before it are closed.
        windows: window start (epoch ms) → good records in it, closed windows only.
        records: source records up to the batch's end offsets.
        good: those that decoded cleanly.
        dead_letters: those that did not (they go to the dead-letter topic).
        source: the source's name.
        topic: its topic.
        source_ends: end offset per partition of the batch.
        dead_letter_topic: where rejected records go.
        dead_letter_topic_records: records in it now (None: it does not exist yet).
    """

    job: str
    query: str
    batch: int | None
    window_ms: int
    watermark_ms: int | None = None
    windows: Mapping[int, int] = field(default_factory=dict)
    records: int = 0
    good: int = 0
    dead_letters: int = 0
    source: str | None = None
    topic: str | None = None
    source_ends: Mapping[str, int] = field(default_factory=dict)
    dead_letter_topic: str | None = None
    dead_letter_topic_records: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "job": self.job,
            "query": self.query,
            "batch": self.batch,
            "window_ms": self.window_ms,
            "watermark_ms": self.watermark_ms,
            "windows": {str(w): n for w, n in sorted(self.windows.items())},
            "records": self.records,
            "good": self.good,
            "dead_letters": self.dead_letters,
        }
        if self.source is not None:  # the source was read
            out.update(
                source=self.source,
                topic=self.topic,
                source_ends=dict(self.source_ends),
                dead_letter_topic=self.dead_letter_topic,
                dead_letter_topic_records=self.dead_letter_topic_records,
            )
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WindowCounts:
        return cls(
            job=str(data["job"]),
            query=str(data["query"]),
            batch=_int(data.get("batch")),
            window_ms=int(data["window_ms"]),
            watermark_ms=_int(data.get("watermark_ms")),
            windows={int(w): int(n) for w, n in (data.get("windows") or {}).items()},
            records=int(data.get("records") or 0),
            good=int(data.get("good") or 0),
            dead_letters=int(data.get("dead_letters") or 0),
            source=_str(data.get("source")),
            topic=_str(data.get("topic")),
            source_ends={str(p): int(e) for p, e in (data.get("source_ends") or {}).items()},
            dead_letter_topic=_str(data.get("dead_letter_topic")),
            dead_letter_topic_records=_int(data.get("dead_letter_topic_records")),
        )


@dataclass(frozen=True)
class PlannedQuery:
    """One planned query (:class:`Explain`).

    Attributes:
        name: the query's name.
        path: native (Spark's own operators) or process (the runtime's operator).
        reason: why that path.
        output_mode: Spark's output mode.
        steps: what the query runs, in order.
        stateful_operators: its stateful operators' names.
    """

    name: str
    path: str
    reason: str
    output_mode: str
    steps: tuple[str, ...] = ()
    stateful_operators: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "reason": self.reason,
            "output_mode": self.output_mode,
            "steps": list(self.steps),
            "stateful_operators": list(self.stateful_operators),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PlannedQuery:
        return cls(
            str(data["name"]),
            str(data.get("path")),
            str(data.get("reason")),
            str(data.get("output_mode")),
            _strings(data.get("steps")),
            _strings(data.get("stateful_operators")),
        )


@dataclass(frozen=True)
class Explain:
    """``srt explain --no-spark --json``: what a job file plans to, without Spark.

    Attributes:
        job: the name the job file gives its job.
        parallelism: its state partitions.
        checkpoint_dir: its checkpoint directory.
        text: the plan as ``srt explain`` prints it.
        queries: the planned queries.
    """

    job: str
    parallelism: int | None
    checkpoint_dir: str
    text: str
    queries: tuple[PlannedQuery, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "parallelism": self.parallelism,
            "checkpoint_dir": self.checkpoint_dir,
            "text": self.text,
            "queries": [q.to_json() for q in self.queries],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Explain:
        return cls(
            str(data["job"]),
            _int(data.get("parallelism")),
            str(data["checkpoint_dir"]),
            str(data["text"]),
            tuple(PlannedQuery.from_json(q) for q in data.get("queries") or ()),
        )


@dataclass(frozen=True)
class AppendReport:
    """What ``srt log append --json`` did with its input (and the summary of a ``srt log
    serve`` connection). Lines are numbered from 1, blank ones included.

    Attributes:
        topic: the topic.
        producer_id: the idempotent writer id whose sequence (the last line handled) is stored
            with the records (None: none; a retry is not idempotent).
        lines_read: lines of the input read.
        appended: records appended by this command (dead-lettered lines included).
        skipped: lines at or before the producer's stored sequence: already in the topic from
            an earlier attempt, not appended again.
        dead_lettered: appended lines the job's decoder will dead-letter (blank, or not a
            valid JSON record when a key field is given).
        refused: lines not appended (over the line limit).
        resume_line: the first line not yet in the topic (``lines_read + 1``: all in).
        complete: every line read is in the topic (or was refused and reported).
        end_offsets: the topic's end offsets per partition afterwards.
    """

    topic: str
    producer_id: str | None
    lines_read: int = 0
    appended: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    refused: int = 0
    resume_line: int = 1
    complete: bool = True
    end_offsets: Mapping[int, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "producer_id": self.producer_id,
            "lines_read": self.lines_read,
            "appended": self.appended,
            "skipped": self.skipped,
            "dead_lettered": self.dead_lettered,
            "refused": self.refused,
            "resume_line": self.resume_line,
            "complete": self.complete,
            "end_offsets": {str(p): n for p, n in sorted(self.end_offsets.items())},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AppendReport:
        return cls(
            topic=str(data["topic"]),
            producer_id=_str(data.get("producer_id")),
            lines_read=int(data.get("lines_read") or 0),
            appended=int(data.get("appended") or 0),
            skipped=int(data.get("skipped") or 0),
            dead_lettered=int(data.get("dead_lettered") or 0),
            refused=int(data.get("refused") or 0),
            resume_line=int(data.get("resume_line") or 1),
            complete=bool(data.get("complete", True)),
            end_offsets={int(p): int(n) for p, n in (data.get("end_offsets") or {}).items()},
        )


@dataclass(frozen=True)
class QueryRewound:
    """One query of :class:`CheckpointRewind`.

    Attributes:
        query: the query.
        rerun_batch: the batch re-run with its logged offsets and watermark; later batches are
            planned again.
        restart_after: the committed batch whose state the re-run starts from (-1: none); the
            query's sinks forget every batch after it at the next start.
        why: what was found (the poisoned batch, its watermark and the bound), or that the
            batch was named.
        moved: files moved to the quarantine, relative to the query's checkpoint directory.
    """

    query: str
    rerun_batch: int
    restart_after: int
    why: str
    moved: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "query": self.query,
            "rerun_batch": self.rerun_batch,
            "restart_after": self.restart_after,
            "why": self.why,
            "moved": list(self.moved),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> QueryRewound:
        return cls(
            query=str(data["query"]),
            rerun_batch=int(data["rerun_batch"]),
            restart_after=int(data["restart_after"]),
            why=str(data.get("why") or ""),
            moved=_strings(data.get("moved")),
        )


@dataclass(frozen=True)
class CheckpointRewind:
    """``srt checkpoint rewind --json``: a checkpoint rewound past a poisoned watermark.

    Attributes:
        job: the job's name.
        checkpoint_dir: its checkpoint directory.
        dry_run: nothing was moved (``--dry-run``): what would be.
        queries: the queries rewound (empty: no poisoned watermark found).
        quarantine: where the undone files went (None: nothing moved).
    """

    job: str
    checkpoint_dir: str
    dry_run: bool = False
    queries: tuple[QueryRewound, ...] = ()
    quarantine: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "job": self.job,
            "checkpoint_dir": self.checkpoint_dir,
            "dry_run": self.dry_run,
            "queries": [q.to_json() for q in self.queries],
            "quarantine": self.quarantine,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CheckpointRewind:
        return cls(
            job=str(data["job"]),
            checkpoint_dir=str(data["checkpoint_dir"]),
            dry_run=bool(data.get("dry_run")),
            queries=tuple(QueryRewound.from_json(q) for q in data.get("queries") or ()),
            quarantine=_str(data.get("quarantine")),
        )
