"""``srt``: the command line of the stateful runtime."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Sequence

from stateful_runtime.exceptions import JobError, StatefulRuntimeError

EXIT_USAGE = 2


def _log_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.log import EventLog
    from stateful_runtime.log._ingest import append_stream, serve_lines

    log = EventLog(args.log_dir)
    if args.log_cmd == "create":
        info = log.create_topic(args.topic, args.partitions, exist_ok=args.exist_ok)
        print(f"created topic {info.name} with {info.partitions} partitions in {args.log_dir}")
    elif args.log_cmd == "append":
        with log.writer(args.topic, fsync=args.fsync) as writer:
            n = append_stream(writer, sys.stdin.buffer, args.key_field)
            ends = writer.end_offsets()
        print(f"appended {n} records to {args.topic}; end offsets {ends}", file=sys.stderr)
    elif args.log_cmd == "serve":
        with log.writer(args.topic, fsync=args.fsync) as writer:
            serve_lines(
                writer, host=args.host, port=args.port, key_field=args.key_field,
                on_ready=lambda port: print(
                    f"listening on {args.host}:{port} for lines to topic {args.topic} "
                    f"(one record per line; stop with Ctrl-C)", flush=True),
            )
            print(f"stopped; end offsets {writer.end_offsets()}", flush=True)
    elif args.log_cmd == "info":
        ends = log.reader(args.topic).end_offsets()
        print(json.dumps({"topic": args.topic, "partitions": len(ends), "end_offsets": ends,
                          "records": sum(ends.values())}))
    elif args.log_cmd == "read":
        reader = log.reader(args.topic)
        ends = reader.end_offsets()
        parts = [args.partition] if args.partition is not None else sorted(ends)
        shown = 0
        for p in parts:
            for rec in reader.read(p, args.offset, ends[p]):
                if shown >= args.limit:
                    return 0
                print(json.dumps({"partition": p, "offset": rec.offset,
                                  "key": rec.key.decode(errors="replace") if rec.key else None,
                                  "headers": rec.headers,
                                  "value": rec.value.decode(errors="replace")}))
                shown += 1
    return 0


def _run_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.job import load_job_file, parse_overrides
    from stateful_runtime.runtime.runner import JobRunner

    jobfile = load_job_file(args.job_file, parse_overrides(args.set))
    try:
        return JobRunner(jobfile, available_now=args.available_now, master=args.master).run()
    finally:
        from pyspark.sql import SparkSession

        session = SparkSession.getActiveSession()
        if session is not None:  # end the Spark application cleanly (FINISHED on a cluster)
            session.stop()


def _explain_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.job import load_job_file, parse_overrides
    from stateful_runtime.planner import plan

    job = load_job_file(args.job_file, parse_overrides(args.set)).job
    spark = None
    if not args.no_spark:
        from stateful_runtime.runtime.session import build_session

        spark = build_session(job.parallelism, args.master)
    print(plan(job).explain(spark))
    return 0


def _status_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.runtime import registry

    entries = [registry.require(args.job)] if args.job else registry.entries()
    for e in entries:
        e["alive"] = registry.pid_alive(e.get("pid"))
        if e.get("state") == "RUNNING" and not e["alive"]:
            e["state"] = "DEAD"
    if args.json:
        print(json.dumps(entries, indent=2, default=str))
        return 0
    if not entries:
        print(f"no jobs registered in {registry.home() / 'jobs'}")
        return 0
    for e in entries:
        print(f"{e['job']}: {e.get('state')} pid {e.get('pid')} on {e.get('master')} "
              f"since {e.get('started_at')}")
        for q, h in (e.get("health") or {}).items():
            if h:
                print(f"  {q}: committed batch {h.get('last_committed_batch')}, checkpoint age "
                      f"{h.get('checkpoint_age_s')} s, {h.get('processed_rows_per_s')} rows/s, "
                      f"watermark {h.get('watermark')}, state rows {h.get('state_rows')}, "
                      f"lag {h.get('lag_records')}")
    return 0


def _stop_cmd(args: argparse.Namespace) -> int:
    from stateful_runtime.runtime import registry

    entry = registry.require(args.job)
    if not registry.running(entry):
        raise JobError(f"job {args.job!r} is not running (state {entry.get('state')})")
    pid = entry["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + args.timeout
    while registry.pid_alive(pid):
        if time.monotonic() > deadline:
            raise JobError(f"job {args.job!r} (pid {pid}) did not stop within {args.timeout} s; "
                           f"check it, or kill it: it restarts from its last checkpoint")
        time.sleep(0.2)
    print(f"stopped {args.job} (pid {pid}); state {registry.read(args.job).get('state')}")
    return 0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="srt", description="Stateful stream processing on Spark.")
    sub = p.add_subparsers(dest="cmd", required=True)

    log = sub.add_parser("log", help="the embedded event log")
    lsub = log.add_subparsers(dest="log_cmd", required=True)
    for name, help_ in [("create", "create a topic"), ("append", "append stdin lines"),
                        ("serve", "append lines received over TCP"),
                        ("info", "end offsets of a topic"), ("read", "print records as JSON")]:
        c = lsub.add_parser(name, help=help_)
        c.add_argument("topic")
        c.add_argument("--log-dir", required=True)
        if name == "create":
            c.add_argument("--partitions", type=int, required=True)
            c.add_argument("--exist-ok", action="store_true")
        if name in ("append", "serve"):
            c.add_argument("--key-field", help="JSON field whose value keys each record")
            c.add_argument("--fsync", action="store_true",
                           help="fsync each append (survives power loss, not only kill -9)")
        if name == "serve":
            c.add_argument("--port", type=int, default=9000)
            c.add_argument("--host", default="127.0.0.1")
        if name == "read":
            c.add_argument("--partition", type=int)
            c.add_argument("--offset", type=int, default=0)
            c.add_argument("--limit", type=int, default=100)
    log.set_defaults(func=_log_cmd)

    for name, func, help_ in [("run", _run_cmd, "run a job file"),
                              ("explain", _explain_cmd, "show the planned Spark queries")]:
        c = sub.add_parser(name, help=help_)
        c.add_argument("job_file")
        c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                       help="override a key of the job file's DEFAULTS")
        c.add_argument("--master", help="Spark master (default $SRT_SPARK_MASTER or local[*])")
        c.set_defaults(func=func)
        if name == "run":
            c.add_argument("--available-now", action="store_true",
                           help="process everything in the sources, then stop")
        else:
            c.add_argument("--no-spark", action="store_true", help="skip Spark's own plan")

    c = sub.add_parser("status", help="jobs and their health")
    c.add_argument("job", nargs="?")
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=_status_cmd)
    c = sub.add_parser("stop", help="stop a running job (it resumes from its checkpoint)")
    c.add_argument("job")
    c.add_argument("--timeout", type=float, default=120.0)
    c.set_defaults(func=_stop_cmd)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except StatefulRuntimeError as exc:
        print(f"srt: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
