"""``srt run``: the job's process (Flink's JobManager role) on a local or cluster Spark.

Starts one streaming query per planned query, prints a progress line per micro-batch, keeps
the job's registry entry and health fresh, stops cleanly on SIGTERM/SIGINT (``srt stop``), and
prints each sink's summary at the end.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from stateful_runtime.checkpoints import layout, manifest, recovery, restore, savepoints
from stateful_runtime.checkpoints.layout import CheckpointLayout, QueryLayout
from stateful_runtime.checkpoints.mirror import CheckpointMirror, MirrorSync
from stateful_runtime.checkpoints.verify import disk_full
from stateful_runtime.exceptions import ConfigError, JobError, SinkError
from stateful_runtime.planner import QueryPlan, chain, plan
from stateful_runtime.runtime import registry, warmup, worker_output
from stateful_runtime.runtime.batch_writes import BatchWriter
from stateful_runtime.runtime.dataframes import LATE_METRICS, SOURCE_METRICS, build
from stateful_runtime.runtime.endpoint import ControlEndpoint, Handlers
from stateful_runtime.runtime.session import build_session, default_master
from stateful_runtime.state import TimeDomain
from stateful_runtime.streams import ProcessNode

if TYPE_CHECKING:
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming import StreamingQuery

    from stateful_runtime.runtime.loader import JobFile

# How often the runner reads Spark's progress to print lines and refresh health. Spark keeps
# the last 100 progress reports, so no batch is missed at this rate.
MONITOR_INTERVAL_S = 0.5
# On stop, how long to let a micro-batch in flight finish (Flink's stop drains too) before the
# queries are interrupted; an interrupted batch is replayed on restart, so this is only tidiness.
DRAIN_TIMEOUT_S = 60.0


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class BatchCommitted:
    """What ``on_batch`` listeners hear after each committed micro-batch of a query.

    ``sink_write_ms``/``sink_rows``: time spent in, and rows given to, the query's sinks for
    this batch (every output; :class:`~stateful_runtime.runtime.batch_writes.SinkWrite` says how the
    executor path counts them); ``health`` is what the registry and ``srt status`` show;
    ``progress`` is Spark's ``StreamingQueryProgress`` as JSON; ``mirror`` is what the
    checkpoint mirror uploaded after this batch (None: no mirror, or nothing new).
    """

    job: str
    query: str
    batch_id: int
    input_rows: int
    sink_write_ms: float | None
    sink_rows: int | None
    health: Mapping[str, Any]
    progress: Mapping[str, Any]
    mirror: MirrorSync | None = None


def _wake_on_progress(wake: threading.Event) -> Any:
    """A Spark listener that sets ``wake`` when a query reports a batch or ends.

    It never reads the events: the runner reads each batch's progress itself, once
    (:func:`_new_progress`). PySpark's own wrapper turns every event into Python objects before
    a listener sees it, ~30 py4j round trips per progress report on Spark's listener thread,
    which cost 7% of a core at 5 batches a second in a latency run; so Spark is handed this
    listener itself, as the Java interface, and calls it with the Java event."""
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


def _foreach_batch(
    writer: BatchWriter, timings: dict[tuple[str, int], tuple[float, int]]
) -> Callable[[DataFrame, int], None]:
    def write(df: DataFrame, batch_id: int) -> None:
        done = writer.write(df, batch_id)
        timings[(writer.query.name, batch_id)] = (done.ms, done.rows)

    return write


@dataclass
class _Running:
    plan: QueryPlan
    query: StreamingQuery
    checkpoint_dir: str
    printed: int = -1
    health: dict[str, Any] = field(default_factory=dict)
    records: Records = field(default_factory=lambda: Records())


@dataclass
class Records:
    """Where the records a query read from its source went, this run: ``input`` (read) =
    ``output`` (into the job's operators or sinks) + ``dead_letters`` (rejected, to the
    dead-letter topic) + ``late`` (behind the watermark: dropped and counted, or to a late side
    output). ``input`` and ``dead_letters`` are counted where the source's frame is read,
    ``late`` where the window drops them (Spark's native window, or the window operator)."""

    input: int = 0
    dead_letters: int = 0
    late: int = 0

    @property
    def output(self) -> int:
        return self.input - self.dead_letters - self.late

    def add(self, progress: Mapping[str, Any]) -> int:
        """Count one batch's progress report in; returns the batch's late records."""
        observed = progress.get("observedMetrics") or {}
        source = _metrics(observed.get(SOURCE_METRICS))
        self.input += int(source.get("input") or 0)
        self.dead_letters += int(source.get("dead_letters") or 0)
        late = int(_metrics(observed.get(LATE_METRICS)).get("late") or 0)
        self.late += late
        return late

    def as_dict(self, source: str) -> dict[str, Any]:
        return {
            "source": source,
            "input": self.input,
            "output": self.output,
            "dead_letters": self.dead_letters,
            "late": self.late,
        }


def _metrics(row: Any) -> Mapping[str, Any]:
    """One observed metric of a progress report: a Row (PySpark's progress object) or a dict
    (its JSON)."""
    if row is None:
        return {}
    return row.asDict() if hasattr(row, "asDict") else row


def _offsets(value: Any) -> Any:
    """A source's offsets from a progress report (a dict, or its JSON text)."""
    if isinstance(value, str):
        import json

        try:
            return json.loads(value)
        except ValueError:
            return None
    return value


def _fmt_int(n: Any) -> str:
    return f"{int(n):,}" if isinstance(n, int | float) else "-"


def progress_health(progress: dict[str, Any], checkpoint_dir: str) -> dict[str, Any]:
    """Health of one query from its latest Spark progress report and checkpoint."""
    ops = progress.get("stateOperators") or []
    src = (progress.get("sources") or [{}])[0]
    lag, lag_by_partition = None, None
    end, latest = (_offsets(src.get("endOffset")), _offsets(src.get("latestOffset")))
    if isinstance(end, dict) and isinstance(latest, dict):
        # Offsets are {"<partition>": next} (event log) or {"<topic>:<partition>": next} (Kafka).
        lag_by_partition = {p: max(0, int(latest[p]) - int(end.get(p, 0))) for p in latest}
        lag = sum(lag_by_partition.values())
    query = QueryLayout(checkpoint_dir)
    commit_time = query.last_commit_time()
    return {
        "last_batch": progress.get("batchId"),
        "last_committed_batch": query.last_committed(),
        "checkpoint_age_s": None if commit_time is None else round(time.time() - commit_time, 3),
        "input_rows": progress.get("numInputRows"),
        "input_rows_per_s": progress.get("inputRowsPerSecond"),
        "processed_rows_per_s": progress.get("processedRowsPerSecond"),
        "batch_duration_ms": (progress.get("durationMs") or {}).get("triggerExecution"),
        "watermark": (progress.get("eventTime") or {}).get("watermark"),
        "state_rows": sum(o.get("numRowsTotal", 0) for o in ops),
        "state_bytes": sum(o.get("memoryUsedBytes", 0) for o in ops),
        "lag_records": lag,
        "lag_by_partition": lag_by_partition,
        "updated_at": _now(),
    }


def _new_progress(query: StreamingQuery, printed: int) -> list[dict[str, Any]]:
    """Progress reports of batches after ``printed``, oldest first. ``lastProgress`` answers
    the usual poll (nothing new, or one batch) in one small call; the whole ``recentProgress``
    (up to 100 reports, each a JSON document through py4j) only when batches were missed."""
    last = query.lastProgress
    if last is None or last["batchId"] <= printed:
        return []
    if last["batchId"] == printed + 1:
        return [last]
    return [p for p in query.recentProgress if p["batchId"] > printed]


def _line(job: str, run: _Running, h: dict[str, Any], out: IO[str]) -> None:
    parts = [
        f"[{job}] {run.plan.name} batch {h['last_batch']}",
        f"rows {_fmt_int(h['input_rows'])}",
        f"{_fmt_int(h['processed_rows_per_s'])} rows/s",
        f"{_fmt_int(h['batch_duration_ms'])} ms",
    ]
    if run.plan.stateful_operators:
        parts += [
            f"watermark {h['watermark'] or '-'}",
            f"state {_fmt_int(h['state_rows'])} rows",
            f"late-dropped {_fmt_int(h['late_rows_dropped_this_run'])}",
        ]
    if run.plan.dead_letters is not None:
        parts.append(f"dead letters {run.plan.dead_letters.sink.records():,}")
    if h["lag_records"] is not None:
        parts.append(f"lag {_fmt_int(h['lag_records'])}")
    print(" | ".join(parts), file=out, flush=True)


def _print_summary(sink: Any, out: IO[str]) -> None:
    summary = sink.summary()
    if summary is None:
        return
    print(f"\n{summary.title}", file=out)
    if not summary.columns:
        return
    cells = [[str(c) for c in summary.columns]] + [[str(v) for v in r] for r in summary.rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(summary.columns))]
    for i, row in enumerate(cells):
        print("  " + "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)), file=out)
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths), file=out)
    out.flush()


