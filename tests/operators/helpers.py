"""Running an example job on the shared SparkSession and reading its DuckDB sink, for the
operators' Spark tests."""

from __future__ import annotations

import io

import duckdb

from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import EXAMPLES


def run(job_file: str, tmp_path, late: int = 0, **overrides) -> str:
    values = {
        "source.log_dir": str(tmp_path / "log"),
        "checkpoint.dir": str(tmp_path / "ck" / job_file),
        "parallelism": "2",
        **{k: str(v) for k, v in overrides.items()},
    }
    jf = load_job_file(EXAMPLES / job_file, values)
    out = io.StringIO()
    runner = JobRunner(jf, available_now=True, out=out)
    assert runner.run() == 0, out.getvalue()
    # Records behind the watermark (dropped, or to a late side output), counted one by one.
    assert sum(r.records.late for r in runner.runs) == late, out.getvalue()
    return out.getvalue()


def table(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()
