"""Memory of keyed state in the worker: RSS while state outgrows the RocksDB cache.

Two measurements, each once per RocksDB memory setting (a small bound, then the defaults):

* ``store`` (default): one Python process runs a state partition's store as a task does
  (:class:`KeyedStore` opened at a version, ``--batch`` new keys of 100 random bytes written,
  as many existing keys read at random, the version committed), batch after batch up to
  ``--keys`` keys: state several times the cache. Reports the process's RSS after the first
  quarter of the batches and at the end, the largest seen, and the state's size on disk; the
  RSS before the store opened is the interpreter's with its imports.
* ``--spark``: ``srt run --available-now`` of ``examples/deduplicate_payments.py`` over
  ``--events`` events, sampling the RSS of the job's Python
  workers (the processes of ``pyspark.daemon``) every half second.

    .venv/bin/python benchmarks/rocksdb_memory.py --keys 2000000
    .venv/bin/python benchmarks/rocksdb_memory.py --spark --events 200000

The Spark job keeps a ValueState per txn_id with an event-time TTL longer than the run, so its
state grows with every event; the local copies are measured while it runs (the job's scratch
goes when it ends).
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
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

# block cache, memtable size, memtable count (MiB): a small bound, then the defaults.
SETTINGS = [(8, 4, 2), (256, 64, 2)]


def _children(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            kids = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            continue
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def _worker_rss_mb(pid: int) -> list[float]:
    """RSS (MiB) of each Python worker under ``pid`` (forked by ``pyspark.daemon``)."""
    found = []
    for child in _children(pid):
        try:
            cmd = Path(f"/proc/{child}/cmdline").read_bytes()
            status = Path(f"/proc/{child}/status").read_text()
        except OSError:
            continue
        if b"pyspark.daemon" not in cmd:
            continue
        for line in status.splitlines():
            if line.startswith("VmRSS:"):
                found.append(int(line.split()[1]) / 1024)
    return found


def _size_mb(path: Path) -> float:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / (1 << 20)


def run_one(work: Path, setting: tuple[int, int, int], log: Path) -> dict:
    cache, buffer, count = setting
    name = f"cache{cache}-wb{buffer}x{count}"
    scratch = work / name
    env = {
        **os.environ,
        "SRT_HOME": str(scratch / "home"),
        "PYTHONPATH": str(ROOT),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_DIRS": str(scratch / "local"),
    }
    sets = {
        "source.log_dir": str(log),
        "checkpoint.dir": str(scratch / "ck"),
        "source.max_records_per_batch": "50000",
        "parallelism": "2",
        "ttl_hours": "1000",
        "state.rocksdb.block_cache_mb": str(cache),
        "state.rocksdb.write_buffer_mb": str(buffer),
        "state.rocksdb.write_buffers": str(count),
    }
    args = [str(Path(sys.executable).parent / "srt"), "run"]
    args += [str(ROOT / "examples/deduplicate_payments.py"), "--available-now"]
    for k, v in sets.items():
        args += ["--set", f"{k}={v}"]
    samples: list[tuple[float, float]] = []
    start = time.monotonic()
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=open(scratch.with_suffix(".err"), "w")
    )
    state_mb = 0.0
    while proc.poll() is None:
        rss = _worker_rss_mb(proc.pid)
        if rss:
            samples.append((time.monotonic() - start, max(rss)))
        # The local copies live in the job's scratch, removed when it ends: measured as it runs.
        copies = list((scratch / "local").rglob("srt-keyed"))
        state_mb = max(state_mb, sum(_size_mb(c) for c in copies))
        time.sleep(0.5)  # a sampling period, not a synchronisation
    if proc.returncode != 0:
        raise SystemExit(f"{name}: srt run exited {proc.returncode}; see {scratch}.err")
    span = samples[-1][0] if samples else 0.0
    first = [r for t, r in samples if t <= span / 4]
    last = [r for t, r in samples if t >= span * 3 / 4]
    return {
        "setting": name,
        "bound_mb": cache + buffer * count,
        "state_on_disk_mb": round(state_mb, 1),
        "worker_rss_max_mb": round(max(r for _, r in samples), 1) if samples else None,
        "worker_rss_first_quarter_mb": round(max(first), 1) if first else None,
        "worker_rss_last_quarter_mb": round(max(last), 1) if last else None,
        "seconds": round(time.monotonic() - start, 1),
    }


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def store_child(setting: str, keys: int, batch: int, work: str) -> None:
    """One setting's store run (in a process of its own: the block cache is per process)."""
    import random

    from stateful_runtime.job import RocksDBMemory
    from stateful_runtime.operators.keyed_store import KeyedStore, group_prefix

    cache, buffer, count = (int(x) for x in setting.split(","))
    root = Path(work) / f"store-cache{cache}-wb{buffer}x{count}"
    store = KeyedStore(root / "ck", root / "local", RocksDBMemory(cache, buffer, count))
    rng = random.Random(7)
    before = _rss_mb()  # the interpreter with pyarrow and rocksdict imported, no store open
    batches = -(-keys // batch)
    rss: list[float] = []
    written = 0
    start = time.monotonic()
    for version in range(batches):
        store.open(version)
        for i in range(written, min(keys, written + batch)):
            store.put(group_prefix(i % 128) + i.to_bytes(8, "big"), rng.randbytes(100))
        for _ in range(batch if written else 0):
            i = rng.randrange(written)
            assert store.get(group_prefix(i % 128) + i.to_bytes(8, "big")) is not None
        written = min(keys, written + batch)
        store.commit()
        store.publish()
        store.close()
        rss.append(_rss_mb())
    print(
        json.dumps(
            {
                "setting": f"cache{cache}-wb{buffer}x{count}",
                "bound_mb": cache + buffer * count,
                "keys": written,
                "state_on_disk_mb": round(_size_mb(root / "local"), 1),
                "rss_before_store_mb": round(before, 1),
                "rss_after_first_quarter_mb": round(rss[max(0, batches // 4 - 1)], 1),
                "rss_at_end_mb": round(rss[-1], 1),
                "rss_max_mb": round(max(rss), 1),
                "seconds": round(time.monotonic() - start, 1),
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--spark", action="store_true", help="the Spark job instead of the store")
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--keys", type=int, default=2_000_000)
    p.add_argument("--batch", type=int, default=100_000)
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    p.add_argument("--output", default=str(ROOT / "benchmarks/results/rocksdb_memory.json"))
    a = p.parse_args()
    if a.child:
        store_child(a.child, a.keys, a.batch, a.work)
        return
    work = Path(tempfile.mkdtemp(prefix="srt-bench-rocksdb-memory-"))
    if not a.spark:
        load = os.getloadavg()
        runs = []
        for s in SETTINGS:
            child = [sys.executable, __file__, "--child", ",".join(map(str, s)), "--work"]
            child += [str(work), "--keys", str(a.keys), "--batch", str(a.batch)]
            done = subprocess.run(child, check=True, capture_output=True, text=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
        report = {"mode": "store", "load_before": load, "load_after": os.getloadavg()}
        report["runs"] = runs
        out = Path(a.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        print(json.dumps(report, indent=2))
        return

    from upi_events import events

    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import _records

    log = work / "log"
    EventLog(log).create_topic("upi-payments", 2)
    lines = events(a.events, merchants=1_000, rate_per_s=2_000, disorder_ms=2_000, seed=7)
    chunk: list[bytes] = []
    with EventLog(log).writer("upi-payments") as writer:
        for line in lines:
            chunk.append(line)
            if len(chunk) == 50_000:
                writer.append(_records(chunk, "merchant_id"))
                chunk = []
        if chunk:
            writer.append(_records(chunk, "merchant_id"))
    load = os.getloadavg()
    results = [run_one(work, s, log) for s in SETTINGS]
    report = {"mode": "spark", "events": a.events, "load_before": load}
    report["load_after"] = os.getloadavg()
    report["runs"] = results
    out = Path(a.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
