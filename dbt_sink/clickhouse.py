"""ClickHouse upsert sink: exactly-once without transactions, written from Spark's executors.

ClickHouse has no multi-statement transaction, so data and ledger cannot commit together.
The design follows ClickHouse's Kafka Connect sink (per-partition state BEFORE/AFTER around
each insert; a replay inserts the identical rows again, and the copies are absorbed):

* The table is ``ReplacingMergeTree(_srt_batch) ORDER BY (key)``: every row carries the batch
  that wrote it, so for a key the row of the latest batch wins, and the replay of a batch
  writes rows identical to the first attempt's (same key, same version, same values).
  Readers use ``FINAL`` (or ``argMax``) to see one row per key before merges have run.
* The ledger ``srt_sink_ledger`` (append-only MergeTree) holds, per ``(job, sink, batch,
  partition, partitions)``, a ``BEFORE`` row when a task starts inserting (rows, chunks) and
  an ``AFTER`` row when every chunk is in; the driver adds ``COMMITTED`` for the batch
  (``partition = -1``, with the table's rows read with ``FINAL``) once every partition
  reported (``ACCEPTED``: an operator's ``srt sink accept``). A task that finds ``AFTER`` writes
  nothing; one that finds only ``BEFORE`` is a replay of an interrupted insert and inserts the
  same chunks again.
* Servers ≥ 22.2: each chunk is inserted with ``insert_deduplication_token =
  job/sink/batch/partition-of-partitions/chunk/digest`` (the digest of the chunk's rows, so
  a batch re-executed after a restore with other rows is not taken for a replay) and the table keeps
  ``non_replicated_deduplication_window`` blocks, so the server drops a replayed chunk: the
  raw table holds no copies. Older servers (Debian's 18.16) have neither; a replayed chunk is
  stored twice until a merge collapses it, and ``FINAL`` reads exactly one row per key.
  ``describe()`` (and so ``srt explain``) says which holds for the server it reached.

URLs: ``clickhouse://user[:password]@host:9000/database`` (native protocol, clickhouse-driver;
the password may be ``env:NAME``), or ``chdb:///path[?database=db]`` (chdb, ClickHouse in this
process: one directory per process, for good, so it is written from the driver).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pyarrow as pa

from dbt_sink.partitioned import (
    Column,
    PartitionedWarehouseSink,
    RetryPolicy,
    hook,
    options,
)
from stateful_runtime.connectors.base import PartitionReport, SinkSummary, WritePlacement
from stateful_runtime.exceptions import ConfigError, SinkError
from stateful_runtime.ledger import (
    BATCH_ID,
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

VERSION_COLUMN = "_srt_batch"
# Rows per INSERT: one block per chunk (well under the server's max_insert_block_size of
# 1,048,576, which would split a block and its token), small enough to stream from a task.
CHUNK_ROWS = 100_000
# Blocks whose tokens the table remembers: a batch writes partitions × chunks blocks (4 × 1 in
# the UPI job) and only the batch in flight can be replayed, so 1,000 covers it many times.
DEDUP_WINDOW = 1000
# First release with insert_deduplication_token (and non_replicated_deduplication_window).
TOKENS_SINCE = (22, 2)
DATETIME64_SINCE = (20, 1)
MUTATION_WAIT_S = 120.0


def _q(name: str) -> str:
    return "`" + name.replace("\\", "\\\\").replace("`", "\\`") + "`"


def _lit(value: Any) -> str:
    """A SQL literal (strings escaped ClickHouse's way; ints as ints)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"literal of {type(value).__name__}")
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def ch_type(t: pa.DataType, version: tuple[int, ...]) -> str:
    """The ClickHouse type of an Arrow type (not Nullable-wrapped)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "String"
    for check, name in (
        (pa.types.is_int64, "Int64"),
        (pa.types.is_int32, "Int32"),
        (pa.types.is_int16, "Int16"),
        (pa.types.is_int8, "Int8"),
        (pa.types.is_uint64, "UInt64"),
        (pa.types.is_uint32, "UInt32"),
        (pa.types.is_float64, "Float64"),
        (pa.types.is_float32, "Float32"),
        (pa.types.is_boolean, "UInt8"),
        (pa.types.is_date32, "Date"),
    ):
        if check(t):
            return name
    if pa.types.is_decimal(t):  # a wide sum's decimal(38,0) among them; as DESCRIBE spells it
        return f"Decimal({t.precision}, {t.scale})"
    if pa.types.is_timestamp(t):
        # Stored in UTC either way; 18.16 has DateTime only (seconds).
        return "DateTime64(6, 'UTC')" if version >= DATETIME64_SINCE else "DateTime('UTC')"
    raise SinkError(
        f"ClickHouse sink: no column type for Arrow type {t}; cast the column in "
        f"the job (string, integer, float, decimal, boolean, timestamp, date)"
    )


def _digest(chunk: pa.Table) -> str:
    """Of the chunk's contents: a batch re-executed after a restore (rewind) has the same id
    but maybe other rows, and must not be taken for a replay of the first execution."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, chunk.schema) as writer:
        writer.write_table(chunk)
    return hashlib.blake2b(sink.getvalue().to_pybytes(), digest_size=8).hexdigest()


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split(".")[:3] if p.isdigit())


