"""Control-plane workflows shared by the command line and Dagster.

Each function here is one ``srt`` command's work and returns its result as a document of
:mod:`stateful_runtime.contract`: the command prints its ``to_json()`` with ``--json`` (or a
short human summary), and Dagster's ``StreamingRuntime`` resource runs the command and parses
that JSON with the same class, so both drive jobs the same way.

===================  =============================================================
``status``           registry entries, with liveness and each query's checkpoint
                     facts (last committed batch, checkpoint age, batch in flight)
``launch``           plan the job file (no Spark), then reuse its live process or
                     start ``srt run`` detached
``wait``             until a process is RUNNING, or has committed a micro-batch
``kill``             SIGTERM, then SIGKILL to the process group after a grace period,
                     only to a process whose identity the registry verified
``check_state``      can a job file's code take a savepoint's or checkpoint's state
``upgrade``          check, stop with a savepoint, relaunch from it (new code and/or
                     parallelism), wait for RUNNING (Flink's stateful upgrade/rescale)
``window_counts``    good source records per event-time window up to a committed
                     batch's offsets (closed-window reconciliation of a sink table)
===================  =============================================================
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from stateful_runtime import masking
from stateful_runtime.checkpoints import layout
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.storage import checkpoint_path
from stateful_runtime.contract import (
    CheckpointRewind,
    HealthSource,
    JobHealth,
    JobState,
    JobStatus,
    Killed,
    Launch,
    SavepointSummary,
    StateCheck,
    StopSignal,
    Upgrade,
    Wait,
    WindowCounts,
)
from stateful_runtime.exceptions import (
    ConfigError,
    IncompatibleSavepointError,
    JobError,
    StatefulRuntimeError,
)
from stateful_runtime.runtime import endpoint, launcher, registry
from stateful_runtime.runtime.progress import checkpoint_facts, now_iso

# Records decoded per read while counting a topic: bounds memory on a large topic.
READ_CHUNK = 65_536
# Lines of a dead or failed job's log that its status carries (what it said before it ended).
EXCERPT_LINES = 40


class UpgradeError(JobError):
    """An upgrade or rescale stopped part way; the message says where the job's state is.

    Attributes:
        stage: ``check`` (nothing was stopped or started), ``stop`` (stopping the job or taking
            its savepoint failed) or ``relaunch`` (the old process is stopped; its state is in
            ``savepoint_location``).
        savepoint_location: the savepoint the job was (to be) restarted from, if any.
        differences: what keeps the new code from taking the state (compatibility check).
        cause: type name of the error underneath.
    """

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        savepoint_location: str | None = None,
        differences: list[str] | None = None,
        cause: str | None = None,
    ) -> None:
        self.stage = stage
        self.savepoint_location = savepoint_location
        self.differences = list(differences or [])
        self.cause = cause
        super().__init__(message)


# ----------------------------------------------------------------------------- status


def job_status(entry: Mapping[str, Any], now: float | None = None) -> JobStatus:
    """A registry entry as ``srt status --json`` shows it: the entry, plus ``alive`` (its pid
    is a live process, the one the entry recorded), ``live`` (alive and STARTING or RUNNING),
    ``registered_state`` (the entry's own state; ``state`` says DEAD for a RUNNING entry whose
    process is gone), ``checked_at``, per query its :func:`~.progress.checkpoint_facts`, and
    ``health`` as the job process reports it now through its control endpoint
    (``health_source``: ``endpoint``) or, when it does not answer, as last written to the
    registry; for a process that ended without being asked to (DEAD, FAILED) the last lines
    of its log (``log_excerpt``)."""
    now = time.time() if now is None else now
    status = JobStatus.from_json(entry)
    alive = registry.alive(dict(entry))
    live = launcher.live(dict(entry))
    health, source = status.health, HealthSource.REGISTRY
    if live and status.control is not None:
        try:
            health = JobHealth.from_json(
                endpoint.call(entry, "GET", "/health", timeout=5.0)
            ).queries
            source = HealthSource.ENDPOINT
        except endpoint.EndpointUnavailable:
            pass
        except endpoint.EndpointError:
            pass
    state = JobState.DEAD if status.state is JobState.RUNNING and not alive else status.state
    excerpt = None
    if state in (JobState.DEAD, JobState.FAILED) or (
        status.state is JobState.STARTING and not alive
    ):
        excerpt = log_excerpt(status.log_path or launcher.log_path(status.job))
    return replace(
        status,
        state=state,
        log_excerpt=excerpt,
        registered_state=status.state,
        alive=alive,
        live=live,
        checked_at=now,
        health_source=source,
        health=health,
        queries={
            q: replace(info, checkpoint=checkpoint_facts(info.checkpoint_dir, now))
            for q, info in status.queries.items()
        },
    )


def log_excerpt(path: str | Path, lines: int = EXCERPT_LINES) -> str | None:
    """The last ``lines`` lines of a job's log, secrets masked (None: no log, or empty)."""
    text = launcher.tail(path).rstrip()
    return masking.mask_text("\n".join(text.splitlines()[-lines:])) if text else None


