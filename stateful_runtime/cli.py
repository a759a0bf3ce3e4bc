"""``srt``: the command line of the stateful runtime.

Everything ``srt`` prints passes through :class:`stateful_runtime.masking.MaskingStream`, and
JSON results through :func:`~stateful_runtime.masking.mask_data`: a secret given in a
``--set`` (or reaching this process in ``SRT_SECRET_SETS`` from a parent ``srt``) is never
shown. Job names are validated (:func:`~stateful_runtime.names.check_name`) before any
registry file is touched.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

from stateful_runtime import masking
from stateful_runtime.contract import ErrorDocument
from stateful_runtime.exceptions import JobError, StatefulRuntimeError
from stateful_runtime.names import check_name

EXIT_USAGE = 2
# Whoever read srt's output closed it (`srt log read ... | head`): srt ends quietly with the
# status a shell gives a command killed by SIGPIPE (128 + 13), as `cat` would.
EXIT_CLOSED_PIPE = 141


def _seconds(text: str) -> float:
    """A ``--timeout``-like flag: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 <= value <= 1e9):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of seconds from 0 to 1e9 (e.g. 120)"
        )
    return value


def _stop_seconds(text: str) -> float:
    """A stop's ``--timeout``: what the job's control endpoint takes, above 0 and at most a
    day (:data:`~stateful_runtime.runtime.endpoint.MAX_STOP_TIMEOUT_S`)."""
    value = _seconds(text)
    if not 0 < value <= 86_400:
        raise argparse.ArgumentTypeError(
            f"{text!r}: give a number of seconds above 0 and at most 86400 (e.g. 120)"
        )
    return value


def _epoch(text: str) -> float:
    """A ``--since``-like flag: a finite time in epoch seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r}: give a time in epoch seconds (date +%s)")
    return value


def _count(least: int, most: int | None = None):  # type: ignore[no-untyped-def]
    """An integer flag (a count, an offset, a port) from ``least`` to ``most``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = least - 1
        if value < least or (most is not None and value > most):
            bound = f"from {least} to {most}" if most is not None else f"{least} or more"
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number {bound}")
        return value

    parse.__name__ = "number"
    return parse


def _json(value: object) -> None:
    """A command's result under ``--json`` (a :mod:`stateful_runtime.contract` document's
    ``to_json()``): one JSON document on stdout, nothing else."""
    print(json.dumps(masking.mask_data(json.loads(json.dumps(value, default=str))), indent=2))


def _error_json(exc: StatefulRuntimeError) -> str:
    """An error under ``--json``, for programs (one line on stderr): its
    :class:`~stateful_runtime.contract.ErrorDocument` (type, message, public fields such as
    ``differences`` and ``stage``)."""
    return json.dumps(masking.mask_data(ErrorDocument.of(exc).to_json()))


def _log_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import append_input, serve_lines

    log = EventLog(args.log_dir)
    if args.log_cmd == "create":
        from stateful_runtime.connectors.formats.json import schema_from_ddl

        schema = schema_from_ddl(args.schema) if args.schema else None
        info = log.create_topic(args.topic, args.partitions, exist_ok=args.exist_ok, schema=schema)
        stored = f", records stored parsed as ({args.schema})" if schema is not None else ""
        print(
            f"created topic {info.name} with {info.partitions} partitions in {args.log_dir}{stored}"
        )
    elif args.log_cmd == "append":
        out = append_input(
            log,
            args.topic,
            sys.stdin.buffer,
            args.key_field,
            producer_id=args.producer_id,
            fsync=args.fsync,
        )
        if args.json:
            _json(out.to_json())
        else:
            producer = (
                f"producer id {out.producer_id!r}: the same command again appends nothing"
                if out.producer_id
                else "no producer id (piped input): give --producer-id to make a retry "
                "append nothing"
            )
            print(
                f"appended {out.appended} records to {args.topic} ({out.lines_read} lines read, "
                f"{out.skipped} skipped as already there, {out.dead_lettered} to be "
                f"dead-lettered, {out.refused} refused; {producer}); "
                f"end offsets {dict(out.end_offsets)}",
                file=sys.stderr,
            )
    elif args.log_cmd == "serve":
        with log.writer(args.topic, fsync=args.fsync) as writer:
            serve_lines(
                writer,
                host=args.host,
                port=args.port,
                key_field=args.key_field,
                on_ready=lambda port: print(
                    f"listening on {args.host}:{port} for lines to topic {args.topic} "
                    f"(one record per line; stop with Ctrl-C)",
                    flush=True,
                ),
            )
            print(f"stopped; end offsets {writer.end_offsets()}", flush=True)
    elif args.log_cmd == "info":
        ends = log.reader(args.topic).end_offsets()
        info = log.topic(args.topic)
        key = info.key
        print(
            json.dumps(
                {
                    "topic": args.topic,
                    "partitions": len(ends),
                    "end_offsets": ends,
                    "records": sum(ends.values()),
                    # placed by this field's key groups (its first append was keyed by it)
                    "key": key.to_json() if key is not None else None,
                    # records stored parsed into these fields too (created with --schema)
                    "schema": info.schema.simpleString() if info.schema is not None else None,
                }
            )
        )
    elif args.log_cmd == "read":
        reader = log.reader(args.topic)
        ends = reader.end_offsets()
        parts = [args.partition] if args.partition is not None else sorted(ends)
        shown = 0
        for p in parts:
            for rec in reader.read(p, args.offset, ends[p]):
                if shown >= args.limit:
                    return 0
                print(
                    json.dumps(
                        {
                            "partition": p,
                            "offset": rec.offset,
                            "key": rec.key.decode(errors="replace") if rec.key else None,
                            "headers": rec.headers,
                            "value": rec.value.decode(errors="replace"),
                        }
                    )
                )
                shown += 1
    return 0


