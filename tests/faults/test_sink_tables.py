"""Sink tables changed behind the job's back (issue 23), end to end through the real CLI: the
UPI job runs to commits and stops; its table is truncated, dropped, its ledger deleted, its
DuckDB file deleted. Each time `srt run` refuses (exit 2, `SinkDataLostError` naming what
happened and the commands back; the registry records it for Dagster), and after the way back
(`srt run --replay-sinks`: a fresh table from the source's retained records) the table equals
the oracle; the other way on (`srt sink accept`) goes on over the hole. DuckDB, and PostgreSQL
for a server warehouse; every warehouse's refusals are in tests/runtime/test_sink_check.py.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

import duckdb
import pytest
from upi_events import START_MS, events, oracle

from tests.faults.harness import TrialLog
from tests.helpers import UpiWorkspace, append_lines, srt

pytestmark = [pytest.mark.slow, pytest.mark.faults]

JOB = "upi-per-minute"
LINES = list(events(6_000, merchants=12, rate_per_s=50, disorder_ms=3_000, seed=23))
# After the loss is accepted: later payments (LINES span 120 s of event time).
LATER = list(
    events(
        3_000, merchants=12, rate_per_s=50, disorder_ms=3_000, seed=24, start_ms=START_MS + 130_000
    )
)


def _duck(ws: UpiWorkspace, sql: str) -> None:
    con = duckdb.connect(str(ws.database))
    try:
        con.execute(sql)
    finally:
        con.close()


def _pg_table(dsn: str) -> dict:
    import psycopg

    with psycopg.connect(dsn) as con:
        rows = con.execute(
            "SELECT merchant_id, window_start, payments, amount_paise FROM upi_counts"
        ).fetchall()
    return {(m, w.replace(tzinfo=None)): (p, a) for m, w, p, a in rows}


def _refused(ws: UpiWorkspace, env: dict[str, str], problem: str) -> str:
    out = srt(ws.run_args("--available-now"), env)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-3000:]
    err = out.stderr
    assert "SinkDataLostError" not in err or "Traceback" not in err
    assert "sink upi-counts of job 'upi-per-minute'" in err, err[-3000:]
    assert "--replay-sinks" in err and "srt sink accept" in err and "--from-savepoint" in err
    status = srt(["status", JOB, "--json"], env)
    doc = json.loads(status.stdout)
    entry = doc[0] if isinstance(doc, list) else doc
    assert entry["registered_state"] == "FAILED" or entry["state"] == "FAILED"
    assert entry["error"]["type"] == "SinkDataLostError"
    assert entry["error"]["problem"] == problem
    assert entry["error"]["ways_back"]
    return err


DUCKDB_CHANGES: dict[str, tuple[Callable[[UpiWorkspace], None], str]] = {
    "table truncated": (lambda ws: _duck(ws, "DELETE FROM upi_counts"), "rows_missing"),
    "table dropped": (lambda ws: _duck(ws, "DROP TABLE upi_counts"), "table_missing"),
    "ledger deleted": (lambda ws: _duck(ws, "DROP TABLE srt_sink_ledger"), "ledger_missing"),
    "DuckDB file deleted": (lambda ws: ws.database.unlink(), "table_missing"),
}


def test_duckdb_table_changed_while_stopped_is_refused_then_replayed_or_accepted(
    upi: UpiWorkspace, srt_env: dict[str, str], trials: TrialLog
):
    append_lines(upi.log_dir, LINES)
    first = srt(upi.run_args("--available-now"), srt_env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    expected = oracle(LINES)
    assert upi.table() == expected
    kept = upi.root / "kept.duckdb"
    shutil.copy(upi.database, kept)
    for change, (tamper, problem) in DUCKDB_CHANGES.items():
        tamper(upi)
        err = _refused(upi, srt_env, problem)
        trials.record(
            fault=f"sink table changed while the job was stopped: {change} (DuckDB)",
            input="UPI 6k events",
            result="pass",
            refused=problem,
            message=err.strip().splitlines()[0][:300],
        )
        shutil.copy(kept, upi.database)  # the next change starts from the job's table
    # The way back from the last refusal: a fresh table from the source's retained records.
    _duck(upi, "DELETE FROM upi_counts")
    replay = srt(upi.run_args("--available-now", "--replay-sinks"), srt_env)
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-3000:]
    assert "set aside as upi_counts_lost_" in replay.stdout
    assert upi.table() == expected
    aside = list(upi.root.glob("checkpoints.before-replay-*"))
    assert len(aside) == 1 and (aside[0] / "_job.json").exists()  # kept, with its marker
    con = duckdb.connect(str(upi.database), read_only=True)
    try:
        names = [r[0] for r in con.execute("SHOW TABLES").fetchall()]
    finally:
        con.close()
    assert any(n.startswith("upi_counts_lost_") for n in names)  # the truncated one, kept
    trials.record(
        fault="sink table truncated, way back: srt run --replay-sinks (DuckDB)",
        input="UPI 6k events",
        result="pass",
        lost=0,
        duplicated=0,
    )

    # The other way on, on the same table: accept the loss and go on over the hole.
    _duck(upi, "DELETE FROM upi_counts")
    _refused(upi, srt_env, "rows_missing")
    sets = upi.run_args()[2:]
    accepted = srt(["sink", "accept", upi.run_args()[1], *sets, "--json"], srt_env)
    assert accepted.returncode == 0, accepted.stderr[-2000:]
    (line,) = json.loads(accepted.stdout)["accepted"]
    assert "rows_missing" in line
    append_lines(upi.log_dir, LATER)
    again = srt(upi.run_args("--available-now"), srt_env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    con = duckdb.connect(str(upi.database), read_only=True)
    try:
        notes = con.execute("SELECT note FROM srt_sink_ledger WHERE note IS NOT NULL").fetchall()
    finally:
        con.close()
    assert len(notes) == 1 and "accepted by" in notes[0][0]
    # The hole stays (the operator's decision): only windows the later events touched.
    table, everything = upi.table(), oracle(LINES + LATER)
    assert table and len(table) < len(everything)
    assert all(everything[k][0] >= v[0] for k, v in table.items())
    assert any(k not in table for k in expected)  # windows of the lost rows stay lost


def test_postgres_table_truncated_is_refused_then_replayed(
    upi: UpiWorkspace, srt_env: dict[str, str], pg_dsn: str, trials: TrialLog
):
    upi.extra.update({"sink.kind": "postgres", "sink.dsn": pg_dsn})
    append_lines(upi.log_dir, LINES)
    first = srt(upi.run_args("--available-now"), srt_env)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    expected = oracle(LINES)
    assert _pg_table(pg_dsn) == expected
    import psycopg

    with psycopg.connect(pg_dsn) as con:
        con.execute("TRUNCATE upi_counts")
    _refused(upi, srt_env, "rows_missing")
    replay = srt(upi.run_args("--available-now", "--replay-sinks"), srt_env)
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-3000:]
    assert _pg_table(pg_dsn) == expected
    trials.record(
        fault="sink table truncated while the job was stopped, then srt run --replay-sinks "
        "(PostgreSQL)",
        input="UPI 6k events",
        result="pass",
        refused="rows_missing",
        lost=0,
        duplicated=0,
    )


def test_restore_over_a_later_table_passes_and_replay_from_a_savepoint(
    upi: UpiWorkspace, srt_env: dict[str, str], trials: TrialLog
):
    append_lines(upi.log_dir, LINES[:3000])
    first = srt(upi.run_args("--available-now"), srt_env)
    assert first.returncode == 0, first.stderr[-3000:]
    taken = srt(["savepoint", "create", JOB, "--json"], srt_env)
    assert taken.returncode == 0, taken.stderr[-2000:]
    sid = json.loads(taken.stdout)["id"]
    append_lines(upi.log_dir, LINES[3000:])
    second = srt(upi.run_args("--available-now"), srt_env)
    assert second.returncode == 0, second.stderr[-3000:]
    expected = oracle(LINES)
    assert upi.table() == expected
    # Legitimate: the restored checkpoint is older than the table (the existing rewind path).
    restored = srt(upi.run_args("--available-now", "--from-savepoint", sid), srt_env)
    assert restored.returncode == 0, restored.stdout[-2000:] + restored.stderr[-3000:]
    assert upi.table() == expected
    _duck(upi, "DELETE FROM upi_counts")
    err = _refused(upi, srt_env, "rows_missing")
    assert f"--from-savepoint {sid} --replay-sinks" in err  # the newest savepoint, named
    replay = srt(
        upi.run_args("--available-now", "--from-savepoint", sid, "--replay-sinks"), srt_env
    )
    assert replay.returncode == 0, replay.stdout[-2000:] + replay.stderr[-3000:]
    table = upi.table()
    # Only the results after the savepoint: windows the later batches touched, each complete.
    assert table and len(table) < len(expected)
    assert {k: expected[k] for k in table} == table
    trials.record(
        fault="sink table truncated, way back: srt run --from-savepoint --replay-sinks (DuckDB)",
        input="UPI 6k events, savepoint after 3k",
        result="pass",
        windows_after_savepoint=len(table),
        windows_in_oracle=len(expected),
    )
