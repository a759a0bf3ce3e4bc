"""Python workers started while the driver plans, not during the first micro-batch.

A job's first batch used to start, one after another on the stream thread, the Python daemon
that plans a Python data source's reads (a new interpreter importing pyspark), then the task
daemon and a worker per task slot, each importing pyarrow and the source's modules: on this
2-core machine ~1 s of waiting for the planning daemon and 0.93 s of read stage on cold workers,
of the UPI job's 2.8 s first batch for 20,000 records, while the driver itself had spent the
second before it on one core, planning. :func:`start` runs a one-row batch read of a throwaway
Python data source in a background thread as soon as the session exists: the same daemons (a
daemon is shared by every data source of the session) and one warm worker per task slot, which
Spark then reuses for the job's first tasks. Once per Spark application (a session that runs
more jobs keeps its workers). The job never waits for it; if it fails, the first batch starts
its workers itself, as before.

A job whose state is partly Spark's (a native window) has the same thread load the RocksDB
library of Spark's state store into the JVM first, which the first batch did on its way to
the first commit.

A run with nothing to do can end before the warm-up read has: Spark then stopped under its
tasks, which logged ``Python worker exited unexpectedly (crashed)`` and ``Block broadcast_0 does
not exist`` as errors after the run's summary. The read runs in its own job group, and
:func:`settle` (called by the session before it stops Spark) cancels it and waits for its
thread, so its tasks end while Spark still runs.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import BooleanType, LongType, StructField, StructType

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

NAME = "srt_warmup"
GROUP = "srt-worker-warmup"  # the warm-up read's Spark job group (cancelled by settle)
# What a worker of any job imports first: Arrow, and the runtime's connectors.
MODULES = ("pyarrow", "stateful_runtime.connectors.base")


class _Part(InputPartition):
    pass


class _Reader(DataSourceReader):
    def __init__(self, options: Mapping[str, str]) -> None:
        self.slots = int(options.get("slots", "1"))
        self.modules = [m for m in options.get("modules", "").split(",") if m]

    def partitions(self) -> Sequence[InputPartition]:
        return [_Part(i) for i in range(self.slots)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        import os

        imported = True
        for name in self.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - a failed task would log an error in the job's output
                imported = False
        yield (os.getpid(), imported)


class WarmupSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        return StructType([StructField("pid", LongType()), StructField("imported", BooleanType())])

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(self.options)


def importable(modules: Sequence[str]) -> list[str]:
    """The modules a worker can import by name: not a job file's, loaded by path (its classes
    reach workers pickled by value)."""
    from importlib.machinery import PathFinder
    from importlib.util import find_spec

    out = []
    for name in modules:
        try:  # the top-level package on sys.path, not only in this process's sys.modules
            if PathFinder.find_spec(name.split(".")[0]) is not None and find_spec(name) is not None:
                out.append(name)
        except (ImportError, ValueError):
            pass
    return out


def warm(spark: SparkSession, slots: int, modules: Sequence[str] = ()) -> list[Any]:
    """Run the warm-up read: ``slots`` tasks, each importing :data:`MODULES` and ``modules`` in
    its Python worker; one row per task, ``(pid, imported)``: whether every import worked (one
    that fails does not fail the task)."""
    from stateful_runtime.connectors.base import register

    register(spark, WarmupSource)
    return (
        spark.read.format(NAME)
        .schema(WarmupSource({}).schema())
        .option("slots", str(slots))
        .option("modules", ",".join(dict.fromkeys([*MODULES, *modules])))
        .load()
        .collect()
    )


_WARMED: set[tuple[str, int, tuple[str, ...]]] = set()
_RUNNING: list[threading.Thread] = []


def start(
    spark: SparkSession, slots: int, modules: Sequence[str] = (), *, spark_state: bool = False
) -> threading.Thread | None:
    """:func:`warm` in a daemon thread, which the job never waits for; returns the thread, or
    None when this application already warmed as many slots with these modules.
    ``spark_state``: a query keeps state in Spark's state store, whose RocksDB library the
    thread loads into the JVM first (the first batch's state store did, 0.09 s of its time:
    the UPI example's first commit 4.54 -> 4.46 s, the medians of ten alternating runs)."""
    key = (spark.sparkContext.applicationId, slots, tuple(modules))
    if key in _WARMED:
        return None

    def run() -> None:
        try:
            # This thread's jobs (pinned to a JVM thread of its own): cancellable as one.
            spark.sparkContext.setJobGroup(GROUP, "srt worker warm-up", interruptOnCancel=True)
            if spark_state:
                # (one that fails is the first batch's to load, or to say why it cannot)
                with contextlib.suppress(Exception):
                    spark.sparkContext._jvm.org.rocksdb.RocksDB.loadLibrary()  # type: ignore[union-attr]
            warm(spark, slots, modules)
            _WARMED.add(key)
        except Exception:  # noqa: BLE001 - only a head start; the job's own tasks start workers
            pass

    thread = threading.Thread(target=run, name="srt-worker-warmup", daemon=True)
    _RUNNING.append(thread)
    thread.start()
    return thread


def _running_tasks(spark: SparkSession) -> int:
    """Tasks the application's executors are running now (the status tracker's view)."""
    tracker = spark.sparkContext._jsc.sc().statusTracker()  # type: ignore[union-attr]
    return sum(int(e.numRunningTasks()) for e in tracker.getExecutorInfos())


def tasks_ended(spark: SparkSession, timeout: float) -> bool:
    """Wait (up to ``timeout`` s) until the application runs no task; True if none runs."""
    deadline = time.monotonic() + timeout
    try:
        while _running_tasks(spark):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
    except Exception:  # noqa: BLE001 - a context already stopping: nothing left to wait for
        return False
    return True


def settle(spark: SparkSession, timeout: float = 30.0) -> bool:
    """Before Spark stops: cancel a warm-up read still running, wait (up to ``timeout``) for
    its thread and then for its killed tasks to end, so none is cut off by the stop (and logs
    errors after the run's summary). True if nothing of it is left running."""
    alive = [t for t in _RUNNING if t.is_alive()]
    _RUNNING[:] = alive
    if not alive:
        return True
    deadline = time.monotonic() + timeout
    try:
        spark.sparkContext.cancelJobGroup(GROUP)
        for thread in alive:
            thread.join(max(0.0, deadline - time.monotonic()))
        # The job is cancelled at once; its tasks end as their kill reaches them.
        settled = tasks_ended(spark, max(0.0, deadline - time.monotonic()))
    except Exception:  # noqa: BLE001 - a context already stopping: nothing left to wait for
        settled = False
    _RUNNING[:] = [t for t in alive if t.is_alive()]
    return settled and not _RUNNING
