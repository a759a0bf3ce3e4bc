"""Throughput benchmark of the UPI per-minute job (examples/upi_per_minute.py).

Generates N payment events into a fresh event log, runs the job in-process with
``--available-now`` semantics, and hears each committed micro-batch (Spark's progress and the
sink write time) through the runner's ``on_batch`` listener hook. In the same
process and on the same events it also runs peers (plain Spark *batch* jobs doing the same
aggregation), so the headline numbers are ratios that mean something on any machine.

    .venv/bin/python benchmarks/upi_throughput.py                  # 2M events, a few minutes
    .venv/bin/python benchmarks/upi_throughput.py --events 300000  # quick check

See benchmarks/README.md for what every number means.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import multiprocessing as mp
import os
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stateful_runtime.runtime.runner import BatchCommitted, JobRunner

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
JOB_FILE = EXAMPLES / "upi_per_minute.py"
DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "upi_throughput.json"
sys.path.insert(0, str(EXAMPLES))
sys.path.insert(0, str(ROOT))

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

TOPIC = "upi-payments"
AGG_QUERY = "upi-counts"
TARGET_EVENTS_PER_S = 300_000  # from the issue: after warm-up, on a 2-core machine
PAYMENT_DDL = "txn_id STRING, merchant_id STRING, amount_paise BIGINT, ts_ms BIGINT"


# --------------------------------------------------------------------------------------------
# small helpers


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]); None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def rate(rows: float, seconds: float) -> float | None:
    return rows / seconds if seconds > 0 else None


def fmt_rate(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f}/s"


def fmt_ms(x: float | None) -> str:
    return "-" if x is None else f"{x:,.0f} ms"


def fmt_us(x: float | None) -> str:
    return "-" if x is None else f"{x:,.2f} us"


def fmt_ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def tree_cpu_s() -> float:
    """CPU seconds (user + system) used so far by this process and all its descendants (the
    Spark JVM, its Python workers and source runners), reaped children included. A difference
    of two readings is the CPU a step cost, whatever else runs on the machine."""
    tick = os.sysconf("SC_CLK_TCK")
    procs: dict[int, tuple[int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[1] = ppid; [11..14] = utime, stime, cutime, cstime (clock ticks)
        procs[int(name)] = (int(fields[1]), sum(int(x) for x in fields[11:15]))
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in procs.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0, [os.getpid()]
    while stack:
        pid = stack.pop()
        total += procs.get(pid, (0, 0))[1]
        stack.extend(children.get(pid, ()))
    return total / tick


@contextlib.contextmanager
def timed(label: str, into: dict[str, float], key: str) -> Iterator[None]:
    say(f"... {label}")
    t0 = time.perf_counter()
    yield
    into[key] = time.perf_counter() - t0
    say(f"    {label}: {into[key]:.2f} s")


# --------------------------------------------------------------------------------------------
# 1. events → event log (and the same lines as a JSON-lines file for the batch peer)


def _gen_chunk(args: tuple[int, int, int, int, int, int, int]) -> bytes:
    from upi_events import START_MS, events

    count, first_index, merchants, rate_per_s, disorder_ms, bad_every, seed = args
    start = START_MS + int(first_index * 1000 / rate_per_s)
    return b"\n".join(
        events(
            count,
            merchants=merchants,
            rate_per_s=rate_per_s,
            disorder_ms=disorder_ms,
            bad_every=bad_every,
            seed=seed,
            start_ms=start,
        )
    )


def generate(
    n: int,
    *,
    merchants: int,
    rate_per_s: int,
    disorder_ms: int,
    bad_every: int,
    seed: int,
    procs: int,
) -> tuple[list[bytes], int]:
    """N events from examples/upi_events.py, generated in ``procs`` contiguous chunks in
    parallel (chunk k uses seed+k and continues event time where chunk k-1 ends). Returns the
    lines and how many of them are bad records."""
    procs = max(1, min(procs, n // 50_000 or 1))
    bounds = [n * k // procs for k in range(procs + 1)]
    jobs = [
        (
            bounds[k + 1] - bounds[k],
            bounds[k],
            merchants,
            rate_per_s,
            disorder_ms,
            bad_every,
            seed + k,
        )
        for k in range(procs)
    ]
    if procs == 1:
        blobs = [_gen_chunk(jobs[0])]
    else:
        with mp.get_context("fork").Pool(procs) as pool:
            blobs = pool.map(_gen_chunk, jobs)
    bad = sum(j[0] // bad_every for j in jobs) if bad_every else 0
    return [line for blob in blobs if blob for line in blob.split(b"\n")], bad


def append_to_log(log_dir: Path, lines: Sequence[bytes], partitions: int) -> dict[str, Any]:
    """Append like ``srt log append --key-field merchant_id``: key extraction + one RocksDB
    WriteBatch per APPEND_BATCH lines. Times the two halves separately."""
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import APPEND_BATCH, _records

    EventLog(log_dir).create_topic(TOPIC, partitions)
    key_s = append_s = 0.0
    with EventLog(log_dir).writer(TOPIC) as writer:
        for i in range(0, len(lines), APPEND_BATCH):
            t0 = time.perf_counter()
            recs = _records(lines[i : i + APPEND_BATCH], "merchant_id")
            t1 = time.perf_counter()
            writer.append(recs)
            t2 = time.perf_counter()
            key_s += t1 - t0
            append_s += t2 - t1
        ends = writer.end_offsets()
    n = len(lines)
    return {
        "records": n,
        "partitions": partitions,
        "end_offsets": ends,
        "append_batch": APPEND_BATCH,
        "key_extraction_s": round(key_s, 3),
        "store_append_s": round(append_s, 3),
        "events_per_s": rate(n, key_s + append_s),
        "store_events_per_s": rate(n, append_s),
    }


# --------------------------------------------------------------------------------------------
# 2. the streaming job


def _batch_row(p: Mapping[str, Any]) -> dict[str, Any]:
    d = p.get("durationMs") or {}
    ops = p.get("stateOperators") or []
    return {
        "batch": p["batchId"],
        "rows": p.get("numInputRows", 0),
        "trigger_ms": d.get("triggerExecution"),
        "add_batch_ms": d.get("addBatch"),
        "latest_offset_ms": d.get("latestOffset"),
        "get_batch_ms": d.get("getBatch"),
        "query_planning_ms": d.get("queryPlanning"),
        "wal_commit_ms": d.get("walCommit"),
        "commit_offsets_ms": d.get("commitOffsets"),
        "rows_per_s": p.get("processedRowsPerSecond"),
        "timestamp": p.get("timestamp"),
        "state_rows": sum(o.get("numRowsTotal", 0) for o in ops) if ops else None,
        "state_update_ms": sum(o.get("allUpdatesTimeMs", 0) for o in ops) if ops else None,
        "state_removal_ms": sum(o.get("allRemovalsTimeMs", 0) for o in ops) if ops else None,
        "state_commit_ms": sum(o.get("commitTimeMs", 0) for o in ops) if ops else None,
    }


def query_stats(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Throughput and latency of one query from its per-batch progress.

    Warm throughput = rows of data batches with batchId >= 1 / sum of their triggerExecution.
    Batches with 0 input rows (Spark's no-data batch that advances the watermark at the end of
    an available-now run) are listed but left out of throughput and latency.
    """
    data = [b for b in batches if b["rows"]]
    first = next((b for b in data if b["batch"] == 0), data[0] if data else None)
    warm = [b for b in data if b is not first]
    warm_rows = sum(b["rows"] for b in warm)
    warm_ms = sum(b["trigger_ms"] or 0 for b in warm)
    all_ms = sum(b["trigger_ms"] or 0 for b in batches)
    lat = [b["trigger_ms"] for b in warm if b["trigger_ms"] is not None]
    return {
        "batches": len(batches),
        "data_batches": len(data),
        "rows": sum(b["rows"] for b in data),
        "first_batch_rows": first["rows"] if first else None,
        "first_batch_ms": first["trigger_ms"] if first else None,
        "warm_rows": warm_rows,
        "warm_ms": warm_ms,
        "warm_events_per_s": rate(warm_rows, warm_ms / 1000),
        "all_batches_events_per_s": rate(sum(b["rows"] for b in data), all_ms / 1000),
        "no_data_batches_ms": [b["trigger_ms"] for b in batches if not b["rows"]],
        "latency_ms": {
            "p50": percentile(lat, 50),
            "p95": percentile(lat, 95),
            "max": max(lat) if lat else None,
        },
        "per_batch": batches,
    }