def statuses(job: str | None = None) -> list[JobStatus]:
    """:func:`job_status` of one job (empty if it never registered here) or of every
    readable job (:func:`unreadable` names the others)."""
    now = time.time()
    entries = registry.entries() if job is None else [e for e in [registry.read(job)] if e]
    return [job_status(e, now) for e in entries]


def unreadable() -> list[registry.CorruptEntryError]:
    """Registry entries that cannot be read, each naming its file and what to do."""
    return registry.scan()[1]


def last_committed(entry: Mapping[str, Any]) -> dict[str, int | None]:
    return {
        q: QueryLayout(info["checkpoint_dir"]).last_committed()
        for q, info in (entry.get("queries") or {}).items()
    }


# ----------------------------------------------------------------------------- launch


def config_drift(entry: Mapping[str, Any], job_file: str, config: Mapping[str, Any]) -> list[str]:
    """Keys whose value in the live process differs from ``config`` (and ``job_file`` if the
    process runs another file)."""
    running = entry.get("config") or {}
    wanted = masking.mask_config(config)  # entries keep secrets masked; compare likewise

    def same(a: Any, b: Any) -> bool:
        if str(a) == str(b):
            return True
        try:
            return float(a) == float(b)
        except (TypeError, ValueError):
            return False

    drift = [k for k, v in wanted.items() if k not in running or not same(running[k], v)]
    if entry.get("job_file") and str(entry["job_file"]) != str(job_file):
        drift.insert(0, "job_file")
    return drift


def _load(job_file: str | Path, overrides: Mapping[str, str], job: str | None) -> Any:
    """The job file loaded and planned (no Spark); refuses a file that builds another job."""
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.loader import load_job_file

    jf = load_job_file(job_file, {k: str(v) for k, v in overrides.items()})
    if job is not None and jf.job.name != job:
        raise ConfigError(
            f"{job_file} builds job {jf.job.name!r}, not {job!r}; the registry "
            f"knows a job by the name its file gives it"
        )
    return jf, plan(jf.job)


def launch(
    job_file: str | Path,
    overrides: Mapping[str, str],
    *,
    job: str | None = None,
    master: str | None = None,
    from_savepoint: str | None = None,
    parallelism: int | None = None,
    skip: Sequence[str] = (),
) -> Launch:
    """Plan the job file, then reuse the job's live process or start ``srt run`` detached
    (:func:`launcher.ensure_running`). Returns pid, whether it launched, the command, log path,
    the plan, the config keys a reused process runs differently, and the job's status.
    ``skip``: source records (``SOURCE:PARTITION:OFFSET``) the launched run passes to the
    dead-letter topic (``srt run --skip``); each is checked against the plan first."""
    from stateful_runtime.runtime import skips
    from stateful_runtime.runtime.explain import explain

    jf, planned = _load(job_file, overrides, job)
    for given in skip:  # a wrong one refused here, not in the detached process's log
        skips.parse(given, [src.name for src in jf.job.sources])
    result = launcher.ensure_running(
        jf.job.name,
        jf.path,
        overrides,
        master=master,
        from_savepoint=from_savepoint,
        parallelism=parallelism,
        extra_args=[arg for given in skip for arg in ("--skip", given)],
    )
    drift = [] if result.launched else config_drift(result.entry, str(jf.path), overrides)
    return Launch(
        job=jf.job.name,
        pid=result.pid,
        launched=result.launched,
        log_path=str(result.log_path),
        command=None if result.command is None else tuple(result.command),
        plan=explain(planned),
        config_drift=tuple(drift),
        status=job_status(result.entry),
    )