def _run_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime._process import one_blas_thread
    from stateful_runtime.runtime import stop_signals

    one_blas_thread()  # before anything loads numpy

    # SIGINT/SIGTERM stop the job cleanly from here on, even while its file loads.
    signals = stop_signals.catch()
    try:
        from stateful_runtime.runtime.loader import load_job_file, parse_overrides
        from stateful_runtime.runtime.runner import JobRunner

        jobfile = load_job_file(args.job_file, parse_overrides(args.set))
        masking.remember_config(jobfile.config)  # DEFAULTS too: masked in whatever is printed
        return JobRunner(
            jobfile,
            available_now=args.available_now,
            master=args.master,
            from_savepoint=args.from_savepoint,
            restore_from=args.restore_from,
            parallelism=args.parallelism,
            allow_non_restored_state=args.allow_non_restored_state,
            signals=signals,
            skip=args.skip,
            replay_sinks=args.replay_sinks,
        ).run()
    except stop_signals.StopRequested as stop:  # before the runner could take it (loading)
        stop_signals.stopped_early(stop.signal)
        print(f"srt: stopped by {stop.signal} before the job started", file=sys.stderr)
        return 0
    finally:
        if "pyspark.sql" in sys.modules:  # (not when a stop came before anything imported it)
            from pyspark.sql import SparkSession

            from stateful_runtime.runtime.session import stop_application

            session = SparkSession.getActiveSession()
            if session is not None:
                stop_application(session)


def _explain_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.explain import explain, steps
    from stateful_runtime.runtime.loader import load_job_file, parse_overrides

    loaded = load_job_file(args.job_file, parse_overrides(args.set))
    masking.remember_config(loaded.config)
    job = loaded.job
    spark = None
    if not args.no_spark:
        from stateful_runtime.runtime.session import build_session

        # Planning only, no batch: a short run's JVM (C1 only) starts sooner.
        spark = build_session(job.parallelism, args.master, short_run=True)
    planned = plan(job)
    text = masking.mask_text(explain(planned, spark))
    if args.json:
        from stateful_runtime.contract import Explain, PlannedQuery

        explained = Explain(
            job.name,
            job.parallelism,
            str(job.checkpoint.dir),
            text,
            tuple(
                PlannedQuery(
                    q.name,
                    q.path,
                    q.reason,
                    q.output_mode,
                    tuple(steps(q)),
                    tuple(q.stateful_operators),
                )
                for q in planned.queries
            ),
        )
        _json(explained.to_json())
    else:
        print(text)
    return 0


def _status_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.runtime import control, registry

    # A damaged entry of another job never hides the readable ones: it is named on stderr.
    damaged = [] if args.job else control.unreadable()
    for exc in damaged:
        print(f"srt: warning: {exc}", file=sys.stderr)
    if args.json:  # an unknown JOB is an empty list: "no such job" is an answer, not an error
        _json([s.to_json() for s in control.statuses(args.job)])
        return 0
    entries = control.statuses(registry.require(args.job)["job"] if args.job else None)
    if not entries:
        print(
            f"no jobs registered in {registry.home() / 'jobs'}"
            + (f" ({len(damaged)} unreadable, above)" if damaged else "")
        )
        return 0
    for e in entries:
        print(f"{e.job}: {e.state} pid {e.pid} on {e.master} since {e.started_at}")
        for q, h in (e.health or {}).items():
            if h.to_json():
                b = h.batch
                print(
                    f"  {q}: committed batch {h.last_committed_batch}, checkpoint age "
                    f"{h.checkpoint_age_s} s, {b and b.processed_rows_per_s} rows/s, "
                    f"watermark {b and b.watermark}, state rows {b and b.state_rows}, "
                    f"lag {b and b.lag_records}"
                    + (
                        f", watermark held by {b.watermark_held_by}"
                        if b and b.watermark_held_by
                        else ""
                    )
                )
                behind = (b and b.event_time_lag_by_partition) or {}
                if len(behind) > 1:
                    print(
                        "    event-time lag by partition: "
                        + ", ".join(f"{k} {ms / 1000:,.1f} s" for k, ms in behind.items())
                    )
    return 0


