"""A failed query's cause as srt says it (runtime/failures.py), from Spark's own text."""

from __future__ import annotations

from pathlib import Path

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.planner import plan
from stateful_runtime.runtime.failures import explain
from stateful_runtime.runtime.loader import load_job_file
from tests.helpers import EXAMPLES

# Spark's text for a task whose Python worker was killed on its last attempt (abridged).
WORKER_DIED = (
    "Job aborted due to stage failure: Task 0 in stage 9.0 failed 4 times, most recent "
    "failure: Lost task 0.3 in stage 9.0 (TID 30) (localhost executor driver): "
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed): \n"
    "Caused by: java.io.EOFException\n\tat java.base/java.io.DataInputStream.readInt"
)


def test_a_python_worker_that_died_is_named_with_the_way_on(tmp_path: Path):
    job_file = EXAMPLES / "upi_per_minute.py"
    job = load_job_file(job_file, {"checkpoint.dir": str(tmp_path / "ckpt")}).job
    query = plan(job).queries[0]
    said = explain(WORKER_DIED, query, QueryLayout(tmp_path / "q"), str(job_file))
    assert said is not None
    assert f"a Python worker running query {query.name!r} died 4 times" in said
    assert "the batch in flight is not committed" in said
    assert f"srt run {job_file} resumes" in said
    assert "EOFException" not in said  # no stack trace
    assert explain("some other failure", query, QueryLayout(tmp_path / "q"), "j.py") is None
