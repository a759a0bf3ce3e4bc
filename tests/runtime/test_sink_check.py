"""Sink tables checked against the checkpoint (runtime/sink_check.py), on every warehouse:
DuckDB, PostgreSQL and ClickHouse (real servers, tests/conftest.py) and Delta Lake.

A sink writes three batches through its real write path, the checkpoint's commit log says
they committed, then the table is truncated, dropped, its ledger deleted (or its database file
deleted): the start check refuses with the problem, and a sink asked to write the next batch
refuses too (the table is not silently recreated). The legitimate cases pass: a fresh job, a
plain restart, a crash between the sink's commit and Spark's, a restore that rewinds a table
holding later batches, a sink an upgrade added. ``srt sink accept`` (``sink_check.accept``)
lets the job go on, recorded in the ledger. End to end through ``srt run``:
tests/faults/test_sink_tables.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stateful_runtime.checkpoints.layout import CheckpointLayout
from stateful_runtime.exceptions import SinkDataLostError
from stateful_runtime.planner import plan
from stateful_runtime.runtime import sink_check
from tests.dbt_sink.helpers import KEY, SCHEMA, W1, W2, batch

JOB = "j"
WAREHOUSES = ("duckdb", "postgres", "clickhouse", "delta")


def job_to(sink: Any, tmp_path: Path, *sinks: tuple[str, Any]) -> Any:
    """Job "j": an event-log source straight into ``sink`` (output "out"), and ``sinks``."""
    from datetime import timedelta

    from stateful_runtime import CheckpointConfig, LogSource, StreamJob, WatermarkStrategy
    from stateful_runtime.connectors.eventlog import EventLog

    EventLog(tmp_path / "log").create_topic("in", 1, exist_ok=True)
    job = StreamJob(JOB, CheckpointConfig(str(tmp_path / "ck")), parallelism=1)
    stream = job.from_source(
        LogSource(str(tmp_path / "log"), "in", {"merchant_id": str, "payments": int, "ts": int}),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=1)).with_timestamp_field(
            "ts"
        ),
        name="src",
    )
    stream.sink_to(sink, name="out")
    for name, more in sinks:
        stream.sink_to(more, name=name)
    return job


class Warehouse:
    """One warehouse's sink and the ways a user changes its table behind the job's back."""

    def __init__(self, kind: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
        self.kind, self.tmp_path = kind, tmp_path
        self.request = request

    def sink(self, table: str = "t") -> Any:
        if self.kind == "duckdb":
            from dbt_sink import DuckDBUpsertSink

            return DuckDBUpsertSink(str(self.tmp_path / "w.duckdb"), table, KEY)
        if self.kind == "postgres":
            from dbt_sink.postgres import PostgresUpsertSink

            dsn = self.request.getfixturevalue("pg_dsn")
            return PostgresUpsertSink(dsn, table, KEY, executor_writes=False)
        if self.kind == "clickhouse":
            from dbt_sink.clickhouse import ClickHouseUpsertSink

            url = self.request.getfixturevalue("ch_url")
            return ClickHouseUpsertSink(url, table, KEY, executor_writes=False)
        from dbt_sink.delta import DeltaUpsertSink

        return DeltaUpsertSink(str(self.tmp_path / "delta" / table), table, KEY)

    def sql(self, sink: Any, statement: str) -> None:
        if self.kind == "duckdb":
            import duckdb

            con = duckdb.connect(sink.database)
            try:
                con.execute(statement)
            finally:
                con.close()
        elif self.kind == "postgres":
            sink._run("test", lambda con: con.execute(statement))
        else:
            c = sink._client()
            try:
                c.command(statement)
            finally:
                c.close()

    def truncate(self, sink: Any) -> None:
        if self.kind == "delta":
            from deltalake import DeltaTable

            DeltaTable(sink.path).delete()
        elif self.kind == "duckdb":
            self.sql(sink, "DELETE FROM t")
        else:
            self.sql(sink, "TRUNCATE TABLE t")

    def delete_some(self, sink: Any) -> None:
        if self.kind == "delta":
            from deltalake import DeltaTable

            DeltaTable(sink.path).delete("merchant_id = 'M1'")
        elif self.kind == "clickhouse":
            self.sql(sink, "ALTER TABLE t DELETE WHERE merchant_id = 'M1'")
            sink._run("wait", sink._wait_mutations)
        else:
            self.sql(sink, "DELETE FROM t WHERE merchant_id = 'M1'")

    def drop(self, sink: Any) -> None:
        if self.kind == "delta":
            shutil.rmtree(sink.path)
        else:
            self.sql(sink, "DROP TABLE t")

    def delete_ledger(self, sink: Any) -> None:
        if self.kind == "delta":  # the ledger is the app transaction in the table's log
            from deltalake import write_deltalake

            shutil.rmtree(sink.path)  # the same rows, in a table without the transactions
            write_deltalake(sink.path, batch([("M1", W1, 5), ("M1", W2, 2), ("M2", W1, 7)]))
        else:
            self.sql(sink, "DROP TABLE srt_sink_ledger")


@pytest.fixture(params=WAREHOUSES)
def warehouse(request: pytest.FixtureRequest, tmp_path: Path) -> Warehouse:
    return Warehouse(request.param, request, tmp_path)


def committed(tmp_path: Path, query: str, *batches: int) -> CheckpointLayout:
    """The checkpoint's commit log says ``batches`` committed."""
    layout = CheckpointLayout(tmp_path / "ck")
    q = layout.query(query)
    q.commit_log.mkdir(parents=True, exist_ok=True)
    for b in batches:
        q.commit(b).write_text("v1\n{}\n")
    return layout


