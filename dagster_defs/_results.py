"""Typed results of ``srt ... --json`` commands, as the StreamingRuntime resource returns them.

Each is parsed from the JSON document the command printed (``from_json``); nothing here reads
the registry, checkpoints or human-readable output itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


def _batches(value: Any) -> dict[str, int | None]:
    return {str(q): _int(b) for q, b in (value or {}).items()}


@dataclass(frozen=True)
class QueryStatus:
    """One query of a job: what its checkpoint says now, and the job's last health report.

    Attributes:
        name: the query's name (``sink_to(..., name=)``).
        checkpoint_dir: its Spark checkpoint.
        last_committed_batch: the last micro-batch with a commit marker (None: none yet).
        last_commit_time: when that marker was written (epoch seconds).
        checkpoint_age_s: seconds since then, when the status was taken.
        inflight_batch_age_s: seconds the batch after it has been planned (None: none is).
        state_partitions: state partitions at the last committed batch (None: no state).
        health: the job process's last report on the query (rates, lag, watermark, state
            rows and bytes, batch duration, late rows...).
    """

    name: str
    checkpoint_dir: str
    last_committed_batch: int | None = None
    last_commit_time: float | None = None
    checkpoint_age_s: float | None = None
    inflight_batch_age_s: float | None = None
    state_partitions: int | None = None
    health: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(
        cls, name: str, data: Mapping[str, Any], health: Mapping[str, Any] | None
    ) -> QueryStatus:
        return cls(
            name=name,
            checkpoint_dir=str(data["checkpoint_dir"]),
            last_committed_batch=_int(data.get("last_committed_batch")),
            last_commit_time=_float(data.get("last_commit_time")),
            checkpoint_age_s=_float(data.get("checkpoint_age_s")),
            inflight_batch_age_s=_float(data.get("inflight_batch_age_s")),
            state_partitions=_int(data.get("state_partitions")),
            health=dict(health or {}),
        )


@dataclass(frozen=True)
class JobStatus:
    """A job as the runtime's registry knows it (``srt status JOB --json``).

    Attributes:
        job: the job's name.
        state: the registered state: STARTING, RUNNING, STOPPED, FINISHED or FAILED (RUNNING
            even when the process is gone: see ``alive``).
        pid: the job process (the leader of its process group when launched detached).
        alive: the pid is a live process.
        live: alive and STARTING or RUNNING: the job runs.
        job_file: the file it runs.
        config: its config (secrets masked).
        master: Spark master URL.
        spark_app_id: Spark application id.
        checkpoint_dir: the job's checkpoint directory.
        parallelism: its state partitions.
        started_at: when the process started (ISO 8601, UTC).
        ended_at: when it ended, if it did.
        restored_from: the savepoint its checkpoint came from, if any.
        last_savepoint: the last savepoint taken of it (id, location, created_at).
        queries: its queries.
        control: the job process's control endpoint (``{"port": ...}``), if it runs one.
    """

    job: str
    state: str | None
    pid: int | None
    alive: bool
    live: bool
    job_file: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    master: str | None = None
    spark_app_id: str | None = None
    checkpoint_dir: str | None = None
    parallelism: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    restored_from: str | None = None
    last_savepoint: Mapping[str, Any] | None = None
    queries: Mapping[str, QueryStatus] = field(default_factory=dict)
    control: Mapping[str, Any] | None = None

    @property
    def last_committed(self) -> dict[str, int | None]:
        """Last committed batch of each query."""
        return {q: s.last_committed_batch for q, s in self.queries.items()}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> JobStatus:
        health = data.get("health") or {}
        return cls(
            job=str(data["job"]),
            state=_str(data.get("registered_state", data.get("state"))),
            pid=_int(data.get("pid")),
            alive=bool(data.get("alive")),
            live=bool(data.get("live")),
            job_file=_str(data.get("job_file")),
            config=dict(data.get("config") or {}),
            master=_str(data.get("master")),
            spark_app_id=_str(data.get("spark_app_id")),
            checkpoint_dir=_str(data.get("checkpoint_dir")),
            parallelism=_int(data.get("parallelism")),
            started_at=_str(data.get("started_at")),
            ended_at=_str(data.get("ended_at")),
            restored_from=_str(data.get("restored_from")),
            last_savepoint=dict(data["last_savepoint"]) if data.get("last_savepoint") else None,
            queries={
                q: QueryStatus.from_json(q, info, health.get(q))
                for q, info in (data.get("queries") or {}).items()
            },
            control=dict(data["control"]) if isinstance(data.get("control"), Mapping) else None,
        )


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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Launch:
        return cls(
            job=str(data["job"]),
            pid=int(data["pid"]),
            launched=bool(data["launched"]),
            log_path=str(data["log_path"]),
            command=tuple(data["command"]) if data.get("command") else None,
            plan=str(data.get("plan") or ""),
            config_drift=tuple(data.get("config_drift") or ()),
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

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Wait:
        return cls(
            bool(data["reached"]),
            _batches(data.get("last_committed")),
            JobStatus.from_json(data["status"]),
        )


@dataclass(frozen=True)
class Stopped:
    """``srt stop --json`` (``--kill``): how the process ended.

    Attributes:
        job: the job's name.
        pid: the process that was stopped.
        signal: SIGTERM (it stopped cleanly), SIGKILL (it did not in time) or none (it was
            already gone; its process group was killed).
        status: the job's status afterwards.
    """

    job: str
    pid: int | None
    signal: str
    status: JobStatus

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Stopped:
        return cls(
            str(data["job"]),
            _int(data.get("pid")),
            str(data["signal"]),
            JobStatus.from_json(data["status"]),
        )


@dataclass(frozen=True)
class SavepointInfo:
    """A savepoint (``srt savepoint create --json``).

    Attributes:
        id: its id (a directory name under its root).
        job: the job it holds the state of.
        location: directory or ``s3://`` URL.
        kind: savepoint or stop-with-savepoint.
        batches: committed batch per query.
        watermark_ms: watermark per query at that batch.
        size_bytes: total size of its files.
        files: number of files.
        created_at: when it was taken (ISO 8601, UTC).
    """

    id: str
    job: str
    location: str
    kind: str
    batches: Mapping[str, int | None]
    watermark_ms: Mapping[str, int | None]
    size_bytes: int
    files: int
    created_at: str

    @property
    def root(self) -> str:
        """The savepoint root it lies in (``<root>/<id>``)."""
        return self.location.rstrip("/").rpartition("/")[0]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SavepointInfo:
        return cls(
            id=str(data["id"]),
            job=str(data["job"]),
            location=str(data["location"]),
            kind=str(data.get("kind") or "savepoint"),
            batches=_batches(data.get("batches")),
            watermark_ms=_batches(data.get("watermark_ms")),
            size_bytes=int(data["size_bytes"]),
            files=int(data["files"]),
            created_at=str(data["created_at"]),
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
    savepoint: SavepointInfo | None
    parallelism: int | None
    state_partitions: Mapping[str, int | None]
    last_committed: Mapping[str, int | None]
    committed: bool | None
    not_restored: tuple[str, ...]
    status: JobStatus

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Upgrade:
        sp = data.get("savepoint")
        committed = data.get("committed")
        return cls(
            job=str(data["job"]),
            job_file=str(data["job_file"]),
            pid=int(data["pid"]),
            command=tuple(data.get("command") or ()),
            log_path=str(data["log_path"]),
            restored_from=str(data["restored_from"]),
            savepoint=None if not sp else SavepointInfo.from_json(sp),
            parallelism=_int(data.get("parallelism")),
            state_partitions=_batches(data.get("state_partitions")),
            last_committed=_batches(data.get("last_committed")),
            committed=None if committed is None else bool(committed),
            not_restored=tuple(data.get("not_restored") or ()),
            status=JobStatus.from_json(data["status"]),
        )


@dataclass(frozen=True)
class WindowCounts:
    """``srt reconcile --json``: the source's good records per closed event-time window up to
    one committed batch of a query.

    Attributes:
        job: the job's name.
        query: the query (the one writing the sink table).
        batch: the committed batch (None: the query has committed none).
        watermark_ms: that batch's watermark: windows ending at or before it are closed.
        window_ms: the window size.
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
    watermark_ms: int | None
    window_ms: int
    windows: Mapping[int, int]
    records: int = 0
    good: int = 0
    dead_letters: int = 0
    source: str | None = None
    topic: str | None = None
    source_ends: Mapping[str, int] = field(default_factory=dict)
    dead_letter_topic: str | None = None
    dead_letter_topic_records: int | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WindowCounts:
        return cls(
            job=str(data["job"]),
            query=str(data["query"]),
            batch=_int(data.get("batch")),
            watermark_ms=_int(data.get("watermark_ms")),
            window_ms=int(data["window_ms"]),
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
class Plan:
    """``srt explain --no-spark --json``: what a job file plans to, without Spark.

    Attributes:
        job: the name the job file gives its job.
        parallelism: its state partitions.
        checkpoint_dir: its checkpoint directory.
        queries: per query: name, path (native / process), reason, output mode, steps.
        text: the plan as ``srt explain`` prints it.
    """

    job: str
    parallelism: int | None
    checkpoint_dir: str
    queries: tuple[Mapping[str, Any], ...]
    text: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Plan:
        return cls(
            str(data["job"]),
            _int(data.get("parallelism")),
            str(data["checkpoint_dir"]),
            tuple(dict(q) for q in data.get("queries") or ()),
            str(data["text"]),
        )
