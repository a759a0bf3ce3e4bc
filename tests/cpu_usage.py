"""CPU seconds per test, with every process it started: where the suite's time goes.

The suite is CPU-bound on a 2-core machine (three workers, each test's Spark JVMs and Python
workers besides): a test's wall time says more about its neighbours than about itself. Load
it with ``-p tests.cpu_usage`` (``platform/test.sh -p tests.cpu_usage``); each worker appends
one JSON line per test to ``$SRT_TEST_CPU/<worker>.jsonl`` (default ``/tmp/srt-test-cpu``):
the test's id, its wall seconds and CPU seconds of this process and every descendant (live
ones read from /proc, ended ones as reaped). ``python -m tests.cpu_usage [DIR]`` sums them by
file. A service a test's fixture starts and leaves running is charged to the tests after it.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TICK = os.sysconf("SC_CLK_TCK")


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its descendants, ended ones included as far as they
    were reaped (by ``root`` or by a live descendant)."""
    parent: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        pid = int(entry)
        parent[pid] = int(fields[1])
        times[pid] = sum(int(x) for x in fields[11:15]) / TICK  # utime stime cutime cstime
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, ppid in parent.items():
        children[ppid].append(pid)
    total, todo = 0.0, list(children[root])
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo += children[pid]
    own = resource.getrusage(resource.RUSAGE_SELF)
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    return total + own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    out = Path(os.environ.get("SRT_TEST_CPU", "/tmp/srt-test-cpu"))
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    t0, cpu0 = time.monotonic(), _tree_cpu(os.getpid())
    yield
    line = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - t0, 2),
        "cpu_s": round(_tree_cpu(os.getpid()) - cpu0, 2),
    }
    with open(out / f"{worker}.jsonl", "a") as f:
        f.write(json.dumps(line) + "\n")


def main(where: str = "/tmp/srt-test-cpu") -> None:
    rows = [json.loads(line) for p in Path(where).glob("*.jsonl") for line in p.open()]
    cpu: collections.Counter[str] = collections.Counter()
    wall: collections.Counter[str] = collections.Counter()
    count: collections.Counter[str] = collections.Counter()
    for row in rows:
        name = row["test"].split("::")[0]
        cpu[name] += row["cpu_s"]
        wall[name] += row["wall_s"]
        count[name] += 1
    print(f"{sum(cpu.values()):.0f} CPU-s, {sum(wall.values()):.0f} test-s, {len(rows)} tests")
    print(f"{'CPU-s':>8} {'wall-s':>8} {'tests':>5}  file")
    for name, seconds in cpu.most_common():
        print(f"{seconds:8.1f} {wall[name]:8.1f} {count[name]:5d}  {name}")


if __name__ == "__main__":
    main(*sys.argv[1:])
