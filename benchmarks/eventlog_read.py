"""The event-log source's read task without Spark: CPU µs a record of ``EventLogStreamReader.read``
(RocksDB scan, header cut, JSON decode, the source's columns) over UPI payments.

Appends ``--events`` payments keyed by merchant (as ``srt log append --key-field merchant_id``
does) to a one-partition topic in a temporary directory, then reads them as one split, best of
``--repeats`` (CPU time of the process: steadier than wall time on a shared machine).
``--root`` times another checkout's code (e.g. the previous commit's, from ``git archive``) with
this script, so two trees can be run one after the other:

    .venv/bin/python benchmarks/eventlog_read.py --events 250000
    .venv/bin/python benchmarks/eventlog_read.py --root /tmp/old-tree

Not a measure of the job: a ceiling for the source's Python side.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=250_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--root", type=Path, default=ROOT, help="checkout whose code is timed")
    a = ap.parse_args()
    sys.path[:0] = [str(a.root), str(ROOT)]
    from examples.upi_events import events
    from stateful_runtime.connectors.eventlog import EventLog, Record
    from stateful_runtime.connectors.eventlog.source import EventLogStreamReader, LogSplit
    from stateful_runtime.connectors.formats.json import to_struct

    schema = to_struct({"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int})
    with tempfile.TemporaryDirectory(prefix="srt-eventlog-read-") as tmp:
        log = EventLog(tmp)
        log.create_topic("upi", 1)
        with log.writer("upi") as w:
            batch = []
            for line in events(a.events, merchants=1_000):
                key = json.loads(line)["merchant_id"].encode()
                batch.append(Record(line, key, partition=0))
                if len(batch) == 5_000:
                    w.append(batch)
                    batch = []
            w.append(batch)
        options = {"log_dir": tmp, "topic": "upi", "schema": schema.json()}
        reader = EventLogStreamReader({**options, "event_time_field": "ts_ms"})
        best = float("inf")
        for _ in range(a.repeats):
            t0 = time.process_time()
            rows = sum(b.num_rows for b in reader.read(LogSplit(0, 0, a.events)))
            best = min(best, time.process_time() - t0)
        assert rows == a.events
    print(
        json.dumps(
            {"root": str(a.root), "events": a.events, "us_per_record": round(best * 1e6 / rows, 3)}
        )
    )


if __name__ == "__main__":
    main()