def _end_offsets(progress: Mapping[str, Any]) -> dict[str, int] | None:
    src = (progress.get("sources") or [{}])[0]
    end = src.get("endOffset")
    if isinstance(end, str):
        end = json.loads(end)
    return {str(k): int(v) for k, v in end.items()} if isinstance(end, dict) else None


class BatchListener:
    """The benchmark's ``JobRunner(on_batch=[...])`` listener, called on the job process's
    monitor thread once per committed micro-batch of each query (a ``BatchCommitted``).

    It keeps each query's per-batch progress row with the sink write time the runner measured;
    once every query has committed a data batch, notes the CPU used so far and the rows each
    query has consumed (``snapshot``, for the warm CPU cost per event); and with
    ``stop_when_caught_up``, calls ``runner.stop()`` (what ``srt stop`` asks for) once every
    query has committed a batch ending at the log's end offsets (``target``).
    """

    def __init__(self, target: dict[str, int], stop_when_caught_up: bool) -> None:
        self.target = target
        self.stop_when_caught_up = stop_when_caught_up
        self.stop: Callable[[], None] | None = None
        self.batches: dict[str, list[dict[str, Any]]] = {}
        self.rows: dict[str, int] = {}
        self.last_end: dict[str, dict[str, int] | None] = {}
        self.caught_up: set[str] = set()
        self.snapshot: dict[str, Any] = {}
        self.stop_requested = False

    def attach(self, runner: JobRunner) -> None:
        """Expect a batch from every query the runner planned; stop with its ``stop()``."""
        self.stop = runner.stop
        for q in runner.plan.queries:
            self.batches[q.name] = []
            self.rows[q.name] = 0
            self.last_end[q.name] = None

    def __call__(self, event: BatchCommitted) -> None:
        row = _batch_row(event.progress)
        row["sink_write_ms"] = (
            None if event.sink_write_ms is None else round(event.sink_write_ms, 1)
        )
        row["sink_rows"] = event.sink_rows
        self.batches.setdefault(event.query, []).append(row)
        self.rows[event.query] = self.rows.get(event.query, 0) + event.input_rows
        end = _end_offsets(event.progress)
        self.last_end[event.query] = end
        if "cpu_s" not in self.snapshot and self.rows and all(self.rows.values()):
            self.snapshot["cpu_s"] = tree_cpu_s()
            self.snapshot["rows"] = list(self.rows.values())
        if end == self.target:
            self.caught_up.add(event.query)
        everyone = self.caught_up >= set(self.rows)
        if self.stop_when_caught_up and everyone and not self.stop_requested and self.stop:
            self.stop_requested = True
            self.stop()  # the batch in flight (if any) commits, then the queries stop


