"""Every error the runtime raises on purpose.

All of them derive from :class:`StatefulRuntimeError`, so a caller can catch the whole family,
and each says what to do next, not only what went wrong::

    StatefulRuntimeError
    ├── ConfigError                   bad job file, unknown --set key, contradictory options
    │   ├── CheckpointOwnershipError  checkpoint dir written by another job
    │   ├── UnsafeCheckpointDirError  checkpoint dir that is the working directory, a home
    │   │                             directory, the root, or holds data the runtime did not
    │   │                             create: never claimed, moved or deleted
    │   ├── CorruptCheckpointError    damage a restart cannot fall back from
    │   │                             [stateful_runtime.checkpoints.recovery]
    │   ├── InvalidNameError          a job, query or savepoint name that is not a safe name
    │   │                             [stateful_runtime.names]
    │   └── PathEscapeError           a relative path that leaves its root
    │                                 [stateful_runtime.names]
    ├── PlanError                     a job graph the planner cannot turn into a Spark query
    ├── UserFunctionError             a user function raised, or returned what it must not
    ├── LogError                      embedded event log
    │   ├── TopicNotFoundError
    │   ├── TopicExistsError
    │   ├── CorruptLogError           damaged or contradictory topic files
    │   ├── LogWriterBusyError        another process holds the topic's write lock
    │   ├── LogWriteError             the store refused a write (full disk, I/O error)
    │   └── AppendIncompleteError     `srt log append/serve` stopped part-way: what went in,
    │                                 the line to resume from
    ├── SourceDataLostError           records a job had not read were deleted from its
    │                                 source (a Kafka topic's retention): refused by name
    ├── SinkError                     a sink could not write or does not fit its table
    │   └── SinkDataLostError         a sink's table or ledger lacks batches the checkpoint
    │                                 committed into it: refused, with the ways back
    ├── JobError                      job registry: unknown job, not running, already running
    │   ├── JobLockedError            another process holds the job's checkpoint lock
    │   ├── CorruptEntryError         an unreadable registry entry
    │   │                             [stateful_runtime.runtime.registry]
    │   ├── EndpointUnavailable       the job's control endpoint does not answer
    │   │                             [stateful_runtime.runtime.endpoint]
    │   ├── EndpointError             the control endpoint answered with an error
    │   │                             [stateful_runtime.runtime.endpoint]
    │   └── UpgradeError              an upgrade that stopped part-way, with the way back
    │                                 [stateful_runtime.runtime.control]
    ├── StorageError                  a savepoint/mirror location cannot be read or written
    │   └── AlreadyExistsError        a create-only write found the object there
    ├── StateError                    keyed state in the Python worker cannot be opened: a
    │                                 version's files missing, a partition stuck locked
    ├── SavepointError                missing, incomplete or corrupt savepoint
    │   ├── IncompatibleSavepointError  the new code cannot take the savepoint's state
    │   └── CorruptManifestError      a manifest that does not parse or match its format
    │       │                         [stateful_runtime.checkpoints.manifest]
    │       └── ManifestMismatchError  a manifest field the files or its checksum contradict
    │                                 [stateful_runtime.checkpoints.manifest]
    ├── SrtCommandError               an srt command run by Dagster failed [dagster_defs.errors]
    └── SrtAirflowError               an srt command run by the Airflow provider failed, or a
                                      job did not get where a task waited [srt_airflow.errors]

Classes without a module in brackets are defined here; ``tests/test_exceptions.py`` keeps this
tree true to the code.
"""

from __future__ import annotations


class StatefulRuntimeError(Exception):
    """Root of every error raised by stateful_runtime, dbt_sink, dagster_defs and srt_airflow."""


class ConfigError(StatefulRuntimeError):
    """A job definition or its configuration is wrong; the message names the fix."""


