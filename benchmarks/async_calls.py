"""Calling a service from the stream: ``map_async`` against a synchronous ``map`` of the same
HTTP call, and against what the capacity allows (``capacity / latency`` per worker).

    .venv/bin/python benchmarks/async_calls.py --events 100000 --sync-events 2000

Starts the example's model server (``examples/model_server.py``: asyncio, HTTP/1.1
keep-alive, every answer after ``--latency-ms``) in a process of its own, appends UPI payments
to an event-log topic, then runs ``benchmarks/jobs/scored_payments.py`` (``srt run
--available-now`` in a child, ``local[2]``, parallelism 2) with ``map_async`` at
``--capacity`` and with a ``map`` making the same call synchronously. Per run: the steady
events/s (rows after the first batch over the time from its commit to the last) and the whole
process's; the ratio async ÷ sync, and async ÷ the ceiling ``workers × capacity ÷ latency``.
The server shares the machine's cores with the job.

Writes ``benchmarks/results/async_calls.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

JOB = ROOT / "benchmarks" / "jobs" / "scored_payments.py"
SERVER = ROOT / "examples" / "model_server.py"
WORKERS = 2


def run_job(url: str, work: Path, mode: str, capacity: int, events: int) -> dict:
    from benchmarks.harness.srt_child import run_to_end

    ck = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=work))
    sets = {
        "source.log_dir": str(work / "log"),
        "sink.log_dir": str(ck / "out"),
        "checkpoint.dir": str(ck / "checkpoints"),
        "score.url": url,
        "score.mode": mode,
        "score.capacity": str(capacity),
        "source.topic": f"scored-in-{events}",
        # several batches a run, for a steady rate after the first
        "source.max_records_per_batch": str(max(events // 10, 1)),
    }
    return run_to_end(JOB, sets, work, events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--sync-events", type=int, default=2_000)
    ap.add_argument("--capacity", type=int, default=100)
    ap.add_argument("--latency-ms", type=float, default=20.0)
    a = ap.parse_args()

    from benchmarks.harness.data import upi_events
    from stateful_runtime.connectors.eventlog import EventLog

    work = Path(tempfile.mkdtemp(prefix="srt-async-calls-"))
    port = 8700 + os.getpid() % 1000
    server = subprocess.Popen(
        [sys.executable, str(SERVER), "--port", str(port), "--latency-ms", str(a.latency_ms)]
    )
    try:
        log = EventLog(work / "log")
        for n in {a.events, a.sync_events}:
            log.create_topic(f"scored-in-{n}", WORKERS)
            with log.writer(f"scored-in-{n}") as w:
                from stateful_runtime.connectors.eventlog.ingest import _records

                w.append(_records(list(upi_events(n, 14)), "merchant_id"))
        url = f"http://127.0.0.1:{port}"
        time.sleep(1)  # the server's start
        runs = {
            "async": run_job(url, work, "async", a.capacity, a.events),
            "sync": run_job(url, work, "sync", a.capacity, a.sync_events),
        }
        ceiling = WORKERS * a.capacity / (a.latency_ms / 1000)
        summary = {
            **runs,
            "ceiling": ceiling,
            "async ÷ sync (steady)": runs["async"]["steady"] / runs["sync"]["steady"],
            "async ÷ ceiling (steady)": runs["async"]["steady"] / ceiling,
        }
        print(json.dumps(summary, indent=1))
        out = ROOT / "benchmarks" / "results" / "async_calls.json"
        out.write_text(json.dumps({"args": vars(a), "summary": summary}, indent=1))
    finally:
        server.terminate()
        server.wait(10)


if __name__ == "__main__":
    main()