def _stop_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.contract import Stopped, StopSignal
    from stateful_runtime.runtime import control, launcher

    if args.kill:
        killed = control.kill(args.job, pid=args.pid, grace=args.timeout)
        if args.json:
            _json(killed.to_json())
        else:
            print(
                f"ended {args.job} (pid {killed.pid}) with {killed.signal}; state "
                f"{killed.status.state}" + (f"\n  {killed.note}" if killed.note else "")
            )
        return 0
    entry, outcome = launcher.stop(args.job, timeout=args.timeout)
    if args.json:
        stopped = Stopped(args.job, entry.get("pid"), outcome.signal, control.job_status(entry))
        _json(stopped.to_json())
    else:
        how = "its control endpoint" if outcome.signal is StopSignal.ENDPOINT else "SIGTERM"
        pid, state = entry.get("pid"), entry.get("state")
        print(f"stopped {args.job} (pid {pid}, through {how}); state {state}")
    return 0


def _launch_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.runtime import control
    from stateful_runtime.runtime.loader import parse_overrides

    out = control.launch(
        args.job_file,
        parse_overrides(args.set),
        job=args.job,
        master=args.master,
        from_savepoint=args.from_savepoint,
        parallelism=args.parallelism,
        skip=args.skip,
    )
    if args.json:
        _json(out.to_json())
    elif out.launched:
        print(f"launched {out.job} as pid {out.pid}; log {out.log_path}")
    else:
        drift = f" (it runs with other {', '.join(out.config_drift)})" if out.config_drift else ""
        print(f"{out.job} is already {out.status.state} as pid {out.pid}; reused{drift}")
    return 0


def _wait_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.runtime import control

    out = control.wait(args.job, args.until, pid=args.pid, since=args.since, timeout=args.timeout)
    if args.json:
        _json(out.to_json())
    elif out.reached:
        print(f"{args.job} is {out.status.state}; committed {dict(out.last_committed)}")
    else:
        print(
            f"{args.job} committed no micro-batch in {args.timeout:g} s "
            f"(last committed {dict(out.last_committed)})"
        )
    return 0


def _upgrade_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.runtime import control
    from stateful_runtime.runtime.loader import parse_overrides

    out = control.upgrade(
        args.job,
        args.job_file,
        parse_overrides(args.set),
        parallelism=args.parallelism,
        from_savepoint=args.from_savepoint,
        target=_absolute(args.target),
        allow_non_restored_state=args.allow_non_restored_state,
        master=args.master,
        stop_timeout=args.stop_timeout,
        start_timeout=args.timeout,
        commit_timeout=args.commit_timeout,
    )
    if args.json:
        _json(out.to_json())
        return 0
    if out.savepoint:
        print(
            f"stopped {args.job} with savepoint {out.savepoint.id} "
            f"(batches {dict(out.savepoint.batches)})"
        )
    print(
        f"{args.job} runs {out.job_file} from {out.restored_from} as pid {out.pid} "
        f"with parallelism {out.parallelism}; log {out.log_path}"
        + "".join(f"\n  not restored: {d}" for d in out.not_restored)
    )
    return 0


def _reconcile_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.runtime import control

    out = control.window_counts(
        args.job,
        args.query,
        window_ms=int(args.window.total_seconds() * 1000),
        batch=args.batch,
        source=args.source,
    )
    if args.json:
        _json(out.to_json())
        return 0
    if out.batch is None:
        print(f"query {args.query} of {args.job} has committed no batch yet")
        return 0
    print(
        f"{args.job} {args.query} batch {out.batch}, watermark {out.watermark_ms} ms: "
        f"{out.good:,} good and {out.dead_letters:,} dead-letter records of "
        f"{out.records:,} in {out.topic} up to {dict(out.source_ends)}"
    )
    for start, n in sorted(out.windows.items()):
        print(f"  window {start}: {n:,}")
    return 0


def _sink_cmd(args: argparse.Namespace) -> int:
    """``srt sink accept``: go on over what a sink's table lost (the operator's decision)."""
    from stateful_runtime.contract import SinksAccepted
    from stateful_runtime.runtime.loader import load_job_file, parse_overrides
    from stateful_runtime.runtime.runner import JobRunner

    jobfile = load_job_file(args.job_file, parse_overrides(args.set))
    masking.remember_config(jobfile.config)
    done = JobRunner(jobfile).accept_sink_loss(args.sink)
    out = SinksAccepted(jobfile.job.name, tuple(done))
    if args.json:
        _json(out.to_json())
    elif done:
        print("\n".join(done))
    else:
        print(f"no sink of {out.job} lacks anything its checkpoint committed: nothing to accept")
    return 0