def run_job(
    *,
    workdir: Path,
    name: str,
    log_dir: Path,
    ends: dict[int, int],
    batch_size: int,
    parallelism: int,
    master: str,
    mode: str,
    verbose: bool,
) -> dict[str, Any]:
    """Run the UPI job once in this process; return per-query stats.

    ``mode="available-now"``: exactly ``srt run --available-now``. ``mode="catch-up"``: the job
    with a 0 s trigger interval (micro-batches back to back, each capped at
    ``source.max_records_per_batch``), stopped with ``runner.stop()`` as soon as every query has
    consumed the whole log (for sources that read a whole backlog as one available-now batch).
    Per-batch figures come from the runner's ``on_batch`` listener hook.
    """
    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import JobRunner

    run_dir = workdir / name
    run_dir.mkdir()
    overrides = {
        "source.log_dir": str(log_dir),
        "source.topic": TOPIC,
        "source.max_records_per_batch": str(batch_size),
        "sink.database": str(run_dir / "upi.duckdb"),
        "checkpoint.dir": str(run_dir / "checkpoints"),
        "parallelism": str(parallelism),
    }
    if mode == "catch-up":
        overrides["checkpoint.interval_s"] = "0"
    jf = load_job_file(JOB_FILE, overrides)
    out = io.StringIO()
    listener = BatchListener({str(p): n for p, n in ends.items()}, mode == "catch-up")
    runner = JobRunner(
        jf, available_now=mode == "available-now", master=master, out=out, on_batch=[listener]
    )
    listener.attach(runner)
    cpu0, t0 = tree_cpu_s(), time.perf_counter()
    code = runner.run()
    wall = time.perf_counter() - t0
    cpu_end = tree_cpu_s()
    cpu = cpu_end - cpu0
    if verbose:
        say(out.getvalue().rstrip())
    if code != 0:
        say(out.getvalue())
        raise SystemExit(f"job run {name!r} failed with exit code {code}")
    queries = {}
    for q, rows in listener.batches.items():
        stats = query_stats(rows)
        stats["sink_write_ms_total"] = round(sum(b["sink_write_ms"] or 0 for b in rows), 1)
        stats["caught_up"] = listener.last_end.get(q) == listener.target
        queries[q] = stats
    n = sum(ends.values())
    warm_cpu = None
    snapshot = listener.snapshot
    if "cpu_s" in snapshot:  # events still to do after every query's first batch, on average
        left = sum(n - r for r in snapshot["rows"]) / len(snapshot["rows"])
        if left >= n / 2:  # else the end-of-run costs (no-data batch, stop) dominate
            warm_cpu = round((cpu_end - snapshot["cpu_s"]) * 1e6 / left, 3)
    result: dict[str, Any] = {
        "mode": mode,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "cpu_us_per_event": round(cpu * 1e6 / n, 3) if n else None,
        "warm_cpu_us_per_event": warm_cpu,
        "stopped_when_caught_up": listener.stop_requested,
        "queries": queries,
    }
    with contextlib.suppress(Exception):
        import duckdb

        con = duckdb.connect(str(run_dir / "upi.duckdb"), read_only=True)
        try:
            payments, windows = con.execute(
                "SELECT sum(payments), count(*) FROM upi_counts"
            ).fetchone()
        finally:
            con.close()
        result["sink"] = {"payments": int(payments or 0), "rows": int(windows)}
    with contextlib.suppress(Exception):  # dead letters published by this run (fresh topic)
        from stateful_runtime.connectors.eventlog import EventLog

        dlq = EventLog(log_dir).reader(f"{TOPIC}-dlq").end_offsets()
        result["dead_letters_in_topic"] = sum(dlq.values())
    return result


