"""Warehouse sinks against each warehouse's own bulk load, and driver vs executor writes.

Two measurements, in one run, on servers this script starts on 127.0.0.1 (PostgreSQL from
initdb, Debian's clickhouse-server 18.16, a local Delta table, a DuckDB file):

1. **Sink vs bulk load** (no Spark): the same R rows (UPI counts: merchant, window, counts)
   written by the sink (``write_batch``: in-batch dedupe, ledger, upsert; one partition) into a
   new table, then again as an update of every key, against the warehouse's own bulk load of
   the same rows into a new table: PostgreSQL ``COPY``, ClickHouse native ``INSERT``,
   ``write_deltalake``, DuckDB ``INSERT ... SELECT`` from Arrow.
2. **Driver vs executors** (Spark, local[2]): a high-output job — E events from the event log
   straight into a table keyed by ``txn_id`` (every event one row: deduplication by key in the
   warehouse) — with ``executor_writes=False`` (the batch collected to the driver, one COPY /
   INSERT) and with the executor protocol (one task per output partition, ledger committed by
   the driver), for PostgreSQL and ClickHouse.

    .venv/bin/python benchmarks/warehouse_sinks.py                       # 200k rows, 1M events
    .venv/bin/python benchmarks/warehouse_sinks.py --rows 50000 --events 200000   # quick

Writes ``benchmarks/results/warehouse_sinks.json`` and ``warehouse_sinks.png``.
This file is also the job file of part 2 (``DEFAULTS`` + ``build``), loaded by the runner.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

DEFAULT_OUTPUT = ROOT / "benchmarks" / "results" / "warehouse_sinks.json"
KEY = ("merchant_id", "window_start")

# -- the job of part 2 (this file is loaded as a job file) -----------------------------------

DEFAULTS = {
    "source.log_dir": "",
    "source.topic": "payments",
    "source.max_records_per_batch": 250_000,
    "sink.kind": "postgres",
    "sink.dsn": "",
    "sink.url": "",
    "sink.table": "payments_dedup",
    "sink.executor_writes": 1,
    "checkpoint.dir": "",
    "checkpoint.interval_s": 0.0,
    "parallelism": 4,
}


def build(config: dict):  # noqa: ANN201  (a StreamJob)
    from stateful_runtime import StreamJob, WatermarkStrategy
    from stateful_runtime.connectors.eventlog.source import LogSource
    from stateful_runtime.sink_kinds import sink_class

    job = StreamJob.from_config("warehouse-bench", config)
    payments = job.from_source(
        LogSource(
            config["source.log_dir"],
            config["source.topic"],
            schema={"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int},
            max_records_per_batch=int(config["source.max_records_per_batch"]),
        ),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field(
            "ts_ms"
        ),
        name="payments",
    )
    sink = sink_class(config["sink.kind"]).from_config(
        config, key=("txn_id",), executor_writes=bool(int(config["sink.executor_writes"]))
    )
    payments.sink_to(sink, name="dedup")
    return job


# -- helpers ---------------------------------------------------------------------------------


def say(text: str) -> None:
    print(text, flush=True)


def counts_table(rows: int, bump: int = 0):  # noqa: ANN201  (pa.Table)
    import pyarrow as pa

    start = datetime(2026, 1, 1)
    merchants = [f"M{i % 1000:04d}" for i in range(rows)]
    windows = [start + timedelta(minutes=i // 1000) for i in range(rows)]
    return pa.table(
        {
            "merchant_id": merchants,
            "window_start": pa.array(windows, pa.timestamp("us")),
            "window_end": pa.array([w + timedelta(minutes=1) for w in windows], pa.timestamp("us")),
            "payments": pa.array([(i % 97) + 1 + bump for i in range(rows)], pa.int64()),
            "amount_paise": pa.array([(i % 9973) * 100 + bump for i in range(rows)], pa.int64()),
        }
    )


def timed(fn) -> float:  # noqa: ANN001
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def rate(rows: int, seconds: float) -> float:
    return round(rows / seconds, 1) if seconds > 0 else 0.0


# -- part 1: sink vs bulk load ---------------------------------------------------------------


def sink_vs_bulk(rows: int, pg: Any, ch: Any, work: Path) -> dict[str, Any]:
    import duckdb
    import psycopg
    import pyarrow.csv as pacsv
    from clickhouse_driver import Client
    from deltalake import write_deltalake

    from dbt_sink.clickhouse import ClickHouseUpsertSink
    from dbt_sink.delta import DeltaUpsertSink
    from dbt_sink.duckdb import DuckDBUpsertSink
    from dbt_sink.postgres import PostgresUpsertSink

    first, second = counts_table(rows), counts_table(rows, bump=1)
    out: dict[str, Any] = {}

    def sink_runs(sink: Any) -> dict[str, float]:
        sink.open("bench", "q")
        insert = timed(lambda: sink.write_batch(first, 0))
        update = timed(lambda: sink.write_batch(second, 1))
        return {
            "sink_insert_rows_per_s": rate(rows, insert),
            "sink_update_rows_per_s": rate(rows, update),
        }

    # PostgreSQL: COPY (CSV, the same encoding the sink uses) into a new table.
    dsn = pg.database("bench_bulk")
    buf = io.BytesIO()
    pacsv.write_csv(first, buf, pacsv.WriteOptions(include_header=False, quoting_style="all_valid"))
    data = buf.getvalue()

    def pg_copy() -> None:
        with psycopg.connect(dsn) as con:
            con.execute(
                "CREATE TABLE bulk (merchant_id text, window_start timestamp, window_end "
                "timestamp, payments bigint, amount_paise bigint)"
            )
            with con.cursor().copy("COPY bulk FROM STDIN (FORMAT csv)") as cp:
                cp.write(data)

    out["postgres"] = {
        "bulk": "COPY",
        "bulk_rows_per_s": rate(rows, timed(pg_copy)),
        **sink_runs(PostgresUpsertSink(dsn, "counts", KEY)),
    }

    # ClickHouse: native INSERT of the same columns into a plain MergeTree.
    url = ch.database("bench_bulk")
    client = Client(host="127.0.0.1", port=ch.tcp_port, database="bench_bulk")
    client.execute(
        "CREATE TABLE bulk (merchant_id String, window_start DateTime('UTC'), "
        "window_end DateTime('UTC'), payments Int64, amount_paise Int64) "
        "ENGINE = MergeTree ORDER BY (merchant_id, window_start)"
    )
    columns = [c.to_pylist() for c in first.columns]
    seconds = timed(
        lambda: client.execute(
            "INSERT INTO bulk (merchant_id, window_start, window_end, payments, amount_paise) "
            "VALUES",
            columns,
            columnar=True,
        )
    )
    client.disconnect()
    out["clickhouse"] = {
        "bulk": "native INSERT (clickhouse-driver)",
        "bulk_rows_per_s": rate(rows, seconds),
        **sink_runs(ClickHouseUpsertSink(url, "counts", KEY)),
    }

    # Delta: write_deltalake of the same Arrow table into a new table.
    seconds = timed(lambda: write_deltalake(str(work / "delta-bulk"), first))
    out["delta"] = {
        "bulk": "write_deltalake",
        "bulk_rows_per_s": rate(rows, seconds),
        **sink_runs(DeltaUpsertSink(str(work / "delta-sink"), "counts", KEY)),
    }

    # DuckDB: INSERT ... SELECT from the Arrow table into a new table.
    con = duckdb.connect(str(work / "bulk.duckdb"))
    con.register("src", first)
    seconds = timed(lambda: con.execute("CREATE TABLE bulk AS SELECT * FROM src"))
    con.close()
    out["duckdb"] = {
        "bulk": "INSERT ... SELECT from Arrow",
        "bulk_rows_per_s": rate(rows, seconds),
        **sink_runs(DuckDBUpsertSink(str(work / "sink.duckdb"), "counts", KEY)),
    }
    for v in out.values():
        v["sink_insert_vs_bulk"] = round(v["sink_insert_rows_per_s"] / v["bulk_rows_per_s"], 3)
    return out


# -- part 2: driver vs executors -------------------------------------------------------------


def driver_vs_executors(
    events: int, pg: Any, ch: Any, work: Path, master: str, kinds: list[str]
) -> dict[str, Any]:
    from upi_events import events as gen

    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import _records
    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import JobRunner

    log_dir = work / "log"
    EventLog(log_dir).create_topic("payments", 4)
    lines = list(gen(events, merchants=200, rate_per_s=5000, seed=3))
    with EventLog(log_dir).writer("payments") as writer:
        for i in range(0, len(lines), 5000):
            writer.append(_records(lines[i : i + 5000], "merchant_id"))
    del lines
    from stateful_runtime.runtime.session import build_session

    build_session(4, master)  # started once here: no run pays Spark's start-up
    out: dict[str, Any] = {}
    for kind in kinds:
        for path in ("driver", "executors"):
            name = f"{kind}-{path}"
            target = (
                pg.database(name.replace("-", "_"))
                if kind == "postgres"
                else ch.database(name.replace("-", "_"))
            )
            overrides = {
                "source.log_dir": str(log_dir),
                "sink.kind": kind,
                "sink.dsn": target,
                "sink.url": target,
                "sink.executor_writes": "1" if path == "executors" else "0",
                "checkpoint.dir": str(work / "ck" / name),
            }
            jf = load_job_file(Path(__file__), overrides)
            writes: list[tuple[float, int]] = []
            runner = JobRunner(
                jf,
                available_now=True,
                master=master,
                out=io.StringIO(),
                on_batch=[lambda e, w=writes: w.append((e.sink_write_ms or 0.0, e.sink_rows or 0))],
            )
            t0 = time.perf_counter()
            code = runner.run()
            wall = time.perf_counter() - t0
            if code != 0:  # e.g. Spark's 10 s Python-worker connect timeout on a loaded box
                out[name] = {"error": f"run failed (exit {code})", "wall_s": round(wall, 2)}
                say(f"  {name}: FAILED (exit {code})")
                continue
            sink_ms = sum(w for w, _ in writes)
            rows = sum(r for _, r in writes)
            out[name] = {
                "events": events,
                "rows_written": rows,
                "wall_s": round(wall, 2),
                "events_per_s": rate(events, wall),
                "sink_write_s": round(sink_ms / 1000, 2),
                "sink_rows_per_s": rate(rows, sink_ms / 1000),
                "batches": len(writes),
            }
            say(f"  {name}: {out[name]}")
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    part1 = result["sink_vs_bulk"]
    names = list(part1)
    xs = range(len(names))
    w = 0.27
    a.bar(
        [x - w for x in xs],
        [part1[n]["bulk_rows_per_s"] for n in names],
        w,
        label="warehouse bulk load",
    )
    a.bar(list(xs), [part1[n]["sink_insert_rows_per_s"] for n in names], w, label="sink: new keys")
    a.bar(
        [x + w for x in xs],
        [part1[n]["sink_update_rows_per_s"] for n in names],
        w,
        label="sink: update every key",
    )
    a.set_xticks(list(xs), names)
    a.set_ylabel("rows/s")
    a.set_title(f"{result['rows']:,} rows, one process")
    a.legend()
    part2 = result["driver_vs_executors"]
    kinds = [
        k
        for k in ("postgres", "clickhouse")
        if all("events_per_s" in part2.get(f"{k}-{p}", {}) for p in ("driver", "executors"))
    ]
    xs = range(len(kinds))
    w = 0.38
    b.bar(
        [x - w / 2 for x in xs],
        [part2[f"{k}-driver"]["events_per_s"] for k in kinds],
        w,
        label="driver writes",
    )
    b.bar(
        [x + w / 2 for x in xs],
        [part2[f"{k}-executors"]["events_per_s"] for k in kinds],
        w,
        label="executors write",
    )
    b.set_xticks(list(xs), kinds)
    b.set_ylabel("events/s end to end (1 row per event)")
    b.set_title(f"{result['events']:,} events → table keyed by txn_id, {result['master']}")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--events", type=int, default=1_000_000)
    p.add_argument("--master", default="local[2]")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument("--skip-spark", action="store_true", help="part 1 only")
    p.add_argument("--skip-bulk", action="store_true", help="part 2 only")
    p.add_argument("--kinds", default="postgres,clickhouse", help="part 2 warehouses")
    a = p.parse_args()

    from tests.helpers import ClickHouseServer, PostgresServer, free_port

    work = Path(tempfile.mkdtemp(prefix="srt-wh-bench-"))
    os.environ["SRT_HOME"] = str(work / "home")
    pg_root = Path(tempfile.mkdtemp(prefix="srt-wh-pg-"))
    initdb = [
        shutil.which("initdb") or "initdb",
        "-D",
        str(pg_root / "data"),
        "-U",
        "srt",
        "--auth=trust",
        "--no-sync",
    ]
    if os.geteuid() == 0:
        shutil.chown(pg_root, "postgres")
        initdb = ["runuser", "-u", "postgres", "--", *initdb]
    import subprocess

    subprocess.run(initdb, check=True, capture_output=True)
    pg = PostgresServer(pg_root, free_port())
    ch = ClickHouseServer(work / "clickhouse", free_port(), free_port(), free_port())
    load0 = os.getloadavg()
    try:
        pg.start()
        ch.start()
        part1: dict[str, Any] = {}
        if not a.skip_bulk:
            say(f"part 1: {a.rows:,} rows, sink vs bulk load")
            part1 = sink_vs_bulk(a.rows, pg, ch, work)
            for k, v in part1.items():
                say(f"  {k}: {v}")
        part2 = {}
        if not a.skip_spark:
            say(f"part 2: {a.events:,} events, driver vs executors ({a.master})")
            part2 = driver_vs_executors(a.events, pg, ch, work, a.master, a.kinds.split(","))
    finally:
        ch.stop()
        try:
            pg.stop()
        finally:
            shutil.rmtree(pg_root, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
    result = {
        "benchmark": "warehouse_sinks",
        "at": datetime.now(UTC).isoformat(),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_before": load0,
            "load_after": os.getloadavg(),
        },
        "rows": a.rows,
        "events": a.events,
        "master": a.master,
        "sink_vs_bulk": part1,
        "driver_vs_executors": part2,
    }
    a.output.parent.mkdir(parents=True, exist_ok=True)
    a.output.write_text(json.dumps(result, indent=2))
    if part1 and part2:
        plot(result, a.output.with_suffix(".png"))
    say(f"wrote {a.output}")


if __name__ == "__main__":
    main()