def wait(
    job: str, until: str, *, pid: int | None = None, since: float | None = None, timeout: float
) -> Wait:
    """Wait for the job's process ``pid`` (default: the registered one) to be RUNNING
    (``until="running"``; an error if it ends or time runs out) or to commit a micro-batch at
    or after ``since`` (``until="commit"``; ``reached`` false if none came in ``timeout``)."""
    pid = int(pid if pid is not None else registry.require(job)["pid"])
    if until == "running":
        entry = launcher.wait_running(job, pid, timeout=timeout)
        return Wait(True, last_committed(entry), job_status(entry))
    if until != "commit":
        raise ConfigError(f"wait until 'running' or 'commit', not {until!r}")
    committed = launcher.wait_committed(
        job, pid, since=time.time() if since is None else since, timeout=timeout
    )
    entry = registry.require(job)
    return Wait(
        committed is not None,
        committed if committed is not None else last_committed(entry),
        job_status(entry),
    )


def kill(job: str, *, pid: int | None = None, grace: float) -> Killed:
    """End the job's process whatever its state: SIGTERM, and SIGKILL to its process group
    after ``grace`` seconds; a process that is already gone gets its group SIGKILLed (its JVM
    or Python workers may outlive it). With ``pid``, only if that is still the job's process."""
    entry = registry.require(job)
    current = entry.get("pid")
    if pid is not None and current != pid:
        raise JobError(
            f"job {job!r} is now pid {current}, not {pid}: someone else restarted it; left alone"
        )
    if not current:
        raise JobError(f"job {job!r} has no process on record")
    note = None
    if registry.verified(entry):
        sent = launcher.terminate(entry, grace=grace)
    else:
        # Gone, or the pid belongs to another process now: only what is left of the job's
        # own process group (members carrying its run id) is killed.
        leftovers = launcher.signal_job(entry, signal.SIGKILL)
        sent = "none"
        if registry.pid_alive(current):
            note = launcher.not_the_job(entry)
        elif leftovers:
            note = "the job's process was gone; what was left of its process group was killed"
    return Killed(job, current, StopSignal(sent), job_status(registry.require(job)), note)


# ----------------------------------------------------------------------------- upgrade


def check_state(
    job_file: str | Path,
    overrides: Mapping[str, str],
    savepoint: str | None = None,
    *,
    allow_non_restored_state: bool = False,
    job: str | None = None,
) -> StateCheck:
    """Would the job file's code take the state of ``savepoint`` (id, directory or URL), or by
    default of the job's current checkpoint? Decided on the planner's fingerprint, no Spark.
    Raises :class:`IncompatibleSavepointError` listing every difference."""
    from stateful_runtime.checkpoints import manifest, restore, savepoints
    from stateful_runtime.checkpoints.manifest import fingerprint
    from stateful_runtime.runtime.runner import savepoint_root

    jf, planned = _load(job_file, overrides, job)
    new = fingerprint(jf.job.name, planned.queries)
    if savepoint:
        sp = savepoints.resolve(savepoint, [savepoint_root(jf.job)])
        if mismatches := manifest.check(sp, keyed_files=True):
            raise manifest.ManifestMismatchError(sp.location, mismatches)
        saved, where = sp.manifest.get("fingerprint") or {}, sp.location
    else:
        ckpt = layout.CheckpointLayout(jf.job.checkpoint.dir)
        saved = layout.owner(ckpt.root).get("fingerprint") or {}
        where = str(ckpt.root)
    dropped = restore.check_compatible(saved, new, allow_non_restored_state, where)
    return StateCheck(jf.job.name, str(jf.path), where, True, tuple(dropped))


def wait_restored(entry: Mapping[str, Any], timeout: float) -> dict[str, int | None] | None:
    """Wait until a job restored from a savepoint commits a micro-batch of its own: past the
    savepoint's batch and, when it rescaled, past the batch Spark's state repartition wrote
    before the queries started; or until it reports every query caught up (no input). Returns
    the last committed batches, None if neither happened in ``timeout``."""
    restored = entry.get("restore") or {}
    batches = restored.get("batches") or {}
    partitions = restored.get("state_partitions") or {}
    queries = entry.get("queries") or {}
    after = {
        q: batches.get(q, -1)
        + (1 if partitions.get(q) not in (None, entry.get("parallelism")) else 0)
        for q in queries
    }

    def fresh(current: dict[str, Any]) -> bool:
        if any(
            (QueryLayout(info["checkpoint_dir"]).last_committed() or -1) > after[q]
            for q, info in queries.items()
        ):
            return True
        status = JobStatus.from_json(current)
        lags = [status.query_health(q).batch for q in queries]
        return bool(queries) and all(b is not None and b.lag_records == 0 for b in lags)

    done = launcher.wait_until(
        entry["job"],
        entry["pid"],
        fresh,
        timeout=timeout,
        what="committing a micro-batch",
        raise_on_timeout=False,
    )
    return None if done is None else last_committed(done)


