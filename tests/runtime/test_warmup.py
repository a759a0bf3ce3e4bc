"""Python workers warmed while the driver plans (runtime/warmup.py)."""

from __future__ import annotations

import os

from stateful_runtime.runtime import warmup


def test_each_task_slot_gets_a_worker_that_imported_the_modules(spark):
    rows = warmup.warm(spark, 2, ["colorsys", "stateful_runtime.connectors.eventlog.source"])
    assert len(rows) == 2 and all(r.imported for r in rows), rows
    assert all(r.pid != os.getpid() for r in rows)  # in Python workers, not the driver


def test_a_failing_warmup_is_only_a_missed_head_start(spark, monkeypatch):
    import threading

    escaped = []
    monkeypatch.setattr(threading, "excepthook", escaped.append)
    thread = warmup.start(spark, 1, ["stateful_runtime.no_such_module"])
    thread.join(120)
    assert not thread.is_alive() and not escaped, escaped
    assert spark.range(3).count() == 3  # the session is as usable as before