class _Native:
    """clickhouse-driver on the native protocol (works with 18.16 and current servers)."""

    def __init__(self, url: str, password: str | None, timeout_s: float) -> None:
        from clickhouse_driver import Client

        # It logs every refused connection with a traceback; the retry policy says it once.
        logging.getLogger("clickhouse_driver.connection").setLevel(logging.ERROR + 10)

        parts = urlsplit(url)
        self.database = (parts.path or "/default").strip("/") or "default"
        self.client = Client(
            host=parts.hostname or "127.0.0.1",
            port=parts.port or 9000,
            user=parts.username or "default",
            password=password or "",
            database=self.database,
            connect_timeout=timeout_s,
            send_receive_timeout=max(timeout_s, 300),
        )

    def query(self, sql: str) -> list[tuple]:
        return self.client.execute(sql)

    def query_with_names(self, sql: str) -> tuple[list[str], list[tuple]]:
        rows, cols = self.client.execute(sql, with_column_types=True)
        return [c[0] for c in cols], rows

    def command(self, sql: str) -> None:
        self.client.execute(sql)

    def insert(self, table: str, rows: pa.Table, token: str | None) -> None:
        cols = ", ".join(_q(c) for c in rows.column_names)
        # The setting goes in the statement: clickhouse-driver silently drops settings it does
        # not know, the server refuses a SETTINGS clause it does not know. No silent pass.
        settings = f" SETTINGS insert_deduplication_token = {_lit(token)}" if token else ""
        self.client.execute(
            f"INSERT INTO {table} ({cols}){settings} VALUES",
            [c.to_pylist() for c in rows.columns],
            columnar=True,
        )

    def close(self) -> None:
        self.client.disconnect()


class _Chdb:
    """chdb (ClickHouse in this process) through clickhouse-connect's ``chdb://`` backend."""

    _clients: dict[str, Any] = {}  # one session per directory per process

    def __init__(self, url: str) -> None:
        import clickhouse_connect

        path = urlsplit(url).path
        self.database = parse_qs(urlsplit(url).query).get("database", ["default"])[0]
        if path not in self._clients:
            self._clients[path] = clickhouse_connect.get_client(dsn=f"chdb://{path}")
        self.client = self._clients[path]
        if self.database != "default":
            self.client.command(f"CREATE DATABASE IF NOT EXISTS {_q(self.database)}")
        self.client.command(f"USE {_q(self.database)}")  # the session is the process's

    def query(self, sql: str) -> list[tuple]:
        return list(self.client.query(sql).result_rows)

    def query_with_names(self, sql: str) -> tuple[list[str], list[tuple]]:
        res = self.client.query(sql)
        return list(res.column_names), list(res.result_rows)

    def command(self, sql: str) -> None:
        self.client.command(sql)

    def insert(self, table: str, rows: pa.Table, token: str | None) -> None:
        settings = {"insert_deduplication_token": token} if token else None
        self.client.insert_arrow(table.replace("`", ""), rows, settings=settings)

    def close(self) -> None:
        pass  # the session lives as long as the process (a second open would be refused)


