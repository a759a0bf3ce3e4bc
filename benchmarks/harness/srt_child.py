"""Run one job file of this runtime to the end of its input, in this process, and record when
each micro-batch committed.

    .venv/bin/python benchmarks/harness/srt_child.py --job benchmarks/jobs/upi_count.py \
        --set source.log_dir=/tmp/log --result /tmp/run.json

Exactly ``srt run JOB --available-now`` (or, with ``--stop-file``, ``srt run JOB`` until that
file appears, then what ``srt stop`` does): the job file is loaded with ``load_job_file`` and run
by ``JobRunner``; the run is watched only through the runner's ``on_batch`` listener hook
(``BatchCommitted``). The result JSON holds wall-clock times (``time.time()``, so the parent
can line them up with its own clock): interpreter up, runner start and end, and per committed
batch the time the listener heard of it, its rows, sink time and Spark's progress report.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

T_IMPORT = time.time()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--job", required=True)
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--result", required=True)
    ap.add_argument("--verbose", action="store_true")
    ap.add_argument(
        "--stop-file",
        help="run continuously (no --available-now) until this "
        "file exists, then stop the job like `srt stop`",
    )
    a = ap.parse_args()

    from stateful_runtime._process import one_blas_thread

    one_blas_thread()  # as `srt run` does, before anything loads numpy
    from stateful_runtime.runtime.loader import load_job_file, parse_overrides
    from stateful_runtime.runtime.runner import BatchCommitted, JobRunner

    jf = load_job_file(a.job, parse_overrides(a.set))
    batches: list[dict] = []

    def listener(event: BatchCommitted) -> None:
        batches.append(
            {
                "t": time.time(),
                "query": event.query,
                "batch": event.batch_id,
                "rows": event.input_rows,
                "sink_write_ms": event.sink_write_ms,
                "sink_rows": event.sink_rows,
                "progress": dict(event.progress),
            }
        )

    out = sys.stderr if a.verbose else io.StringIO()
    runner = JobRunner(
        jf, available_now=not a.stop_file, master=a.master, out=out, on_batch=[listener]
    )
    if a.stop_file:
        import os
        import threading

        def watch() -> None:
            while not os.path.exists(a.stop_file):
                time.sleep(0.1)
            runner.stop()

        threading.Thread(target=watch, daemon=True).start()
    t_run = time.time()
    code = runner.run()
    t_end = time.time()
    result = {
        "t_import": T_IMPORT,
        "t_run": t_run,
        "t_end": t_end,
        "exit_code": code,
        "queries": {
            q.name: {"path": q.path, "output_mode": q.output_mode} for q in runner.plan.queries
        },
        "batches": batches,
    }
    if code != 0 and not a.verbose:
        result["output"] = out.getvalue()[-5000:]  # type: ignore[union-attr]
    with open(a.result, "w") as f:
        json.dump(result, f, default=str)
    return code


def run_to_end(job: Path, sets: dict[str, str], work: Path, events: int) -> dict:
    """Run ``job`` with ``sets`` in a child of this script to the end of its input (``events``
    records, checked): whole-process events/s (over the child's wall time), steady events/s
    (the rows after the first batch over the time from its commit to the last), the first
    commit's time from the child's start, and the batches."""
    import subprocess
    import tempfile

    result = Path(tempfile.mkstemp(prefix="run-", suffix=".json", dir=work)[1])
    args = [sys.executable, __file__, "--job", str(job), "--result", str(result)]
    args += [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    t0 = time.time()
    subprocess.run(args, check=True, cwd=work, stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    out = json.loads(result.read_text())
    batches = [b for b in out["batches"] if b["rows"]]
    rows = sum(b["rows"] for b in batches)
    assert rows == events, f"read {rows} of {events}"
    steady_s = batches[-1]["t"] - batches[0]["t"]
    return {
        "whole": events / wall,
        "steady": (rows - batches[0]["rows"]) / steady_s if steady_s > 0 else None,
        "first_commit_s": batches[0]["t"] - t0,
        "batches": len(batches),
    }


if __name__ == "__main__":
    sys.exit(main())
