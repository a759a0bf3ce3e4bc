"""Process helpers shared by the runtime and checkpoints (no engine, no Spark)."""

from __future__ import annotations

import os


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
        import gc

        gc.collect()
        gc.freeze()
        _HEAP_FROZEN = True
