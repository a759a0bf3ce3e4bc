"""Python workers warmed while the driver plans (runtime/warmup.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from stateful_runtime.runtime import warmup


def test_each_task_slot_gets_a_worker_that_imported_the_modules(spark):
    rows = warmup.warm(spark, 2, ["colorsys", "stateful_runtime.connectors.eventlog.source"])
    assert len(rows) == 2 and all(r.imported for r in rows), rows
    assert all(r.pid != os.getpid() for r in rows)  # in Python workers, not the driver


def test_a_module_a_worker_cannot_import_fails_no_task(spark):
    [row] = warmup.warm(spark, 1, ["stateful_runtime.no_such_module"])
    assert row.imported is False


def test_only_modules_importable_by_name_are_warmed(tmp_path):
    import importlib.util
    import sys

    path = tmp_path / "job_by_path.py"
    path.write_text("X = 1\n")
    spec = importlib.util.spec_from_file_location("srt_job_by_path", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["srt_job_by_path"] = module  # as loading a job file by path leaves it
    try:
        assert warmup.importable(
            [
                "srt_job_by_path",
                "stateful_runtime.connectors.base",
                "stateful_runtime.no_such_module",
            ]
        ) == ["stateful_runtime.connectors.base"]
    finally:
        del sys.modules["srt_job_by_path"]


def test_a_failing_warmup_is_only_a_missed_head_start(spark, monkeypatch):
    import threading

    def broken(*args, **kwargs):
        raise RuntimeError("the warm-up read failed")

    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    monkeypatch.setattr(warmup, "warm", broken)
    thread = warmup.start(spark, 1, ["test-failing-warmup"])
    thread.join(120)
    assert not thread.is_alive() and not escaped, escaped
    assert spark.range(3).count() == 3  # the session is as usable as before
    monkeypatch.undo()
    retried = warmup.start(spark, 1, ["test-failing-warmup"])  # a failure is not remembered
    assert retried is not None
    retried.join(120)


def test_an_application_warms_once_per_slots_and_modules(spark):
    first = warmup.start(spark, 2, ["colorsys"])
    if first is not None:  # None: an earlier test's job warmed the same already
        first.join(120)
    assert warmup.start(spark, 2, ["colorsys"]) is None
    again = warmup.start(spark, 2, ["colorsys", "stateful_runtime.connectors.eventlog.source"])
    assert again is not None
    again.join(120)


SETTLE_SCRIPT = """
import time
from stateful_runtime.runtime import warmup
from stateful_runtime.runtime.session import build_session

spark = build_session(2, "local[2]", log_file=LOG)
maps = f"/proc/{spark.sparkContext._gateway.proc.pid}/maps"
print("rocksdb before", "librocksdbjni" in open(maps).read(), flush=True)
thread = warmup.start(spark, 2, ["stateful_runtime.connectors.eventlog.source"], spark_state=True)
# The job ends while the warm-up's tasks run (what a run with nothing to do does); then the
# session stops, as `srt run` stops it. The warm-up read's stage is active from the moment its
# tasks are scheduled (Spark's status store counts running tasks only every 100 ms: short
# tasks can start and end unseen).
tracker = spark.sparkContext.statusTracker()
while thread.is_alive() and not tracker.getActiveStageIds():
    time.sleep(0.01)
print("rocksdb after", "librocksdbjni" in open(maps).read(), flush=True)
print("summary", flush=True)
if SETTLE:
    warmup.settle(spark)
spark.stop()
print("stopped", flush=True)
"""


@pytest.mark.slow
def test_a_warm_up_loads_spark_states_library_and_a_stop_during_it_prints_nothing_after(
    tmp_path,
):
    """A job whose state is partly Spark's has the JVM load RocksDB's library in the warm-up,
    before the read (the first batch's state store did, on its critical path). The warm-up
    read cut off by a stop printed ``Python worker exited unexpectedly (crashed)`` and
    ``Block broadcast_0 does not exist`` after the run's summary; settle() cancels it first
    (and the run's end calls it)."""
    env = {**os.environ, "SRT_SPARK_LOG": str(tmp_path / "spark.log")}
    script = SETTLE_SCRIPT.replace("LOG", repr(str(tmp_path / "spark.log")))
    out = subprocess.run(
        [sys.executable, "-c", script.replace("SETTLE", "True")],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[-4:] == [
        "rocksdb before False",
        "rocksdb after True",
        "summary",
        "stopped",
    ]
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line or "Exception" in line]
    assert not errors, out.stderr[-3000:]