def upgrade(
    job: str,
    job_file: str | Path,
    overrides: Mapping[str, str],
    *,
    parallelism: int | None = None,
    from_savepoint: str | None = None,
    target: str | None = None,
    allow_non_restored_state: bool = False,
    master: str | None = None,
    stop_timeout: float = 120.0,
    start_timeout: float = 300.0,
    commit_timeout: float = 0.0,
) -> Upgrade:
    """Run ``job_file`` (new code, or the same with a new ``parallelism``) from the job's state:

    1. the file must plan, build job ``job`` and take the state (:func:`check_state`) of the
       running job's checkpoint, or of ``from_savepoint`` for a job that is not running;
    2. stop the running job with a savepoint (under ``target``);
    3. start ``srt run job_file --from-savepoint ... [--parallelism N]`` detached (by default
       with the parallelism the job has now: a rescale sticks across upgrades);
    4. wait until it is RUNNING and, with ``commit_timeout``, until it commits a batch of its
       own (or reports itself caught up).

    Any failure raises :class:`UpgradeError` saying at which stage and where the state is.
    """
    entry = registry.read(job) or {}
    running = registry.running(entry)
    state = entry.get("state", "never started")
    left = "the running job was left alone" if running else "nothing was started"
    n = parallelism if parallelism is not None else entry.get("parallelism")
    try:
        if n is not None and int(n) < 1:
            raise ConfigError(f"parallelism must be >= 1, got {n}")
        if from_savepoint and running:
            raise JobError(
                f"{job} is running (pid {entry.get('pid')}); leave --from-savepoint "
                f"out to stop it with a savepoint and upgrade from that"
            )
        if not from_savepoint and not running:
            last = (entry.get("last_savepoint") or {}).get("location")
            hint = f" (its last savepoint: {last})" if last else ""
            raise JobError(
                f"{job} is not running ({state}): there is nothing to stop with a "
                f"savepoint; give a savepoint to start from{hint}"
            )
        checked = check_state(
            job_file,
            overrides,
            from_savepoint,
            allow_non_restored_state=allow_non_restored_state,
            job=job,
        )
    except StatefulRuntimeError as exc:
        differences = exc.differences if isinstance(exc, IncompatibleSavepointError) else []
        raise UpgradeError(
            f"{job_file} cannot take {job}'s state; {left}:\n{exc}"
            if differences
            else f"{exc}\n({left})",
            stage="check",
            differences=differences,
            cause=type(exc).__name__,
        ) from exc

    summary: SavepointSummary | None = None
    # A savepoint given by id is passed on by the location the check resolved.
    source = checked.location if from_savepoint else None
    if not source:
        try:
            sp = launcher.savepoint(job, target=target, stop=True, timeout=stop_timeout)
        except StatefulRuntimeError as exc:
            after = registry.read(job) or {}
            where = (
                "it is still running"
                if registry.running(after)
                else "it is stopped; its state is in its checkpoint (`srt run` resumes it)"
            )
            raise UpgradeError(
                f"stop-with-savepoint of {job} failed: {exc}\n({where})",
                stage="stop",
                cause=type(exc).__name__,
            ) from exc
        summary = sp
        source = sp.location

    extra = ["--allow-non-restored-state"] if allow_non_restored_state else []
    try:
        jf_path = Path(job_file).resolve()
        started = launcher.ensure_running(
            job,
            jf_path,
            overrides,
            master=master,
            from_savepoint=source,
            parallelism=None if n is None else int(n),
            extra_args=extra,
        )
        if not started.launched:
            raise JobError(
                f"{job} was started by someone else (pid {started.pid}) after it "
                f"stopped; it did not restore {source}"
            )
        entry = launcher.wait_running(job, started.pid, timeout=start_timeout)
        committed = wait_restored(entry, commit_timeout) if commit_timeout > 0 else None
    except StatefulRuntimeError as exc:
        raise UpgradeError(
            f"{exc}\n\n{job} is not running; its state is in savepoint {source}. Fix the job "
            f"and upgrade again from that savepoint (`srt upgrade {job} FILE --from-savepoint "
            f"{source}`), or run the previous code from it.",
            stage="relaunch",
            savepoint_location=source,
            cause=type(exc).__name__,
        ) from exc

    entry = registry.require(job)
    last = last_committed(entry)
    partitions = {
        q: checkpoint_facts(info["checkpoint_dir"]).state_partitions
        for q, info in (entry.get("queries") or {}).items()
    }
    return Upgrade(
        job=job,
        job_file=str(jf_path),
        pid=started.pid,
        command=tuple(started.command or ()),
        log_path=str(started.log_path),
        restored_from=source,
        savepoint=summary,
        parallelism=entry.get("parallelism"),
        state_partitions=partitions,
        last_committed=committed if committed is not None else last,
        committed=None if commit_timeout <= 0 else committed is not None,
        not_restored=checked.not_restored,
        status=job_status(entry),
    )


