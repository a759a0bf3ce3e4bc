"""The runner's wake-up listener: it wakes the monitor on each batch a query reports, and once
removed it stays silent (a session runs more jobs after this one)."""

from __future__ import annotations

import threading
import time

from stateful_runtime.runtime.runner import _wake_on_progress


def _batches(query, more: int, timeout: float = 60.0) -> None:
    """Wait until ``query`` has reported ``more`` batches after its latest one."""
    start = (query.lastProgress or {}).get("batchId", -1)
    deadline = time.monotonic() + timeout
    while (query.lastProgress or {}).get("batchId", -1) < start + more:
        assert query.isActive, query.exception()
        assert time.monotonic() < deadline, "the query reported no new batches"
        time.sleep(0.05)


def test_the_listener_wakes_on_progress_and_is_silent_once_removed(spark):
    woken = threading.Event()
    listener = _wake_on_progress(woken)
    spark.streams.addListener(listener)
    query = (
        spark.readStream.format("rate")
        .option("rowsPerSecond", 10)
        .load()
        .writeStream.format("noop")
        .trigger(processingTime="0.1 seconds")
        .start()
    )
    try:
        assert woken.wait(60), "no wake-up for a reported batch"
        spark.streams.removeListener(listener)
        _batches(query, 1)  # a report the listener may have been handed before its removal
        woken.clear()
        _batches(query, 2)
        assert not woken.is_set(), "a removed listener still woke the monitor"
    finally:
        query.stop()
