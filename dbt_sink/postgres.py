"""PostgreSQL upsert sink (psycopg 3), written from Spark's executors.

Per micro-batch ``N`` (:class:`~stateful_runtime.connectors.base.PartitionedSink`):

* driver, ``begin_batch``: create the table (``PRIMARY KEY (key)``) and the ledger tables, add
  new columns; skip the batch if ``srt_sink_ledger`` has ``(job, sink, N)``.
* each task, one transaction per partition ``p`` of ``n``: skip if ``srt_sink_partitions`` has
  ``(job, sink, N, p, n)``; else ``COPY`` the partition's rows into a temporary table,
  ``INSERT ... ON CONFLICT (key) DO UPDATE`` from it, insert the partition's ledger row, commit.
* driver, ``commit_batch``: insert ``(job, sink, N)`` into ``srt_sink_ledger`` with the table's
  rows after it (the previous entry's plus the keys the batch's partitions inserted: no
  ``count(*)`` per batch) and drop the partition rows of earlier batches, one transaction.

Data and ledger commit together, so a kill -9 anywhere leaves either both or neither; the
replay of a batch (same rows per partition, see ``prepare_rows``) skips what is there.
Unlike Flink's JDBC upsert sink or Quix Streams' PostgreSQL sink (at-least-once: a replay
writes again, harmless only because upserts converge), the ledger makes a replay a no-op
even for rows a later batch has already superseded.
"""

from __future__ import annotations

import io
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pyarrow as pa
import pyarrow.csv as pacsv

from dbt_sink.limits import holds_no_nul
from dbt_sink.partitioned import (
    Column,
    PartitionedWarehouseSink,
    RetryPolicy,
    hook,
    options,
)
from stateful_runtime.connectors.base import PartitionReport, SinkSummary
from stateful_runtime.exceptions import ConfigError, SinkError
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
from stateful_runtime.masking import mask_text, resolve