def savepoint_root(job: Any) -> str:
    """Where the job's savepoints go unless a command names a target."""
    return job.checkpoint.savepoint_dir or str(registry.home() / "savepoints")


class _Control(Handlers):
    """What the control endpoint asks of a :class:`JobRunner` (see ``runtime/endpoint.py``)."""

    def __init__(self, runner: JobRunner) -> None:
        self.runner = runner
        self.job = runner.job.name

    def health(self) -> dict[str, Any]:
        r = self.runner
        queries = {}
        for run in list(r.runs):
            h = dict(run.health)
            query = QueryLayout(run.checkpoint_dir)
            commit_time = query.last_commit_time()
            h["last_committed_batch"] = query.last_committed()
            h["checkpoint_age_s"] = (
                None if commit_time is None else round(time.time() - commit_time, 3)
            )
            h.setdefault("records", run.records.as_dict(run.plan.source.name))
            queries[run.plan.name] = h
        return {
            "job": self.job,
            "pid": os.getpid(),
            "state": r.state,
            "checked_at": time.time(),
            "queries": queries,
        }

    def savepoint(self, target: str | None) -> dict[str, Any]:
        summary = self.runner.take_savepoint(target, "savepoint")
        registry.update(self.job, last_savepoint=_last_savepoint(summary))
        return summary

    def stop(self, savepoint: bool, target: str | None, timeout: float) -> dict[str, Any]:
        return self.runner.stop_and_wait(savepoint=savepoint, target=target, timeout=timeout)