def three_batches(wh: Warehouse) -> tuple[Any, Any, CheckpointLayout]:
    """A sink that wrote batches 0..2 (committed), checked at its first start as the runner
    does; returns the sink, the query plan and the checkpoint."""
    sink = wh.sink()
    q = plan(job_to(sink, wh.tmp_path)).queries[0]
    layout = CheckpointLayout(wh.tmp_path / "ck")
    assert sink_check.check(JOB, [q], layout, rewinds={}) == [
        sink_check.Checked(q.name, "out", 0, None)
    ]  # a fresh job: nothing expected
    assert not layout.query(q.name).root.exists()  # nothing written before Spark starts
    layout.query(q.name).commit_log.mkdir(parents=True)  # Spark started the query
    sink_check.record_started(layout.query(q.name), q)  # the sink recorded from batch 0
    sink.open(JOB, "out")
    sink.write_batch(batch([("M1", W1, 1), ("M2", W1, 7)]), 0)
    sink.write_batch(batch([("M1", W1, 5), ("M1", W2, 2)]), 1)
    sink.write_batch(batch([], SCHEMA), 2)
    committed(wh.tmp_path, q.name, 0, 1, 2)
    return sink, q, layout


def refusal(q: Any, layout: CheckpointLayout, **kw: Any) -> SinkDataLostError:
    with pytest.raises(SinkDataLostError) as err:
        sink_check.check(JOB, [q], layout, rewinds=kw.get("rewinds", {}))
    return err.value


def test_a_plain_restart_passes_and_expects_the_last_batch(warehouse):
    sink, q, layout = three_batches(warehouse)
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={})
    assert checked.expected_batch == 2 and sink.expected_batch == 2
    obs = sink.observe(JOB, "out")
    assert (obs.last_batch, obs.rows) == (2, 3)
    assert obs.expected_rows in (3, None if warehouse.kind == "delta" else 3)


TAMPER: dict[str, tuple[Callable[[Warehouse, Any], None], str]] = {
    "truncated": (Warehouse.truncate, "rows_missing"),
    "rows deleted": (Warehouse.delete_some, "rows_missing"),
    "dropped": (Warehouse.drop, "table_missing"),
    "ledger deleted": (Warehouse.delete_ledger, "ledger_missing"),
}


