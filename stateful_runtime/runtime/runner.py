"""``srt run``: the job's process (Flink's JobManager role) on a local or cluster Spark.

Its lifecycle: :meth:`JobRunner.prepare` (restore, claim and recover the checkpoint, register
with the control endpoint serving), :meth:`JobRunner.start` (Spark, the queries),
:meth:`JobRunner.monitor` (a progress line and fresh health per committed micro-batch, until
the queries end or SIGTERM/SIGINT or ``srt stop`` stops them), and the shutdown (queries
stopped, sinks closed, the end state registered); then each sink's summary. Accounting and
health are :mod:`.progress`'s, terminal output :mod:`.console`'s, the control endpoint's
answers :mod:`.endpoint_handlers`'.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from stateful_runtime.checkpoints import layout, manifest, migrate, recovery, restore, savepoints
from stateful_runtime.checkpoints.layout import CheckpointLayout, CheckpointLock, LeaseLock
from stateful_runtime.checkpoints.mirror import CheckpointMirror, MirrorSync
from stateful_runtime.checkpoints.storage import S3Path, checkpoint_path, s3a_url
from stateful_runtime.checkpoints.verify import disk_full
from stateful_runtime.connectors import accounting
from stateful_runtime.contract import (
    RATE_BATCHES,
    CallStats,
    DeadLetterView,
    ErrorDocument,
    JobState,
    JobStatus,
    MirrorHealth,
    QueryHealth,
    QueryStatus,
    RecentBatch,
    SavepointSummary,
    StopReport,
    StopSignal,
)
from stateful_runtime.exceptions import (
    ConfigError,
    IncompatibleSavepointError,
    JobError,
    JobLockedError,
    SinkDataLostError,
    SinkError,
    StatefulRuntimeError,
)
from stateful_runtime.masking import mask_text
from stateful_runtime.operators.isolation import SKIPPED
from stateful_runtime.planner import QueryPlan, chain, plan
from stateful_runtime.runtime import (
    dagster_push,
    failures,
    final_timers,
    registry,
    sink_check,
    skips,
    spark_output,
    stop_signals,
    warmup,
)
from stateful_runtime.runtime.batch_writes import BatchWriter, interrupted
from stateful_runtime.runtime.console import Console
from stateful_runtime.runtime.dataframes import (
    SINGLE_WATERMARK,
    build,
    calls_of,
    refuse_speculation,
)
from stateful_runtime.runtime.endpoint import ControlEndpoint
from stateful_runtime.runtime.endpoint_handlers import RunnerHandlers
from stateful_runtime.runtime.input_watermarks import (
    InputWatermarks,
    resumes,
    tracks_partitions,
)
from stateful_runtime.runtime.progress import (
    Records,
    SampledDeadLetters,
    batch_health,
    checkpoint_facts,
    counted_input,
    idle_health,
    merge_views,
    new_progress,
    now_iso,
    recent_batch,
)
from stateful_runtime.runtime.session import (
    arrow_schema,
    build_session,
    default_master,
    jvm_ending,
    s3_conf,
    short_run,
    sized_jit_note,
)
from stateful_runtime.state import TimeDomain
from stateful_runtime.streams import ProcessNode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming import StreamingQuery

    from stateful_runtime.runtime.loader import JobFile

# How often the runner reads Spark's progress to print lines and refresh health. Spark keeps
# the last 100 progress reports, so no batch is missed at this rate.
MONITOR_INTERVAL_S = 0.5
# On stop, how long to let a micro-batch in flight finish (Flink's stop drains too) before the
# queries are interrupted; an interrupted batch is replayed on restart, so this is only tidiness.
DRAIN_TIMEOUT_S = 60.0
# A failure's message as the registry keeps it (Spark's can run to pages of plan).
FAILURE_CHARS = 4000


@dataclass(frozen=True)
class BatchCommitted:
    """What ``on_batch`` listeners hear after each committed micro-batch of a query.

    ``sink_write_ms``/``sink_rows``: time spent in, and rows given to, the query's sinks for
    this batch (every output; :class:`~stateful_runtime.runtime.batch_writes.SinkWrite` says
    how the executor path counts them); ``health`` is what the registry and ``srt status`` show;
    ``progress`` is Spark's ``StreamingQueryProgress`` as JSON; ``mirror`` is what the
    checkpoint mirror uploaded after this batch (None: no mirror, or nothing new).
    """

    job: str
    query: str
    batch_id: int
    input_rows: int
    sink_write_ms: float | None
    sink_rows: int | None
    health: QueryHealth
    progress: Mapping[str, Any]
    mirror: MirrorSync | None = None


def _wake_on_progress(wake: threading.Event) -> Any:
    """A Spark listener that sets ``wake`` when a query reports a batch or ends.

    It never reads the events: the runner reads each batch's progress itself, once
    (:func:`~.progress.new_progress`). PySpark's own wrapper turns every event into Python
    objects before a listener sees it, ~30 py4j round trips per progress report on Spark's
    listener thread, which cost 7% of a core at 5 batches a second in a latency run; so Spark
    is handed this listener itself, as the Java interface, and calls it with the Java event."""
    from pyspark import SparkContext
    from pyspark.sql.streaming import StreamingQueryListener

    class Wake(StreamingQueryListener):
        _jwake: Any = None

        @property
        def _jlistener(self) -> Any:  # what addListener/removeListener hand to Spark
            if self._jwake is None:
                streaming = SparkContext._jvm.org.apache.spark.sql.streaming  # type: ignore
                self._jwake = streaming.PythonStreamingQueryListenerWrapper(self)
            return self._jwake

        def onQueryStarted(self, event: Any) -> None:
            pass

        def onQueryProgress(self, event: Any) -> None:
            wake.set()

        def onQueryIdle(self, event: Any) -> None:
            pass

        def onQueryTerminated(self, event: Any) -> None:
            wake.set()

        class Java:
            implements = ["org.apache.spark.sql.streaming.PythonStreamingQueryListener"]

    return Wake()


@dataclass(frozen=True)
class _Written:
    """What a query's ``foreachBatch`` knows of its batch, for the batch's commit report: the
    sinks' write (ms, rows) and what its sources' read tasks counted, by source."""

    ms: float
    rows: int
    counted: dict[str, accounting.BatchCounts]


def _foreach_batch(
    spark: SparkSession,
    writer: BatchWriter,
    written: dict[tuple[str, int], _Written],
    watermarks: InputWatermarks | None = None,
) -> Callable[[DataFrame, int], None]:
    def write(df: DataFrame, batch_id: int) -> None:
        try:
            done = writer.write(df, batch_id)
        except Exception as exc:
            stop = interrupted(exc)
            if stop is None:
                raise
            raise stop from None
        # Every read task of the batch has reported once its sinks' write ran.
        counted = accounting.take(spark, writer.query.name, batch_id)
        if watermarks is not None:  # before Spark commits the batch
            watermarks.after_batch(batch_id, counted)
        written[(writer.query.name, batch_id)] = _Written(done.ms, done.rows, counted)

    return write


@dataclass
class _Running:
    """A started query of the job, and what the runner knows of it."""

    plan: QueryPlan
    query: StreamingQuery
    checkpoint_dir: str
    writer: BatchWriter | None = None
    printed: int = -1
    idle_at: str | None = None  # the idle trigger's report last read (its timestamp)
    health: QueryHealth = field(default_factory=QueryHealth)
    records: Records = field(default_factory=Records)
    # The run's last batches that ran: the rates over time (contract.BatchHealth.recent).
    recent: deque[RecentBatch] = field(default_factory=lambda: deque(maxlen=RATE_BATCHES))
    # When the last batch was heard of, and its map_async steps' calls then (for their rate).
    calls_seen: tuple[float, dict[str, int]] | None = None
    # Its inputs' watermarks per partition (runtime/input_watermarks.py), if it keeps them.
    watermarks: InputWatermarks | None = None


def savepoint_root(job: Any) -> str:
    """Where the job's savepoints go unless a command names a target."""
    return job.checkpoint.savepoint_dir or str(registry.home() / "savepoints")