def _dbt_cmd(args: argparse.Namespace) -> int:
    """``srt dbt sources``: the job file's sink tables as dbt sources
    (:mod:`stateful_runtime.dbt_sources`)."""
    from stateful_runtime import dbt_sources
    from stateful_runtime.runtime import catalog
    from stateful_runtime.runtime.loader import parse_overrides

    described = catalog.sink_tables(args.job_file, parse_overrides(args.set))
    job = dbt_sources.JobTables.from_dict(described)
    document = dbt_sources.sources(
        job,
        source_name=args.source_name,
        database=args.database,
        schema=args.schema,
        loaded_at=args.loaded_at,
        kind=args.kind,
        asset_key_prefix=[p for p in (args.asset_key_prefix or "").split("/") if p],
    )
    text = dbt_sources.render(document, job_file=args.job_file, job=job.job)
    changed = None
    if args.output:
        changed = dbt_sources.write_if_changed(args.output, text)
    if args.json:
        _json(
            {
                "job": job.job,
                "output": args.output,
                "changed": changed,
                "tables": described["tables"],
                "sources": document,
            }
        )
    elif args.output:
        print(
            f"{'wrote' if changed else 'unchanged:'} {args.output} "
            f"({len(document['sources'][0]['tables'])} tables of {job.job})"
        )
    else:
        sys.stdout.write(text)
    return 0