@pytest.mark.parametrize("change", list(TAMPER))
def test_a_table_changed_behind_the_job_is_refused_at_start_and_before_writing(warehouse, change):
    sink, q, layout = three_batches(warehouse)
    tamper, problem = TAMPER[change]
    tamper(warehouse, sink)
    err = refusal(q, layout)
    assert err.problem == problem, str(err)
    assert (err.job, err.sink, err.committed_batch) == (JOB, "out", 2)
    assert "Nothing was written" in str(err)
    # A sink already running (its last batch 2) refuses the next batch rather than write over
    # the hole or recreate the table: a table dropped or emptied, a ledger gone, rows deleted
    # (PostgreSQL counts rows at start only: an emptied table is caught before each batch).
    sink.expected_batch = 2
    if change == "rows deleted" and warehouse.kind == "postgres":
        sink.write_batch(batch([("M3", W2, 1)]), 3)
        committed(warehouse.tmp_path, q.name, 3)
        assert refusal(q, layout).problem == problem  # the next start
        return
    with pytest.raises(SinkDataLostError) as during:
        sink.write_batch(batch([("M3", W2, 1)]), 3)
    assert during.value.problem == problem
    obs = sink.observe(JOB, "out")
    assert obs.last_batch != 3 and not (obs.rows or 0) > 3  # nothing of batch 3 went in


def test_a_deleted_duckdb_file_is_refused(tmp_path, request):
    wh = Warehouse("duckdb", request, tmp_path)
    sink, q, layout = three_batches(wh)
    os.remove(sink.database)
    assert refusal(q, layout).problem == "table_missing"
    assert not os.path.exists(sink.database)  # the check creates nothing
    sink.expected_batch = 2
    with pytest.raises(SinkDataLostError):
        sink.write_batch(batch([("M3", W2, 1)]), 3)


def test_a_table_with_a_ledger_ahead_of_the_checkpoint_is_refused_unless_rewound(warehouse):
    sink, q, layout = three_batches(warehouse)
    shutil.rmtree(layout.root)  # the checkpoint deleted: batches 0..2 would be skipped
    assert refusal(q, layout).problem == "ledger_ahead"
    layout = committed(warehouse.tmp_path, q.name, 0)
    err = refusal(q, layout)
    assert err.problem == "ledger_ahead" and err.ledger_batch == 2
    # A restore (or a fallback) at batch 0 rewinds the sink: the later batches are forgotten.
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={q.name: 0})
    assert checked.expected_batch == 0


def test_a_crash_between_the_sink_commit_and_sparks_passes(warehouse):
    sink, q, layout = three_batches(warehouse)
    layout.query(q.name).commit(2).unlink()  # batch 2 in the ledger, not committed
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={})
    assert checked.expected_batch == 2


def test_a_sink_added_by_an_upgrade_starts_empty(tmp_path, request):
    from dataclasses import replace

    from stateful_runtime.planner import QueryOutput

    wh = Warehouse("duckdb", request, tmp_path)
    sink, q, layout = three_batches(wh)
    # The upgraded job's query has a second output (a side output's sink, say).
    q2 = replace(q, outputs=(*q.outputs, QueryOutput("more", wh.sink("added"))))
    checked = {c.sink: c for c in sink_check.check(JOB, [q2], layout, rewinds={})}
    assert checked["more"].since == 3 and checked["more"].expected_batch is None
    assert "new to the checkpoint" in checked["more"].note
    # Without the checkpoint's record, the same empty ledger beside commits is a loss.
    sink_check.record_path(layout.query(q.name)).unlink()
    assert refusal(q2, layout).problem in ("table_missing", "ledger_missing")


def test_accept_records_the_decision_and_lets_the_job_go_on(warehouse):
    sink, q, layout = three_batches(warehouse)
    warehouse.truncate(sink)
    assert refusal(q, layout).problem == "rows_missing"
    (done,) = sink_check.accept(JOB, [q], layout, by="tester")
    assert "accepted by tester" in done and "rows_missing" in done
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={})
    assert checked.expected_batch == 2
    sink.expected_batch = 2
    sink.write_batch(batch([("M3", W2, 1)]), 3)  # the job goes on from here
    committed(warehouse.tmp_path, q.name, 3)
    assert sink_check.check(JOB, [q], layout, rewinds={})[0].expected_batch == 3
    assert sink.observe(JOB, "out").rows == 1