def _offset_lines(q: QueryPlan) -> int:
    """The lines of source offsets Spark logs per batch of ``q``: one per input, except that
    the branch that makes Spark run batches for the watermark (``q.watermark_carrier``) reads
    each input again (it shares the shuffle, not the source relation), a process function
    whose timers need batches without input also reads its timer ticks (``q.ticks``), and a
    query of several inputs with a stateful step also reads the source that starts a run's
    batches (:mod:`stateful_runtime.runtime.input_watermarks`)."""
    return len(q.inputs) * (1 + q.watermark_carrier) + reads_ticks(q) + resumes(q)


def reads_ticks(q: QueryPlan) -> bool:
    """Whether ``q`` reads its process function's timer ticks
    (:mod:`stateful_runtime.operators.ticks`)."""
    return q.ticks is not None


def _written_as(q: QueryPlan, sources: Sequence[Any]) -> bool:
    """Whether a batch that logged the offsets ``sources`` was run by ``q`` as planned: as
    many lines, and a line of timer ticks (``{"due": ...}``) where ``q`` reads them (the
    watermark's branch reads an input again instead, so one input with ticks and one with
    the branch log two lines each)."""
    ticked = any(isinstance(o, dict) and set(o) == {"due"} for o in sources)
    return _offset_lines(q) == len(sources) and ticked == reads_ticks(q)


def _migrates(q: QueryPlan, query: layout.QueryLayout) -> bool:
    """Whether the engine takes over the state of ``q``'s process function from the removed
    ``state.backend=spark`` when the run starts (:mod:`stateful_runtime.checkpoints.migrate`)."""
    return q.process is not None and migrate.written_by_spark_backend(query)


def migrate_spark_backend(
    spark: SparkSession, checkpoint: CheckpointLayout, queries: Sequence[QueryPlan]
) -> list[str]:
    """Move the state the removed ``state.backend=spark`` wrote into the engine, query by
    query (:mod:`stateful_runtime.checkpoints.migrate`); what was done."""
    from stateful_runtime.operators.keyed import describe_states

    notes = []
    for q in queries:
        query = checkpoint.query(q.name)
        if q.process is None or not _migrates(q, query):
            continue
        states = describe_states(q.process.function)
        ttl = [
            d.name
            for d in states
            if getattr(d, "ttl", None) is not None
            and d.ttl.time_domain is TimeDomain.PROCESSING_TIME  # type: ignore[attr-defined]
        ]
        notes.append(
            migrate.migrate(
                spark,
                query,
                q.process.name,
                list(q.process.parent.keys),
                [d.name for d in states],
                ttl,
                carrier=q.watermark_carrier,
                ticks=reads_ticks(q),
                resumes=resumes(q),
            )
        )
    return notes