def _age(text: str) -> timedelta:
    """``90s``, ``30m``, ``12h``, ``7d``."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        value = float(text[:-1])
        if not (math.isfinite(value) and 0 <= value * units[text[-1]] <= 1e9):
            raise ValueError(text)
        return timedelta(seconds=value * units[text[-1]])
    except (KeyError, ValueError, IndexError, OverflowError):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give an age of 0 or more like 90s, 30m, 12h or 7d"
        ) from None


def _absolute(target: str | None) -> str | None:
    """A savepoint target as the user meant it: relative to where they ran ``srt`` (the
    running job would refuse a relative one, as it cannot know that directory)."""
    if not target or "://" in target:
        return target
    return os.path.abspath(target)


def _roots(args: argparse.Namespace) -> list[str]:
    from stateful_runtime.runtime import registry

    if getattr(args, "target", None):
        return [args.target]
    roots = {e["savepoint_dir"] for e in registry.entries() if e.get("savepoint_dir")}
    return sorted(roots | {str(registry.home() / "savepoints")})


def _print_savepoints(rows: list[dict], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print("no savepoints")
        return
    for r in rows:
        batches = ", ".join(f"{q}@{b}" for q, b in r["batches"].items())
        print(
            f"{r['id']}  job {r['job']}  batch {batches}  watermark "
            f"{list(r['watermark_ms'].values())}  {r['size_bytes']:,} bytes  {r['created_at']}"
            f"  {r['kind']} v{r['format_version']}  {r['location']}"
        )


def _savepoint_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.checkpoints import manifest, retention, savepoints
    from stateful_runtime.contract import Disposed
    from stateful_runtime.runtime import launcher, registry

    if args.sp_cmd == "create":
        taken = launcher.savepoint(
            args.job, target=_absolute(args.target), stop=args.stop, timeout=args.timeout
        )
        if args.json:
            _json(taken.to_json())
        else:
            print(
                f"savepoint {taken.id} of {taken.job} at {taken.location} "
                f"({taken.size_bytes:,} bytes, batches {dict(taken.batches)})"
                + ("; the job is stopped" if args.stop else "")
            )
    elif args.sp_cmd == "list":
        problems: list[manifest.CorruptManifestError] = []
        rows = [
            sp.summary()
            for root in _roots(args)
            for sp in savepoints.list_savepoints(root, args.job, problems)
        ]
        _print_savepoints(rows, args.json)
        for problem in problems:  # left out of the list, named here
            print(f"srt: not listed: {problem}", file=sys.stderr)
    elif args.sp_cmd == "describe":
        sp = savepoints.resolve(args.savepoint, _roots(args))
        mismatches = manifest.check(sp)
        print(
            json.dumps(
                {
                    **sp.summary(),
                    **(
                        {"manifest": sp.manifest}
                        if args.files
                        else {
                            "fingerprint": sp.manifest.get("fingerprint"),
                            "queries": sp.manifest["queries"],
                        }
                    ),
                    "manifest_mismatches": [m.to_json() for m in mismatches],
                },
                indent=2,
            )
        )
        if mismatches:
            # The document above shows them; the exit status and stderr say it is unusable.
            raise manifest.ManifestMismatchError(sp.location, mismatches)
    elif args.sp_cmd == "dispose":
        sp = savepoints.resolve(args.savepoint, _roots(args))
        if sp.location in registry.protected_locations() and not args.force:
            raise JobError(
                f"a registered job was restored from {sp.location}; "
                f"pass --force to dispose of it anyway"
            )
        savepoints.dispose(sp)
        if args.json:
            _json(Disposed(((sp.id, sp.location),)).to_json())
        else:
            print(f"disposed of savepoint {sp.id} ({sp.location})")
    elif args.sp_cmd == "check":
        return _check_cmd(args)
    elif args.sp_cmd == "prune":
        if args.keep is None and args.max_age is None:
            raise JobError("say what to keep: --keep N and/or --max-age AGE")
        policy = retention.Retention(max_count=args.keep, max_age=args.max_age)
        gone = [
            sp
            for root in _roots(args)
            for sp in retention.apply_retention(
                root, args.job, policy, registry.protected_locations()
            )
        ]
        left = [sp.id for root in _roots(args) for sp in savepoints.list_savepoints(root, args.job)]
        if args.json:
            _json(Disposed(tuple((sp.id, sp.location) for sp in gone), tuple(left)).to_json())
            return 0
        for sp in gone:
            print(f"disposed of savepoint {sp.id} ({sp.location})")
        print(f"{len(gone)} disposed; kept {len(left)}: {', '.join(left) or 'none'}")
    return 0


def _check_cmd(args: argparse.Namespace) -> int:
    """Would the job file's code take this state? (No Spark: the planner's fingerprint.)"""
    from stateful_runtime.runtime import control
    from stateful_runtime.runtime.loader import parse_overrides

    out = control.check_state(
        args.job_file,
        parse_overrides(args.set),
        args.savepoint,
        allow_non_restored_state=args.allow_non_restored_state,
    )
    if args.json:
        _json(out.to_json())
        return 0
    print(
        f"{args.job_file} can restore the state of {out.location}"
        + "".join(f"\n  not restored: {d}" for d in out.not_restored)
    )
    return 0


def _checkpoint_cmd(args: argparse.Namespace) -> int:
    """``srt checkpoint rewind``: undo the batches from the one that poisoned the watermark."""
    from stateful_runtime.runtime import control
    from stateful_runtime.runtime.loader import parse_overrides

    out = control.rewind_checkpoint(
        args.job_file,
        parse_overrides(args.set),
        from_batch=args.from_batch,
        query=args.query,
        dry_run=args.dry_run,
    )
    if args.json:
        _json(out.to_json())
        return 0
    if not out.queries:
        print(
            f"{out.job}: no query's logged watermark lies beyond what its sources' event-time "
            f"policy allows; nothing to rewind (name a batch with --from-batch to rewind anyway)"
        )
        return 0
    verb = "would move" if out.dry_run else "moved"
    for q in out.queries:
        print(f"query {q.query}: {q.why}")
        print(
            f"  {verb} {len(q.moved)} file(s) of batches from {q.rerun_batch} on"
            + ("" if out.quarantine is None else f" to {out.quarantine}/{q.query}")
            + f"; the next run re-runs batch {q.rerun_batch} with its logged offsets from "
            f"batch {q.restart_after}'s state and plans the rest again; the query's sinks "
            f"forget the batches after {q.restart_after} first and write them again"
        )
    if not out.dry_run:
        print(
            "Run the job again (`srt run`). Rows the sinks hold for windows that only the "
            "refused records made stay in their tables: delete them there if unwanted."
        )
    return 0


def _state_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.checkpoints.state_reader import (
        checkpoint_of,
        inspect,
        needs_spark,
        summary,
    )
    from stateful_runtime.checkpoints.storage import is_s3
    from stateful_runtime.runtime.session import build_session, s3_conf

    with checkpoint_of(args.location, _roots(args)) as ckpt:
        # Keyed state is read from its files, without Spark (native windows' through Spark).
        spark = (
            build_session(1, args.master, s3_conf() if is_s3(ckpt) else None)
            if needs_spark(ckpt, args.operator)
            else None
        )
        rows = inspect(
            spark, ckpt, operator=args.operator, state=args.state, key=args.key, limit=args.limit
        )
        totals = summary(ckpt) if not args.json else []
    if args.json:
        for r in rows:
            print(json.dumps(r, default=str))
        return 0
    for t in totals:
        if args.operator in (None, t["operator"]):
            shown = ", ".join(f"{n} {s}" for s, n in sorted(t["rows"].items())) or "no rows"
            print(
                f"{t['query']}/{t['operator']} (batch {t['batch']}): "
                f"{t['partitions']} partition{'s' * (t['partitions'] != 1)}, "
                f"{t['key_groups']}, {shown}, {t['bytes']:,} bytes"
            )
    if not rows:
        print("no state rows")
        return 0
    import pandas as pd

    with pd.option_context("display.max_rows", None, "display.width", 200):
        print(pd.DataFrame(rows).to_string(index=False))
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="srt", description="Stateful stream processing on Spark.")
    p.add_argument(
        "--home", metavar="DIR", help="job registry directory (default $SRT_HOME, else ~/.srt)"
    )
    sub = p.add_subparsers(dest="cmd", required=True)

    log = sub.add_parser("log", help="the embedded event log")
    lsub = log.add_subparsers(dest="log_cmd", required=True)
    for name, help_ in [
        ("create", "create a topic"),
        ("append", "append stdin lines"),
        ("serve", "append lines received over TCP"),
        ("info", "end offsets of a topic"),
        ("read", "print records as JSON"),
    ]:
        c = lsub.add_parser(name, help=help_)
        c.add_argument("topic")
        c.add_argument("--log-dir", required=True)
        if name == "create":
            c.add_argument("--partitions", type=_count(1), required=True)
            c.add_argument("--exist-ok", action="store_true")
            c.add_argument(
                "--schema",
                metavar="FIELDS",
                help="the records' fields, e.g. 'txn_id string, amount_paise bigint': each "
                "append is stored parsed into them as well, and a job whose source declares the "
                "same fields and types reads those columns instead of parsing JSON",
            )
        if name in ("append", "serve"):
            c.add_argument("--key-field", help="JSON field whose value keys each record")
            c.add_argument(
                "--fsync",
                action="store_true",
                help="fsync each append (survives power loss, not only kill -9)",
            )
        if name == "append":
            c.add_argument(
                "--producer-id",
                metavar="ID",
                help="idempotent writer id: a retry with the same id skips the lines already "
                "in (default: derived from the input file; none for a pipe)",
            )
            c.add_argument("--json", action="store_true", help="print the result as JSON")
        if name == "serve":
            c.add_argument("--port", type=_count(0, 65535), default=9000)
            c.add_argument("--host", default="127.0.0.1")
        if name == "read":
            c.add_argument("--partition", type=_count(0))
            c.add_argument("--offset", type=_count(0), default=0)
            c.add_argument("--limit", type=_count(0), default=100)
    log.set_defaults(func=_log_cmd)

    for name, func, help_ in [
        ("run", _run_cmd, "run a job file"),
        ("explain", _explain_cmd, "show the planned Spark queries"),
    ]:
        c = sub.add_parser(name, help=help_)
        c.add_argument("job_file")
        c.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a key of the job file's DEFAULTS",
        )
        c.add_argument("--master", help="Spark master (default $SRT_SPARK_MASTER or local[*])")
        c.set_defaults(func=func)
        if name == "run":
            c.add_argument(
                "--available-now",
                action="store_true",
                help="process everything in the sources, then stop",
            )
            c.add_argument(
                "--from-savepoint",
                metavar="ID|PATH",
                help="start from a savepoint (id, directory or s3:// URL)",
            )
            c.add_argument(
                "--restore-from",
                metavar="LOCATION",
                help="bring the checkpoint back from its mirror (empty disk)",
            )
            c.add_argument(
                "--parallelism",
                type=_count(1),
                help="state partitions; with --from-savepoint, rescales the state",
            )
            c.add_argument(
                "--allow-non-restored-state",
                action="store_true",
                help="start even if the savepoint holds state the job no longer has",
            )
            c.add_argument(
                "--skip",
                action="append",
                default=[],
                metavar="SOURCE:PARTITION:OFFSET",
                help="pass this source record to the dead-letter topic (recorded in the "
                "checkpoint; the record a stopped job names)",
            )
            c.add_argument(
                "--replay-sinks",
                action="store_true",
                help="replay into fresh warehouse tables (the old ones renamed, kept): from "
                "the sources' earliest records (the checkpoint moved aside), or with "
                "--from-savepoint from that savepoint",
            )
        else:
            c.add_argument("--no-spark", action="store_true", help="skip Spark's own plan")
            c.add_argument(
                "--json",
                action="store_true",
                help="job name, queries (path, reason, steps) and the text",
            )

    c = sub.add_parser("launch", help="start a job file detached (or reuse its live process)")
    c.add_argument("job_file")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--job", metavar="NAME", help="refuse a file that builds another job")
    c.add_argument("--master", help="Spark master (default $SRT_SPARK_MASTER or local[*])")
    c.add_argument("--from-savepoint", metavar="ID|PATH")
    c.add_argument("--parallelism", type=_count(1))
    c.add_argument(
        "--skip",
        action="append",
        default=[],
        metavar="SOURCE:PARTITION:OFFSET",
        help="as srt run --skip: pass this source record to the dead-letter topic (given to "
        "the launched process; a live process is reused as it runs)",
    )
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_launch_cmd)

    c = sub.add_parser("wait", help="wait until a job's process is RUNNING or has committed")
    c.add_argument("job")
    c.add_argument("--until", choices=("running", "commit"), default="running")
    c.add_argument(
        "--pid", type=_count(1), help="the process to wait for (default: the registered)"
    )
    c.add_argument(
        "--since",
        type=_epoch,
        metavar="EPOCH_S",
        help="with --until commit: a commit at or after this time (default: now)",
    )
    c.add_argument("--timeout", type=_seconds, default=300.0)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_wait_cmd)

    c = sub.add_parser("status", help="jobs and their health")
    c.add_argument("job", nargs="?")
    c.add_argument(
        "--json",
        action="store_true",
        help="entries with liveness and each query's checkpoint (unknown JOB: [])",
    )
    c.set_defaults(func=_status_cmd)
    c = sub.add_parser("stop", help="stop a running job (it resumes from its checkpoint)")
    c.add_argument("job")
    c.add_argument(
        "--timeout",
        type=_stop_seconds,
        default=120.0,
        help="seconds to wait for a clean stop (with --kill: before SIGKILL)",
    )
    c.add_argument(
        "--kill",
        action="store_true",
        help="whatever its state: SIGTERM, then SIGKILL to its process group",
    )
    c.add_argument("--pid", type=_count(1), help="with --kill: only if this is still the job's pid")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_stop_cmd)

    c = sub.add_parser("upgrade", help="check, stop with a savepoint, run NEW_FILE from it")
    c.add_argument("job")
    c.add_argument("job_file", metavar="NEW_FILE")
    c.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="config of the new run, as for `srt run` (give the same as the job's)",
    )
    c.add_argument(
        "--parallelism",
        type=_count(1),
        help="state partitions (a rescale; default: the job's current count)",
    )
    c.add_argument(
        "--from-savepoint",
        metavar="ID|PATH",
        help="for a job that is not running: start from this savepoint",
    )
    c.add_argument("--target", help="savepoint root for the stop-with-savepoint")
    c.add_argument("--allow-non-restored-state", action="store_true")
    c.add_argument("--master", help="Spark master of the new run")
    c.add_argument(
        "--stop-timeout",
        type=_stop_seconds,
        default=120.0,
        help="seconds to wait for the running job to stop",
    )
    c.add_argument(
        "--timeout",
        type=_seconds,
        default=300.0,
        help="seconds to wait for the new process to be RUNNING",
    )
    c.add_argument(
        "--commit-timeout",
        type=_seconds,
        default=0.0,
        help="then wait this long for its first own commit (0: do not wait)",
    )
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_upgrade_cmd)

    c = sub.add_parser(
        "reconcile",
        help="good source records per closed event-time window up "
        "to a committed batch (what the sink's closed windows must count)",
    )
    c.add_argument("job")
    c.add_argument("--query", required=True, help="the query writing the table")
    c.add_argument("--window", type=_age, required=True, help="tumbling window size (60s, 1m...)")
    c.add_argument("--batch", type=_count(0), help="committed batch (default: the last)")
    c.add_argument("--source", help="source name, if the job has several")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_reconcile_cmd)

    sink_p = sub.add_parser("sink", help="a job's warehouse sink tables")
    sink_sub = sink_p.add_subparsers(dest="sink_cmd", required=True)
    c = sink_sub.add_parser(
        "accept",
        help="go on over batches a sink's table lost (recorded in its ledger as your decision)",
    )
    c.add_argument("job_file")
    c.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the job file's DEFAULTS (as the job runs)",
    )
    c.add_argument(
        "--sink",
        action="append",
        default=[],
        metavar="NAME",
        help="the sink (repeatable; default: every sink the start check refuses)",
    )
    c.add_argument("--json", action="store_true", help="the sinks accepted, as JSON")
    c.set_defaults(func=_sink_cmd)

    dbt_p = sub.add_parser("dbt", help="dbt on the tables a job writes")
    dbt_sub = dbt_p.add_subparsers(dest="dbt_cmd", required=True)
    c = dbt_sub.add_parser(
        "sources",
        help="dbt sources (columns, types, freshness, tests, "
        "Dagster asset keys) for the job file's warehouse sink tables",
    )
    c.add_argument("job_file")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument(
        "--output",
        "-o",
        metavar="PATH",
        help="write the YAML here (untouched when nothing changed); default stdout",
    )
    c.add_argument("--source-name", help="dbt source name (default: the job's name)")
    c.add_argument("--database", help="the source's database (e.g. an attached alias)")
    c.add_argument("--schema", help="the tables' schema (default: the warehouse's)")
    c.add_argument(
        "--loaded-at",
        choices=("commit", "window_end"),
        default="commit",
        help="freshness by the sink ledger's commit time (default) or window_end",
    )
    c.add_argument("--kind", help="only tables written to this warehouse kind")
    c.add_argument(
        "--asset-key-prefix",
        metavar="A/B",
        help="prefix of the sink-table asset keys, if your translator adds one",
    )
    c.add_argument("--json", action="store_true")
    dbt_p.set_defaults(func=_dbt_cmd)

    sp = sub.add_parser("savepoint", help="take, list and dispose of savepoints")
    ssub = sp.add_subparsers(dest="sp_cmd", required=True)
    c = ssub.add_parser("create", help="savepoint of a job's last committed batch")
    c.add_argument("job")
    c.add_argument("--stop", action="store_true", help="stop the job first (stop-with-savepoint)")
    c.add_argument(
        "--timeout", type=_stop_seconds, default=120.0, help="seconds to wait for --stop"
    )
    c = ssub.add_parser("list", help="complete savepoints")
    c.add_argument("job", nargs="?")
    for name in ("describe", "dispose"):
        c = ssub.add_parser(name, help=f"{name} one savepoint")
        c.add_argument("savepoint", metavar="ID|PATH")
        if name == "describe":
            c.add_argument("--files", action="store_true", help="the whole manifest")
        else:
            c.add_argument("--force", action="store_true")
    c = ssub.add_parser(
        "check",
        help="can a job file's code restore a savepoint (default: the "
        "job's current checkpoint)? Exit 2 with the differences if not",
    )
    c.add_argument("job_file")
    c.add_argument("savepoint", nargs="?", metavar="ID|PATH")
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.add_argument("--allow-non-restored-state", action="store_true")
    c = ssub.add_parser("prune", help="apply a retention policy to a job's savepoints")
    c.add_argument("job")
    c.add_argument("--keep", type=_count(0), help="keep at most N (the newest always stays)")
    c.add_argument("--max-age", type=_age, help="dispose of those older than AGE (7d, 12h...)")
    for c in ssub.choices.values():
        c.add_argument(
            "--target",
            help="savepoint root: a directory or s3://bucket/prefix "
            "(default: the job's savepoint.dir, else $SRT_HOME/savepoints)",
        )
        c.add_argument("--json", action="store_true")
    sp.set_defaults(func=_savepoint_cmd)

    ck = sub.add_parser("checkpoint", help="repair a job's checkpoint")
    cksub = ck.add_subparsers(dest="checkpoint_cmd", required=True)
    c = cksub.add_parser(
        "rewind",
        help="undo the batches from the one that poisoned the watermark (state kept); the "
        "next run replays them under the event-time policy",
    )
    c.add_argument("job_file")
    c.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="the job's config, as it runs (the event-time policy and checkpoint.dir)",
    )
    c.add_argument(
        "--from-batch",
        type=_count(0),
        help="re-run from this batch (default: the batch before the first whose watermark "
        "breaks the policy)",
    )
    c.add_argument("--query", help="only this query")
    c.add_argument("--dry-run", action="store_true", help="say what would move; move nothing")
    c.add_argument("--json", action="store_true")
    ck.set_defaults(func=_checkpoint_cmd)

    st = sub.add_parser("state", help="read keyed state")
    stsub = st.add_subparsers(dest="state_cmd", required=True)
    c = stsub.add_parser("inspect", help="state of a checkpoint or savepoint as a table")
    c.add_argument("location", metavar="SAVEPOINT|CHECKPOINT")
    c.add_argument("--operator")
    c.add_argument("--state")
    c.add_argument("--key", help="only this key (the first key_by field, as text)")
    c.add_argument("--limit", type=_count(0), default=1000)
    c.add_argument("--json", action="store_true", help="one JSON object per row")
    c.add_argument("--target", help="savepoint root to find an id in")
    c.add_argument("--master", help="Spark master (default local[*])")
    st.set_defaults(func=_state_cmd)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    if not isinstance(sys.stdout, masking.MaskingStream):
        sys.stdout = masking.MaskingStream(sys.stdout)  # type: ignore[assignment]
        sys.stderr = masking.MaskingStream(sys.stderr)  # type: ignore[assignment]
    args = _parser().parse_args(argv)
    if args.home:
        # This process's registry (a child of Dagster or a test gets it as a value).
        os.environ["SRT_HOME"] = str(Path(args.home).resolve())
    try:
        # Overrides holding secrets come from a parent srt (or Dagster) in the environment,
        # never in argv; removed here so Spark's processes do not inherit them.
        hidden = masking.take_env_overrides()
        if hasattr(args, "set"):
            given = dict(p.partition("=")[::2] for p in args.set)
            masking.remember_config(given)
            shown = sorted(k for k, v in given.items() if masking.holds_secret(k, v))
            if shown:
                print(
                    f"srt: warning: {', '.join(shown)} given on the command line, where "
                    f"`ps` shows it to every user; give env:NAME (an environment variable) "
                    f"instead",
                    file=sys.stderr,
                )
            args.set = [*args.set, *(f"{k}={v}" for k, v in hidden.items())]
        for attr in ("job",):
            value = getattr(args, attr, None)
            if isinstance(value, str) and args.cmd != "log":
                check_name("job", value)
        return args.func(args)
    except BrokenPipeError:
        return _closed_pipe()
    except StatefulRuntimeError as exc:
        if getattr(args, "json", False):
            print(_error_json(exc), file=sys.stderr)
        else:
            print(f"srt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _closed_pipe() -> int:
    """The reader of stdout went away: no traceback, nothing more written (the interpreter's
    final flush would fail again, so stdout now points at /dev/null)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
    return EXIT_CLOSED_PIPE


if __name__ == "__main__":
    sys.exit(main())
