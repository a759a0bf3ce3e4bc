"""`srt explain` plans a job whose source topic does not exist yet; Spark's own plan says what
is missing instead of failing the command."""

from __future__ import annotations

from pathlib import Path

from stateful_runtime.planner import plan
from stateful_runtime.runtime.loader import load_job_file
from tests.helpers import EXAMPLES


def test_explain_without_the_topic(spark, tmp_path: Path):
    job = load_job_file(
        EXAMPLES / "upi_per_minute.py",
        {"source.log_dir": str(tmp_path / "no-log"), "checkpoint.dir": str(tmp_path / "ckpt")},
    ).job
    text = plan(job).explain(spark)
    assert "window per-merchant-minute" in text
    assert "Spark plan: not available until the source's topic exists" in text
    assert "srt log create upi-payments" in text
    assert not (tmp_path / "no-log").exists()  # explaining creates nothing
