"""The resources' own behaviour, against real `srt` processes and a real DuckDB file (no Spark
job): typed results, the runtime's errors with their fields, the registry passed as a value,
and the sink ledger read through dbt_sink."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from dagster_defs import DuckDBWarehouse, StreamingRuntime
from dagster_defs.errors import SrtCommandError, StatefulRuntimeError
from tests.helpers import EXAMPLES, ROOT

UPI = EXAMPLES / "upi_per_minute.py"


@pytest.fixture
def runtime(tmp_path: Path) -> StreamingRuntime:
    return StreamingRuntime(home=str(tmp_path / "home"), working_directory=str(ROOT))


def test_status_of_an_unknown_job_is_none_and_the_registry_is_passed_not_set(
    runtime: StreamingRuntime, tmp_path: Path
):
    before = os.environ.get("SRT_HOME")
    assert runtime.status("never-ran") is None
    assert runtime.statuses() == [] and runtime.last_committed("never-ran") == {}
    assert os.environ.get("SRT_HOME") == before  # the Dagster process's environment is untouched
    assert runtime.command(["status"])[-3:] == ["--home", str(tmp_path / "home"), "status"]


def test_explain_is_typed(runtime: StreamingRuntime, tmp_path: Path):
    plan = runtime.explain(str(UPI), {"source.log_dir": str(tmp_path / "log"), "parallelism": 3})
    assert (plan.job, plan.parallelism) == ("upi-per-minute", 3)
    [query] = plan.queries
    assert query.name == "upi-counts" and query.path == "native"
    assert "query upi-counts" in plan.text


def test_runtime_errors_keep_their_type_and_fields(runtime: StreamingRuntime, tmp_path: Path):
    with pytest.raises(SrtCommandError) as info:
        runtime.stop("never-ran")
    assert info.value.kind == "JobError" and "no job named 'never-ran'" in str(info.value)
    assert isinstance(info.value, StatefulRuntimeError) and info.value.returncode == 2

    # An upgrade of a job that never ran stops at the check and says so in its fields.
    with pytest.raises(SrtCommandError) as info:
        runtime.upgrade("upi-per-minute", str(UPI), {"source.log_dir": str(tmp_path / "log")})
    assert info.value.kind == "UpgradeError"
    assert info.value.details["stage"] == "check"
    assert "not running (never started)" in str(info.value)

    # A file that builds another job is refused before anything starts.
    with pytest.raises(SrtCommandError) as info:
        runtime.launch("other-job", str(UPI), {})
    assert info.value.kind == "ConfigError" and "not 'other-job'" in str(info.value)
    assert runtime.statuses() == []


def test_a_command_that_fails_without_json_is_a_process_error(tmp_path: Path):
    broken = StreamingRuntime(home=str(tmp_path), srt_executable="/bin/false")
    with pytest.raises(SrtCommandError) as info:
        broken.statuses()
    assert info.value.kind == "ProcessError" and info.value.returncode == 1


def test_the_sink_ledger_is_read_through_dbt_sink(tmp_path: Path):
    from dbt_sink import DuckDBUpsertSink

    db = tmp_path / "w.duckdb"
    warehouse = DuckDBWarehouse(path=str(db))
    sink = DuckDBUpsertSink(str(db), "t", key=("k",))
    sink.open("job-a", "q")
    batch = pa.table({"k": ["a", "b"], "v": [1, 2]})
    for batch_id in (0, 1, 1):  # a replayed batch leaves no second ledger row
        sink.write_batch(batch, batch_id)
    other = DuckDBUpsertSink(str(db), "t", key=("k",))
    other.open("job-b", "q")
    other.write_batch(batch.slice(0, 1), 7)

    rows = warehouse.committed_batches("job-a", "q")
    assert [(r.batch_id, r.rows) for r in rows] == [(1, 2), (0, 2)]
    assert rows[0].committed_at is not None
    with warehouse.read_only() as con:
        [last] = warehouse.committed_batches("job-b", "q", newest=1, con=con)
    assert last.batch_id == 7
    assert warehouse.committed_batches("job-a", "other-sink") == []