# --------------------------------------------------------------------------------------------
# 3. peers: the same aggregation as Spark batch jobs over the same events


def _aggregate(df):  # DataFrame -> DataFrame
    from pyspark.sql import functions as F

    return df.groupBy(F.window(F.timestamp_millis("ts_ms"), "1 minute"), "merchant_id").agg(
        F.count(F.lit(1)).alias("payments"), F.sum("amount_paise").alias("amount_paise")
    )


def time_batch_job(build: Callable[[], Any], runs: int) -> dict[str, Any]:
    """Run ``build()`` (a DataFrame) to completion ``runs`` times; first run is the warm-up."""
    times, cpus = [], []
    for _ in range(runs):
        cpu0, t0 = tree_cpu_s(), time.perf_counter()
        build().write.format("noop").mode("overwrite").save()
        times.append(time.perf_counter() - t0)
        cpus.append(tree_cpu_s() - cpu0)
    warm, warm_cpu = times[1:] or times, cpus[1:] or cpus
    return {
        "runs_s": [round(t, 3) for t in times],
        "runs_cpu_s": [round(c, 3) for c in cpus],
        "cold_s": times[0],
        "warm_median_s": percentile(warm, 50),
        "warm_best_s": min(warm),
        "warm_median_cpu_s": percentile(warm_cpu, 50),
    }


