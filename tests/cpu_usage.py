"""CPU seconds per test, with every process it started: where the suite's time goes.

The suite is CPU-bound on a 2-core machine (three workers, each test's Spark JVMs and Python
workers besides): a test's wall time says more about its neighbours than about itself. Load
it with ``-p tests.cpu_usage`` (``platform/test.sh -p tests.cpu_usage``); each worker appends
one JSON line per test to ``$SRT_TEST_CPU/<worker>.jsonl`` (default ``/tmp/srt-test-cpu``):
the test's id, its wall seconds and CPU seconds of this process and every process below it
(sampled from /proc every 0.25 s, killed ones included). ``python -m tests.cpu_usage [DIR]``
sums them by file. A service a test's fixture starts and leaves running is charged to the tests
after it.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

TICK = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.25  # a process that lives less than this between two looks is not counted


class _Tree:
    """CPU seconds (user + system) of every process below this one, by (pid, start time), as
    last seen: sampled in a thread, because a test's processes often end unreaped (a kill -9
    of a job's process group leaves its JVM to init, whose CPU no rusage of ours includes)."""

    def __init__(self) -> None:
        self.root = os.getpid()
        self.seen: dict[tuple[int, int], float] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._loop, daemon=True, name="cpu-usage").start()

    def _loop(self) -> None:
        while True:
            self.look()
            time.sleep(SAMPLE_S)

    def look(self) -> dict[tuple[int, int], float]:
        parent: dict[int, int] = {}
        times: dict[int, tuple[int, float]] = {}
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
            times[pid] = (int(fields[19]), (int(fields[11]) + int(fields[12])) / TICK)
        children: dict[int, list[int]] = collections.defaultdict(list)
        for pid, ppid in parent.items():
            children[ppid].append(pid)
        todo = list(children[self.root])
        with self.lock:
            while todo:
                pid = todo.pop()
                started, cpu = times[pid]
                self.seen[(pid, started)] = cpu
                todo += children[pid]
            return dict(self.seen)


def _own_cpu() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


_tree: _Tree | None = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    global _tree
    if _tree is None:
        _tree = _Tree()
    out = Path(os.environ.get("SRT_TEST_CPU", "/tmp/srt-test-cpu"))
    out.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    t0, own0, before = time.monotonic(), _own_cpu(), _tree.look()
    yield
    after = _tree.look()
    below = sum(cpu - before.get(key, 0.0) for key, cpu in after.items())
    line = {
        "test": item.nodeid,
        "wall_s": round(time.monotonic() - t0, 2),
        "cpu_s": round(_own_cpu() - own0 + below, 2),
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
