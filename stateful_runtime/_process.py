"""Process helpers shared by the runtime and checkpoints (no engine, no Spark)."""

from __future__ import annotations

import atexit
import contextlib
import gc
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) is not alive
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


_SWEPT: set[Path] = set()


def _remove_own(root: Path) -> None:
    for d in root.glob(f"{os.getpid()}-*"):
        shutil.rmtree(d, ignore_errors=True)


def process_dir(kind: str) -> Path:
    """A new private directory of this process, ``<temp dir>/<kind>-<uid>/<pid>-…``.

    Spark's Python workers end by ``os._exit`` and a killed job runs no cleanup at all, so
    ``atexit`` alone would leave them behind: a process's first call for ``kind`` removes the
    directories of processes that are gone, and a process that exits normally removes its own.
    """
    root = Path(tempfile.gettempdir()) / f"{kind}-{os.getuid()}"
    root.mkdir(mode=0o700, exist_ok=True)
    if root.is_symlink() or root.stat().st_uid != os.getuid():
        return Path(tempfile.mkdtemp(prefix=f"{kind}-"))  # not ours: a private one
    if root not in _SWEPT:
        _SWEPT.add(root)
        atexit.register(_remove_own, root)
        for d in root.iterdir():
            pid = d.name.split("-", 1)[0]
            if pid.isdigit() and not pid_alive(int(pid)):
                shutil.rmtree(d, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=root))


_HEAP_FROZEN = False


def freeze_worker_heap() -> None:
    """Spark's reused Python workers run a full ``gc.collect()`` after every task
    (``pyspark/daemon.py``), walking every object the worker's imports made: tens of
    milliseconds per task, between a batch's tasks. Called at the start of our code in a worker
    (source reads, the keyed operator, sink partition writes), this moves what exists then (the
    imports) into the permanent generation once per process, so each collection walks only
    what later tasks allocate."""
    global _HEAP_FROZEN
    if not _HEAP_FROZEN:
        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True


# What "never" means to the collector's oldest generation (young collections it has seen).
_NO_FULL_COLLECTION = 1 << 30


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    """Python's collector makes no full pass during the block; its young collections go on,
    so a cycle that dies young is still freed. A keyed task keeps its state long-lived (the
    rows it read, ~125,000 dicts a task on the deduplication benchmark, and what a worker
    keeps for its next task), and each full pass walked it all again: 3-5 of them a task,
    0.03-0.25 s of a 2-3 CPU-s task (NOTES.md, "A keyed task defers the collector's full
    passes"). Spark's worker makes one after every task (``pyspark/daemon.py``); outside a
    worker, the next full pass after the block."""
    thresholds = gc.get_threshold()
    gc.set_threshold(thresholds[0], thresholds[1], _NO_FULL_COLLECTION)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)


def one_blas_thread() -> None:
    """OpenBLAS (numpy's) with no thread pool in this process and those it starts, unless the
    environment chose: a job's processes do no linear algebra, and the pool, a thread per
    core started when numpy loads, spins before it sleeps (2% of a 3,000-event run's CPU,
    NOTES.md). Spark's workers take one core per task likewise (``OMP_NUM_THREADS``). Takes
    effect for numpy loaded after it: a job process's first step, and before its session
    starts the processes that load numpy."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def import_ahead(modules: tuple[str, ...]) -> None:
    """Import ``modules`` ahead of their need (in a thread that would otherwise wait, or in a
    server before it serves). A module that fails to import is left to its importer, which
    meets the same error."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - its importer pays for it, and says why
            pass