def _arrow_source_class():
    """A batch Python DataSource yielding pre-decoded Arrow batches with the exact columns the
    event-log source yields: Spark's aggregation over a Python Arrow source with zero read or
    decode cost (the ceiling for the event-log source's design)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class ArrowFilesReader(DataSourceReader):
        def __init__(self, options):
            self.paths = json.loads(options["paths"])

        def partitions(self):
            return [InputPartition(p) for p in self.paths]

        def read(self, partition):
            import pyarrow as pa

            with pa.memory_map(partition.value) as src:
                reader = pa.ipc.open_file(src)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)

    class ArrowFilesSource(DataSource):
        @classmethod
        def name(cls):
            return "srt_bench_arrow"

        def schema(self):
            return f"{PAYMENT_DDL}, _error STRING, _raw BINARY, _partition INT, _offset BIGINT"

        def reader(self, schema):
            return ArrowFilesReader(self.options)

    return ArrowFilesSource


def write_arrow_files(
    lines: Sequence[bytes], out_dir: Path, rows_per_file: int, partitions: int, arrow_rows: int
) -> list[str]:
    """The events decoded by the source's own decoder (``decode_json``: declared columns plus
    ``_error``/``_raw``) plus ``_partition``/``_offset``, as Arrow IPC files of
    ``rows_per_file`` rows in record batches of ``arrow_rows``."""
    import numpy as np
    import pyarrow as pa

    from stateful_runtime.connectors.formats.json import decode_json, to_struct

    schema = to_struct({"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int})
    out_dir.mkdir()
    paths = []
    for k, lo in enumerate(range(0, len(lines), rows_per_file)):
        hi = min(len(lines), lo + rows_per_file)
        table = decode_json(lines[lo:hi], schema)
        table = table.append_column(
            "_partition", pa.array(np.arange(lo, hi) % partitions, pa.int32())
        ).append_column("_offset", pa.array(np.arange(lo, hi), pa.int64()))
        path = out_dir / f"part-{k:05d}.arrow"
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            for batch in table.to_batches(max_chunksize=arrow_rows):
                w.write_batch(batch)
        paths.append(str(path))
    return paths


def run_peers(spark, *, jsonl: Path, arrow_paths: list[str], runs: int, n: int) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from stateful_runtime.connectors.base import ERROR

    out: dict[str, Any] = {}
    say(f"... peer: spark.read.json + groupBy(window, merchant_id) ({runs} runs)")
    json_peer = time_batch_job(
        lambda: _aggregate(
            spark.read.schema(PAYMENT_DDL)
            .json(str(jsonl))
            .filter("merchant_id IS NOT NULL AND amount_paise IS NOT NULL AND ts_ms IS NOT NULL")
        ),
        runs,
    )
    out["spark_json_batch"] = json_peer
    say(f"    warm median {json_peer['warm_median_s']:.2f} s")

    spark.dataSource.register(_arrow_source_class())
    paths = json.dumps(arrow_paths)
    say(f"... peer: Python Arrow DataSource (pre-decoded) + same aggregation ({runs} runs)")
    arrow_peer = time_batch_job(
        lambda: _aggregate(
            spark.read.format("srt_bench_arrow")
            .option("paths", paths)
            .load()
            .filter(F.col(ERROR).isNull())
        ),
        runs,
    )
    out["python_arrow_source_batch"] = arrow_peer
    say(f"    warm median {arrow_peer['warm_median_s']:.2f} s")
    for peer in out.values():
        peer["warm_events_per_s"] = rate(n, peer["warm_median_s"])
        peer["cold_events_per_s"] = rate(n, peer["cold_s"])
        peer["warm_cpu_us_per_event"] = round(peer["warm_median_cpu_s"] * 1e6 / n, 3)
    return out


# --------------------------------------------------------------------------------------------
# 4. where a source task's time goes (in this process, one core, same code as a Spark task)


def read_path_breakdown(log_dir: Path, max_records: int, repeats: int = 3) -> dict[str, Any]:
    """CPU time per record of the source's read path, in this process on one core: the code a
    Spark source task runs. Each figure is the best of ``repeats`` passes over the same records,
    after a warm-up pass (block cache, allocator)."""
    from stateful_runtime.connectors.eventlog import cached_reader
    from stateful_runtime.connectors.eventlog.source import (
        ARROW_BATCH_ROWS,
        EventLogStreamReader,
        LogSplit,
    )
    from stateful_runtime.connectors.formats.json import CHUNK, decode_json, to_struct

    schema = to_struct({"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int})
    reader = cached_reader(str(log_dir), TOPIC)
    ends = reader.end_offsets()
    per_part = max(1, max_records // len(ends))
    splits = [(p, 0, min(e, per_part)) for p, e in ends.items() if e]
    n = sum(hi - lo for _, lo, hi in splits)
    rows = ARROW_BATCH_ROWS
    stream = EventLogStreamReader(
        {"log_dir": str(log_dir), "topic": TOPIC, "schema": schema.json()}
    )

    def whole_task() -> None:
        for p, lo, hi in splits:
            for _ in stream.read(LogSplit(p, lo, hi)):
                pass

    def parts() -> tuple[float, float]:
        t_read = t_decode = 0.0
        for p, lo, hi in splits:
            for a in range(lo, hi, rows):
                t0 = time.process_time()
                values = reader.read_values(p, a, min(hi, a + rows))
                t1 = time.process_time()
                decode_json(values, schema)
                t_read += t1 - t0
                t_decode += time.process_time() - t1
        return t_read, t_decode

    def cpu(f: Callable[[], Any]) -> float:
        t0 = time.process_time()
        f()
        return time.process_time() - t0

    whole_task()  # warm-up
    t_task = min(cpu(whole_task) for _ in range(repeats))
    split_times = [parts() for _ in range(repeats)]
    t_read = min(t for t, _ in split_times)
    t_decode = min(t for _, t in split_times)

    # What one malformed record costs: its CHUNK-record chunk falls back to the Python decoder.
    values = reader.read_values(splits[0][0], 0, min(CHUNK, splits[0][2]))
    clean = min(cpu(lambda: decode_json(values, schema)) for _ in range(repeats))
    dirty_values = [*values[:-1], b"{not json"]
    dirty = min(cpu(lambda: decode_json(dirty_values, schema)) for _ in range(repeats))

    def us(t: float) -> float:
        return round(t * 1e6 / n, 3)

    return {
        "records": n,
        "repeats": repeats,
        "read_values_us_per_record": us(t_read),
        "decode_json_us_per_record": us(t_decode),
        "source_task_us_per_record": us(t_task),
        "other_us_per_record": us(max(0.0, t_task - t_read - t_decode)),
        "read_values_events_per_s": rate(n, t_read),
        "decode_json_events_per_s": rate(n, t_decode),
        "source_task_events_per_s_per_core": rate(n, t_task),
        "decode_chunk_records": len(values),
        "decode_chunk_clean_ms": round(clean * 1000, 3),
        "decode_chunk_one_bad_record_ms": round(dirty * 1000, 3),
    }


# --------------------------------------------------------------------------------------------
# report


def _batch_table(p: Callable[..., None], q: dict[str, Any]) -> None:
    p(
        f"    {'batch':>5} {'rows':>9} {'trigger':>10} {'addBatch':>10} {'sink':>8} "
        f"{'stCommit':>8} {'latestOff':>9} {'walCommit':>9} {'commit':>8} {'rows/s':>10}"
    )
    for b in q["per_batch"]:
        p(
            f"    {b['batch']:>5} {b['rows']:>9,} {fmt_ms(b['trigger_ms']):>10} "
            f"{fmt_ms(b['add_batch_ms']):>10} {fmt_ms(b.get('sink_write_ms')):>8} "
            f"{fmt_ms(b.get('state_commit_ms')):>8} {fmt_ms(b['latest_offset_ms']):>9} "
            f"{fmt_ms(b['wal_commit_ms']):>9} {fmt_ms(b['commit_offsets_ms']):>8} "
            f"{fmt_rate(b['rows_per_s']):>10}"
        )


def print_report(res: dict[str, Any]) -> None:
    cfg, app, s = res["config"], res["append"], res["summary"]
    runs = res["runs"]
    job = runs["job"]["queries"]
    agg = job[AGG_QUERY]
    p = print
    p()
    p(
        f"UPI per-minute job: {cfg['events']:,} events, max {cfg['batch_size']:,} records/batch, "
        f"parallelism {cfg['parallelism']}, {cfg['topic_partitions']} topic partitions, "
        f"{cfg['master']} on {res['env']['cpus']} CPUs"
    )
    load = res["env"].get("loadavg_1m_before")
    if load is not None and load > (res["env"]["cpus"] or 1):
        p(
            f"  WARNING: load average was {load:.1f} on {res['env']['cpus']} CPUs at the start: "
            f"other processes share the machine, absolute numbers are pessimistic"
        )
    p()
    g = res["generate"]
    p(
        f"  generate events              {fmt_rate(g['events_per_s']):>12}   "
        f"({g['seconds']:.1f} s, {g['processes']} processes)"
    )
    p(
        f"  append (srt log append path) {fmt_rate(app['events_per_s']):>12}   "
        f"(JSON key extraction {app['key_extraction_s']:.1f} s + RocksDB write "
        f"{app['store_append_s']:.1f} s; store alone {fmt_rate(app['store_events_per_s'])})"
    )
    p(f"  Spark session start          {res['spark_session_start_s']:>10.1f} s")
    p()
    how = "--available-now" if cfg["mode"] == "available-now" else "catch-up (0 s trigger)"
    others = [q for q in job if q != AGG_QUERY]
    alongside = f" (+ {', '.join(others)} alongside)" if others else ""
    p(f"  {AGG_QUERY}, job as shipped{alongside}, {how}:")
    _batch_table(p, agg)
    p()
    lat = agg["latency_ms"]
    p(
        f"  events/s after first batch   {fmt_rate(s['streaming_warm_events_per_s']):>12}   "
        f"target {TARGET_EVENTS_PER_S:,}/s: {'MET' if s['target_met'] else 'NOT MET'}"
    )
    p(
        f"  first batch latency          {fmt_ms(agg['first_batch_ms']):>12}   "
        f"({agg['first_batch_rows'] or 0:,} rows, includes warm-up)"
    )
    p(
        f"  batch latency p50/p95/max    {fmt_ms(lat['p50'])} / {fmt_ms(lat['p95'])} / "
        f"{fmt_ms(lat['max'])}   (batches >= 1)"
    )
    p(
        f"  job wall time                {runs['job']['wall_s']:>10.1f} s   "
        f"({fmt_rate(s['job_wall_events_per_s'])} end to end, start to stop)"
    )
    dl = runs["job"].get("dead_letters_in_topic")
    p(
        f"  dead letters: staged per split inside {AGG_QUERY}, published by the job process; "
        f"{res['generate']['bad_records']:,} bad records generated"
        + (f", {dl:,} in topic {TOPIC}-dlq" if dl is not None else "")
    )
    if not s.get("batch_limit_honoured", True):
        p(
            f"  NOTE: {agg['data_batches']} data batch(es) for {cfg['events']:,} events: "
            f"the source "
            f"did not split the backlog by max_records_per_batch in this mode; try --mode catch-up"
        )
    p()
    p("  peers: same events, same aggregation, Spark batch jobs in the same session (warm median)")
    for name, peer in res["peers"].items():
        p(
            f"    {name:<28} {fmt_rate(peer['warm_events_per_s']):>12}   "
            f"(runs {', '.join(f'{t:.2f}' for t in peer['runs_s'])} s)"
        )
    p(
        f"  events/s after first batch / spark_json_batch            "
        f"{fmt_ratio(s['ratio_vs_spark_json_batch'])}"
    )
    p(
        f"  events/s after first batch / python_arrow_source_batch   "
        f"{fmt_ratio(s['ratio_vs_python_arrow_source_batch'])}"
    )
    p()
    p("  CPU per event (this process tree: Spark JVM + Python workers; robust to other load)")
    p(f"    {'':42} {'after batch 0':>14} {'whole run':>12}")
    labels = {"job": f"job ({' + '.join(job)})"}
    for label, r in runs.items():
        p(
            f"    {labels.get(label, label):<42} {fmt_us(r['warm_cpu_us_per_event']):>14} "
            f"{fmt_us(r['cpu_us_per_event']):>12}   ({r['cpu_s']:.1f} CPU s in "
            f"{r['wall_s']:.1f} s wall)"
        )
    for name, peer in res["peers"].items():
        p(f"    peer {name:<37} {fmt_us(peer['warm_cpu_us_per_event']):>14}")
    p(
        f"  CPU efficiency spark_json_batch / job (after batch 0)            "
        f"{fmt_ratio(s.get('cpu_efficiency_vs_spark_json_batch'))}"
    )
    p(
        f"  CPU efficiency python_arrow_source_batch / job (after batch 0)   "
        f"{fmt_ratio(s.get('cpu_efficiency_vs_python_arrow_source_batch'))}"
    )
    bd = res.get("read_path_breakdown")
    if bd:
        p()
        p(
            f"  source read path, in-process, CPU time on one core, best of {bd['repeats']} "
            f"({bd['records']:,} records):"
        )
        p(
            f"    TopicReader.read_values     {bd['read_values_us_per_record']:>6.2f} us/record "
            f"({fmt_rate(bd['read_values_events_per_s'])})"
        )
        p(
            f"    decode_json                 {bd['decode_json_us_per_record']:>6.2f} us/record "
            f"({fmt_rate(bd['decode_json_events_per_s'])})"
        )
        p(f"    rest of read()              {bd['other_us_per_record']:>6.2f} us/record")
        p(
            f"    EventLogStreamReader.read   {bd['source_task_us_per_record']:>6.2f} us/record "
            f"({fmt_rate(bd['source_task_events_per_s_per_core'])} per core)"
        )
        p(
            f"    one bad record: its {bd['decode_chunk_records']:,}-record chunk decodes in "
            f"{bd['decode_chunk_one_bad_record_ms']:.1f} ms instead of "
            f"{bd['decode_chunk_clean_ms']:.1f} ms (Python fallback)"
        )
    p()
    if s.get("sink_payments_ok") is False:
        p("  WARNING: the sink's sum(payments) does not equal the number of events")
    if not s.get("caught_up", True):
        p("  WARNING: a query did not reach the log's end offsets")


# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=2_000_000)
    ap.add_argument(
        "--batch-size",
        type=int,
        default=250_000,
        help="source.max_records_per_batch (default 250k)",
    )
    ap.add_argument(
        "--parallelism",
        type=int,
        default=None,
        help="job parallelism = shuffle/state partitions (default: the job's)",
    )
    ap.add_argument("--partitions", type=int, default=4, help="topic partitions (default 4)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--merchants", type=int, default=50)
    ap.add_argument("--rate", type=int, default=1000, help="events per second of event time")
    ap.add_argument("--disorder-ms", type=int, default=4000)
    ap.add_argument(
        "--bad-every",
        type=int,
        default=0,
        help="make every Nth event a malformed record (default 0: none)",
    )
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument(
        "--peer-runs",
        type=int,
        default=3,
        help="runs of each batch peer; the first is the warm-up (default 3)",
    )
    ap.add_argument(
        "--mode",
        choices=("available-now", "catch-up"),
        default="available-now",
        help="available-now: run like `srt run --available-now` (default); "
        "catch-up: 0 s trigger interval, stopped once the log is consumed",
    )
    ap.add_argument(
        "--skip-breakdown",
        action="store_true",
        help="skip the in-process timing of the source's read path",
    )
    ap.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    ap.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="parent of the temp work directory (default: system temp)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    ap.add_argument("--verbose", action="store_true", help="echo the job's progress lines")
    a = ap.parse_args(argv)
    if a.events < 1 or a.batch_size < 1:
        ap.error("--events and --batch-size must be >= 1")

    t_start = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="srt-bench-upi-", dir=a.workdir))
    # The job registry, and the RocksDB secondaries that Spark's Python workers open, go in the
    # work directory, so nothing is left behind in ~/.srt or /tmp.
    os.environ["SRT_HOME"] = str(workdir / "srt-home")
    (workdir / "tmp").mkdir()
    os.environ["TMPDIR"] = str(workdir / "tmp")
    tempfile.tempdir = None
    say(f"work directory {workdir}")

    import importlib.util

    spec = importlib.util.spec_from_file_location("_upi_job_defaults", JOB_FILE)
    assert spec and spec.loader
    job_module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job_module)
    parallelism = a.parallelism or int(job_module.DEFAULTS["parallelism"])

    import pyarrow
    import pyspark

    res: dict[str, Any] = {
        "benchmark": "upi_throughput",
        "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": {
            "events": a.events,
            "batch_size": a.batch_size,
            "parallelism": parallelism,
            "topic_partitions": a.partitions,
            "master": a.master,
            "merchants": a.merchants,
            "rate_per_s": a.rate,
            "disorder_ms": a.disorder_ms,
            "bad_every": a.bad_every,
            "seed": a.seed,
            "peer_runs": a.peer_runs,
            "mode": a.mode,
            "job_file": str(JOB_FILE.relative_to(ROOT)),
        },
        "env": {
            "python": platform.python_version(),
            "pyspark": pyspark.__version__,
            "pyarrow": pyarrow.__version__,
            "cpus": os.cpu_count(),
            "machine": platform.machine(),
            "platform": platform.platform(),
            "loadavg_1m_before": os.getloadavg()[0],
        },
    }
    log_dir = workdir / "log"
    jsonl = workdir / "events.jsonl"
    try:
        timings: dict[str, float] = {}
        with timed(f"generate {a.events:,} events", timings, "generate"):
            lines, n_bad = generate(
                a.events,
                merchants=a.merchants,
                rate_per_s=a.rate,
                disorder_ms=a.disorder_ms,
                bad_every=a.bad_every,
                seed=a.seed,
                procs=os.cpu_count() or 1,
            )
        assert len(lines) == a.events, (len(lines), a.events)
        res["generate"] = {
            "seconds": round(timings["generate"], 3),
            "bad_records": n_bad,
            "events_per_s": rate(a.events, timings["generate"]),
            "processes": max(1, min(os.cpu_count() or 1, a.events // 50_000 or 1)),
        }
        with timed("append to the event log", timings, "append"):
            res["append"] = append_to_log(log_dir, lines, a.partitions)
        with timed("write the same lines as JSON lines (batch peer input)", timings, "jsonl"):
            with open(jsonl, "wb") as f:
                f.write(b"\n".join(lines))
                f.write(b"\n")
        from stateful_runtime.connectors.eventlog.source import ARROW_BATCH_ROWS

        with timed("write pre-decoded Arrow files (Arrow-source peer input)", timings, "arrow"):
            arrow_paths = write_arrow_files(
                lines,
                workdir / "arrow",
                max(1, math.ceil(a.batch_size / a.partitions)),
                a.partitions,
                ARROW_BATCH_ROWS,
            )
        del lines

        from stateful_runtime.runtime.session import build_session

        with timed("start Spark", timings, "spark"):
            spark = build_session(parallelism, a.master)
        res["spark_session_start_s"] = round(timings["spark"], 3)

        ends = res["append"]["end_offsets"]
        common = dict(
            log_dir=log_dir,
            ends=ends,
            batch_size=a.batch_size,
            parallelism=parallelism,
            master=a.master,
            verbose=a.verbose,
        )
        runs: dict[str, Any] = {}
        res["runs"] = runs
        how = "with --available-now" if a.mode == "available-now" else "until caught up"
        with timed(f"run the job {how}", timings, "job"):
            runs["job"] = run_job(workdir=workdir, name="job", mode=a.mode, **common)

        res["peers"] = run_peers(
            spark, jsonl=jsonl, arrow_paths=arrow_paths, runs=max(1, a.peer_runs), n=a.events
        )
        if not a.skip_breakdown:
            with timed("time the source read path in-process", timings, "breakdown"):
                res["read_path_breakdown"] = read_path_breakdown(
                    log_dir, min(a.events, 4 * ARROW_BATCH_ROWS)
                )

        agg = runs["job"]["queries"][AGG_QUERY]
        warm = agg["warm_events_per_s"]
        peers = res["peers"]

        def ratio(x: float | None, y: float | None) -> float | None:
            return x / y if x and y else None

        summary: dict[str, Any] = {
            "streaming_warm_events_per_s": warm,
            "target_events_per_s": TARGET_EVENTS_PER_S,
            "target_met": bool(warm and warm >= TARGET_EVENTS_PER_S),
            "first_batch_ms": agg["first_batch_ms"],
            "latency_ms": agg["latency_ms"],
            "job_wall_s": runs["job"]["wall_s"],
            "job_wall_events_per_s": rate(a.events, runs["job"]["wall_s"]),
            "ratio_vs_spark_json_batch": ratio(
                warm, peers["spark_json_batch"]["warm_events_per_s"]
            ),
            "ratio_vs_python_arrow_source_batch": ratio(
                warm, peers["python_arrow_source_batch"]["warm_events_per_s"]
            ),
            "caught_up": all(q["caught_up"] for r in runs.values() for q in r["queries"].values()),
        }
        summary["cpu_us_per_event"] = runs["job"]["cpu_us_per_event"]
        summary["cpu_efficiency_vs_spark_json_batch"] = ratio(
            peers["spark_json_batch"]["warm_cpu_us_per_event"], runs["job"]["warm_cpu_us_per_event"]
        )
        summary["cpu_efficiency_vs_python_arrow_source_batch"] = ratio(
            peers["python_arrow_source_batch"]["warm_cpu_us_per_event"],
            runs["job"]["warm_cpu_us_per_event"],
        )
        sink = runs["job"].get("sink")
        if sink is not None:
            summary["sink_payments_ok"] = sink["payments"] == a.events - n_bad
        summary["warm_cpu_us_per_event"] = runs["job"]["warm_cpu_us_per_event"]
        summary["batch_limit_honoured"] = agg["data_batches"] >= math.ceil(a.events / a.batch_size)
        res["summary"] = summary
        res["env"]["loadavg_1m_after"] = os.getloadavg()[0]
        res["timings_s"] = {k: round(v, 3) for k, v in timings.items()}
        res["total_wall_s"] = round(time.perf_counter() - t_start, 3)

        a.output.parent.mkdir(parents=True, exist_ok=True)
        a.output.write_text(json.dumps(res, indent=2, default=str) + "\n")
        print_report(res)
        print(f"  total benchmark wall time {res['total_wall_s']:.1f} s; results in {a.output}")
        spark.stop()
        return 0
    finally:
        if a.keep:
            say(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