# ----------------------------------------------------------------------------- reconcile


def window_counts(
    job: str, query: str, *, window_ms: int, batch: int | None = None, source: str | None = None
) -> WindowCounts:
    """Good records of the query's source topic per tumbling event-time window (aligned to
    the epoch) whose end is at or before the watermark of committed ``batch`` (default: the
    last), counting only records up to that batch's source end offsets: what a sink table
    written up to ``batch`` must hold in its closed windows.

    The job file is loaded exactly as the registered process runs it (its file and config), so
    the source decodes records as the job does; dead letters are counted apart.
    """
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.source import LogSource
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.loader import load_job_file

    if window_ms <= 0:
        raise ConfigError(f"window must be > 0, got {window_ms} ms")
    entry = registry.require(job)
    queries = entry.get("queries") or {}
    if query not in queries:
        raise JobError(
            f"job {job!r} has no query {query!r} in its registry entry (queries: "
            f"{sorted(queries)}); name the query that writes the table"
        )
    qdir = queries[query]["checkpoint_dir"]
    batch = QueryLayout(qdir).last_committed() if batch is None else batch
    if batch is None:
        return WindowCounts(job, query, batch, window_ms)
    try:
        offsets = QueryLayout(qdir).committed_offsets(int(batch))
    except OSError as exc:
        raise JobError(
            f"batch {batch} of query {query!r} is not in its checkpoint {qdir}: {exc}"
        ) from exc
    assert offsets is not None
    loaded = load_job_file(
        entry["job_file"], {k: str(v) for k, v in (entry.get("config") or {}).items()}
    ).job
    # A union's query reads several sources, each on its own line of the offset log: the
    # counts are of one of them (its good records, its dead letters).
    planned = next((q for q in plan(loaded).queries if q.name == query), None)
    inputs = planned.source_names if planned is not None else []
    nodes = [n for n in loaded.sources if source in (None, n.name)]
    if len(inputs) > 1:
        nodes = [n for n in nodes if n.name in inputs]
    if len(nodes) != 1:
        names = inputs if len(inputs) > 1 else [n.name for n in loaded.sources]
        raise ConfigError(
            f"query {query!r} of job {job!r} reads sources {names}; name one of them "
            f"(--source): each is counted on its own"
        )
    node = nodes[0]
    index = inputs.index(node.name) if node.name in inputs else 0
    if len(offsets["sources"]) <= index or not isinstance(offsets["sources"][index], dict):
        raise JobError(
            f"batch {batch} of query {query!r} holds no offsets of source {node.name!r} "
            f"(line {index + 1} of its offset log)"
        )
    watermark = int(offsets["watermark_ms"] or 0)
    ends = {str(k): int(v) for k, v in offsets["sources"][index].items()}
    src = node.source
    if not isinstance(src, LogSource):
        raise ConfigError(
            f"source {node.name!r} is a {type(src).__name__}; window counts read "
            f"the embedded event log (LogSource)"
        )
    if src.starting_offsets != "earliest":
        raise ConfigError(
            f"source {node.name!r} starts at {src.starting_offsets!r} offsets; "
            f"window counts need a source read from the earliest offset"
        )
    ts_field, unit = node.watermark.timestamp_field, node.watermark.timestamp_unit
    if ts_field is None:
        raise ConfigError(f"source {node.name!r} has no timestamp field")
    if unit not in ("ms", "s"):
        raise ConfigError(f"event time unit {unit!r} of source {node.name!r} is not ms or s")

    log = EventLog(src.log_dir)
    reader = log.reader(src.topic)
    reader.catch_up()
    windows: dict[int, int] = {}
    try:
        counts = _count(
            reader,
            src,
            (ts_field, unit),
            _batch_spans(QueryLayout(qdir), int(batch), node.watermark, index),
            window_ms,
            watermark,
            windows,
        )
    finally:
        reader.close()
    dlq_records = None
    if src.dead_letter_topic in {t.name for t in log.topics()}:
        dlq = log.reader(src.dead_letter_topic)
        try:
            dlq_records = sum(dlq.end_offsets().values())
        finally:
            dlq.close()
    return WindowCounts(
        job,
        query,
        batch,
        window_ms,
        watermark_ms=watermark,
        windows=dict(sorted(windows.items())),
        records=counts["records"],
        good=counts["good"],
        dead_letters=counts["dead_letters"],
        source=node.name,
        topic=src.topic,
        source_ends=ends,
        dead_letter_topic=src.dead_letter_topic,
        dead_letter_topic_records=dlq_records,
    )