class JobRunner:
    """Runs one job file until it ends (``available_now``) or is stopped.

    ``on_batch`` listeners are called on the job process's monitor thread with a
    :class:`BatchCommitted` once per committed micro-batch of each query (after the runner's
    own bookkeeping: health, dead letters, mirror); a listener may call :meth:`stop`.

    The process serves its control endpoint while it runs (:mod:`.endpoint`): health,
    metrics, savepoints and stop (with a savepoint) for ``srt`` and Dagster.
    """

    def __init__(
        self,
        jobfile: JobFile,
        *,
        available_now: bool = False,
        master: str | None = None,
        out: IO[str] = sys.stdout,
        from_savepoint: str | None = None,
        restore_from: str | None = None,
        parallelism: int | None = None,
        allow_non_restored_state: bool = False,
        on_batch: Sequence[Callable[[BatchCommitted], None]] = (),
        signals: stop_signals.StopSignals | None = None,
        skip: Sequence[str] = (),
        replay_sinks: bool = False,
    ) -> None:
        self.jobfile = jobfile
        self.job = jobfile.job
        self.available_now = available_now
        self.master = master or default_master()
        self.out = out
        self.console = Console(self.job.name, out)
        if from_savepoint and restore_from:
            raise ConfigError("give --from-savepoint or --restore-from, not both")
        if parallelism is not None:
            if parallelism < 1:
                raise ConfigError(f"--parallelism must be >= 1, got {parallelism}")
            self.job.parallelism = parallelism
        self.from_savepoint = from_savepoint
        self.restore_from = restore_from
        self.allow_non_restored_state = allow_non_restored_state
        if replay_sinks and restore_from:
            raise ConfigError(
                "--replay-sinks replays into fresh tables from the source (alone) or from a "
                "savepoint (--from-savepoint), not from the checkpoint mirror"
            )
        self.replay_sinks = replay_sinks
        # Set when a sink refused to write over a hole (raised once the run has ended).
        self.refusal: SinkDataLostError | None = None
        self._failure: str | None = None  # why the run failed, for the registry
        self._dead_letters: dict[str, SampledDeadLetters] = {}
        self.plan = plan(self.job)
        # Source records (source, partition, offset) an operator passes to the dead-letter
        # topic (``srt run --skip``), checked against the job's sources before anything runs.
        self.skip = [skips.parse(s, [src.name for src in self.job.sources]) for s in skip]
        self.skips: dict[str, set[tuple[int, int]]] = {}
        # Step dead letters published before this run's queries started (a crashed run's):
        # counted in the run's accounting when the query starts.
        self._published_early: dict[str, int] = {}
        if available_now:
            self._check_available_now()
        self.fingerprint = manifest.fingerprint(self.job.name, self.plan.queries)
        self.checkpoint_dir = checkpoint_path(self.job.checkpoint.dir).resolve()
        self.layout = CheckpointLayout(self.checkpoint_dir)
        # Taken first by prepare(); held until run() ends.
        self.checkpoint_lock: CheckpointLock | None = None
        # Set by prepare(): what a restore laid out, what checking the checkpoint found.
        self.restored: dict[str, Any] | None = None
        self.recovery = recovery.Recovery()
        self.mirror: CheckpointMirror | None = None
        self.endpoint: ControlEndpoint | None = None
        # Set by start().
        self.spark: SparkSession | None = None
        self._listener: Any = None
        self.runs: list[_Running] = []
        self.state = JobState.STARTING
        self.on_batch = list(on_batch)
        # Launched by Dagster with a webserver to report to: each commit is pushed at once.
        if (push := dagster_push.from_env(self.job.name, self.console.say)) is not None:
            self.on_batch.append(push)
        self._written: dict[tuple[str, int], _Written] = {}
        self._stop = threading.Event()
        # Set by Spark's listener on every progress report and query end, and by a stop: the
        # monitor reacts at once instead of at its next poll.
        self._wake = threading.Event()
        self._stop_lock = threading.Lock()
        self._stop_request: dict[str, Any] | None = None
        self._stopped = threading.Event()
        self._stop_result: StopReport | None = None
        self._savepoint_lock = threading.Lock()
        # SIGINT/SIGTERM (:mod:`.stop_signals`): caught by ``srt run`` from its start, or by
        # run(); the first asks for a stop, a second abandons the batch in flight.
        self.signals = signals
        self._hurry = threading.Event()
        self._registered = False

    def _check_available_now(self) -> None:
        timed = [
            n.name
            for s in self.job.sinks
            for n in chain(s.parent)
            if isinstance(n, ProcessNode) and n.function.time_domain is TimeDomain.PROCESSING_TIME
        ]
        if timed:
            # Spark keeps an availableNow query with processing-time timers alive forever.
            raise ConfigError(
                f"operator(s) {sorted(set(timed))} run in processing time, which never lets "
                f"--available-now finish; run without it and stop with `srt stop`"
            )

    @property
    def _query_names(self) -> list[str]:
        return [q.name for q in self.plan.queries]

    # ------------------------------------------------------------------------- lifecycle

    def run(self) -> int:
        """Run to the end; returns the process exit code (0 clean, including a stop by
        ``srt stop`` or by SIGINT/SIGTERM; 1 a query failed)."""
        own_signals = self.signals is None  # else ``srt run`` caught them and gives them back
        signals = self.signals = self.signals or stop_signals.StopSignals()
        signals.install()
        signals.listen(self._on_signal)
        try:
            if not self._stop.is_set():  # a signal while the job file loaded: nothing starts
                self.prepare()  # (a stop signal during it unwinds it: StopRequested)
        except stop_signals.StopRequested:
            pass  # prepare() undid its lock; the stop below records STOPPED
        except BaseException:  # a refusal: nothing to stop
            if own_signals:
                signals.restore()
            raise
        # From here a signal only asks: Spark is let finish starting, the queries stop cleanly.
        signals.interrupt = False
        if signals.received:
            self.stop()
        state, code = JobState.FAILED, 1
        try:
            if not self._stop.is_set():  # a signal while it prepared: Spark does not start
                self.start()
            failed = self.monitor()
            if not failed and self.available_now and not self._stop.is_set():
                for note in final_timers.fire(self.layout, self.plan.queries):
                    self.console.say(note)
            if not failed:
                state = JobState.STOPPED if self._stop.is_set() else JobState.FINISHED
                code = 0
        except SinkError as exc:
            self.console.error(f"error: {exc}")
            self._failure = f"{type(exc).__name__}: {exc}"
        except BaseException as exc:
            self._failure = self._failure or f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._shutdown(state, signals)
            if own_signals:
                signals.restore()
        if self.refusal is not None:  # a sink's table lost batches while the job ran
            raise self.refusal
        if code == 0 and not self.runs:
            self.console.say(
                f"stopped by {self._stopped_by(signals) or 'request'} before the job started"
            )
        elif code == 0:
            self._print_summaries()
        return code

    def prepare(self) -> None:
        """Before Spark starts: refuse a checkpoint directory the runtime does not own, take the
        job's lock on it (a second process of the job is refused, whatever its state) and name
        this process in the registry, lay out a savepoint or the mirror if asked, claim the
        checkpoint directory, make a damaged checkpoint restartable (or refuse), check the
        sources, and register the process (its control endpoint serving)."""
        self._lock_checkpoint()
        try:
            self._prepare_locked()
        except BaseException as exc:
            entry = registry.read(self.job.name) or {}
            if entry.get("pid") == os.getpid() and entry.get("state") == JobState.STARTING:
                why = (
                    {"error": ErrorDocument.of(exc).to_json()["error"]}
                    if isinstance(exc, StatefulRuntimeError)
                    else {}
                )
                registry.update(self.job.name, state=JobState.FAILED, ended_at=now_iso(), **why)
            self.release_checkpoint(tidy=True)
            raise

    def _prepare_locked(self) -> None:
        # The records passed so far, read before a restore or --replay-sinks puts another
        # checkpoint in this one's place: carried into it (a record skipped once is not met
        # again, whatever batch replays it).
        passed = skips.load(self.layout.skips)
        if self.replay_sinks and not self.from_savepoint:
            self._fresh_checkpoint()
        saved = None
        if self.from_savepoint or self.restore_from:
            self._restore()
        else:
            self._check_state_types()
            if self.layout.marker.exists():
                saved = layout.owner(self.checkpoint_dir).get("fingerprint")
        self._check_inputs(saved)
        layout.claim(self.checkpoint_dir, self.job.name, self._query_names, self.fingerprint)
        # Recorded before anything below can fail the run: a --skip given once is kept, whatever
        # happens to this run (a refusal, a crash, a kill before the record's batch commits).
        self.skips = skips.record(self.layout.skips, [*skips.listed(passed), *self.skip])
        # Damage confined to the newest batch falls back to the one before; other damage refuses.
        self.recovery = recovery.recover(
            self.checkpoint_dir,
            self._query_names,
            job_file=str(self.jobfile.path),
            savepoint_dir=savepoint_root(self.job),
            mirror=self.job.checkpoint.mirror,
        )
        for note in self.recovery.notes:
            self.console.say(note)
        if self.replay_sinks:
            restored = (self.restored or {}).get("batches") or {}
            since = {q: (-1 if b is None else b) + 1 for q, b in restored.items()}
            for note in sink_check.set_aside(self.job.name, self.plan.queries, self.layout, since):
                self.console.say(note)
        self._check_sinks()
        if self.job.checkpoint.mirror:
            self.mirror = CheckpointMirror(self.checkpoint_dir, self.job.checkpoint.mirror)
        for src in self.job.sources:
            src.source.check()
        for source, partition, offset in self.skip:
            self.console.say(
                f"skipping record {source}:{partition}:{offset}: it goes to the dead-letter "
                f"topic (reason: {SKIPPED})"
            )
        self._register()

    def start(self) -> None:
        """Start Spark and every query (state RUNNING)."""
        # The JVM's warnings on stderr and Spark's log: into the job's log file instead of its
        # terminal.
        log = registry.job_file(self.job.name, ".log")
        spark_output.divert(log)
        held = [s.source.records_held() for s in self.job.sources] if self.available_now else []
        short = short_run(self.available_now, held)
        jit_note = sized_jit_note(self.master, short, sum(n or 0 for n in held))
        try:
            spark = self.spark = build_session(
                self.job.parallelism,
                self.master,
                s3_conf() if isinstance(self.checkpoint_dir, S3Path) else None,
                log_file=log,
                short_run=short,
            )
        except KeyboardInterrupt:  # PySpark's handler, for the moment its context starts
            if self.signals is not None:
                self.signals.note(StopSignal.SIGINT)
            self.stop()
            return
        if self._stop.is_set():  # a stop signal while Spark started: start no queries
            return
        warmup.start(
            spark,
            self.job.parallelism,
            warmup.importable([type(src.source).__module__ for src in self.job.sources]),
            spark_state=any(q.spark_state for q in self.plan.queries),
        )
        self._listener = _wake_on_progress(self._wake)
        spark.streams.addListener(self._listener)
        registry.update(self.job.name, spark_app_id=spark.sparkContext.applicationId)
        for note in migrate_spark_backend(spark, self.layout, self.plan.queries):
            self.console.say(note)
        before = {q.name: self.layout.query(q.name).last_committed() for q in self.plan.queries}
        for note in restore.rescale(
            spark,
            self.checkpoint_dir,
            self._query_names,
            self.job.parallelism,
            restored=self.restored is not None,
            job=self.job.name,
        ):
            self.console.say(note)
        for q in self.plan.queries:  # a rescale's batch of redistributed state: no sink's
            query = self.layout.query(q.name)
            after = query.last_committed()
            if after is not None and after != before[q.name]:
                sink_check.record_no_output(query, q, after)
        self._publish_dead_letters()  # left staged by a run that crashed after a commit
        self._sync_mirror()  # batches a crashed run committed but did not mirror
        for q in self.plan.queries:
            if self._stop.is_set():  # a stop signal while Spark started: start no more
                return
            self.runs.append(self._start_query(spark, q))
        if self._stop.is_set():
            return
        registry.update(self.job.name, state=JobState.RUNNING)
        self.state = JobState.RUNNING
        self.console.running(len(self.runs), self.master, self.checkpoint_dir, jit_note)

    def monitor(self) -> bool:
        """Wait until every query ends or a stop is requested; True if a query failed."""
        while True:
            self._wake.clear()
            if isinstance(self.checkpoint_lock, LeaseLock):
                self.checkpoint_lock.renew()
            self._report()
            if self._failed():
                return True
            if self._stop.is_set():
                why = self.signals.first if self.signals else None
                self.console.say(f"stopping ({why})" if why else "stopping")
                self._drain()
                for run in self.runs:
                    run.query.stop()
                self._report()
                # A query that failed before or while the stop drained is a failed run, not a
                # stopped one: the stop must not hide its error (a full disk, say).
                return self._failed()
            if not any(run.query.isActive for run in self.runs):
                self._report()
                # Asked again: a query that failed after the check above, before this one, is
                # inactive now and its error is set (Spark sets it before it ends the query).
                return self._failed()
            self._wake.wait(MONITOR_INTERVAL_S)

    def stop(self) -> None:
        """Ask the job to stop: the batch in flight commits, then the queries stop."""
        jvm_ending()  # a signal to the process group ends the JVM under a call as well
        self._stop.set()
        self._wake.set()

    def stop_and_wait(
        self, *, savepoint: bool = False, target: str | None = None, timeout: float = 300.0
    ) -> StopReport:
        """Stop (with a savepoint of the final committed batch if asked) and wait until the
        queries stopped and the sinks closed: the final state, and the savepoint's summary."""
        with self._stop_lock:
            if self._stop_request is None:
                self._stop_request = {"savepoint": savepoint, "target": target}
            elif savepoint and not self._stop_request["savepoint"]:
                self._stop_request.update(savepoint=True, target=target)
        self.stop()
        if not self._stopped.wait(timeout) or self._stop_result is None:
            raise JobError(
                f"job {self.job.name!r} did not stop within {timeout:.0f} s; it is "
                f"still stopping (a micro-batch in flight)"
            )
        return self._stop_result

    def accept_sink_loss(self, sinks: Sequence[str] = ()) -> list[str]:
        """``srt sink accept``: with the job stopped (its checkpoint lock taken), record that
        the named warehouse sinks (default: every one the start check refuses) go on with
        their tables as they are (:func:`.sink_check.accept`); one line per sink."""
        self.layout.check_owned()
        lock = self.layout.lock(
            self.job.name, {"pid": os.getpid(), "since": now_iso(), "command": "srt sink accept"}
        )
        try:
            layout.claim(self.checkpoint_dir, self.job.name, self._query_names, self.fingerprint)
            return sink_check.accept(self.job.name, self.plan.queries, self.layout, sinks=sinks)
        finally:
            lock.release()

    def take_savepoint(self, target: str | None, kind: str) -> SavepointSummary:
        """A savepoint of the last committed batch, taken by this process (it knows its
        checkpoint); its summary."""
        if self.state is JobState.STARTING:
            raise JobError(
                f"job {self.job.name!r} is still starting; take the savepoint once "
                f"it is RUNNING and has committed a batch"
            )
        with self._savepoint_lock:
            sp = savepoints.create(
                self.checkpoint_dir, target or savepoint_root(self.job), kind=kind
            )
        return SavepointSummary.from_json(sp.summary())

    # ------------------------------------------------------------------------- prepare

    def _lock_checkpoint(self) -> None:
        """Before anything is written: check the checkpoint directory is one the runtime may
        own, take the job's exclusive lock on it (held until the run ends, or by the kernel
        until the process does), then name this process in the registry as STARTING, so
        ``srt stop`` and a refused second run find it while it restores, recovers and starts.
        A refused run writes nothing, the registry entry included."""
        if self.checkpoint_lock is not None:
            return
        self.layout.check_owned()
        run_id = os.environ.setdefault(registry.RUN_ID_ENV, uuid.uuid4().hex)
        since = now_iso()
        try:
            self.checkpoint_lock = self.layout.lock(
                self.job.name, {"pid": os.getpid(), "run_id": run_id, "since": since}
            )
        except JobLockedError as exc:
            entry = registry.read(self.job.name) or {}
            if entry.get("pid") == exc.holder.get("pid") and entry.get("state"):
                exc.holder["state"] = entry["state"]
                raise JobLockedError(self.job.name, exc.directory, exc.holder) from None
            raise
        try:
            previous = registry.read(self.job.name)
            if (
                previous
                and previous.get("state") in (JobState.STARTING, JobState.RUNNING)
                and registry.alive(previous)
                and previous.get("pid") != os.getpid()
            ):
                # The same job name on another checkpoint directory: still one process per job.
                # (A process that ended its run, STOPPED or FINISHED, may still be exiting.)
                raise JobError(
                    f"job {self.job.name!r} is already running as pid {previous['pid']} "
                    f"(state {previous.get('state')}, checkpoint "
                    f"{previous.get('checkpoint_dir')}); stop it with `srt stop "
                    f"{self.job.name}` or use `srt status`"
                )
            entry = self._starting(run_id, since).to_json()
            # What the last run left (its queries' checkpoints, last savepoint, the launcher's
            # log) stays visible until this run registers its own.
            for key in ("queries", "last_savepoint", "restored_from", "log_path"):
                if (previous or {}).get(key) and not entry.get(key):
                    entry[key] = previous[key]  # type: ignore[index]
            registry.write(self.job.name, entry)
        except BaseException:
            self.release_checkpoint(tidy=True)
            raise

    def _starting(self, run_id: str, started_at: str, **more: Any) -> JobStatus:
        """This process's STARTING registry entry (``more``: what registration adds)."""
        return JobStatus(
            job=self.job.name,
            state=JobState.STARTING,
            pid=os.getpid(),
            pid_start=registry.process_start(os.getpid()),
            run_id=run_id,
            job_file=str(self.jobfile.path),
            config=dict(self.jobfile.config),
            started_at=started_at,
            checkpoint_dir=str(self.checkpoint_dir),
            master=self.master,
            available_now=self.available_now,
            parallelism=self.job.parallelism,
            savepoint_dir=savepoint_root(self.job),
            mirror=self.job.checkpoint.mirror,
            **more,
        )

    def release_checkpoint(self, *, tidy: bool = False) -> None:
        """Drop the job's lock on its checkpoint (the run is over); with ``tidy`` (a start that
        failed), also the directory the lock made if nothing else was written into it."""
        if self.checkpoint_lock is not None:
            self.checkpoint_lock.release(tidy=tidy)
            self.checkpoint_lock = None

    def _check_state_types(self) -> None:
        """Refuse, by name and with the ways on, to restart a checkpoint whose native-window
        state holds sums this code keeps in a wider type (Spark fails such a restart on its
        first batch with a state schema error that names neither)."""
        if not self.layout.marker.exists():
            return
        saved = layout.owner(self.checkpoint_dir).get("fingerprint") or {}
        changed = [
            what
            for query, what in restore.widened_sums(saved, self.fingerprint)
            if self.layout.query(query).last_committed() is not None
        ]
        if changed:
            raise IncompatibleSavepointError(
                str(self.checkpoint_dir),
                changed,
                "Nothing was changed; the checkpoint is as the last run left it.",
            )

    def _check_inputs(self, saved: dict | None = None) -> None:
        """Refuse, by name, a query whose checkpoint holds the offsets of other sources than it
        reads now (a union's inputs added, removed or reordered): Spark keeps one line of
        offsets per source, by position, and would stop on its first batch with an assertion
        that names neither. ``saved``: the fingerprint the checkpoint was claimed with."""
        named = {
            query: what
            for query, what in restore.changed_sources(saved or {}, self.fingerprint)
            if self.layout.query(query).last_committed() is not None
        }
        changed = list(named.values())
        for n, q in enumerate(self.plan.queries):
            try:
                committed = self.layout.query(q.name).committed_offsets()
            except (OSError, ValueError, IndexError):
                # A damaged offset log entry (UnicodeDecodeError is a ValueError) is damage
                # recovery's to name or fall back from, below; the fingerprint above still
                # compares the inputs.
                continue
            if committed is None or q.name in named or _migrates(q, self.layout.query(q.name)):
                continue  # (a migration writes the offsets of the engine's query)
            sources = committed["sources"]
            lines = len(sources)
            # Written before each input's watermark was kept, while every process function
            # whose timers can emit carried the watermark's branch, with the timer ticks of an
            # on_timer since removed, or without ticks before TTL-only functions read them: it
            # runs on as it was written (Spark refuses a source added to or removed from a
            # checkpoint).
            written = [
                q,
                replace(q, watermark_carrier_kept=True),
                replace(q, event_ticks_written=True),
                replace(q, event_ticks_written=False),
            ]
            if resumes(q):
                written += [replace(w, input_watermarks=False) for w in written]
            same = next((w for w in written if _written_as(w, sources)), None)
            if same is not None:
                self.plan.queries[n] = same
            if same is not None and not same.input_watermarks:
                self.console.say(
                    f"query {q.name}: its checkpoint was written before srt kept each input's "
                    f"watermark with the batch, so it runs as before: after a restart, an "
                    f"input that gets no new record holds the query's watermark where the "
                    f"restart found it. A new checkpoint directory (its inputs read again from "
                    f"their start) keeps each input's watermark."
                )
            elif same is None:
                changed.append(
                    f"query {q.name}: its checkpoint holds the offsets of {lines} source(s), "
                    f"the job reads {len(q.inputs)} ({', '.join(q.source_names)}) — a union's "
                    f"inputs cannot be added or removed on a checkpoint; keep them as they "
                    f"were, or run the changed union as a query of its own (another sink name)"
                )
        if changed:
            raise IncompatibleSavepointError(
                str(self.checkpoint_dir),
                changed,
                "Nothing was changed; the checkpoint is as the last run left it.",
            )

    def _restore(self) -> None:
        """Lay a savepoint or the mirror out as the job's checkpoint (before it is claimed)."""
        sp, self.restored = restore.restore_job(
            self.job.checkpoint.dir,
            self._query_names,
            self.fingerprint,
            from_savepoint=self.from_savepoint,
            savepoint_roots=[savepoint_root(self.job)],
            restore_from=self.restore_from,
            allow_non_restored=self.allow_non_restored_state,
            lock=self.checkpoint_lock,
        )
        what = "savepoint" if self.from_savepoint else "checkpoint mirror"
        self.console.say(
            f"restored {what} {sp.location} (batches {self.restored['batches']}) into "
            f"{self.checkpoint_dir}"
        )
        if self.restored["previous_checkpoint_moved_to"]:
            self.console.say(
                "the checkpoint that was there is kept in "
                f"{self.restored['previous_checkpoint_moved_to']}"
            )
        for d in self.restored["dropped_state"]:
            self.console.say(f"not restored (--allow-non-restored-state): {d}")

    def _fresh_checkpoint(self) -> None:
        """``--replay-sinks`` from the source: the checkpoint is moved aside whole (only one of
        the runtime's, never deleted) and the job starts from its sources' earliest records."""
        ckpt = self.checkpoint_dir
        held = (
            [p for p in ckpt.iterdir() if p.name != self.layout.lock_file.name]
            if (ckpt.exists())
            else []
        )
        if not held:
            return
        self.layout.check_owned(moving=True)
        aside = ckpt.with_name(
            f"{ckpt.name}.before-replay-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}"
        )
        if isinstance(ckpt, S3Path):  # no rename of a prefix: its objects move, the lease stays
            self.layout.move_contents(aside)
        else:
            self._swap_for_fresh(ckpt, aside)
        self.console.say(
            f"replaying into fresh sink tables from the sources: the checkpoint that was "
            f"there is kept in {aside}"
        )

    def _swap_for_fresh(self, ckpt: Path, aside: Path) -> None:
        """Rename the checkpoint directory to ``aside`` and an empty one, locked first, into
        its place."""
        fresh = ckpt.with_name(f".{ckpt.name}.replay-{uuid.uuid4().hex[:6]}")
        fresh.mkdir()
        if self.checkpoint_lock is not None:
            self.checkpoint_lock.follow(fresh)  # the fresh directory is this process's first
        os.replace(ckpt, aside)
        os.replace(fresh, ckpt)
        if self.checkpoint_lock is not None:
            self.checkpoint_lock.settle()

    def _check_sinks(self) -> None:
        """Each warehouse sink's table against the checkpoint (:mod:`.sink_check`): a table or
        ledger that lost batches refuses the start, naming the ways back."""
        rewinds = {
            **self.recovery.rewind,
            **{
                q: b
                for q, b in ((self.restored or {}).get("batches") or {}).items()
                if b is not None
            },
        }
        try:
            checked = sink_check.check(
                self.job.name, self.plan.queries, self.layout, rewinds=rewinds
            )
        except SinkDataLostError as exc:
            raise self._with_ways_back(exc) from None
        for c in checked:
            if c.note:
                self.console.say(c.note)

    def _with_ways_back(self, exc: SinkDataLostError) -> SinkDataLostError:
        newest = None
        try:
            found = savepoints.list_savepoints(savepoint_root(self.job), job=self.job.name)
        except Exception:  # noqa: BLE001 - an unreadable savepoint store: name none
            found = []
        if found:
            sp = found[-1]
            batches = {q: v.get("batch") for q, v in sp.manifest.get("queries", {}).items()}
            newest = (sp.id, next((b for b in batches.values() if b is not None), None))
        return exc.with_ways_back(
            sink_check.ways_back(
                exc, str(self.jobfile.path), self.jobfile.config, self.jobfile.defaults, newest
            )
        )

    def _register(self) -> None:
        # A damaged entry stops the run (CorruptEntryError says what to do): it may belong to
        # a live process of this job, which a second one must not run beside.
        previous = registry.read(self.job.name)
        if previous and registry.running(previous) and previous.get("pid") != os.getpid():
            raise JobError(
                f"job {self.job.name!r} is already running as pid {previous['pid']}; "
                f"stop it with `srt stop {self.job.name}` or use `srt status`"
            )
        # Everything this process starts (the JVM, Python workers) carries the run's id, so
        # what is left of it can be told from an unrelated process that reused a pid.
        run_id = os.environ.setdefault(registry.RUN_ID_ENV, uuid.uuid4().hex)
        self.endpoint = ControlEndpoint(RunnerHandlers(self))
        entry = self._starting(
            run_id,
            now_iso(),
            control=self.endpoint.start(),
            # Kept across plain restarts (the checkpoint remembers its origin), so retention
            # keeps protecting the savepoint this checkpoint came from.
            restored_from=layout.owner(self.checkpoint_dir).get("restored_from"),
            restore=self.restored,
            queries={
                q.name: QueryStatus(str(self.layout.query(q.name).root), q.path, q.output_mode)
                for q in self.plan.queries
            },
        )
        registry.write(self.job.name, entry.to_json())
        self._registered = True

    # ------------------------------------------------------------------------- start

    def _start_query(self, spark: SparkSession, q: QueryPlan) -> _Running:

        qdir = str(self.layout.query(q.name).root)
        single = q.process is not None
        if single:
            refuse_speculation(
                spark.sparkContext.getConf().get("spark.speculation", "false")
            )  # taken by the query's own session when it starts, then set back
            key, value = SINGLE_WATERMARK
            before = spark.conf.get(key, None)
            spark.conf.set(key, value)
        try:
            return self._start_built(spark, q, qdir)
        finally:
            if single:
                if before is None:
                    spark.conf.unset(key)
                else:
                    spark.conf.set(key, before)

    def _start_built(self, spark: SparkSession, q: QueryPlan, qdir: str) -> _Running:
        df = build(spark, q, qdir, skips=self.skips)
        batch_writer = BatchWriter(q, qdir)
        batch_writer.check_schemas(arrow_schema(df.schema))
        self._open_sinks(q)
        name = f"{self.job.name}.{q.name}"
        watermarks = None
        if resumes(q) or tracks_partitions(q):
            watermarks = InputWatermarks(spark, q, name, qdir, bounded=self.available_now)
        writer = (
            df.writeStream.queryName(name)
            .outputMode(q.output_mode)
            .option("checkpointLocation", s3a_url(checkpoint_path(qdir)))
            .foreachBatch(_foreach_batch(spark, batch_writer, self._written, watermarks))
        )
        if self.available_now:
            writer = writer.trigger(availableNow=True)
        else:
            secs = self.job.checkpoint.interval.total_seconds()
            writer = writer.trigger(processingTime=f"{secs} seconds")
        run = _Running(q, writer.start(), qdir, batch_writer, watermarks=watermarks)
        sink_check.record_started(self.layout.query(q.name), q)
        run.records.dead_letters += self._published_early.pop(q.name, 0)
        return run

    def _open_sinks(self, q: QueryPlan) -> None:
        """Open each sink of the query; rewind it to a restored or recovered batch (the batches
        after it are planned again)."""
        for out in q.outputs:
            out.sink.open(self.job.name, out.name)
            if self.restored and q.name in self.restored["batches"]:
                out.sink.rewind(self.restored["batches"][q.name])
            elif q.name in self.recovery.rewind:
                out.sink.rewind(self.recovery.rewind[q.name])
        if q.name in self.recovery.rewind:
            self.recovery.rewound(q.name)

    # ------------------------------------------------------------------------- monitor

    def _report(self) -> None:
        """Per newly committed batch: health, progress line, dead letters, mirror, listeners."""
        events = []
        idle = False
        for run in self.runs:
            reported = new_progress(run.query, run.printed)
            for progress in reported.batches:
                run.printed = progress["batchId"]
                events.append(self._committed(run, progress))
            if not reported.batches and reported.idle is not None:
                idle = self._idle(run, reported.idle) or idle
        if idle and not events:
            registry.update(self.job.name, health=self._health())
        if not events and not (self.mirror is not None and self.mirror.failed_syncs):
            return  # nothing committed since the last poll (and no mirror outage to retry)
        if events:
            self._publish_dead_letters()
        synced = self._sync_mirror()
        registry.update(self.job.name, health=self._health())
        for event in events:
            for listener in self.on_batch:
                listener(replace(event, mirror=synced))

    def _idle(self, run: _Running, report: Mapping[str, Any]) -> bool:
        """An idle trigger's report, once: the source's lag now (0: caught up), with no batch
        to show it. True if it was new."""
        if report.get("timestamp") == run.idle_at:
            return False
        run.idle_at = report.get("timestamp")
        run.health = replace(run.health, batch=idle_health(run.health.batch, report))
        return True

    def _committed(self, run: _Running, progress: dict[str, Any]) -> BatchCommitted:
        """A query's committed batch: its health and progress line; what listeners hear."""
        # Late records counted one by one (Spark's numRowsDroppedByWatermark counts groups
        # after the partial aggregation): dropped, or to a late side output.
        written = self._written.pop((run.plan.name, progress["batchId"]), None)
        counted = written.counted if written is not None else {}
        if written is not None:
            progress = dict(counted_input(progress, sum(c.records for c in counted.values())))
        late = run.records.add(progress, counted, run.plan.source_names)
        if (ran_batch := recent_batch(progress)) is not None:
            run.recent.append(ran_batch)
        batch = batch_health(
            progress,
            late_rows=late,
            late_rows_this_run=run.records.late,
            recent=tuple(run.recent),
        )
        if run.watermarks is not None:
            batch = replace(
                batch,
                event_time_lag_by_partition=run.watermarks.lag_by_partition,
                watermark_held_by=run.watermarks.held_by,
            )
        run.health = QueryHealth(
            batch=batch,
            checkpoint=checkpoint_facts(run.checkpoint_dir).committed(),
            records=run.records.counts(run.plan.source_names),
            calls=self._calls(run),
        )
        assert run.health.batch is not None
        self.console.batch(run.plan, run.health.batch)
        return BatchCommitted(
            self.job.name,
            run.plan.name,
            progress["batchId"],
            progress.get("numInputRows") or 0,
            written.ms if written is not None else None,
            written.rows if written is not None else None,
            run.health,
            progress,
        )

    @staticmethod
    def _calls(run: _Running) -> dict[str, CallStats] | None:
        """The query's map_async steps' calls this run, each with its rate since the query's
        previous batch."""
        calls = calls_of(run.plan.name)
        if calls is None:
            return None
        now = time.monotonic()
        if run.calls_seen is not None and now > run.calls_seen[0]:
            then, before = run.calls_seen
            calls = {
                step: replace(c, rate_per_s=(c.calls - before.get(step, 0)) / (now - then))
                for step, c in calls.items()
            }
        run.calls_seen = (now, {step: c.calls for step, c in calls.items()})
        return calls

    def _health(self) -> dict[str, Any]:
        """Each query's health as the registry entry keeps it."""
        return {
            r.plan.name: replace(
                r.health, dead_letters=self.dead_letter_view(r.plan.name)
            ).to_json()
            for r in self.runs
        }

    def _failed(self) -> bool:
        """True (and the cause on stderr) if a query ended with an error."""
        for run in self.runs:
            if run.writer is not None and run.writer.refused is not None:
                if not run.query.isActive or run.query.exception() is not None:
                    # Raised by run() once the job has stopped: srt's error, its JSON.
                    self.refusal = self._with_ways_back(run.writer.refused)
                    return True
            if not run.query.isActive and run.query.exception() is not None:
                # Spark appends the whole logical plan to the message; the cause is above it.
                reason = str(run.query.exception()).split("=== Streaming Query ===")[0]
                said = failures.explain(
                    reason, run.plan, self.layout.query(run.plan.name), str(self.jobfile.path)
                )
                log = registry.job_file(self.job.name, ".log")
                self.console.error(
                    f"query {run.plan.name} failed: {(said or reason).strip()} (Spark's own "
                    f"report: {log})"
                )
                self._failure = f"query {run.plan.name} failed: {(said or reason).strip()}"
                if advice := skips.advice(reason, str(self.jobfile.path)):
                    self.console.error(advice)
                if full := disk_full(run.checkpoint_dir):  # the cause, in one line
                    self.console.error(f"query {run.plan.name} failed: {full}")
                return True
        return False

    def _drain(self) -> None:
        """Let the micro-batch in flight commit before stopping (bounded by DRAIN_TIMEOUT_S),
        but not the ones after it: with a backlog the trigger is never idle, and a stop that
        waited for that waited until the backlog was read (or DRAIN_TIMEOUT_S)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        before = {r.plan.name: self._last_committed(r) for r in self.runs}

        def in_flight(r: _Running) -> bool:
            return (
                r.query.isActive
                and bool(r.query.status.get("isTriggerActive"))
                and self._last_committed(r) == before[r.plan.name]
            )

        while time.monotonic() < deadline and any(in_flight(r) for r in self.runs):
            if self._hurry.is_set():
                self.console.say(
                    "second stop signal: the batch in flight is abandoned (it is replayed "
                    "when the job runs again)"
                )
                return
            time.sleep(0.05)

    def _last_committed(self, run: _Running) -> int | None:
        return self.layout.query(run.plan.name).last_committed()

    def _publish_dead_letters(self) -> None:
        """Publish the staged dead letters of every committed batch (idempotent): at start (a
        run that crashed after a commit), after each committed batch, and at stop. The job
        process is their one publisher (:mod:`stateful_runtime.connectors.dead_letters`)."""
        runs = {r.plan.name: r for r in self.runs}
        for q in self.plan.queries:
            for i in q.inputs:
                if i.dead_letters is None:
                    continue
                # Through a sink that remembers what this run published (reasons, samples).
                key = q.name if i.index == 0 else f"{q.name}:{i.source.name}"
                replace(i.dead_letters, sink=self._sampled(key, i.dead_letters.sink)).publish(
                    self.layout.query(q.name)
                )
            if q.step_dead_letters is None:
                continue
            # A step's rejects are counted when they are published (once: the topic's mark):
            # input = output + dead letters (source's and steps') + late.
            steps = replace(
                q.step_dead_letters,
                sink=self._sampled(f"{q.name}@steps", q.step_dead_letters.sink),
            )
            published = steps.publish(self.layout.query(q.name))
            run = runs.get(q.name)
            if run is None:
                self._published_early[q.name] = self._published_early.get(q.name, 0) + published
            elif published:
                run.records.dead_letters += published
                run.health = replace(run.health, records=run.records.counts(run.plan.source_names))

    def _sampled(self, key: str, sink: Any) -> SampledDeadLetters:
        """A dead-letter sink of a query (``QUERY``: its source's; ``QUERY@steps``: its
        steps'), remembering what this run published through it."""
        sampled = self._dead_letters.get(key)
        if sampled is None:
            sampled = self._dead_letters[key] = SampledDeadLetters(sink, getattr(sink, "topic", ""))
        return sampled

    def dead_letter_view(self, query: str) -> DeadLetterView | None:
        """The query's dead letters as health reports show them, source's and steps' (one
        topic); None: it owns none."""
        views = [s.view() for k in (query, f"{query}@steps") if (s := self._dead_letters.get(k))]
        return merge_views(views) if views else None

    def _sync_mirror(self) -> MirrorSync | None:
        if self.mirror is None:
            return None
        done = self.mirror.sync()
        if done is None:
            return None
        self.console.mirror(done, self.mirror.location)
        for run in self.runs:
            mirrored = MirrorHealth(done.batches.get(run.plan.name), done.bytes_uploaded)
            run.health = replace(run.health, mirror=mirrored)
        return done

    def _on_signal(self, sig: StopSignal) -> None:
        """SIGINT/SIGTERM (on the main thread, between two of its steps): the first asks for
        a stop, a later one not to wait for the batch in flight. Flags only (see
        :mod:`.stop_signals`)."""
        if self._stop.is_set():
            self._hurry.set()
        self.stop()

    # ------------------------------------------------------------------------- stop

    def _shutdown(self, state: JobState, signals: stop_signals.StopSignals) -> None:
        """Stop the queries, publish and mirror what they committed, close the sinks, record the
        end state (and the stop-with-savepoint asked for, and what asked for the stop), answer a
        waiting ``POST /stop``. The signals go back to their handlers only once this is done: a
        second one during it must not end the process half-way."""
        for run in self.runs:
            if run.query.isActive:
                run.query.stop()
        if self.spark is not None and self._listener is not None:  # the session may run more
            self.spark.streams.removeListener(self._listener)
        if self.runs:  # (a stop before the queries started: nothing new was committed)
            self._publish_dead_letters()
            self._sync_mirror()
        for run in self.runs:  # the sinks of queries that started (a stop may come first)
            for out in run.plan.outputs:
                out.sink.close()
        self.state = state
        result = StopReport(self.job.name, os.getpid(), state)
        try:
            result = self._finish_control(state)
            taken: dict[str, Any] = (
                {"last_savepoint": result.savepoint.ref().to_json()}
                if result.savepoint is not None
                else {}
            )
            if state is JobState.STOPPED:
                taken["stopped_by"] = self._stopped_by(signals)
            if self.refusal is not None:
                taken["error"] = ErrorDocument.of(self.refusal).to_json()["error"]
            failure = self._failure or (None if self.refusal is None else str(self.refusal))
            if state is JobState.FAILED and failure:
                # What Dagster's health check and alert show (`srt status`: ``failure``).
                taken["failure"] = mask_text(failure[:FAILURE_CHARS])
            if self._owns_entry():
                registry.update(
                    self.job.name, state=state, ended_at=now_iso(), health=self._health(), **taken
                )
        finally:
            # A POST /stop waiting for this answer gets it before the endpoint closes.
            self._stop_result = result
            self._stopped.set()
            if self.endpoint is not None:
                self.endpoint.close()
            self.release_checkpoint()

    def _stopped_by(self, signals: stop_signals.StopSignals) -> StopSignal | None:
        """What asked for the stop: a signal, ``srt stop`` through the endpoint, or neither
        (a listener of the job's own)."""
        with self._stop_lock:
            if self._stop_request is not None:
                return StopSignal.ENDPOINT
        return signals.first

    def _owns_entry(self) -> bool:
        """Whether this process may write the job's end state: it registered, or the entry is
        a launcher's for this process (a stop before registering must not leave it STARTING,
        which a supervisor would take for a failed launch); never another process's entry."""
        if self._registered:
            return True
        entry = registry.read(self.job.name)
        return entry is not None and entry.get("pid") == os.getpid()

    def _finish_control(self, state: JobState) -> StopReport:
        """At the end of the run: the stop-with-savepoint if one was asked for; what a
        ``POST /stop`` answers."""
        with self._stop_lock:
            request = dict(self._stop_request or {})
        result = StopReport(self.job.name, os.getpid(), state)
        if request.get("savepoint"):
            try:
                taken = self.take_savepoint(request.get("target"), "stop-with-savepoint")
                result = replace(result, savepoint=taken)
            except Exception as exc:  # the job is stopped; its state is in the checkpoint
                result = replace(result, savepoint_error=f"{type(exc).__name__}: {exc}")
        return result

    def _print_summaries(self) -> None:
        """Each sink's summary and where each query's records went."""
        for q in self.plan.queries:
            for out in q.outputs:
                self.console.sink_summary(out.sink)
            if q.dead_letters is not None:
                self.console.sink_summary(q.dead_letters.sink)
        for run in self.runs:
            self.console.records(run.plan.name, run.records.counts(run.plan.source_names))
