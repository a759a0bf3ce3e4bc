"""The Spark session of a job process: its JVM and the job's stop signals."""

from __future__ import annotations

import signal
from pathlib import Path


def _ignored(pid: int) -> set[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(ln for ln in status.splitlines() if ln.startswith("SigIgn:")).split()[1], 16)
    return {sig for sig in range(1, 65) if mask & (1 << (sig - 1))}


def test_the_jvm_ignores_the_stop_signals_its_process_group_gets(spark):
    # Ctrl-C and a SIGTERM to the job's group reach its JVM too; HotSpot would run its shutdown
    # hooks and stop the SparkContext under the queries the driver is stopping.
    jvm = spark.sparkContext._gateway.proc.pid
    assert {signal.SIGINT, signal.SIGTERM} <= _ignored(jvm)


def test_the_session_leaves_the_processes_sigint_handler_as_it_was(spark):
    # PySpark's context sets one (cancel all jobs, raise KeyboardInterrupt) for shells.
    handler = signal.getsignal(signal.SIGINT)
    assert "SparkContext" not in getattr(handler, "__qualname__", "")


def test_a_local_master_retries_a_failed_task_as_a_cluster_does():
    from stateful_runtime.runtime.session import LOCAL_TASK_ATTEMPTS, spark_conf, with_task_retries

    n = LOCAL_TASK_ATTEMPTS
    assert with_task_retries("local") == f"local[1,{n}]"
    assert with_task_retries("local[2]") == f"local[2,{n}]"
    assert with_task_retries("local[*]") == f"local[*,{n}]"
    assert with_task_retries("local[2,1]") == "local[2,1]"  # the user's own count
    assert with_task_retries("spark://127.0.0.1:7077") == "spark://127.0.0.1:7077"
    assert spark_conf(2, "local[2]")["spark.master"] == f"local[2,{n}]"


def test_arrow_batches_to_python_workers_have_no_byte_bound(spark):
    # With a byte bound Spark sizes every vector's buffers after each row it appends to a batch
    # for a Python worker (ArrowWriter.sizeInBytes, 18% of a keyed job's task threads): the
    # session runs with Spark's "no bound", and rows per batch stay bounded.
    assert spark.conf.get("spark.sql.execution.arrow.maxBytesPerBatch") == str(2**31 - 1)
    assert int(spark.conf.get("spark.sql.execution.arrow.maxRecordsPerBatch")) > 0
