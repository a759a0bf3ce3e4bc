"""Running an example job on the shared SparkSession and reading its DuckDB sink, for the
operators' Spark tests."""

from __future__ import annotations

import io

import duckdb

from stateful_runtime.ledger import BATCH_ID, LEDGER_TABLE
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import EXAMPLES


def run(
    job_file: str,
    tmp_path,
    late: int = 0,
    from_savepoint: str | None = None,
    late_by_source: dict[str, int] | None = None,
    **overrides,
) -> str:
    """Run ``job_file`` to the end of its input; ``late``: the records behind the watermark
    it must count, and ``late_by_source`` ({source: n}, over its queries of several sources)
    those of each source."""
    values = {
        "source.log_dir": str(tmp_path / "log"),
        "checkpoint.dir": str(tmp_path / "ck" / job_file),
        "parallelism": "2",
        **{k: str(v) for k, v in overrides.items()},
    }
    jf = load_job_file(EXAMPLES / job_file, values)
    out = io.StringIO()
    runner = JobRunner(jf, available_now=True, out=out, from_savepoint=from_savepoint)
    assert runner.run() == 0, out.getvalue()
    # Records behind the watermark (dropped, or to a late side output), counted one by one.
    assert sum(r.records.late for r in runner.runs) == late, out.getvalue()
    if late_by_source is not None:
        by_source: dict[str, int] = {}
        for r in runner.runs:
            for name, records in r.records.by_source.items():
                by_source[name] = by_source.get(name, 0) + records.late
        assert by_source == late_by_source, (by_source, out.getvalue())
    return out.getvalue()


def table(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def crash_before_commit(query, db) -> None:
    """As if the job died after its tasks wrote the state of its last data batch and before
    anything committed it (Spark's commit log, the sink's ledger): the batch is replayed, and
    its tasks must start from the version before it, not from the newer state they find (the
    local copies are ahead: they are rebuilt from the checkpoint)."""
    commits = sorted(int(p.name) for p in (query / "commits").iterdir() if p.name.isdigit())
    last = commits[-1]  # the final batch, without data
    assert (query / "keyed").is_dir()
    for name in (str(last), f".{last}.crc"):
        (query / "offsets" / name).unlink(missing_ok=True)
    for batch in (last, last - 1):
        for name in (str(batch), f".{batch}.crc"):
            (query / "commits" / name).unlink(missing_ok=True)
    con = duckdb.connect(str(db))
    try:
        con.execute(f"DELETE FROM {LEDGER_TABLE} WHERE {BATCH_ID} >= ?", [last - 1])
    finally:
        con.close()