class ClickHouseUpsertSink(PartitionedWarehouseSink):
    """Upsert into a ClickHouse ``ReplacingMergeTree`` table, exactly once (read with FINAL).

    Args:
        url: ``clickhouse://user[:password]@host:port/database`` (native protocol) or
            ``chdb:///directory``.
        table: table name.
        key: the table's unique key columns (its ``ORDER BY``).
        password: password or ``env:NAME`` (overrides the URL's; never shown).
        partitions, retry, summary_sql: see
            :class:`~dbt_sink.partitioned.PartitionedWarehouseSink`.
        connect_timeout_s: per connection attempt.
    """

    kind = "clickhouse"
    config_keys = ("sink.url", "sink.table", "sink.password", "sink.partitions")
    location_key = "sink.url"
    system = "ClickHouse"

    def __init__(
        self,
        url: str,
        table: str,
        key: Sequence[str],
        *,
        password: str | None = None,
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
        scheme = urlsplit(url).scheme
        if scheme not in ("clickhouse", "chdb"):
            raise ConfigError(
                f"ClickHouse url must be clickhouse://user@host:port/database or "
                f"chdb:///path, got {mask_text(url)!r}"
            )
        self.url = url
        self.password = password if password is not None else urlsplit(url).password
        self.connect_timeout_s = connect_timeout_s
        self.server_version: tuple[int, ...] | None = None
        self.tokens: bool | None = None

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, key: Sequence[str] = (), **kw: Any
    ) -> ClickHouseUpsertSink:
        """From ``sink.url``, ``sink.table``, ``sink.password``, ``sink.partitions``."""
        if not config.get("sink.url"):
            raise ConfigError(
                "sink.kind=clickhouse needs sink.url=clickhouse://user@host:port/database"
            )
        o = options(config, "password", "partitions")
        return cls(
            config["sink.url"],
            config["sink.table"],
            key,
            password=o.get("password"),
            partitions=int(o.get("partitions") or 0) or None,
            **kw,
        )

    @property
    def in_process(self) -> bool:
        return self.url.startswith("chdb:")

    @property
    def location(self) -> str:
        return mask_text(self.url)

    def write_placement(self) -> WritePlacement:
        if self.in_process:
            return WritePlacement("driver", "chdb keeps its directory open in one process only")
        return super().write_placement()

    def _client(self) -> _Native | _Chdb:
        if self.in_process:
            return _Chdb(self.url)
        return _Native(self.url, resolve("password", self.password), self.connect_timeout_s)

    def transient(self, exc: BaseException) -> bool:
        from clickhouse_driver import errors

        if isinstance(
            exc,
            errors.NetworkError
            | errors.SocketTimeoutError
            | EOFError
            | ConnectionError
            | TimeoutError
            | OSError,
        ):
            return True
        # 202 TOO_MANY_SIMULTANEOUS_QUERIES, 252 TOO_MANY_PARTS, 209 SOCKET_TIMEOUT,
        # 210 NETWORK_ERROR, 241 MEMORY_LIMIT_EXCEEDED: the server asks to come back later.
        return getattr(exc, "code", None) in (202, 209, 210, 241, 252)

    def _run(self, what: str, step: Any) -> Any:
        def attempt() -> Any:
            client = self._client()
            try:
                return step(client)
            finally:
                client.close()

        return self.retry.run(
            attempt, what=f"ClickHouse {self.location} ({what})", transient=self.transient
        )

    def _detect(self, client: _Native | _Chdb) -> None:
        version = parse_version(client.query("SELECT version()")[0][0])
        # Checked by name, not by version alone: a setting the server lacks would be refused.
        known = client.query(
            "SELECT count() FROM system.settings WHERE name = 'insert_deduplication_token'"
        )[0][0]
        self.server_version = version
        self.tokens = bool(known) and version >= TOKENS_SINCE

    def guarantee(self) -> str:
        if self.tokens is None:
            try:  # one try: explain must not wait out the retry policy of a dead server
                client = self._client()
                try:
                    self._detect(client)
                finally:
                    client.close()
            except Exception:  # noqa: BLE001 - unreachable, refused, not ClickHouse...
                return (
                    "server not reachable now: exactly-once either way; with a server "
                    "≥ 22.2 replayed chunks are dropped by insert tokens, older servers "
                    "keep them until merges and FINAL reads one row per key"
                )
        v = ".".join(map(str, self.server_version or ()))
        if self.tokens:
            return (
                f"server {v}: exactly-once; replayed chunks dropped by "
                f"insert_deduplication_token (window {DEDUP_WINDOW} blocks); read with FINAL "
                f"until merges collapse superseded versions"
            )
        return (
            f"server {v} has no insert_deduplication_token: exactly-once as read with "
            f"FINAL (one row per key, the latest batch's); a replayed chunk's copies stay "
            f"in the raw table until a merge"
        )

    def describe(self) -> str:
        return (
            f"ClickHouse {self.location} table {self.table} (ReplacingMergeTree("
            f"{VERSION_COLUMN}) ORDER BY {', '.join(self.key_columns)}; ledger "
            f"{LEDGER_TABLE} BEFORE/AFTER per partition; {self.guarantee()})"
        )

    @property
    def _table(self) -> str:
        return _q(self.table)

    # -- driver ---------------------------------------------------------------------------

    def begin_batch(self, batch_id: int, schema: pa.Schema) -> bool:
        def step(c: _Native | _Chdb) -> bool:
            self._detect(c)
            assert self.server_version is not None
            if self.expected_batch is not None:
                # Table and ledger still hold the last batch (a table dropped while the job
                # runs is not silently recreated), and its rows: counted before the batch, as
                # the commit counts them after it (a count after would hide rows deleted
                # behind new ones). 65 ms a count at 1M rows: NOTES.md.
                self._observe_on(c, self.job, self.sink_name, count=True).check_holds(
                    self.job, self.sink_name, self.expected_batch
                )
            self._ensure_ledger(c)
            want = [Column(f.name, self._column_type(f)) for f in schema]
            exists = c.query(
                f"SELECT count() FROM system.tables WHERE database = "
                f"{_lit(c.database)} AND name = {_lit(self.table)}"
            )[0][0]
            have = (
                [Column(r[0], r[1]) for r in c.query(f"DESCRIBE TABLE {self._table}")]
                if exists
                else []
            )
            window = (
                f" SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
                if self.tokens
                else ""
            )
            if not have:
                self.limits_of({x.name: x.type for x in want}, schema)  # its time columns'
                cols = ", ".join(f"{_q(x.name)} {x.type}" for x in want)
                keys = ", ".join(_q(k) for k in self.key_columns)
                c.command(
                    f"CREATE TABLE IF NOT EXISTS {self._table} ({cols}, "
                    f"{VERSION_COLUMN} UInt64) ENGINE = ReplacingMergeTree("
                    f"{VERSION_COLUMN}) ORDER BY ({keys}){window}"
                )
            else:
                kept = [h for h in have if h.name != VERSION_COLUMN]
                checked = self.limits_of({h.name: h.type for h in kept}, schema)
                for x in self.evolve(kept, want, checked):
                    c.command(f"ALTER TABLE {self._table} ADD COLUMN {_q(x.name)} {x.type}")
                if self.tokens:  # a table created by an older server: remember tokens now
                    c.command(
                        f"ALTER TABLE {self._table} MODIFY SETTING "
                        f"non_replicated_deduplication_window = {DEDUP_WINDOW}"
                    )
            return not self._committed(c, batch_id)

        return bool(self._run(f"prepare batch {batch_id}", step))

    def _ensure_ledger(self, c: _Native | _Chdb) -> None:
        c.command(
            f"CREATE TABLE IF NOT EXISTS {LEDGER_TABLE} ({JOB} String, {SINK} String, "
            f"{BATCH_ID} Int64, partition Int32, partitions Int32, state String, {ROWS} "
            f"Int64, chunks Int32, at DateTime, seq UInt64, {TABLE_ROWS} Nullable(Int64), "
            f"{NOTE} String) ENGINE = MergeTree ORDER BY ({JOB}, {SINK}, {BATCH_ID}, partition)"
        )
        if getattr(self, "_ledger_current", False):
            return
        have = {r[0] for r in c.query(f"DESCRIBE TABLE {LEDGER_TABLE}")}
        # A ledger written before the table's rows were recorded gains the columns.
        for column, tp in ((TABLE_ROWS, "Nullable(Int64)"), (NOTE, "String")):
            if column not in have:
                c.command(f"ALTER TABLE {LEDGER_TABLE} ADD COLUMN {column} {tp}")
        self._ledger_current = True

    def _tables(self, c: _Native | _Chdb) -> set[str]:
        return {
            r[0]
            for r in c.query(
                f"SELECT name FROM system.tables WHERE database = {_lit(c.database)} "
                f"AND name IN ({_lit(self.table)}, {_lit(LEDGER_TABLE)})"
            )
        }

    def _count(self, c: _Native | _Chdb) -> int:
        # FINAL: one row per key whatever merges have done (raw copies of replayed chunks on
        # servers without tokens would count twice).
        return int(c.query(f"SELECT count() FROM {self._table} FINAL")[0][0])

    def _observe_on(
        self, c: _Native | _Chdb, job: str, sink: str, *, count: bool = True
    ) -> SinkObservation:
        tables = self._tables(c)
        exists = self.table in tables
        last = expected = None
        if LEDGER_TABLE in tables:
            recorded = (
                TABLE_ROWS
                if TABLE_ROWS in {r[0] for r in c.query(f"DESCRIBE TABLE {LEDGER_TABLE}")}
                else "NULL"
            )
            rows = c.query(
                f"SELECT {BATCH_ID}, {recorded} FROM {LEDGER_TABLE} WHERE {JOB} = {_lit(job)} "
                f"AND {SINK} = {_lit(sink)} AND partition = -1 AND state IN ('COMMITTED', "
                f"'ACCEPTED', 'REWOUND') ORDER BY {BATCH_ID} DESC, seq DESC LIMIT 1"
            )
            if rows:
                last = int(rows[0][0])
                expected = None if rows[0][1] is None else int(rows[0][1])
        now = self._count(c) if exists and count else None
        return SinkObservation(self.table, self.location, exists, last, expected, now)

    def observe(self, job: str, sink: str) -> SinkObservation:
        return self._run("check the table", lambda c: self._observe_on(c, job, sink, count=True))

    def _wait_mutations(self, c: _Native | _Chdb) -> None:
        deadline = time.monotonic() + MUTATION_WAIT_S
        while c.query(
            f"SELECT count() FROM system.mutations WHERE database = "
            f"{_lit(c.database)} AND is_done = 0"
        )[0][0]:
            if time.monotonic() > deadline:
                raise SinkError(
                    f"ClickHouse: mutations on {self.table} not done "
                    f"after {MUTATION_WAIT_S:.0f} s; see system.mutations"
                )
            time.sleep(0.05)  # poll interval of the mutation's progress

    def accept(self, job: str, sink: str, batch: int | None, note: str) -> None:
        at = -1 if batch is None else batch

        def step(c: _Native | _Chdb) -> None:
            self._ensure_ledger(c)
            c.command(
                f"ALTER TABLE {LEDGER_TABLE} DELETE WHERE {JOB} = {_lit(job)} AND "
                f"{SINK} = {_lit(sink)} AND {BATCH_ID} > {_lit(at)}"
            )
            self._wait_mutations(c)
            rows = self._count(c) if self.table in self._tables(c) else 0
            c.command(
                f"INSERT INTO {LEDGER_TABLE} ({JOB}, {SINK}, {BATCH_ID}, partition, partitions, "
                f"state, {ROWS}, chunks, at, seq, {TABLE_ROWS}, {NOTE}) SELECT {_lit(job)}, "
                f"{_lit(sink)}, {_lit(at)}, -1, 0, 'ACCEPTED', 0, 0, now(), "
                f"{_lit(time.time_ns())}, {_lit(rows)}, {_lit(note)}"
            )

        self._run("record the acceptance", step)

    def set_aside(self, job: str, sink: str, suffix: str) -> str | None:
        moved = f"{self.table}{suffix}"

        def step(c: _Native | _Chdb) -> str | None:
            tables = self._tables(c)
            out = None
            if self.table in tables:
                c.command(f"RENAME TABLE {self._table} TO {_q(moved)}")
                out = moved
            if LEDGER_TABLE in tables:
                c.command(
                    f"ALTER TABLE {LEDGER_TABLE} DELETE WHERE {JOB} = {_lit(job)} AND "
                    f"{SINK} = {_lit(sink)}"
                )
                self._wait_mutations(c)
            return out

        return self._run("set the table aside", step)

    def column_type(self, f: pa.Field) -> str:
        return ch_type(f.type, self.server_version or DATETIME64_SINCE)

    def _column_type(self, f: pa.Field) -> str:
        assert self.server_version is not None
        t = ch_type(f.type, self.server_version)
        return t if f.name in self.key_columns else f"Nullable({t})"

    def _where(self, batch_id: int) -> str:
        return (
            f"{JOB} = {_lit(self.job)} AND {SINK} = {_lit(self.sink_name)} AND {BATCH_ID} = "
            f"{_lit(batch_id)}"
        )

    def _committed(self, c: _Native | _Chdb, batch_id: int) -> bool:
        return bool(
            c.query(
                f"SELECT count() FROM {LEDGER_TABLE} WHERE {self._where(batch_id)} "
                f"AND partition = -1 AND state = 'COMMITTED'"
            )[0][0]
        )

    def _ledger(
        self,
        c: _Native | _Chdb,
        batch_id: int,
        partition: int,
        partitions: int,
        state: str,
        rows: int,
        chunks: int,
        *,
        table_rows: int | None = None,
    ) -> None:
        recorded = "NULL" if table_rows is None else _lit(table_rows)
        c.command(
            f"INSERT INTO {LEDGER_TABLE} ({JOB}, {SINK}, {BATCH_ID}, partition, partitions, "
            f"state, {ROWS}, chunks, at, seq, {TABLE_ROWS}) SELECT {_lit(self.job)}, "
            f"{_lit(self.sink_name)}, {_lit(batch_id)}, {_lit(partition)}, {_lit(partitions)}, "
            f"{_lit(state)}, {_lit(rows)}, {_lit(chunks)}, now(), {_lit(time.time_ns())}, "
            f"{recorded}"
        )

    def commit_batch(self, batch_id: int, reports: Sequence[PartitionReport]) -> None:
        hook("commit", batch_id)
        rows = sum(r.rows for r in reports)

        def step(c: _Native | _Chdb) -> None:
            if not self._committed(c, batch_id):
                # The table's rows after the batch (FINAL: one per key), for the next start's
                # check; measured in NOTES.md ("Sink tables checked against the checkpoint").
                self._ledger(
                    c, batch_id, -1, len(reports), "COMMITTED", rows, 0, table_rows=self._count(c)
                )

        self._run(f"commit batch {batch_id}", step)

    def rewind(self, batch_id: int) -> None:
        """Delete the rows and ledger entries of batches after ``batch_id`` (mutations, waited
        for): their re-execution must not lose against their old, higher versions."""

        def step(c: _Native | _Chdb) -> None:
            tables = {
                r[0]
                for r in c.query(
                    f"SELECT name FROM system.tables WHERE database = {_lit(c.database)} "
                    f"AND name IN "
                    f"({_lit(self.table)}, {_lit(LEDGER_TABLE)})"
                )
            }
            if self.table in tables:
                c.command(
                    f"ALTER TABLE {self._table} DELETE WHERE {VERSION_COLUMN} > {_lit(batch_id)}"
                )
            if LEDGER_TABLE in tables:
                c.command(
                    f"ALTER TABLE {LEDGER_TABLE} DELETE WHERE {JOB} = {_lit(self.job)} AND "
                    f"{SINK} = {_lit(self.sink_name)} AND {BATCH_ID} > {_lit(batch_id)}"
                )
            self._wait_mutations(c)
            if self.table in tables and LEDGER_TABLE in tables:
                # A key whose older versions merges collapsed is gone with its later version:
                # the table's rows now are the baseline the next batch is checked against.
                self._ensure_ledger(c)
                self._ledger(c, batch_id, -1, 0, "REWOUND", 0, 0, table_rows=self._count(c))

        self._run(f"rewind to batch {batch_id}", step)

    # -- executors ------------------------------------------------------------------------

    def write_partition(
        self, rows: pa.Table, batch_id: int, partition: int, partitions: int
    ) -> PartitionReport:
        if rows.num_rows == 0:
            return self.skipped(partition, 0, "empty")
        rows = self.storable(rows, batch_id)
        versioned = rows.append_column(
            VERSION_COLUMN, pa.array([batch_id] * rows.num_rows, pa.uint64())
        )
        chunks = [versioned.slice(i, CHUNK_ROWS) for i in range(0, rows.num_rows, CHUNK_ROWS)]

        def step(c: _Native | _Chdb) -> PartitionReport:
            t0 = time.perf_counter()
            states = {
                r[0]
                for r in c.query(
                    f"SELECT state FROM {LEDGER_TABLE} WHERE {self._where(batch_id)} AND "
                    f"partition = {_lit(partition)} AND partitions = {_lit(partitions)}"
                )
            }
            if "AFTER" in states:
                return self.skipped(partition, rows.num_rows, "already written")
            note = "replay of an interrupted insert" if "BEFORE" in states else ""
            self._ledger(c, batch_id, partition, partitions, "BEFORE", rows.num_rows, len(chunks))
            for i, chunk in enumerate(chunks):
                c.insert(self._table, chunk, self.token(batch_id, partition, partitions, i, chunk))
            hook("data", batch_id, partition)
            self._ledger(c, batch_id, partition, partitions, "AFTER", rows.num_rows, len(chunks))
            return PartitionReport(
                partition, rows.num_rows, rows.num_rows, (time.perf_counter() - t0) * 1000, note
            )

        report = self._run(f"batch {batch_id} partition {partition}/{partitions}", step)
        hook("partition", batch_id, partition)
        return report

    def token(
        self, batch_id: int, partition: int, partitions: int, chunk_no: int, chunk: pa.Table
    ) -> str | None:
        """The chunk's insert_deduplication_token (None where the server has none)."""
        if not self.tokens:
            return None
        return (
            f"{self.job}/{self.sink_name}/{batch_id}/{partition}-of-{partitions}/"
            f"{chunk_no}/{_digest(chunk)}"
        )

    def committed_batches(self) -> list[tuple[int, int]]:
        """``(batch_id, rows)`` of every committed batch of this sink, newest first."""

        def step(c: _Native | _Chdb) -> list[tuple[int, int]]:
            return [
                (int(b), int(r))
                for b, r in c.query(
                    f"SELECT {BATCH_ID}, max({ROWS}) FROM {LEDGER_TABLE} WHERE {JOB} = "
                    f"{_lit(self.job)} AND {SINK} = {_lit(self.sink_name)} AND partition = -1 "
                    f"AND state = 'COMMITTED' GROUP BY {BATCH_ID} ORDER BY {BATCH_ID} DESC"
                )
            ]

        return self._run("read the ledger", step)

    def snapshot(self) -> tuple[pa.Table, LedgerEntry | None]:
        """The table read with FINAL (one row per key, without the version column) and the
        last batch this sink committed. ClickHouse has no snapshots: the ledger is read first,
        so the table is at least as new as that batch (windows closed by its watermark cannot
        change after it). Raises LookupError if the table does not exist."""

        def step(c: _Native | _Chdb) -> tuple[pa.Table, LedgerEntry | None]:
            have = {
                r[0]
                for r in c.query(
                    f"SELECT name FROM system.tables WHERE database = {_lit(c.database)} "
                    f"AND name IN "
                    f"({_lit(self.table)}, {_lit(LEDGER_TABLE)})"
                )
            }
            if self.table not in have:
                raise LookupError(f"table {self.table} is not in {self.location}")
            last = None
            if LEDGER_TABLE in have:
                rows = c.query(
                    f"SELECT {BATCH_ID}, max({ROWS}), max(at) FROM {LEDGER_TABLE} WHERE {JOB} = "
                    f"{_lit(self.job)} AND {SINK} = {_lit(self.sink_name)} AND partition = -1 "
                    f"AND state = 'COMMITTED' GROUP BY {BATCH_ID} ORDER BY {BATCH_ID} DESC "
                    f"LIMIT 1"
                )
                if rows:
                    last = LedgerEntry(int(rows[0][0]), int(rows[0][1]), rows[0][2])
            names, rows = c.query_with_names(f"SELECT * FROM {self._table} FINAL")
            keep = [i for i, n in enumerate(names) if n != VERSION_COLUMN]
            table = pa.table({names[i]: [r[i] for r in rows] for i in keep})
            return table, last

        return self._run("read the table", step)

    def summary(self) -> SinkSummary | None:
        def run(sql: str) -> tuple[list[str], list[tuple]]:
            c = self._client()
            try:
                return c.query_with_names(sql)
            finally:
                c.close()

        return self.summary_from(run, f"{self._table} FINAL", self.location)
