"""What the executor-written warehouse sinks share (PostgreSQL, ClickHouse, Delta Lake).

* :class:`PartitionedWarehouseSink` — the write protocol of
  :class:`~stateful_runtime.connectors.base.PartitionedSink` for a table upserted by key:
  validated, quoted names; schema evolution (new nullable columns added, a removed or retyped
  column refused with what to do); retries with backoff; no connection in the pickled state.
* :class:`RetryPolicy` — a warehouse that is down or refusing: each step is retried with
  exponential backoff, then the batch fails with a message naming the warehouse (Spark replays
  the batch when the job runs again: nothing lost, nothing doubled).
* :func:`hook` — the test hook that blocks a sink between two steps so a test can kill -9 it
  there (``SRT_TEST_SINK_HOOK=<dir>``, ``SRT_TEST_SINK_HOOK_AT=<point>[,<point>...]``).
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from dbt_sink.limits import limit_of, reasons, storable, takes
from stateful_runtime.connectors.base import (
    PartitionedSink,
    PartitionReport,
    SinkSummary,
    WritePlacement,
)
from stateful_runtime.exceptions import ConfigError, SinkError

T = TypeVar("T")

HOOK_DIR = "SRT_TEST_SINK_HOOK"
HOOK_AT = "SRT_TEST_SINK_HOOK_AT"
# Where a sink can be held for a test's kill -9:
#   data       after the partition's rows reached the warehouse, before its ledger entry
#   partition  after a partition is fully written (ledger too), before the task reports
#   commit     on the driver, after every partition reported, before the batch's ledger commit
HOOK_POINTS = ("data", "partition", "commit")

# Plain SQL identifiers only: every warehouse takes them unquoted or quoted alike, and none
# needs escaping. 63 = PostgreSQL's limit (NAMEDATALEN - 1), the smallest of the three.
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")


def check_identifier(name: str, what: str) -> str:
    """``name`` if it is a plain identifier (letters, digits, ``_``; 1–63; not starting with a
    digit), else a :class:`ConfigError` naming the fix."""
    if not isinstance(name, str) or not _IDENT.fullmatch(name):
        raise ConfigError(
            f"{what} {name!r} is not a plain SQL identifier: use 1-63 ASCII letters, digits "
            f"or '_', not starting with a digit (rename it, e.g. in the job's output schema "
            f"or sink.table)"
        )
    if name.startswith("_srt") or name.startswith("__srt"):
        raise ConfigError(f"{what} {name!r}: names starting with _srt are the sink's own")
    return name


@dataclass(frozen=True)
class RetryPolicy:
    """How long a sink keeps trying a warehouse that is down or refusing connections.

    Attributes:
        attempts: tries per step (connect + write of one partition, one ledger commit).
        initial_backoff_s: wait after the first failure; doubled after each further one.
        max_backoff_s: cap of one wait.

    The default (8 tries, 0.5 s doubling to 8 s) keeps trying for ~30 s, long enough for a
    warehouse restart, short enough that a dead warehouse fails the batch within a minute.
    """

    attempts: int = 8
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 8.0

    def __post_init__(self) -> None:
        if self.attempts < 1 or self.initial_backoff_s < 0 or self.max_backoff_s < 0:
            raise ConfigError("RetryPolicy: attempts >= 1 and non-negative backoffs")

    def run(
        self, step: Callable[[], T], *, what: str, transient: Callable[[BaseException], bool]
    ) -> T:
        """Run ``step``; retry it after a transient error with backoff; a permanent error, or
        the last transient one, becomes a :class:`SinkError` saying what happens next."""
        delay = self.initial_backoff_s
        first = time.monotonic()
        for attempt in range(1, self.attempts + 1):
            try:
                return step()
            except SinkError:
                raise
            except Exception as exc:
                if not transient(exc):
                    raise SinkError(
                        f"{what} failed: {_one_line(exc)}. The batch was not "
                        f"committed; Spark replays it when the job runs again"
                    ) from exc
                if attempt == self.attempts:
                    raise SinkError(
                        f"{what} failed {attempt} times over "
                        f"{time.monotonic() - first:.0f} s: {_one_line(exc)}. Is the "
                        f"warehouse up and reachable? The batch was not committed; Spark "
                        f"replays it when the job runs again (`srt run`, or the Dagster "
                        f"sensor's restart): nothing is lost or written twice"
                    ) from exc
                time.sleep(delay)  # backoff before the next try, not a synchronisation
                delay = min(delay * 2, self.max_backoff_s)
        raise AssertionError("unreachable")


def _one_line(exc: BaseException) -> str:
    # ClickHouse appends the server's C++ stack trace to its messages: not for people.
    text = " ".join(str(exc).split("Stack trace:")[0].split())
    return f"{type(exc).__name__}: {text[:300]}"


def hook(point: str, batch_id: int, partition: int = -1) -> None:
    """Test hook: if ``point`` is in ``$SRT_TEST_SINK_HOOK_AT``, touch
    ``$SRT_TEST_SINK_HOOK/<point>-<batch>-<partition>`` and block (the test kills the job)."""
    where = os.environ.get(HOOK_DIR)
    if not where or point not in os.environ.get(HOOK_AT, "").split(","):
        return
    Path(where).mkdir(parents=True, exist_ok=True)
    (Path(where) / f"{point}-{batch_id}-{partition}").touch()
    threading.Event().wait(600)  # the test kills the job here


@dataclass(frozen=True)
class Column:
    """A column as the sink compares schemas: name and the warehouse's type name."""

    name: str
    type: str


