"""DuckDB upsert sink (the embedded default warehouse)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import duckdb
import pyarrow as pa

from dbt_sink.base import WarehouseUpsertSink
from dbt_sink.limits import Limit, limit_of, reasons, storable, takes
from dbt_sink.partitioned import check_identifier
from stateful_runtime.connectors.base import SinkSummary, WritePlacement
from stateful_runtime.exceptions import SinkError
from stateful_runtime.ledger import (
    BATCH_ID,
    COMMITTED_AT,
    JOB,
    LEDGER_TABLE,
    NOTE,
    ROWS,
    SINK,
    TABLE_ROWS,
    LedgerEntry,
    SinkObservation,
)

# DuckDB allows one writing process per file; a reader (srt status, a test, a BI tool) may hold
# the lock briefly, so a batch waits for it this long before the batch fails and is retried.
LOCK_WAIT_S = 30.0


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def committed_batches(
    con: duckdb.DuckDBPyConnection, job: str, sink: str, *, newest: int | None = None
) -> list[LedgerEntry]:
    """The micro-batches sink ``sink`` (the writing query's name) of ``job`` committed, newest
    first (only the ``newest`` N if given), read from the ledger on ``con``: a caller reading
    the sink's table on the same connection sees both in one snapshot. Empty if the sink has
    written nothing yet."""
    exists = con.execute(
        "SELECT 1 FROM information_schema.tables WHERE table_name = ?", [LEDGER_TABLE]
    ).fetchone()
    if not exists:
        return []
    limit = "" if newest is None else f" LIMIT {int(newest)}"
    rows = con.execute(
        f"SELECT {BATCH_ID}, {ROWS}, {COMMITTED_AT} FROM {LEDGER_TABLE} WHERE {JOB} = ? AND "
        f"{SINK} = ? ORDER BY {BATCH_ID} DESC{limit}",
        [job, sink],
    ).fetchall()
    return [LedgerEntry(int(b), int(n or 0), at) for b, n, at in rows]


# One writer at a time per DuckDB file in this process. The queries of a job write from the
# driver, each through a connection of its own to one database; two first batches creating
# the ledger table at once failed one with DuckDB's "Catalog write-write conflict on create"
# (a job of three queries into one file, killed and restarted).
_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _writing(database: str) -> threading.Lock:
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(os.path.abspath(database), threading.Lock())


class DuckDBUpsertSink(WarehouseUpsertSink):
    """Upsert into a DuckDB table, created on first write with ``PRIMARY KEY (key...)``.

    Args:
        database: DuckDB file path.
        table: table name.
        key: the table's unique key columns (e.g. ``("merchant_id", "window_start")``).
        summary_sql: query printed at the end of a run; ``{table}`` is replaced by the table.

    The connection is opened per batch and closed after commit, so other processes can read
    the file between batches.
    """

    kind = "duckdb"
    config_keys = ("sink.database", "sink.table")
    location_key = "sink.database"

    def __init__(
        self,
        database: str,
        table: str,
        key: Sequence[str],
        *,
        summary_sql: str | None = None,
    ) -> None:
        super().__init__(
            check_identifier(table, "table name"),
            [check_identifier(k, "key column") for k in key],
            summary_sql,
        )
        self.database = database
        # The existing table's columns' limits, read in each batch's transaction (None: not
        # read yet in this process).
        self._limits: dict[str, Limit] | None = None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, key: Sequence[str] = (), summary_sql: str | None = None
    ) -> DuckDBUpsertSink:
        """From ``sink.database`` and ``sink.table``."""
        return cls(config["sink.database"], config["sink.table"], key, summary_sql=summary_sql)

    def write_placement(self) -> WritePlacement:
        return WritePlacement(
            "driver",
            "DuckDB is embedded, one writing process per file: the job "
            "process upserts each batch and its ledger row in one transaction",
        )

    def check_schema(self, schema: pa.Schema) -> None:
        super().check_schema(schema)
        for name in schema.names:
            check_identifier(name, f"output column of table {self.table!r}")

    def describe(self) -> str:
        return (
            f"DuckDB {self.database} table {self.table} (upsert by "
            f"{', '.join(self.key_columns)}, ledger {LEDGER_TABLE})"
        )

    def _connect(self, read_only: bool = False) -> duckdb.DuckDBPyConnection:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                return duckdb.connect(self.database, read_only=read_only)
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    raise SinkError(f"cannot open DuckDB {self.database}: {exc}") from exc
                time.sleep(0.05)

    @staticmethod
    def _has(con: duckdb.DuckDBPyConnection, table: str) -> bool:
        return bool(
            con.execute(
                "SELECT 1 FROM information_schema.tables WHERE table_name = ?", [table]
            ).fetchone()
        )

    def _ensure_ledger(self, con: duckdb.DuckDBPyConnection) -> None:
        con.execute(
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ({JOB} VARCHAR, {SINK} VARCHAR, "
            f"{BATCH_ID} BIGINT, {ROWS} BIGINT, {COMMITTED_AT} TIMESTAMP, {TABLE_ROWS} BIGINT, "
            f"{NOTE} VARCHAR, PRIMARY KEY ({JOB}, {SINK}, {BATCH_ID}))"
        )
        have = {
            r[0]
            for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                [LEDGER_TABLE],
            ).fetchall()
        }
        # A ledger written before the table's rows were recorded: the columns are added.
        for column, tp in ((TABLE_ROWS, "BIGINT"), (NOTE, "VARCHAR")):
            if column not in have:
                con.execute(f"ALTER TABLE {LEDGER_TABLE} ADD COLUMN {column} {tp}")

    def _observe_on(self, con: duckdb.DuckDBPyConnection, job: str, sink: str) -> SinkObservation:
        exists = self._has(con, self.table)
        last = expected = None
        if self._has(con, LEDGER_TABLE):
            columns = {
                r[0]
                for r in con.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                    [LEDGER_TABLE],
                ).fetchall()
            }
            recorded = TABLE_ROWS if TABLE_ROWS in columns else "NULL"
            row = con.execute(
                f"SELECT {BATCH_ID}, {recorded} FROM {LEDGER_TABLE} WHERE {JOB} = ? AND "
                f"{SINK} = ? ORDER BY {BATCH_ID} DESC LIMIT 1",
                [job, sink],
            ).fetchone()
            if row:
                last, expected = int(row[0]), None if row[1] is None else int(row[1])
        rows = (
            int(con.execute(f"SELECT count(*) FROM {_q(self.table)}").fetchall()[0][0])
            if exists
            else None
        )
        return SinkObservation(self.table, self.database, exists, last, expected, rows)

    def observe(self, job: str, sink: str) -> SinkObservation:
        if self.database != ":memory:" and not os.path.exists(self.database):
            return SinkObservation(self.table, self.database, False, None, None, None)
        con = self._connect(read_only=True)
        try:
            return self._observe_on(con, job, sink)
        finally:
            con.close()

    def accept(self, job: str, sink: str, batch: int | None, note: str) -> None:
        at = -1 if batch is None else batch
        con = self._connect()
        try:
            con.begin()
            self._ensure_ledger(con)
            con.execute(
                f"DELETE FROM {LEDGER_TABLE} WHERE {JOB} = ? AND {SINK} = ? AND {BATCH_ID} > ?",
                [job, sink, at],
            )
            rows = (
                con.execute(f"SELECT count(*) FROM {_q(self.table)}").fetchall()[0][0]
                if self._has(con, self.table)
                else 0
            )
            con.execute(
                f"INSERT INTO {LEDGER_TABLE} ({JOB}, {SINK}, {BATCH_ID}, {ROWS}, {COMMITTED_AT}, "
                f"{TABLE_ROWS}, {NOTE}) VALUES (?, ?, ?, 0, now()::TIMESTAMP, ?, ?) ON CONFLICT "
                f"({JOB}, {SINK}, {BATCH_ID}) DO UPDATE SET {TABLE_ROWS} = excluded.{TABLE_ROWS}, "
                f"{NOTE} = excluded.{NOTE}",
                [job, sink, at, rows, note],
            )
            con.commit()
        finally:
            con.close()

    def set_aside(self, job: str, sink: str, suffix: str) -> str | None:
        if self.database != ":memory:" and not os.path.exists(self.database):
            return None
        con = self._connect()
        try:
            con.begin()
            moved = None
            if self._has(con, self.table):
                moved = f"{self.table}{suffix}"
                con.execute(f"ALTER TABLE {_q(self.table)} RENAME TO {_q(moved)}")
            if self._has(con, LEDGER_TABLE):
                con.execute(
                    f"DELETE FROM {LEDGER_TABLE} WHERE {JOB} = ? AND {SINK} = ?", [job, sink]
                )
            con.commit()
            return moved
        finally:
            con.close()

    def _columns(self, con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
        """The table's columns and their types (none: no table)."""
        return [
            (str(n), str(t))
            for n, t in con.execute(
                "SELECT column_name, data_type FROM information_schema.columns WHERE "
                "table_name = ? ORDER BY ordinal_position",
                [self.table],
            ).fetchall()
        ]

    def unstorable(self, rows: pa.Table) -> list[tuple[int, str]]:
        """The rows the table's columns cannot hold, by the limits the last batch's
        transaction read (the table's columns are read once when none has run yet)."""
        if self._limits is None and not os.path.exists(self.database):
            self._limits = {}  # no file (its first batch creates it): no narrower column
        if self._limits is None:
            con = self._connect()
            try:
                self._limits = {c: lim for c, t in self._columns(con) if (lim := limit_of(t))}
            finally:
                con.close()
        return reasons(rows, self._limits, f"DuckDB table {self.table} in {self.database}")

    def _ensure_tables(self, con: duckdb.DuckDBPyConnection, batch: pa.Table) -> None:
        self._ensure_ledger(con)
        existing = self._columns(con)
        if existing:
            have = [r[0] for r in existing]
            gone = [c for c in have if c not in batch.column_names]
            if gone:
                raise SinkError(
                    f"DuckDB table {self.table} has columns {have} but the job writes "
                    f"{batch.column_names} (without {gone}); migrate the table or write to a "
                    f"new one"
                )
            types = self._types(con, batch)
            # A narrower column than the job's (BIGINT for a decimal(38,0) sum, made by an
            # earlier version) is kept: each row is checked against it before the write.
            limits = {c: lim for c, t in existing if (lim := limit_of(t)) is not None}
            self._limits = limits
            retyped = [
                f"{c} {t} -> {types[c]}"
                for c, t in existing
                if types[c] != t and not takes(limits.get(c), batch.schema.field(c).type)
            ]
            if retyped:
                raise SinkError(
                    f"DuckDB table {self.table}: the job changes the type of {retyped}; "
                    f"migrate the table (ALTER TABLE ... ALTER COLUMN ... TYPE) or write to a "
                    f"new one"
                )
            # An upgraded job may add output columns: add them (rows before it read NULL).
            for c in (c for c in batch.column_names if c not in have):
                con.execute(f"ALTER TABLE {_q(self.table)} ADD COLUMN {_q(c)} {types[c]}")
            return
        cols = ", ".join(
            f"{_q(name)} {tp}{' NOT NULL' if name in self.key_columns else ''}"
            for name, tp in self._types(con, batch).items()
        )
        keys = ", ".join(_q(k) for k in self.key_columns)
        con.execute(f"CREATE TABLE IF NOT EXISTS {_q(self.table)} ({cols}, PRIMARY KEY ({keys}))")

    @staticmethod
    def _types(con: duckdb.DuckDBPyConnection, batch: pa.Table) -> dict[str, str]:
        con.register("_srt_schema", batch.slice(0, 0))
        types = con.execute("DESCRIBE SELECT * FROM _srt_schema").fetchall()
        con.unregister("_srt_schema")
        return {name: tp for name, tp, *_ in types}

    def rewind(self, batch_id: int) -> None:
        con = self._connect()
        try:
            exists = con.execute(
                "SELECT 1 FROM information_schema.tables WHERE table_name = ?", [LEDGER_TABLE]
            ).fetchone()
            if exists:
                con.execute(
                    f"DELETE FROM {LEDGER_TABLE} WHERE {JOB} = ? AND {SINK} = ? AND {BATCH_ID} > ?",
                    [self.job, self.sink_name, batch_id],
                )
        finally:
            con.close()

    def _write(self, batch: pa.Table, batch_id: int) -> None:
        with _writing(self.database):
            self._write_one(batch, batch_id)

    def _write_one(self, batch: pa.Table, batch_id: int) -> None:
        con = self._connect()
        try:
            con.begin()
            if self.expected_batch is not None:
                # The file, table and ledger still hold what the last batch left (a table
                # dropped or truncated, or the file deleted while the job runs, is not
                # silently recreated or written over).
                self._observe_on(con, self.job, self.sink_name).check_holds(
                    self.job, self.sink_name, self.expected_batch
                )
            self._limits = {}
            self._ensure_tables(con, batch)
            seen = con.execute(
                f"SELECT 1 FROM {LEDGER_TABLE} WHERE {JOB} = ? AND {SINK} = ? AND {BATCH_ID} = ?",
                [self.job, self.sink_name, batch_id],
            ).fetchone()
            if seen:
                con.rollback()
                return
            if batch.num_rows:
                batch = storable(
                    batch,
                    self._limits or {},
                    self.key_columns,
                    table=f"DuckDB table {self.table} in {self.database}",
                    batch_id=batch_id,
                    widen=self._types(con, batch),
                )
                cols = ", ".join(_q(c) for c in batch.column_names)
                keys = ", ".join(_q(k) for k in self.key_columns)
                updates = ", ".join(
                    f"{_q(c)} = excluded.{_q(c)}"
                    for c in batch.column_names
                    if c not in self.key_columns
                )
                action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
                con.register("_srt_batch", batch)
                con.execute(
                    f"INSERT INTO {_q(self.table)} ({cols}) SELECT {cols} FROM _srt_batch "
                    f"ON CONFLICT ({keys}) {action}"
                )
                con.unregister("_srt_batch")
            # The table's rows after the batch, in the same transaction: the next start (and
            # batch) finds fewer if rows were deleted behind the job's back.
            table_rows = con.execute(f"SELECT count(*) FROM {_q(self.table)}").fetchall()[0][0]
            con.execute(
                f"INSERT INTO {LEDGER_TABLE} ({JOB}, {SINK}, {BATCH_ID}, {ROWS}, {COMMITTED_AT}, "
                f"{TABLE_ROWS}) VALUES (?, ?, ?, ?, now()::TIMESTAMP, ?)",
                [self.job, self.sink_name, batch_id, batch.num_rows, table_rows],
            )
            con.commit()
        except BaseException:
            try:
                con.rollback()
            except duckdb.Error:
                pass
            raise
        finally:
            con.close()

    def summary(self) -> SinkSummary | None:
        if self.database != ":memory:" and not os.path.exists(self.database):
            # A run stopped before its first batch (Ctrl-C, SIGTERM): nothing was written.
            return SinkSummary(f"{self.table}: no rows written yet", [], [])
        con = self._connect(read_only=True)
        try:
            sql = (self.summary_sql or "SELECT * FROM {table} LIMIT 10").format(
                table=_q(self.table)
            )
            cur = con.execute(sql)
            cols = [d[0] for d in cur.description]
            rows = cur.fetchall()
            total = con.execute(f"SELECT count(*) FROM {_q(self.table)}").fetchall()[0][0]
        except duckdb.CatalogException:
            return SinkSummary(f"{self.table}: no rows written yet", [], [])
        finally:
            con.close()
        return SinkSummary(f"{self.table} in {self.database} ({total} rows)", cols, rows)