def _batch_spans(
    query: QueryLayout, batch: int, watermark: Any, index: int = 0
) -> list[tuple[dict, Any]]:
    """Per batch up to ``batch``, in order: the end offsets of the query's ``index``-th source
    and the event-time bounds its read tasks applied (from its logged processing time and
    watermark). Offsets before the oldest batch Spark still logs are judged with that batch's
    bounds."""
    from stateful_runtime.connectors import event_time

    opts = {"event_time_field": watermark.timestamp_field, **event_time.options(watermark, None)}
    spans = []
    for b in query.planned_batches():
        if b > batch:
            break
        entry = query.committed_offsets(b)
        assert entry is not None
        lines = entry["sources"]
        if len(lines) <= index or not isinstance(lines[index], dict):
            continue
        ts, wm = query.batch_times(b)
        ends = {str(k): int(v) for k, v in lines[index].items()}
        spans.append((ends, event_time.bounds(opts, ts, wm)))
    return spans


def _count(
    reader: Any,
    source: Any,
    event_time: tuple[str, str],
    spans: list[tuple[dict, Any]],
    size: int,
    watermark_ms: int,
    windows: dict[int, int],
) -> dict[str, int]:
    from functools import partial

    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from stateful_runtime.connectors import event_time as event_time_policy
    from stateful_runtime.connectors.base import ERROR
    from stateful_runtime.connectors.eventlog.source import MAX_SPLIT_RECORDS
    from stateful_runtime.connectors.ranges import split_ranges

    ts_field, unit = event_time
    scale = 1000 if unit == "s" else 1
    records = good_total = dead = 0
    starts: dict[str, int] = {}

    def split(p: int, lo: int, hi: int, through: int, bounds: Any) -> Iterator[tuple]:
        """(raw values, decoded) of a read task's split, its outliers refused as the task does
        (the event log's splits: ``MAX_SPLIT_RECORDS`` of a partition's range in a batch)."""
        chunks = [
            reader.read_values(p, c, min(hi, c + READ_CHUNK)) for c in range(lo, hi, READ_CHUNK)
        ]
        tables = [source.decode(v, event_time=event_time, bounds=bounds) for v in chunks]
        if bounds is not None:
            tables = event_time_policy.refuse_outliers(
                tables,
                event_time_policy.event_ms(tables, ts_field, unit),
                ts_field,
                bounds,
                raw=lambda i: pa.array(chunks[i], pa.binary()),
                after=lambda: event_time_policy.times_after(
                    partial(reader.read_values, p), hi, through, ts_field, unit, bounds
                ),
            )
        return zip(chunks, tables, strict=True)

    for ends, bounds in spans:
        for p, end in sorted(ends.items(), key=lambda kv: int(kv[0])):
            first = starts.get(p, 0)
            starts[p] = max(first, end)
            pieces = [
                piece
                for _, lo, hi in split_ranges({p: first}, {p: end}, MAX_SPLIT_RECORDS)
                for piece in split(int(p), lo, hi, end, bounds)
            ]
            for values, decoded in pieces:
                good = pc.is_null(decoded.column(ERROR))
                ts = decoded.column(ts_field).filter(good).drop_null()
                records += len(values)
                good_total += len(ts)
                dead += len(values) - pc.sum(good.cast("int64")).as_py()
                if not len(ts):
                    continue
                starts_ = ts.to_numpy().astype(np.int64) * scale // size * size
                closed = starts_[starts_ + size <= watermark_ms]
                for w, c in zip(*np.unique(closed, return_counts=True), strict=True):
                    windows[int(w)] = windows.get(int(w), 0) + int(c)
    return {"records": records, "good": good_total, "dead_letters": dead}