class PartitionedWarehouseSink(PartitionedSink):
    """A table upserted by ``key``, written by the executor protocol
    (:class:`~stateful_runtime.connectors.base.PartitionedSink`).

    Args:
        table: table name (a plain identifier).
        key: the table's unique key columns.
        partitions: output partitions per batch (None: the job's parallelism).
        executor_writes: False writes every batch from the driver (collected there), as one
            partition: for small outputs, or to compare (benchmarks/warehouse_sinks.py).
        retry: how long to keep trying a warehouse that is down (:class:`RetryPolicy`).
        summary_sql: query printed at the end of a run; ``{table}`` is replaced by the
            quoted table (ClickHouse: with ``FINAL``).
    """

    upsert = True
    # The warehouse's name in messages.
    system = "warehouse"

    def __init__(
        self,
        table: str,
        key: Sequence[str],
        *,
        partitions: int | None = None,
        executor_writes: bool = True,
        retry: RetryPolicy | None = None,
        summary_sql: str | None = None,
    ) -> None:
        if not key:
            raise ConfigError(f"upsert sink for {table!r} needs the table's unique key columns")
        if partitions is not None and partitions < 1:
            raise ConfigError(f"partitions must be >= 1, got {partitions}")
        self.table = check_identifier(table, "table name")
        self.key_columns = tuple(check_identifier(k, "key column") for k in key)
        self.partitions = partitions
        self.executor_writes = executor_writes
        self.retry = retry or RetryPolicy()
        self.summary_sql = summary_sql
        self.job = ""
        self.sink_name = ""

    def default_name(self) -> str:
        return f"upsert-{self.table}"

    def write_placement(self) -> WritePlacement:
        if not self.executor_writes:
            return WritePlacement(
                "driver",
                "executor_writes=False: the job process collects each "
                "batch and writes it as one partition",
            )
        return super().write_placement()

    def open(self, job: str, query: str) -> None:
        self.job, self.sink_name = job, query

    def __getstate__(self) -> dict[str, Any]:
        # Connections and clients stay on the process that opened them; a task opens its own.
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_conn")}

    def check_schema(self, schema: pa.Schema) -> None:
        missing = [k for k in self.key_columns if k not in schema.names]
        if missing:
            raise SinkError(
                f"table {self.table!r}: key column(s) {missing} are not in the stream's output "
                f"columns {schema.names}; set key= to output columns"
            )
        for name in schema.names:
            check_identifier(name, f"output column of table {self.table!r}")

    # Transient = worth retrying (connection refused or lost, server starting, timeouts).
    def transient(self, exc: BaseException) -> bool:
        return isinstance(exc, ConnectionError | TimeoutError | OSError)

    def evolve(
        self, have: Sequence[Column], want: Sequence[Column], checked: Collection[str] = ()
    ) -> list[Column]:
        """Columns to add so the table takes ``want``; refuses a removed or retyped column,
        but for those in ``checked``: narrower than the job's, each row is checked against
        them before it is written (:mod:`dbt_sink.limits`)."""
        have_by = {c.name: c.type for c in have}
        want_by = {c.name: c.type for c in want}
        gone = [n for n in have_by if n not in want_by and not n.startswith("_srt")]
        retyped = [
            f"{n} {have_by[n]} -> {t}"
            for n, t in want_by.items()
            if n in have_by and have_by[n] != t and n not in checked
        ]
        if gone or retyped:
            what = []
            if gone:
                what.append(f"no longer writes {gone}")
            if retyped:
                what.append(f"changes the type of {retyped}")
            raise SinkError(
                f"{self.system} table {self.table}: the job {' and '.join(what)}. Only new "
                f"(nullable) columns are added by the sink; migrate the table yourself (ALTER "
                f"TABLE, or copy it to a new table) or write to a new sink.table"
            )
        return [c for c in want if c.name not in have_by]

    def limits_of(self, types: Mapping[str, str], schema: pa.Schema) -> set[str]:
        """Keep the limits of the table's columns (``types``: name → the warehouse's full type)
        for the executors' row check; the columns narrower than the job's ``schema`` that the
        check lets the table keep."""
        self._limits = {n: lim for n, t in types.items() if (lim := limit_of(t)) is not None}
        return {
            n
            for n, lim in self._limits.items()
            if n in schema.names and takes(lim, schema.field(n).type)
        }

    def unstorable(self, rows: pa.Table) -> list[tuple[int, str]]:
        """The rows the table cannot store, by the limits :meth:`begin_batch` read (on the
        driver, shipped to the tasks with the sink)."""
        return reasons(rows, getattr(self, "_limits", {}), f"{self.system} table {self.table}")

    def storable(self, rows: pa.Table, batch_id: int) -> pa.Table:
        """``rows`` if the table can take every value (else :func:`dbt_sink.limits.storable`'s
        error naming each row that does not fit)."""
        return storable(
            rows,
            getattr(self, "_limits", {}),
            self.key_columns,
            table=f"{self.system} table {self.table}",  # "PostgreSQL table t"
            batch_id=batch_id,
            widen={f.name: self.column_type(f) for f in rows.schema},
        )

    def column_type(self, f: pa.Field) -> str:
        """The type the sink creates column ``f`` with."""
        return str(f.type)

    def skipped(self, partition: int, rows: int, note: str) -> PartitionReport:
        return PartitionReport(partition, rows, 0, 0.0, note)

    def summary_query(self, table_sql: str) -> str:
        return (self.summary_sql or "SELECT * FROM {table} LIMIT 10").format(table=table_sql)

    def summary_from(
        self, run: Callable[[str], tuple[list[str], list[tuple]]], table_sql: str, where: str
    ) -> SinkSummary:
        try:
            cols, rows = run(self.summary_query(table_sql))
            _, total = run(f"SELECT count(*) FROM {table_sql}")
        except Exception as exc:  # the table may not exist yet
            return SinkSummary(
                f"{self.table} in {where}: nothing to show ({_one_line(exc)})", [], []
            )
        return SinkSummary(f"{self.table} in {where} ({total[0][0]} rows)", cols, rows)


def options(config: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The ``sink.<name>`` keys present (and non-empty) in a job file's config."""
    return {n: config[f"sink.{n}"] for n in names if config.get(f"sink.{n}") not in (None, "")}
