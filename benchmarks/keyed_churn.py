"""A state partition's commit at a large state and a small churn: what a batch's checkpoint
writes and how long its commit takes (issue 24's 10M-key targets: a batch's checkpoint write
at most 10% of the state at 1% of the keys changed, a commit adding at most 0.2 s).

One process runs a partition's :class:`KeyedStore` as a task does: ``--keys`` rows of
``--value-bytes`` random bytes written in versions of ``--fill`` rows, then ``--batches``
versions that each change ``--churn`` of the keys, at random; every version is opened and
committed as a task would. Per churn version it prints the commit's wall time, the bytes the
version wrote to the checkpoint (its delta, and the snapshot of a snapshot version) against the
state's size, and at the end the median and largest commit. A snapshot is written once the deltas
since the last add up to its size (at least 64 MiB) or number 50 (``keyed_store.snapshot_due``):
at 1% churn ``--batches 55`` covers one. 10M keys over a job's 2 state
partitions is ``--keys 5000000`` here.

    .venv/bin/python benchmarks/keyed_churn.py --keys 5000000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from stateful_runtime.checkpoints import keyed as files  # noqa: E402
from stateful_runtime.operators.keyed_store import KeyedStore, group_prefix  # noqa: E402


def _row(i: int) -> bytes:
    return group_prefix(i % 64) + b"k" + i.to_bytes(8, "big")


def _written(checkpoint: Path, version: int) -> int:
    """The bytes of the committed attempt's files of ``version`` (its delta, its snapshot)."""
    return sum(
        p.stat().st_size
        for suffix in (files.DELTA, files.SNAPSHOT)
        if (p := files.committed(checkpoint, version, suffix)) is not None
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--value-bytes", type=int, default=40)
    p.add_argument("--fill", type=int, default=500_000, help="rows a version while filling")
    p.add_argument("--churn", type=float, default=0.01, help="share of the keys a batch changes")
    p.add_argument("--batches", type=int, default=25)
    p.add_argument("--work", default=None, help="directory (default: a temporary one, removed)")
    a = p.parse_args()
    work = Path(a.work or tempfile.mkdtemp(prefix="srt-keyed-churn-"))
    checkpoint, local = work / "checkpoint", work / "local"
    rng = random.Random(24)
    version = 0
    try:
        for lo in range(0, a.keys, a.fill):
            store = KeyedStore(checkpoint, local)
            store.open(version)
            rows = {_row(i): os.urandom(a.value_bytes) for i in range(lo, min(a.keys, lo + a.fill))}
            version = store.commit(rows)
            store.publish()
            store.close()
        store.wait_snapshots()
        state = sum(f.stat().st_size for f in (local / "db").glob("*.sst"))
        changed = int(a.keys * a.churn)
        commits = []
        for _ in range(a.batches):
            store = KeyedStore(checkpoint, local)
            store.open(version)
            rows = {_row(rng.randrange(a.keys)): os.urandom(a.value_bytes) for _ in range(changed)}
            t = time.perf_counter()
            version = store.commit(rows)
            took = time.perf_counter() - t
            store.publish()
            store.close()
            commits.append(took)
            print(f"version {version}: commit {took:.3f} s", flush=True)
        store.wait_snapshots()  # snapshots are written aside: counted once they are there
        churned = range(version - a.batches + 1, version + 1)
        writes = [_written(checkpoint, v) for v in churned]
        for v, written in zip(churned, writes, strict=True):
            print(
                f"version {v}: wrote {written / 2**20:.1f} MiB "
                f"({written / state:.1%} of the state's {state / 2**20:.0f} MiB)"
            )
        snapshots = [v for v in files.versions(checkpoint, files.SNAPSHOT) if v > a.keys // a.fill]
        print(
            json.dumps(
                {
                    "keys": a.keys,
                    "changed_per_batch": changed,
                    "state_mib": round(state / 2**20, 1),
                    "commit_s_median": round(statistics.median(commits), 3),
                    "commit_s_max": round(max(commits), 3),
                    "write_share_median": round(statistics.median(writes) / state, 4),
                    "write_share_mean": round(sum(writes) / len(writes) / state, 4),
                    "snapshots_written": snapshots,
                }
            )
        )
    finally:
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