# Which partitions of a batch are written (each in its own transaction, with its rows).
PARTITION_LEDGER = "srt_sink_partitions"


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def pg_type(t: pa.DataType) -> str:
    """The PostgreSQL type a column of Arrow type ``t`` gets."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_int64(t) or pa.types.is_uint32(t):
        return "bigint"
    if pa.types.is_int32(t) or pa.types.is_int16(t) or pa.types.is_int8(t):
        return "integer"
    if pa.types.is_floating(t):
        return "double precision"
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_timestamp(t):
        return "timestamp with time zone" if t.tz else "timestamp without time zone"
    if pa.types.is_date(t):
        return "date"
    if pa.types.is_decimal(t):
        return "numeric"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytea"
    raise SinkError(
        f"PostgreSQL sink: no column type for Arrow type {t}; cast the column in "
        f"the job (string, integer, float, boolean, timestamp, date, decimal)"
    )


def _full_type(data_type: str, precision: int | None, scale: int | None, length: int | None) -> str:
    """A column's type with its bounds, from information_schema (``numeric(38,0)``,
    ``character varying(8)``; an unconstrained ``numeric`` has none)."""
    if data_type == "numeric" and precision is not None:
        return f"numeric({precision},{scale or 0})"
    if data_type in ("character varying", "character") and length is not None:
        return f"{data_type}({length})"
    return data_type


class PostgresUpsertSink(PartitionedWarehouseSink):
    """Upsert into a PostgreSQL table, exactly once, from the executors.

    Args:
        dsn: ``postgresql://user[:password]@host:port/database``; the password may be
            ``env:NAME`` (read where the sink connects) or given as ``password``.
        table: table name (``schema`` selects the schema, default ``public``).
        key: the table's unique key columns.
        password: a password or ``env:NAME`` (not shown anywhere).
        partitions, retry, summary_sql: see
            :class:`~dbt_sink.partitioned.PartitionedWarehouseSink`.
        connect_timeout_s: per connection attempt.
    """

    kind = "postgres"
    config_keys = ("sink.dsn", "sink.table", "sink.password", "sink.partitions")
    location_key = "sink.dsn"
    system = "PostgreSQL"

    def __init__(
        self,
        dsn: str,
        table: str,
        key: Sequence[str],
        *,
        password: str | None = None,
        schema: str = "public",
        partitions: int | None = None,
        executor_writes: bool = True,
        retry: RetryPolicy | None = None,
        summary_sql: str | None = None,
        connect_timeout_s: float = 5.0,
    ) -> None:
        super().__init__(
            table,
            key,
            partitions=partitions,
            executor_writes=executor_writes,
            retry=retry,
            summary_sql=summary_sql,
        )
        parts = urlsplit(dsn)
        if parts.scheme not in ("postgresql", "postgres"):
            raise ConfigError(
                f"PostgreSQL dsn must start with postgresql://, got {mask_text(dsn)!r}"
            )
        self.dsn = dsn
        self.password = password if password is not None else parts.password
        self.schema = schema
        self.connect_timeout_s = connect_timeout_s

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, key: Sequence[str] = (), **kw: Any
    ) -> PostgresUpsertSink:
        """From ``sink.dsn``, ``sink.table``, ``sink.password``, ``sink.partitions``."""
        if not config.get("sink.dsn"):
            raise ConfigError("sink.kind=postgres needs sink.dsn=postgresql://user@host:port/db")
        o = options(config, "password", "partitions")
        return cls(
            config["sink.dsn"],
            config["sink.table"],
            key,
            password=o.get("password"),
            partitions=int(o.get("partitions") or 0) or None,
            **kw,
        )

    @property
    def location(self) -> str:
        return mask_text(self.dsn)

    def describe(self) -> str:
        return (
            f"PostgreSQL {self.location} table {self.schema}.{self.table} (upsert by "
            f"{', '.join(self.key_columns)}; COPY + INSERT ON CONFLICT and the ledger "
            f"{LEDGER_TABLE} in one transaction per partition: exactly-once)"
        )

    def _conninfo(self) -> str:
        parts = urlsplit(self.dsn)
        netloc = parts.hostname or ""
        if parts.port:
            netloc = f"{netloc}:{parts.port}"
        if parts.username:
            netloc = f"{parts.username}@{netloc}"
        return urlunsplit(parts._replace(netloc=netloc))

    def _connect(self) -> Any:
        import psycopg

        return psycopg.connect(
            self._conninfo(),
            password=resolve("password", self.password),
            connect_timeout=max(1, int(self.connect_timeout_s)),
            application_name=f"srt:{self.job}:{self.sink_name}"[:63],
        )

    def transient(self, exc: BaseException) -> bool:
        import psycopg

        # OperationalError: connection refused or lost, server shutting down or starting.
        # SerializationFailure / deadlock: a concurrent writer; the transaction can run again.
        return isinstance(
            exc,
            psycopg.OperationalError
            | psycopg.errors.SerializationFailure
            | psycopg.errors.DeadlockDetected
            | OSError,
        )

    def _run(self, what: str, step: Any) -> Any:
        def attempt() -> Any:
            with self._connect() as con:
                return step(con)

        return self.retry.run(
            attempt, what=f"PostgreSQL {self.location} ({what})", transient=self.transient
        )

    @property
    def _table(self) -> str:
        return f"{_q(self.schema)}.{_q(self.table)}"

    def column_type(self, f: pa.Field) -> str:
        return pg_type(f.type)

    def limits_of(self, types: Mapping[str, str], schema: pa.Schema) -> set[str]:
        """As the base's, and every string column checked for the NUL character, which no
        PostgreSQL string holds (the server refuses the whole batch: "invalid byte sequence
        for encoding UTF8: 0x00")."""
        checked = super().limits_of(types, schema)
        for f in schema:
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
                kind = types.get(f.name, "text")
                self._limits[f.name] = holds_no_nul(self._limits.get(f.name), kind)
        return checked

    # -- driver ---------------------------------------------------------------------------

    def begin_batch(self, batch_id: int, schema: pa.Schema) -> bool:
        want = [Column(f.name, pg_type(f.type)) for f in schema]

        def step(con: Any) -> bool:
            if self.expected_batch is not None:
                # Table and ledger still hold the last batch (a table dropped while the job
                # runs is not silently recreated); rows are counted at start only.
                self._observe_on(con, self.job, self.sink_name, count=False).check_holds(
                    self.job, self.sink_name, self.expected_batch
                )
            self._ensure_ledger(con)
            described = con.execute(
                "SELECT column_name, data_type, numeric_precision, numeric_scale, "
                "character_maximum_length FROM information_schema.columns WHERE "
                "table_schema = %s AND table_name = %s ORDER BY ordinal_position",
                [self.schema, self.table],
            ).fetchall()
            have = [Column(n, t) for n, t, *_ in described]
            checked = self.limits_of({n: _full_type(*rest) for n, *rest in described}, schema)
            if not have:
                cols = ", ".join(
                    f"{_q(c.name)} {c.type}{' NOT NULL' if c.name in self.key_columns else ''}"
                    for c in want
                )
                keys = ", ".join(_q(k) for k in self.key_columns)
                con.execute(
                    f"CREATE TABLE IF NOT EXISTS {self._table} ({cols}, PRIMARY KEY ({keys}))"
                )
            else:
                for c in self.evolve(have, want, checked):
                    con.execute(
                        f"ALTER TABLE {self._table} ADD COLUMN IF NOT EXISTS {_q(c.name)} {c.type}"
                    )
            return (
                con.execute(
                    f"SELECT 1 FROM {_q(self.schema)}.{LEDGER_TABLE} WHERE {JOB} = %s AND "
                    f"{SINK} = %s AND {BATCH_ID} = %s",
                    [self.job, self.sink_name, batch_id],
                ).fetchone()
                is None
            )

        return bool(self._run(f"prepare batch {batch_id}", step))

    def _ensure_ledger(self, con: Any) -> None:
        ledger, parts = f"{_q(self.schema)}.{LEDGER_TABLE}", f"{_q(self.schema)}.{PARTITION_LEDGER}"
        con.execute(
            f"CREATE TABLE IF NOT EXISTS {ledger} ({JOB} text, {SINK} text, {BATCH_ID} bigint, "
            f"{ROWS} bigint, {COMMITTED_AT} timestamptz DEFAULT now(), {TABLE_ROWS} bigint, "
            f"{NOTE} text, PRIMARY KEY ({JOB}, {SINK}, {BATCH_ID}))"
        )
        con.execute(
            f"CREATE TABLE IF NOT EXISTS {parts} ({JOB} text, {SINK} text, {BATCH_ID} bigint, "
            f"partition integer, partitions integer, {ROWS} bigint, {COMMITTED_AT} timestamptz "
            f"DEFAULT now(), new_rows bigint, "
            f"PRIMARY KEY ({JOB}, {SINK}, {BATCH_ID}, partition, partitions))"
        )
        if getattr(self, "_ledger_current", False):
            return
        # Ledgers written before the table's rows were recorded gain the columns (once per
        # run: ALTER takes an exclusive lock even when the column is there).
        for table, column, tp in (
            (ledger, TABLE_ROWS, "bigint"),
            (ledger, NOTE, "text"),
            (parts, "new_rows", "bigint"),
        ):
            con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {tp}")
        self._ledger_current = True

    def _exists(self, con: Any, table: str) -> bool:
        return con.execute("SELECT to_regclass(%s)", [table]).fetchone()[0] is not None

    def _observe_on(self, con: Any, job: str, sink: str, *, count: bool) -> SinkObservation:
        exists = self._exists(con, self._table)
        last = expected = None
        ledger = f"{_q(self.schema)}.{LEDGER_TABLE}"
        if self._exists(con, ledger):
            has_rows = con.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_schema = %s AND "
                "table_name = %s AND column_name = %s",
                [self.schema, LEDGER_TABLE, TABLE_ROWS],
            ).fetchone()
            row = con.execute(
                f"SELECT {BATCH_ID}, {TABLE_ROWS if has_rows else 'NULL'} FROM {ledger} "
                f"WHERE {JOB} = %s AND {SINK} = %s ORDER BY {BATCH_ID} DESC LIMIT 1",
                [job, sink],
            ).fetchone()
            if row:
                last, expected = int(row[0]), None if row[1] is None else int(row[1])
        rows = None
        if exists and count:
            rows = int(con.execute(f"SELECT count(*) FROM {self._table}").fetchone()[0])
        elif exists and expected:  # before each batch: an emptied table, probed by one row
            rows = (
                0
                if con.execute(f"SELECT 1 FROM {self._table} LIMIT 1").fetchone() is None
                else None
            )
        return SinkObservation(
            f"{self.schema}.{self.table}", self.location, exists, last, expected, rows
        )

    def observe(self, job: str, sink: str) -> SinkObservation:
        return self._run(
            "check the table", lambda con: self._observe_on(con, job, sink, count=True)
        )

    def accept(self, job: str, sink: str, batch: int | None, note: str) -> None:
        at = -1 if batch is None else batch

        def step(con: Any) -> None:
            self._ensure_ledger(con)
            ledger = f"{_q(self.schema)}.{LEDGER_TABLE}"
            con.execute(
                f"DELETE FROM {ledger} WHERE {JOB} = %s AND {SINK} = %s AND {BATCH_ID} > %s",
                [job, sink, at],
            )
            rows = (
                con.execute(f"SELECT count(*) FROM {self._table}").fetchone()[0]
                if self._exists(con, self._table)
                else 0
            )
            con.execute(
                f"INSERT INTO {ledger} ({JOB}, {SINK}, {BATCH_ID}, {ROWS}, {TABLE_ROWS}, {NOTE}) "
                f"VALUES (%s, %s, %s, 0, %s, %s) ON CONFLICT ({JOB}, {SINK}, {BATCH_ID}) DO "
                f"UPDATE SET {TABLE_ROWS} = EXCLUDED.{TABLE_ROWS}, {NOTE} = EXCLUDED.{NOTE}",
                [job, sink, at, rows, note],
            )

        self._run("record the acceptance", step)

    def set_aside(self, job: str, sink: str, suffix: str) -> str | None:
        moved = f"{self.table}{suffix}"

        def step(con: Any) -> str | None:
            out = None
            if self._exists(con, self._table):
                con.execute(f"ALTER TABLE {self._table} RENAME TO {_q(moved)}")
                out = f"{self.schema}.{moved}"
            for table in (LEDGER_TABLE, PARTITION_LEDGER):
                if self._exists(con, f"{_q(self.schema)}.{table}"):
                    con.execute(
                        f"DELETE FROM {_q(self.schema)}.{table} WHERE {JOB} = %s AND {SINK} = %s",
                        [job, sink],
                    )
            return out

        return self._run("set the table aside", step)

    def commit_batch(self, batch_id: int, reports: Sequence[PartitionReport]) -> None:
        hook("commit", batch_id)
        rows = sum(r.rows for r in reports)
        ledger, parts = f"{_q(self.schema)}.{LEDGER_TABLE}", f"{_q(self.schema)}.{PARTITION_LEDGER}"

        def step(con: Any) -> None:
            # The table's rows after the batch: the last entry's plus the keys this batch's
            # partitions inserted (counted as they were written), not a count(*) per batch.
            before = con.execute(
                f"SELECT {TABLE_ROWS} FROM {ledger} WHERE {JOB} = %s AND {SINK} = %s AND "
                f"{BATCH_ID} < %s ORDER BY {BATCH_ID} DESC LIMIT 1",
                [self.job, self.sink_name, batch_id],
            ).fetchone()
            if before is not None and before[0] is not None:
                new = con.execute(
                    f"SELECT coalesce(sum(new_rows), 0) FROM {parts} WHERE {JOB} = %s AND "
                    f"{SINK} = %s AND {BATCH_ID} = %s AND partitions = %s",
                    [self.job, self.sink_name, batch_id, len(reports)],
                ).fetchone()[0]
                table_rows = int(before[0]) + int(new)
            else:  # the first batch, or a ledger from before the rows were recorded: once
                table_rows = con.execute(f"SELECT count(*) FROM {self._table}").fetchone()[0]
            con.execute(
                f"INSERT INTO {ledger} ({JOB}, {SINK}, {BATCH_ID}, {ROWS}, {TABLE_ROWS}) "
                f"VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                [self.job, self.sink_name, batch_id, rows, table_rows],
            )
            con.execute(
                f"DELETE FROM {_q(self.schema)}.{PARTITION_LEDGER} WHERE {JOB} = %s AND "
                f"{SINK} = %s AND {BATCH_ID} < %s",
                [self.job, self.sink_name, batch_id],
            )

        self._run(f"commit batch {batch_id}", step)

    def rewind(self, batch_id: int) -> None:
        def step(con: Any) -> None:
            for table in (LEDGER_TABLE, PARTITION_LEDGER):
                exists = con.execute(
                    "SELECT to_regclass(%s)", [f"{_q(self.schema)}.{table}"]
                ).fetchone()[0]
                if exists:
                    con.execute(
                        f"DELETE FROM {_q(self.schema)}.{table} WHERE {JOB} = %s AND "
                        f"{SINK} = %s AND {BATCH_ID} > %s",
                        [self.job, self.sink_name, batch_id],
                    )

        self._run(f"rewind to batch {batch_id}", step)

    # -- executors ------------------------------------------------------------------------

    def write_partition(
        self, rows: pa.Table, batch_id: int, partition: int, partitions: int
    ) -> PartitionReport:
        if rows.num_rows == 0:
            return self.skipped(partition, 0, "empty")
        rows = self.storable(rows, batch_id)
        ident = [self.job, self.sink_name, batch_id, partition, partitions]
        cols = ", ".join(_q(c) for c in rows.column_names)
        keys = ", ".join(_q(k) for k in self.key_columns)
        updates = ", ".join(
            f"{_q(c)} = EXCLUDED.{_q(c)}" for c in rows.column_names if c not in self.key_columns
        )
        action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
        buf = io.BytesIO()
        # Every valid value quoted, nulls bare: PostgreSQL's CSV reads a bare empty as NULL
        # and a quoted one as the empty string.
        pacsv.write_csv(
            rows, buf, pacsv.WriteOptions(include_header=False, quoting_style="all_valid")
        )
        data = buf.getvalue()

        def step(con: Any) -> PartitionReport:
            t0 = time.perf_counter()
            done = con.execute(
                f"SELECT 1 FROM {_q(self.schema)}.{PARTITION_LEDGER} WHERE {JOB} = %s AND "
                f"{SINK} = %s AND {BATCH_ID} = %s AND partition = %s AND partitions = %s",
                ident,
            ).fetchone()
            if done:
                return self.skipped(partition, rows.num_rows, "already written")
            con.execute(
                f"CREATE TEMPORARY TABLE _srt_stage ON COMMIT DROP AS SELECT {cols} "
                f"FROM {self._table} WITH NO DATA"
            )
            with con.cursor().copy(f"COPY _srt_stage ({cols}) FROM STDIN (FORMAT csv)") as cp:
                cp.write(data)
            # How many keys are new to the table (xmax = 0: inserted, not updated), for the
            # ledger's count of the table's rows; one row comes back, not one per row.
            new_rows = con.execute(
                f"WITH up AS (INSERT INTO {self._table} ({cols}) SELECT {cols} FROM _srt_stage "
                f"ON CONFLICT ({keys}) {action} RETURNING (xmax = 0) AS fresh) "
                f"SELECT count(*) FILTER (WHERE fresh) FROM up"
            ).fetchone()[0]
            hook("data", batch_id, partition)
            con.execute(
                f"INSERT INTO {_q(self.schema)}.{PARTITION_LEDGER} ({JOB}, {SINK}, {BATCH_ID}, "
                f"partition, partitions, {ROWS}, new_rows) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                [*ident, rows.num_rows, new_rows],
            )
            con.commit()
            return PartitionReport(
                partition, rows.num_rows, rows.num_rows, (time.perf_counter() - t0) * 1000
            )

        report = self._run(f"batch {batch_id} partition {partition}/{partitions}", step)
        hook("partition", batch_id, partition)
        return report

    def snapshot(self) -> tuple[pa.Table, LedgerEntry | None]:
        """The table and the last batch this sink committed, read in one snapshot
        (REPEATABLE READ); raises LookupError if the table does not exist."""
        import psycopg

        with self._connect() as con:
            con.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            if (
                con.execute(
                    "SELECT to_regclass(%s)", [f"{_q(self.schema)}.{_q(self.table)}"]
                ).fetchone()[0]
                is None
            ):
                raise LookupError(f"table {self.schema}.{self.table} is not in {self.location}")
            last = None
            if (
                con.execute(
                    "SELECT to_regclass(%s)", [f"{_q(self.schema)}.{LEDGER_TABLE}"]
                ).fetchone()[0]
                is not None
            ):
                row = con.execute(
                    f"SELECT {BATCH_ID}, {ROWS}, {COMMITTED_AT} FROM "
                    f"{_q(self.schema)}.{LEDGER_TABLE} WHERE {JOB} = %s AND {SINK} = %s "
                    f"ORDER BY {BATCH_ID} DESC LIMIT 1",
                    [self.job, self.sink_name],
                ).fetchone()
                last = LedgerEntry(int(row[0]), int(row[1] or 0), row[2]) if row else None
            cur = con.execute(f"SELECT * FROM {self._table}")
            names = [d.name for d in cur.description]
            rows = cur.fetchall()
        return pa.Table.from_pylist(
            [dict(zip(names, r, strict=True)) for r in rows]
        ) if rows else pa.table({n: [] for n in names}), last

    def summary(self) -> SinkSummary | None:
        def run(sql: str) -> tuple[list[str], list[tuple]]:
            with self._connect() as con:
                cur = con.execute(sql)
                return [d.name for d in cur.description], cur.fetchall()

        return self.summary_from(run, self._table, self.location)