def rewind_checkpoint(
    job_file: str,
    overrides: Mapping[str, str],
    *,
    from_batch: int | None = None,
    query: str | None = None,
    dry_run: bool = False,
) -> CheckpointRewind:
    """``srt checkpoint rewind``: bring back a stopped job whose checkpoint holds a watermark
    its sources' event-time policy (as ``job_file`` and ``overrides`` set it) says no record
    could have set, without losing state (:func:`~stateful_runtime.checkpoints.recovery.rewind`).

    Holds the checkpoint's lock while it works, so a running job refuses it (stop it first).
    """
    from datetime import timedelta

    from stateful_runtime.checkpoints import recovery
    from stateful_runtime.checkpoints.layout import CheckpointLayout
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.loader import load_job_file

    job = load_job_file(job_file, overrides).job
    ckpt = checkpoint_path(job.checkpoint.dir).resolve()
    if not CheckpointLayout(ckpt).marker.is_file():
        raise ConfigError(
            f"{ckpt} is not a checkpoint of job {job.name!r} (no marker): nothing to rewind; "
            f"give the --set checkpoint.dir=... the job runs with"
        )

    def ms(value: timedelta | None) -> int | None:
        return None if value is None else value // timedelta(milliseconds=1)

    queries = plan(job).queries
    bounds = {
        q.name: recovery.WatermarkBounds(
            ms(q.source.watermark.event_time_policy.max_ahead_of_processing_time),
            ms(q.source.watermark.event_time_policy.max_ahead_of_watermark),
        )
        for q in queries
    }
    lock = CheckpointLayout(ckpt).lock(
        job.name, {"pid": os.getpid(), "command": "srt checkpoint rewind", "since": now_iso()}
    )
    try:
        rewound, quarantine = recovery.rewind(
            ckpt, bounds, from_batch=from_batch, query=query, dry_run=True
        )
        if not dry_run and rewound:
            # Durable before anything moves: the replay's new dead letters below the topic's
            # mark are published, the ones already there are not again.
            tag = "rewind-" + time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            for r in rewound:
                q = next(q for q in queries if q.name == r.query)
                for i in q.inputs:  # each source the query owns the dead letters of
                    if i.dead_letters is not None:
                        _note_replay(CheckpointLayout(ckpt).query(r.query), r, i.dead_letters, tag)
            rewound, quarantine = recovery.rewind(ckpt, bounds, from_batch=from_batch, query=query)
    finally:
        lock.release()
    return CheckpointRewind(
        job.name,
        str(ckpt),
        dry_run,
        tuple(rewound),
        None if quarantine is None else str(quarantine),
    )


def _note_replay(query: QueryLayout, rewound: Any, dead_letters: Any, tag: str) -> None:
    """Note where the re-run batch starts reading, per source partition, for the dead-letter
    publisher (:func:`stateful_runtime.connectors.dead_letters.note_replay`)."""
    from stateful_runtime.connectors.dead_letters import note_replay

    at = dead_letters.index  # the source's line of the offset log (a union reads several)
    rerun = query.committed_offsets(rewound.rerun_batch)
    keys = rerun["sources"][at] if rerun and len(rerun["sources"]) > at else {}
    before = query.committed_offsets(rewound.restart_after) if rewound.restart_after >= 0 else None
    starts = before["sources"][at] if before and len(before["sources"]) > at else {}
    starts = starts if isinstance(starts, dict) else {}
    if isinstance(keys, dict):
        note_replay(
            dead_letters.staging,
            {str(k): int(starts.get(k, 0)) for k in keys},
            dead_letters.sink,
            tag,
        )
