"""A source's accounting of each batch (``connectors/accounting.py``): taken once per batch,
and what a failed run left is not counted by the next. The read tasks' side is tested through
whole jobs (``operators/test_keyed_spark.py``, ``runtime/test_progress.py``)."""

from __future__ import annotations

from stateful_runtime.connectors import accounting
from stateful_runtime.connectors.accounting import SplitReport


def test_a_batchs_reports_are_taken_once_and_a_new_run_forgets_what_a_failed_one_left(spark):
    reports = accounting._accumulator(spark)
    reports.add(
        {
            ("q", "s", 3, "0", 0): SplitReport(10, 1, 0, 5_000),
            ("q", "s", 3, "1", 0): SplitReport(5, 0, 1, 7_000, ends_run=True),
            ("q", "s", 2, "0", 0): SplitReport(99, 0, 0),  # left by a batch that failed
        }
    )
    got = accounting.take(spark, "q", 3)
    assert (got["s"].records, got["s"].dead_letters) == (15, 1)
    assert got["s"].partition_times == {0: (5_000, False), 1: (7_000, True)}
    assert accounting.take(spark, "q", 3) == {}  # once; the older batch's left-over gone too
    reports.add(
        {
            ("q", "s", 4, "0", 0): SplitReport(1, 0, 0),
            ("other", "s", 4, "0", 0): SplitReport(2, 0, 0),
        }
    )
    accounting.forget(spark, "q")  # a new run of q: its own batch 4 alone will count
    assert accounting.take(spark, "q", 4) == {}
    assert accounting.take(spark, "other", 4)["s"].records == 2