def _last_savepoint(summary: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": summary["id"],
        "location": summary["location"],
        "created_at": summary["created_at"],
    }


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
    ) -> None:
        self.jobfile = jobfile
        self.job = jobfile.job
        self.available_now = available_now
        self.master = master or default_master()
        self.out = out
        if from_savepoint and restore_from:
            raise ConfigError("give --from-savepoint or --restore-from, not both")
        if parallelism is not None:
            if parallelism < 1:
                raise ConfigError(f"--parallelism must be >= 1, got {parallelism}")
            self.job.parallelism = parallelism
        self.from_savepoint = from_savepoint
        self.restore_from = restore_from
        self.allow_non_restored_state = allow_non_restored_state
        self.restored: dict[str, Any] | None = None
        self.mirror: CheckpointMirror | None = None
        self.plan = plan(self.job)
        if available_now:
            timed = [
                n.name
                for s in self.job.sinks
                for n in chain(s.parent)
                if isinstance(n, ProcessNode)
                and n.function.time_domain is TimeDomain.PROCESSING_TIME
            ]
            if timed:
                # Spark keeps an availableNow query with processing-time timers alive forever.
                raise ConfigError(
                    f"operator(s) {sorted(set(timed))} run in processing time, which never lets "
                    f"--available-now finish; run without it and stop with `srt stop`"
                )
        self._stop = threading.Event()
        # Set by Spark's listener on every progress report and query end, and by a stop: the
        # monitor reacts at once instead of at its next poll.
        self._wake = threading.Event()
        self.runs: list[_Running] = []
        self.on_batch = list(on_batch)
        self._timings: dict[tuple[str, int], tuple[float, int]] = {}
        self.state = "STARTING"
        self.endpoint: ControlEndpoint | None = None
        self._stop_lock = threading.Lock()
        self._stop_request: dict[str, Any] | None = None
        self._stopped = threading.Event()
        self._stop_result: dict[str, Any] = {}
        self._savepoint_lock = threading.Lock()

    def _register(self) -> None:
        # A damaged entry stops the run (CorruptEntryError says what to do): it may belong to
        # a live process of this job, which a second one must not run beside.
        entry = registry.read(self.job.name)
        if entry and registry.running(entry) and entry.get("pid") != os.getpid():
            raise JobError(
                f"job {self.job.name!r} is already running as pid {entry['pid']}; "
                f"stop it with `srt stop {self.job.name}` or use `srt status`"
            )
        # Everything this process starts (the JVM, Python workers) carries the run's id, so
        # what is left of it can be told from an unrelated process that reused a pid.
        run_id = os.environ.setdefault(registry.RUN_ID_ENV, uuid.uuid4().hex)
        self.endpoint = ControlEndpoint(_Control(self))
        control = self.endpoint.start()
        registry.write(
            self.job.name,
            {
                "job": self.job.name,
                "state": "STARTING",
                "pid": os.getpid(),
                "pid_start": registry.process_start(os.getpid()),
                "run_id": run_id,
                "control": control,
                "job_file": str(self.jobfile.path),
                "config": dict(self.jobfile.config),
                "checkpoint_dir": str(self.checkpoint_dir),
                "master": self.master,
                "available_now": self.available_now,
                "started_at": _now(),
                "parallelism": self.job.parallelism,
                "savepoint_dir": savepoint_root(self.job),
                "mirror": self.job.checkpoint.mirror,
                # Kept across plain restarts (the checkpoint remembers its origin), so retention
                # keeps protecting the savepoint this checkpoint came from.
                "restored_from": layout.owner(self.checkpoint_dir).get("restored_from"),
                "restore": self.restored,
                "queries": {
                    q.name: {
                        "checkpoint_dir": str(
                            CheckpointLayout(self.checkpoint_dir).query(q.name).root
                        ),
                        "path": q.path,
                        "output_mode": q.output_mode,
                    }
                    for q in self.plan.queries
                },
            },
        )

    def stop(self) -> None:
        """Ask the job to stop: the batch in flight commits, then the queries stop."""
        self._stop.set()
        self._wake.set()

    def stop_and_wait(
        self, *, savepoint: bool = False, target: str | None = None, timeout: float = 300.0
    ) -> dict[str, Any]:
        """Stop (with a savepoint of the final committed batch if asked) and wait until the
        queries stopped and the sinks closed: the final state, and the savepoint's summary."""
        with self._stop_lock:
            if self._stop_request is None:
                self._stop_request = {"savepoint": savepoint, "target": target}
            elif savepoint and not self._stop_request["savepoint"]:
                self._stop_request.update(savepoint=True, target=target)
        self.stop()
        if not self._stopped.wait(timeout):
            raise JobError(
                f"job {self.job.name!r} did not stop within {timeout:.0f} s; it is "
                f"still stopping (a micro-batch in flight)"
            )
        return dict(self._stop_result)

    def take_savepoint(self, target: str | None, kind: str) -> dict[str, Any]:
        """A savepoint of the last committed batch, taken by this process (it knows its
        checkpoint); its summary."""
        if self.state == "STARTING" or not hasattr(self, "checkpoint_dir"):
            raise JobError(
                f"job {self.job.name!r} is still starting; take the savepoint once "
                f"it is RUNNING and has committed a batch"
            )
        with self._savepoint_lock:
            sp = savepoints.create(
                self.checkpoint_dir, target or savepoint_root(self.job), kind=kind
            )
        return sp.summary()

    def _finish_control(self, state: str) -> dict[str, Any]:
        """At the end of the run: the stop-with-savepoint if one was asked for; what a
        ``POST /stop`` answers."""
        result: dict[str, Any] = {
            "job": self.job.name,
            "pid": os.getpid(),
            "state": state,
            "savepoint": None,
        }
        with self._stop_lock:
            request = dict(self._stop_request or {})
        if request.get("savepoint"):
            try:
                result["savepoint"] = self.take_savepoint(
                    request.get("target"), "stop-with-savepoint"
                )
            except Exception as exc:  # the job is stopped; its state is in the checkpoint
                result["savepoint_error"] = f"{type(exc).__name__}: {exc}"
        return result

    def _on_signal(self, signum: int, frame: Any) -> None:
        self.stop()

    def _restore(self) -> None:
        """Lay a savepoint or the mirror out as the job's checkpoint (before it is claimed)."""
        queries = [q.name for q in self.plan.queries]
        sp, self.restored = restore.restore_job(
            self.job.checkpoint.dir,
            queries,
            self.fingerprint,
            from_savepoint=self.from_savepoint,
            savepoint_roots=[savepoint_root(self.job)],
            restore_from=self.restore_from,
            allow_non_restored=self.allow_non_restored_state,
        )
        what = "savepoint" if self.from_savepoint else "checkpoint mirror"
        self._say(
            f"restored {what} {sp.location} (batches {self.restored['batches']}) into "
            f"{Path(self.job.checkpoint.dir).resolve()}"
        )
        if self.restored["previous_checkpoint_moved_to"]:
            self._say(
                "the checkpoint that was there is kept in "
                f"{self.restored['previous_checkpoint_moved_to']}"
            )
        for d in self.restored["dropped_state"]:
            self._say(f"not restored (--allow-non-restored-state): {d}")

    def _say(self, text: str) -> None:
        print(f"[{self.job.name}] {text}", file=self.out, flush=True)

    def run(self) -> int:
        """Run to the end; returns the process exit code (0 clean, 1 a query failed)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        self.fingerprint = manifest.fingerprint(self.job.name, self.plan.queries)
        if self.from_savepoint or self.restore_from:
            self._restore()
        self.checkpoint_dir = layout.claim(
            self.job.checkpoint.dir,
            self.job.name,
            [q.name for q in self.plan.queries],
            self.fingerprint,
        )
        # Damage confined to the newest batch falls back to the one before; other damage refuses.
        self.recovery = recovery.recover(
            self.checkpoint_dir,
            [q.name for q in self.plan.queries],
            job_file=str(self.jobfile.path),
            savepoint_dir=savepoint_root(self.job),
            mirror=self.job.checkpoint.mirror,
        )
        for note in self.recovery.notes:
            self._say(note)
        if self.job.checkpoint.mirror:
            self.mirror = CheckpointMirror(self.checkpoint_dir, self.job.checkpoint.mirror)
        for src in self.job.sources:
            src.source.check()
        self._register()
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        state, code = "FAILED", 1
        result: dict[str, Any] = {}
        spark, wake = None, None
        try:
            # Spark's Python workers print per-batch lines on stdout: into a log file instead.
            worker_output.divert(registry.job_file(self.job.name, ".workers.log"))
            spark = build_session(self.job.parallelism, self.master)
            warmup.start(
                spark,
                self.job.parallelism,
                warmup.importable([type(src.source).__module__ for src in self.job.sources]),
            )
            wake = _wake_on_progress(self._wake)
            spark.streams.addListener(wake)
            registry.update(self.job.name, spark_app_id=spark.sparkContext.applicationId)
            queries = [q.name for q in self.plan.queries]
            for note in restore.rescale(
                spark,
                self.checkpoint_dir,
                queries,
                self.job.parallelism,
                restored=self.restored is not None,
                job=self.job.name,
            ):
                self._say(note)
            self._publish_dead_letters()  # left staged by a run that crashed after a commit
            self._sync_mirror()  # batches a crashed run committed but did not mirror
            for q in self.plan.queries:
                qdir = str(CheckpointLayout(self.checkpoint_dir).query(q.name).root)
                df = build(spark, q, qdir)
                batch_writer = BatchWriter(q)
                batch_writer.check_schemas(to_arrow_schema(df.schema))
                for out in q.outputs:
                    out.sink.open(self.job.name, out.name)
                    if self.restored and q.name in self.restored["batches"]:
                        out.sink.rewind(self.restored["batches"][q.name])
                    elif q.name in self.recovery.rewind:  # batches planned again
                        out.sink.rewind(self.recovery.rewind[q.name])
                if q.name in self.recovery.rewind:
                    self.recovery.rewound(q.name)
                writer = (
                    df.writeStream.queryName(f"{self.job.name}.{q.name}")
                    .outputMode(q.output_mode)
                    .option("checkpointLocation", qdir)
                    .foreachBatch(_foreach_batch(batch_writer, self._timings))
                )
                if self.available_now:
                    writer = writer.trigger(availableNow=True)
                else:
                    secs = self.job.checkpoint.interval.total_seconds()
                    writer = writer.trigger(processingTime=f"{secs} seconds")
                self.runs.append(_Running(q, writer.start(), qdir))
            registry.update(self.job.name, state="RUNNING")
            self.state = "RUNNING"
            n = len(self.runs)
            print(
                f"[{self.job.name}] running {n} {'query' if n == 1 else 'queries'} on "
                f"{self.master}; "
                f"checkpoints in {self.checkpoint_dir}",
                file=self.out,
                flush=True,
            )
            failed = self._monitor()
            state, code = (
                ("FAILED", 1) if failed else ("STOPPED" if self._stop.is_set() else "FINISHED", 0)
            )
        except SinkError as exc:
            print(f"[{self.job.name}] error: {exc}", file=sys.stderr)
        finally:
            for run in self.runs:
                if run.query.isActive:
                    run.query.stop()
            if spark is not None and wake is not None:  # the session may run more jobs
                spark.streams.removeListener(wake)
            self._publish_dead_letters()
            self._sync_mirror()
            for q in self.plan.queries:
                for out in q.outputs:
                    out.sink.close()
            self.state = state
            try:
                result = self._finish_control(state)
                taken = (
                    {"last_savepoint": _last_savepoint(result["savepoint"])}
                    if result.get("savepoint")
                    else {}
                )
                registry.update(
                    self.job.name,
                    state=state,
                    ended_at=_now(),
                    health={r.plan.name: r.health for r in self.runs},
                    **taken,
                )
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                # A POST /stop waiting for this answer gets it before the endpoint closes.
                self._stop_result = result
                self._stopped.set()
                if self.endpoint is not None:
                    self.endpoint.close()
        if code == 0:
            for q in self.plan.queries:
                for out in q.outputs:
                    _print_summary(out.sink, self.out)
                if q.dead_letters is not None:
                    _print_summary(q.dead_letters.sink, self.out)
            for run in self.runs:
                r = run.records
                print(
                    f"\nrecords of {run.plan.name} from source {run.plan.source.name} (this run): "
                    f"input {r.input:,} = output {r.output:,} + dead letters "
                    f"{r.dead_letters:,} + late {r.late:,}",
                    file=self.out,
                    flush=True,
                )
        return code

    def _publish_dead_letters(self) -> None:
        """Publish the staged dead letters of every committed batch (idempotent): at start (a
        run that crashed after a commit), after each committed batch, and at stop. The job
        process is their one publisher (:mod:`stateful_runtime.connectors.dead_letters`)."""
        for q in self.plan.queries:
            if q.dead_letters is None:
                continue
            q.dead_letters.publish(CheckpointLayout(self.checkpoint_dir).query(q.name))

    def _report(self) -> None:
        """Per newly committed batch: health, progress line, dead letters, mirror, listeners."""
        events = []
        for run in self.runs:
            for progress in _new_progress(run.query, run.printed):
                run.printed = progress["batchId"]
                run.health = progress_health(progress, run.checkpoint_dir)
                # Late records counted one by one (Spark's numRowsDroppedByWatermark counts
                # groups after the partial aggregation): dropped, or to a late side output.
                run.health["late_rows_dropped"] = run.records.add(progress)
                run.health["late_rows_dropped_this_run"] = run.records.late
                run.health["records"] = run.records.as_dict(run.plan.source.name)
                _line(self.job.name, run, run.health, self.out)
                ms, rows = self._timings.pop((run.plan.name, progress["batchId"]), (None, None))
                events.append(
                    BatchCommitted(
                        self.job.name,
                        run.plan.name,
                        progress["batchId"],
                        progress.get("numInputRows") or 0,
                        ms,
                        rows,
                        dict(run.health),
                        progress,
                    )
                )
        if not events and not (self.mirror is not None and self.mirror.failed_syncs):
            return  # nothing committed since the last poll (and no mirror outage to retry)
        if events:
            self._publish_dead_letters()
        synced = self._sync_mirror()
        registry.update(self.job.name, health={r.plan.name: r.health for r in self.runs})
        for event in events:
            for listener in self.on_batch:
                listener(replace(event, mirror=synced))

    def _sync_mirror(self) -> MirrorSync | None:
        if self.mirror is None:
            return None
        done = self.mirror.sync()
        if done is None:
            return None
        share = done.bytes_uploaded / done.bytes_referenced if done.bytes_referenced else 0.0
        print(
            f"[{self.job.name}] mirror: batches {done.batches} -> {self.mirror.location}: "
            f"{done.files_uploaded} files, {done.bytes_uploaded:,} bytes uploaded "
            f"({share:.1%} of {done.bytes_referenced:,} bytes of checkpoint)",
            file=self.out,
            flush=True,
        )
        for run in self.runs:
            run.health["mirror_batch"] = done.batches.get(run.plan.name)
            run.health["mirror_bytes_uploaded"] = done.bytes_uploaded
        return done

    def _drain(self) -> None:
        """Let a micro-batch in flight commit before stopping (bounded by DRAIN_TIMEOUT_S)."""
        deadline = time.monotonic() + DRAIN_TIMEOUT_S
        while time.monotonic() < deadline and any(
            r.query.isActive and r.query.status.get("isTriggerActive") for r in self.runs
        ):
            time.sleep(0.05)

    def _monitor(self) -> bool:
        """Wait until every query ends or a stop is requested; True if a query failed."""
        while True:
            self._wake.clear()
            self._report()
            for run in self.runs:
                if not run.query.isActive and run.query.exception() is not None:
                    # Spark appends the whole logical plan to the message; the cause is above it.
                    reason = str(run.query.exception()).split("=== Streaming Query ===")[0]
                    print(
                        f"[{self.job.name}] query {run.plan.name} failed: {reason.strip()}",
                        file=sys.stderr,
                        flush=True,
                    )
                    if full := disk_full(run.checkpoint_dir):  # the cause, in one line
                        print(
                            f"[{self.job.name}] query {run.plan.name} failed: {full}",
                            file=sys.stderr,
                            flush=True,
                        )
                    return True
            if self._stop.is_set():
                print(f"[{self.job.name}] stopping", file=self.out, flush=True)
                self._drain()
                for run in self.runs:
                    run.query.stop()
                self._report()
                return False
            if not any(run.query.isActive for run in self.runs):
                self._report()
                return False
            self._wake.wait(MONITOR_INTERVAL_S)
