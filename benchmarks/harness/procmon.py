"""Memory and CPU of a process tree, sampled from /proc (no psutil in the project's venv)."""

from __future__ import annotations

import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _children_map() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(name))
    return kids


def tree(root: int) -> list[int]:
    """``root`` and all its descendants."""
    kids = _children_map()
    out, stack = [], [root]
    while stack:
        pid = stack.pop()
        out.append(pid)
        stack.extend(kids.get(pid, ()))
    return out


def pss_bytes(pid: int) -> int:
    """Proportional set size (shared pages split between the processes sharing them), so
    forked Python workers are not counted once per fork; RSS if smaps_rollup is missing."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except OSError:
        return 0


def own_cpu_s(pid: int) -> float:
    """user + system CPU seconds of ``pid`` itself (not its reaped children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, IndexError, ValueError):
        return 0.0


def children_cpu_s() -> float:
    """CPU seconds (user + system) of every reaped descendant of this process so far. A run's
    CPU is the difference around it: each process of a tree is reaped by its parent, so the
    JVM's Python workers count in the JVM, the JVM in the child, the child in us."""
    import resource

    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class TreeMonitor:
    """Samples a process tree every ``interval`` s on a thread: the peak of its summed PSS, and
    its CPU (user + system of every process ever seen in it, as last read; a process that
    lived less than one interval is missed, and a JVM that its parent never reaps, such as
    PyFlink's gateway, would be missed by ``getrusage``)."""

    def __init__(self, root: int, interval: float = 0.25) -> None:
        self.root = root
        self.interval = interval
        self.peak_bytes = 0
        self.peak_processes = 0
        self._cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def start(self) -> TreeMonitor:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def sample(self) -> None:
        pids = tree(self.root)
        total = 0
        for pid in pids:
            total += pss_bytes(pid)
            self._cpu[pid] = own_cpu_s(pid)
        if total > self.peak_bytes:
            self.peak_bytes = total
            self.peak_processes = len(pids)

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


def wait_for(pred, timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(interval)
    return False