class CheckpointOwnershipError(ConfigError):
    """The checkpoint directory belongs to another job.

    Attributes:
        directory: the checkpoint directory.
        owner: the job name recorded in it.
        job: the job that tried to use it.
    """

    def __init__(self, directory: str, owner: str, job: str) -> None:
        self.directory, self.owner, self.job = directory, owner, job
        super().__init__(
            f"checkpoint directory {directory} belongs to job {owner!r}, not {job!r}. "
            f"Point checkpoint.dir at a directory of this job's own (for example "
            f"--set checkpoint.dir=<new dir>), or delete {directory} if job {owner!r} is gone."
        )


class UnsafeCheckpointDirError(ConfigError):
    """A checkpoint directory the runtime must not claim, move aside or delete: the working
    directory, a home directory, the filesystem root (or a parent of one of them), or a
    directory holding files the runtime did not create. Nothing was changed.

    Attributes:
        directory: the checkpoint directory.
        problem: why it is refused.
    """

    def __init__(self, directory: str, problem: str) -> None:
        self.directory, self.problem = directory, problem
        super().__init__(
            f"checkpoint directory {directory} {problem}; nothing was moved or written. A "
            f"checkpoint directory holds one job's checkpoint and nothing else: point "
            f"checkpoint.dir at a new directory of the job's own (for example "
            f"--set checkpoint.dir=<dir>/checkpoints/<job>)."
        )


class PlanError(StatefulRuntimeError):
    """The job graph cannot be planned onto Spark Structured Streaming."""


class UserFunctionError(StatefulRuntimeError):
    """A user function raised or returned something its declared output cannot hold, and
    the record could not be dead-lettered: the job's ``errors.policy`` is ``fail``, the step
    rejected too many records (``errors.max_consecutive``, ``errors.max_fraction``), or no
    single record is to blame. The micro-batch fails and is replayed from its checkpoint when
    the job restarts, so nothing is lost: fix the function, or pass the record with
    ``srt run <job file> --skip <source>:<partition>:<offset>`` (it goes to the dead-letter
    topic, reason "skipped by operator").

    Attributes:
        operator: the step's name.
        record: the input record (its repr, cut to 300 characters).
        origin: ``<source>:<partition>:<offset>`` of the record, when known (else "").
    """

    def __init__(
        self,
        operator: str,
        record: object,
        problem: str,
        *,
        origin: str = "",
        advice: str = "",
        skippable: bool = True,
    ) -> None:
        self.operator, self.record, self.origin = operator, repr(record)[:300], origin
        self.skippable = skippable  # False: the bound on a step's rejects stopped the job
        where = f" (source record {origin})" if origin else ""
        skip = (
            f", or pass this record: srt run <job file> --skip {origin} (it goes to the "
            f"dead-letter topic)"
            if origin and skippable
            else ""
        )
        super().__init__(
            f"{operator}: {problem}, on the record {self.record}{where}. "
            f"{advice + ' ' if advice else ''}The micro-batch failed and is replayed when the "
            f"job restarts; fix the function or filter such records before it{skip}"
        )


class LogError(StatefulRuntimeError):
    """An operation on the embedded event log failed."""


class TopicNotFoundError(LogError):
    def __init__(self, log_dir: str, topic: str) -> None:
        self.log_dir, self.topic = log_dir, topic
        super().__init__(
            f"topic {topic!r} does not exist in log {log_dir}; "
            f"create it with: srt log create {topic} --partitions N --log-dir {log_dir}"
        )


class TopicExistsError(LogError):
    def __init__(self, log_dir: str, topic: str, partitions: int) -> None:
        self.log_dir, self.topic, self.partitions = log_dir, topic, partitions
        super().__init__(
            f"topic {topic!r} already exists in log {log_dir} with {partitions} partitions"
        )


class CorruptLogError(LogError):
    """A topic's files are damaged or contradict each other; names the file and what to do.

    Attributes:
        topic: the topic.
        path: the damaged file or store.
        problem: what is wrong.
    """

    def __init__(self, topic: str, path: str, problem: str) -> None:
        self.topic, self.path, self.problem = topic, path, problem
        super().__init__(
            f"topic {topic!r} is damaged: {problem} ({path}). Nothing was read past the damage. "
            f"Restore the topic's directory from a backup, or re-create the topic and replay "
            f"its producers; jobs reading it keep their committed offsets and resume after."
        )