def test_set_aside_keeps_the_old_table_and_starts_the_ledger_over(warehouse):
    sink, q, layout = three_batches(warehouse)
    warehouse.truncate(sink)
    (note,) = sink_check.set_aside(JOB, [q], layout, {q.name: 0})
    assert "set aside as" in note
    shutil.rmtree(layout.root)  # --replay-sinks moves the checkpoint aside
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={})
    assert checked.expected_batch in (None, -1)  # Delta: the app transaction set to -1
    obs = sink.observe(JOB, "out")
    assert obs.last_batch in (None, -1) and not obs.rows


def test_a_restore_rewinds_and_the_batches_after_it_are_written_again(warehouse):
    sink, q, layout = three_batches(warehouse)
    if warehouse.kind == "clickhouse":  # merges collapse M1/W1's versions 0 and 1 into 1
        warehouse.sql(sink, "OPTIMIZE TABLE t FINAL")
    # The savepoint is at batch 0; the table holds batches 1 and 2 of the run after it.
    for b in (1, 2):
        layout.query(q.name).commit(b).unlink()
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={q.name: 0})
    assert checked.expected_batch == 0
    sink.rewind(0)  # as the runner does after the check
    sink.write_batch(batch([("M1", W1, 6), ("M1", W2, 3)]), 1)  # re-executed, other rows
    sink.expected_batch = 1
    committed(warehouse.tmp_path, q.name, 1)
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={})
    assert checked.expected_batch == 1
    sink.write_batch(batch([("M4", W2, 1)]), 2)


def test_a_rescale_batch_is_no_sinks_and_a_later_start_passes(tmp_path, request):
    # Spark's checkpoint repartition (a restore with another parallelism) commits one batch of
    # redistributed state that no sink is given; a savepoint of it restored later must not be
    # taken for a ledger that lost that batch.
    wh = Warehouse("duckdb", request, tmp_path)
    sink, q, layout = three_batches(wh)
    committed(tmp_path, q.name, 3)  # the rescale's batch
    assert refusal(q, layout).problem == "ledger_missing"
    sink_check.record_no_output(layout.query(q.name), q, 3)
    (checked,) = sink_check.check(JOB, [q], layout, rewinds={})
    assert checked.expected_batch == 2
    sink_check.write_record(layout.query(q.name), sink_check.read_record(layout.query(q.name)))
    assert sink_check.check(JOB, [q], layout, rewinds={})  # the record keeps the batch
    wh.truncate(sink)  # and a real loss is still caught
    assert refusal(q, layout).problem == "rows_missing"
    # A checkpoint without a record (written before it existed) gets every sink from batch 0.
    sink_check.record_path(layout.query(q.name)).unlink()
    sink_check.record_no_output(layout.query(q.name), q, 3)
    assert sink_check.read_record(layout.query(q.name)) == {"out": {"since": 0}}


def test_the_ways_back_name_the_jobs_flags_with_secrets_masked():
    err = SinkDataLostError(JOB, "out", "t", "db", "rows_missing", "rows gone", committed_batch=2)
    ways = sink_check.ways_back(
        err,
        "/jobs/job.py",
        {"sink.dsn": "postgresql://srt:hunter2@h/db", "sink.table": "t", "x": 1},
        {"sink.dsn": "", "sink.table": "t", "x": 1},
        ("sp-7", 41),
    )
    assert len(ways) == 3 and not any("hunter2" in w for w in ways)
    assert (
        "srt run /jobs/job.py --set 'sink.dsn=postgresql://srt:***@h/db' --replay-sinks" in ways[0]
    )
    assert "--from-savepoint sp-7 --replay-sinks" in ways[1] and "batch 41" in ways[1]
    assert "srt sink accept /jobs/job.py" in ways[2] and "--sink out" in ways[2]
