"""Savepoint and checkpoint-mirror benchmark: cost against state size.

For each state size (keys), the UPI job (native window path) builds state with one open
window per key, then runs churn batches that touch ``--churn`` of the keys. Reported per size:

* ``savepoint``: seconds and bytes of ``savepoints.create`` (the files batch N needs), against
  the bytes of the whole checkpoint directory;
* ``restore``: seconds to lay the savepoint out again (copy + sha256 of every file), and the
  first run on the restored checkpoint over one churn batch (RocksDB load included);
* ``mirror``: bytes the incremental mirror uploaded per churn batch against the bytes of the
  checkpoint that batch needs (goal: at most 5 %).

    .venv/bin/python benchmarks/savepoints.py --keys 100000 1000000
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

T0 = 1_767_225_600_000


def _lines(merchants: list[int], seed: int) -> list[bytes]:
    """One payment per merchant, all inside the first 50 s of one minute (windows stay open)."""
    rng = random.Random(seed)
    return [
        json.dumps(
            {
                "txn_id": f"t{seed}-{i}",
                "merchant_id": f"M{m:07d}",
                "amount_paise": rng.randint(100, 50_000),
                "ts_ms": T0 + rng.randint(0, 50_000),
            }
        ).encode()
        for i, m in enumerate(merchants)
    ]


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def bench(keys: int, churn: float, batches: int, work: Path) -> dict:
    from stateful_runtime.checkpoints import restore, savepoints
    from stateful_runtime.checkpoints.mirror import MirrorSync
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import _records
    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import BatchCommitted, JobRunner

    log = EventLog(work / "log")
    log.create_topic("upi-payments", 4)

    def append(lines: list[bytes]) -> None:
        with log.writer("upi-payments") as w:
            for i in range(0, len(lines), 5000):
                w.append(_records(lines[i : i + 5000], "merchant_id"))

    def run(ckpt: Path, **kw) -> list[MirrorSync]:
        """Run the job to the end of the log; the mirror syncs its batches reported."""
        jf = load_job_file(
            ROOT / "examples/upi_per_minute.py",
            {
                "source.log_dir": str(work / "log"),
                "sink.database": str(work / "upi.duckdb"),
                "checkpoint.dir": str(ckpt),
                "checkpoint.mirror": str(work / "mirror"),
                "source.max_records_per_batch": str(keys),
            },
        )
        out = io.StringIO()
        syncs: list[MirrorSync] = []

        def on_batch(event: BatchCommitted) -> None:
            # One sync may cover several batches (each hears it): keep it once.
            if event.mirror is not None and (not syncs or syncs[-1] is not event.mirror):
                syncs.append(event.mirror)

        runner = JobRunner(jf, available_now=True, out=out, on_batch=[on_batch], **kw)
        assert runner.run() == 0, out.getvalue()
        return syncs

    ckpt = work / "ck"
    append(_lines(list(range(keys)), seed=1))
    t = time.perf_counter()
    run(ckpt)
    build_s = time.perf_counter() - t
    rng = random.Random(2)
    mirror = []
    for b in range(batches):
        append(_lines(rng.sample(range(keys), max(1, int(keys * churn))), seed=10 + b))
        syncs = run(ckpt)
        assert syncs, "mirror did not sync after any batch"
        s = syncs[-1]
        mirror.append(
            {
                "uploaded_bytes": s.bytes_uploaded,
                "files": s.files_uploaded,
                "checkpoint_bytes": s.bytes_referenced,
                "share": s.bytes_uploaded / s.bytes_referenced,
            }
        )
    t = time.perf_counter()
    sp = savepoints.create(ckpt, work / "savepoints")
    sp_s = time.perf_counter() - t
    t = time.perf_counter()
    restore.materialize(sp, work / "laid-out")
    lay_s = time.perf_counter() - t
    append(_lines(rng.sample(range(keys), max(1, int(keys * churn))), seed=99))
    t = time.perf_counter()
    run(work / "ck-restored", from_savepoint=sp.location)
    restored_run_s = time.perf_counter() - t
    return {
        "keys": keys,
        "churn": churn,
        "build_run_s": round(build_s, 2),
        "checkpoint_dir_bytes": _dir_bytes(ckpt),
        "savepoint": {
            "seconds": round(sp_s, 3),
            "bytes": sp.size,
            "files": len(sp.manifest["files"]),
        },
        "restore": {
            "lay_out_s": round(lay_s, 3),
            "first_run_after_restore_s": round(restored_run_s, 2),
        },
        "mirror_per_churn_batch": mirror,
        "mirror_share_max": round(max(m["share"] for m in mirror), 4),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--churn", type=float, default=0.01)
    p.add_argument("--batches", type=int, default=3)
    p.add_argument("--output", default=str(ROOT / "benchmarks/results/savepoints.json"))
    a = p.parse_args()
    from stateful_runtime.runtime.session import build_session

    results = []
    for keys in a.keys:
        work = Path(tempfile.mkdtemp(prefix="srt-bench-sp-"))
        os.environ["SRT_HOME"] = str(work / "home")
        build_session(4, "local[2]")
        try:
            r = bench(keys, a.churn, a.batches, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append(r)
        print(
            f"{keys:>9,} keys: savepoint {r['savepoint']['bytes']:,} B in "
            f"{r['savepoint']['seconds']} s (checkpoint dir {r['checkpoint_dir_bytes']:,} B); "
            f"lay-out {r['restore']['lay_out_s']} s, first run after restore "
            f"{r['restore']['first_run_after_restore_s']} s; mirror per {a.churn:.0%} churn "
            f"batch: {[m['uploaded_bytes'] for m in r['mirror_per_churn_batch']]} B of "
            f"{r['mirror_per_churn_batch'][-1]['checkpoint_bytes']:,} B "
            f"(max {r['mirror_share_max']:.2%})",
            flush=True,
        )
    Path(a.output).parent.mkdir(parents=True, exist_ok=True)
    Path(a.output).write_text(
        json.dumps({"load_avg": os.getloadavg(), "results": results}, indent=2)
    )
    print(f"wrote {a.output}")


if __name__ == "__main__":
    main()