class LogWriteError(LogError):
    """The topic's store refused a write: nothing of that write is acknowledged (an idempotent
    producer's retry finds out what went in from its stored sequence).

    Attributes:
        topic: the topic.
        path: the topic's directory.
        reason: RocksDB's error.
        disk_full: the disk holding the topic is full.
    """

    def __init__(self, topic: str, path: str, reason: str) -> None:
        self.topic, self.path, self.reason = topic, path, reason
        self.disk_full = "no space left" in reason.lower()
        what = "the disk holding it is full" if self.disk_full else "an I/O error"
        super().__init__(
            f"writing to topic {topic!r} at {path} failed: {what} ({reason}). "
            + (
                "Free space on that disk, then retry."
                if self.disk_full
                else "Check the disk, then retry."
            )
        )


class AppendIncompleteError(LogError):
    """``srt log append`` (or a ``srt log serve`` connection) stopped part-way.

    Attributes:
        topic: the topic.
        producer_id: the idempotent writer id (None: none, the retry is not idempotent).
        lines_read, appended, skipped, dead_lettered, refused: the counts so far (``appended``:
            records acknowledged by the store).
        resume_line: the first line not known to be in the topic.
        disk_full: the disk holding the topic is full.
        reason: what stopped it.
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        producer_id: str | None,
        lines_read: int,
        appended: int,
        skipped: int,
        dead_lettered: int,
        refused: int,
        resume_line: int,
        disk_full: bool,
        reason: str,
    ) -> None:
        self.topic, self.producer_id = topic, producer_id
        self.lines_read, self.appended, self.skipped = lines_read, appended, skipped
        self.dead_lettered, self.refused, self.resume_line = dead_lettered, refused, resume_line
        self.disk_full, self.reason = disk_full, reason
        super().__init__(message)


class LogWriterBusyError(LogError):
    def __init__(self, topic: str, path: str) -> None:
        self.topic, self.path = topic, path
        super().__init__(
            f"topic {topic!r} is open for writing by another process (only one writer per "
            f"topic: a running `srt log serve` or `srt log append`). Send records to that "
            f"process (e.g. through `srt log serve`'s port) or stop it first. Store: {path}"
        )


class SourceDataLostError(StatefulRuntimeError):
    """Records a job had not read yet were deleted from its source (a Kafka topic's retention
    or a DeleteRecords) before it read them. The batch is refused, nothing of it committed:
    going on would leave a hole in the results nobody sees.

    Attributes:
        source: the source's name.
        lost: ``{"topic:partition": (first deleted offset, first offset left)}``.
    """

    def __init__(self, source: str, lost: dict[str, tuple[int, int]]) -> None:
        self.source, self.lost = source, dict(lost)
        ranges = ", ".join(
            f"{k} offsets {lo}..{hi - 1} ({hi - lo:,} records)" for k, (lo, hi) in lost.items()
        )
        super().__init__(
            f"source {source}: records the job had not read were deleted before it read "
            f"them (the topic's retention, or records deleted by hand): {ranges}. Nothing of "
            f"the batch was committed. To go on from the oldest records left, without these, "
            f"run again with the source's fail_on_data_loss off (the job setting "
            f"source.fail_on_data_loss=false where the job file declares it; each skipped "
            f"range is said when skipped); to keep them in future, set the topic's "
            f"retention.ms above the job's longest stop"
        )


class SinkError(StatefulRuntimeError):
    """A sink could not write a batch, or its target does not fit the job's output."""


class SinkDataLostError(SinkError):
    """A sink's table no longer holds what the job's checkpoint says was committed into it
    (truncated, dropped, its file deleted, its ledger gone), or the ledger holds batches the
    checkpoint does not (the checkpoint was replaced). Going on would leave a hole in the
    results nobody sees, so the job refuses to start (or stops before writing the next batch).

    Attributes:
        job: the job.
        sink: the sink (its output's name).
        table: the sink's table.
        location: where the table lives (masked).
        problem: ``table_missing``, ``ledger_missing``, ``rows_missing`` or ``ledger_ahead``.
        committed_batch: the newest batch the job's checkpoint committed (None: none).
        ledger_batch: the newest batch the sink's ledger records (None: none).
        rows: the table's rows now (None: no table).
        expected_rows: the rows the ledger recorded after ``ledger_batch`` (None: unknown).
        ways_back: the commands that bring the job back, each with what it gives.
    """

    def __init__(
        self,
        job: str,
        sink: str,
        table: str,
        location: str,
        problem: str,
        what: str,
        *,
        committed_batch: int | None = None,
        ledger_batch: int | None = None,
        rows: int | None = None,
        expected_rows: int | None = None,
        ways_back: list[str] | None = None,
    ) -> None:
        self.job, self.sink, self.table, self.location = job, sink, table, location
        self.problem, self.what = problem, what
        self.committed_batch, self.ledger_batch = committed_batch, ledger_batch
        self.rows, self.expected_rows = rows, expected_rows
        self.ways_back = list(ways_back or [])
        ways = "".join(f"\n  * {w}" for w in self.ways_back)
        super().__init__(
            f"sink {sink} of job {job!r} (table {table} in {location}): {what}. Nothing was "
            f"written, so nothing more is lost; the job does not go on over a hole in its "
            f"results." + (f" Ways back:{ways}" if ways else "")
        )

    def with_ways_back(self, ways_back: list[str]) -> SinkDataLostError:
        """The same refusal, naming the commands that bring this job back."""
        return SinkDataLostError(
            self.job,
            self.sink,
            self.table,
            self.location,
            self.problem,
            self.what,
            committed_batch=self.committed_batch,
            ledger_batch=self.ledger_batch,
            rows=self.rows,
            expected_rows=self.expected_rows,
            ways_back=ways_back,
        )


class JobError(StatefulRuntimeError):
    """A job registry operation failed (unknown job, not running, already running)."""


class JobLockedError(JobError):
    """Another process holds the exclusive lock on the job's checkpoint directory: it runs the
    job (in any state, STARTING included). Nothing was written, the registry entry included.

    Attributes:
        directory: the checkpoint directory.
        holder: what the lock file and the registry say of the holder (``pid``, ``run_id``,
            ``since``, ``state``; a key is missing when it is not known).
    """

    def __init__(self, job: str, directory: str, holder: dict) -> None:
        self.directory, self.holder = directory, dict(holder)
        who = ", ".join(
            f"{k} {holder[k]}" for k in ("pid", "run_id", "since", "state") if holder.get(k)
        )
        who = who or "starting, not yet identified"
        super().__init__(
            f"job {job!r} is already running: another process ({who}) holds the lock on "
            f"its checkpoint {directory}; this run was refused and changed nothing. One job "
            f"runs in one process: stop it first (`srt stop {job}`), or see it with "
            f"`srt status {job}`."
        )


class StorageError(StatefulRuntimeError):
    """A savepoint or mirror location could not be read or written (missing bucket, no
    credentials, a refused write)."""


class AlreadyExistsError(StorageError):
    """A create-only write found the object already there."""


class StateError(StatefulRuntimeError):
    """Keyed state in the Python worker cannot be opened at
    the version a batch needs; says what to do."""


class SavepointError(StatefulRuntimeError):
    """A savepoint is missing, incomplete, corrupt, or cannot be taken now."""


class IncompatibleSavepointError(SavepointError):
    """The savepoint's state does not fit the job being started; lists every difference."""

    def __init__(self, source: str, differences: list[str], hint: str) -> None:
        self.differences = differences
        lines = "\n".join(f"  - {d}" for d in differences)
        super().__init__(f"savepoint {source} cannot be restored into this job:\n{lines}\n{hint}")
