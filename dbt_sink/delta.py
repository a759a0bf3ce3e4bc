"""Delta Lake upsert sink (``deltalake``, delta-rs), on a local path or S3.

Per micro-batch ``N``: one ``MERGE`` by key (update matched, insert the rest) whose commit also
carries the app transaction ``(srt:<job>:<sink>, N)`` (Delta's ``txn`` action: Spark's
``txnAppId``/``txnVersion``). Data and ledger are one atomic Delta commit, so the batch is in
the table or not at all; a replayed batch finds ``transaction_version(app) >= N`` and writes
nothing.

Written from the driver: a Delta table's log takes one commit at a time and a merge rewrites
the files holding its keys, so one merge commit per task would conflict with its siblings
(optimistic concurrency) — the batch's rows are computed on the executors and merged once.

S3 (``s3://bucket/prefix``): credentials, region and endpoint as boto3 reads them
(``AWS_*``; ``SRT_S3_ENDPOINT_URL`` overrides the endpoint); commits use S3 conditional
writes (``conditional_put=etag``), so two writers cannot both create the same log entry.

Readers: anything that reads Delta (delta-rs, DuckDB through ``DeltaTable.to_pyarrow_dataset``,
Spark with the Delta jars); without them, Spark can read the current snapshot's Parquet files
(``DeltaTable.file_uris()``; this sink writes no deletion vectors).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from dbt_sink.partitioned import Column, PartitionedWarehouseSink, RetryPolicy, hook
from stateful_runtime.connectors.base import PartitionReport, SinkSummary, WritePlacement
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.ledger import LedgerEntry, SinkObservation

# Commits of this sink carry its app id in their commit info (custom metadata), so the start
# check finds the newest one and counts the table's rows as of that version.
APP_KEY = "srt.app"
# Commits scanned back for it: one per batch, so the newest is among the last few unless
# other writers committed this many times since.
HISTORY_SCAN = 1000

# Failures worth another try: the store unreachable or throttling, or another writer's commit
# got in first (the merge is re-planned on the new version).
_TRANSIENT = re.compile(
    r"connect|timed? ?out|error sending request|dns|broken pipe|reset by "
    r"peer|unavailable|slow ?down|throttl|\b50[0-9]\b|concurrent|commit "
    r"failed|version already exists",
    re.IGNORECASE,
)


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


class DeltaUpsertSink(PartitionedWarehouseSink):
    """Merge each micro-batch into a Delta table by key, exactly once (app transactions).

    Args:
        path: table location: a directory or ``s3://bucket/prefix``.
        table: the table's name (shown in summaries and Dagster; the data lives at ``path``).
        key: the table's unique key columns (the merge predicate).
        storage_options: extra delta-rs object-store options (secrets are never shown).
        retry, summary_sql: see :class:`~dbt_sink.partitioned.PartitionedWarehouseSink`.
    """

    kind = "delta"
    config_keys = ("sink.path", "sink.table")
    location_key = "sink.path"
    system = "Delta"

    def __init__(
        self,
        path: str,
        table: str,
        key: Sequence[str],
        *,
        storage_options: Mapping[str, str] | None = None,
        retry: RetryPolicy | None = None,
        summary_sql: str | None = None,
    ) -> None:
        super().__init__(table, key, retry=retry, summary_sql=summary_sql)
        if not path:
            raise ConfigError("Delta sink needs a path (a directory or s3://bucket/prefix)")
        self.path = path if "://" in path else os.path.abspath(path)
        self.storage_options = dict(storage_options or {})

    @classmethod
    def from_config(
        cls, config: Mapping[str, Any], *, key: Sequence[str] = (), **kw: Any
    ) -> DeltaUpsertSink:
        """From ``sink.path`` and ``sink.table``."""
        if not config.get("sink.path"):
            raise ConfigError("sink.kind=delta needs sink.path=<directory or s3://bucket/prefix>")
        return cls(config["sink.path"], config["sink.table"], key, **kw)

    @property
    def app_id(self) -> str:
        return f"srt:{self.job}:{self.sink_name}"

    @property
    def location(self) -> str:
        return self.path

    def write_placement(self) -> WritePlacement:
        return WritePlacement(
            "driver",
            "a Delta table takes one commit at a time: the batch is "
            "one merge commit carrying its app transaction (per-task merges "
            "would conflict)",
        )

    def describe(self) -> str:
        return (
            f"Delta table {self.table} at {self.path} (merge by "
            f"{', '.join(self.key_columns)}; the batch id is an app transaction in the "
            f"same commit: exactly-once)"
        )

    def options(self) -> dict[str, str]:
        """delta-rs storage options: S3 settings from the environment, then the sink's own."""
        out: dict[str, str] = {}
        if self.path.startswith("s3://"):
            endpoint = os.environ.get("SRT_S3_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL")
            if endpoint:
                out["AWS_ENDPOINT_URL"] = endpoint
                if endpoint.startswith("http://"):
                    out["AWS_ALLOW_HTTP"] = "true"
            region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            if region:
                out["AWS_REGION"] = region
            out["conditional_put"] = "etag"
        out.update(self.storage_options)
        return out

    def transient(self, exc: BaseException) -> bool:
        return isinstance(exc, OSError) or bool(_TRANSIENT.search(str(exc)))

    def _table(self) -> Any:
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.path, storage_options=self.options())
        except TableNotFoundError:
            return None

    def _run(self, what: str, step: Any) -> Any:
        return self.retry.run(step, what=f"Delta {self.path} ({what})", transient=self.transient)

    def _commit(self, batch_id: int, **more: str) -> Any:
        from deltalake import CommitProperties, Transaction

        return CommitProperties(
            app_transactions=[Transaction(self.app_id, batch_id)],
            custom_metadata={APP_KEY: self.app_id, "srt.batch": str(batch_id), **more},
        )

    @staticmethod
    def _rows(dt: Any) -> int:
        # From the snapshot's add actions (metadata): no data file is read; this sink writes
        # no deletion vectors, so a file's num_records are its live rows.
        actions = pa.table(dt.get_add_actions(flatten=True))
        return int(sum(v for v in actions.column("num_records").to_pylist() if v))

    def _observe_on(self, dt: Any, app_id: str, *, count: bool) -> SinkObservation:
        ledger = f"Delta app transaction {app_id}"
        if dt is None:
            return SinkObservation(self.table, self.path, False, None, None, None, ledger)
        done = dt.transaction_version(app_id)
        # Before each batch: the rows this sink left after its last one, as it counted them
        # (a merge never removes a row, so fewer now means rows were deleted).
        expected = None if count else getattr(self, "_rows_after", None)
        if count and done is not None:
            from deltalake import DeltaTable

            for commit in dt.history(HISTORY_SCAN):
                if commit.get(APP_KEY) == app_id and commit.get("version") is not None:
                    then = DeltaTable(
                        self.path, version=commit["version"], storage_options=self.options()
                    )
                    expected = self._rows(then)
                    break
        rows = self._rows(dt)
        if count:  # what the next write must find (fewer: the check refuses the start)
            self._rows_after = max(rows, expected or 0)
        return SinkObservation(self.table, self.path, True, done, expected, rows, ledger)

    def observe(self, job: str, sink: str) -> SinkObservation:
        return self._run(
            "check the table",
            lambda: self._observe_on(self._table(), f"srt:{job}:{sink}", count=True),
        )

    def accept(self, job: str, sink: str, batch: int | None, note: str) -> None:
        from deltalake import CommitProperties, Transaction

        app = f"srt:{job}:{sink}"

        def step() -> None:
            dt = self._table()
            if dt is None:  # no table to record it in: the checkpoint's record holds it
                return
            at = -1 if batch is None else batch
            dt.create_write_transaction(
                [],
                mode="append",
                schema=dt.schema(),
                partition_by=[],
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app, at)],
                    custom_metadata={APP_KEY: app, "srt.batch": str(at), "srt.accepted": note},
                ),
            )

        self._run("record the acceptance", step)

    def set_aside(self, job: str, sink: str, suffix: str) -> str | None:
        """Delta keeps the old rows in the table's history: the replay starts from an empty
        version (an overwrite), the lost one stays readable by time travel until a VACUUM."""
        from deltalake import CommitProperties, Transaction, write_deltalake

        app = f"srt:{job}:{sink}"

        def step() -> str | None:
            dt = self._table()
            if dt is None:
                return None
            kept = dt.version()
            write_deltalake(
                self.path,
                pa.schema(dt.schema()).empty_table(),
                mode="overwrite",
                storage_options=self.options(),
                commit_properties=CommitProperties(
                    app_transactions=[Transaction(app, -1)],
                    custom_metadata={APP_KEY: app, "srt.batch": "-1", "srt.set_aside": suffix},
                ),
            )
            return f"{self.path} version {kept} (time travel)"

        return self._run("set the table aside", step)

    def begin_batch(self, batch_id: int, schema: pa.Schema) -> bool:
        def step() -> bool:
            dt = self._table()
            if self.expected_batch is not None:
                # The table and its app transaction still hold the last batch (a table
                # deleted while the job runs is not silently recreated).
                self._observe_on(dt, self.app_id, count=False).check_holds(
                    self.job, self.sink_name, self.expected_batch
                )
            if dt is None:
                return True
            have = [Column(f.name, str(f.type)) for f in pa.schema(dt.schema())]
            checked = self.limits_of({c.name: c.type for c in have}, schema)
            self.evolve(have, [Column(f.name, str(f.type)) for f in schema], checked)
            done = dt.transaction_version(self.app_id)
            return done is None or done < batch_id

        return bool(self._run(f"prepare batch {batch_id}", step))

    def write_partition(
        self, rows: pa.Table, batch_id: int, partition: int, partitions: int
    ) -> PartitionReport:
        from deltalake import write_deltalake

        rows = self.storable(rows, batch_id)  # a narrower column's rows checked, then cast

        def step() -> PartitionReport:
            t0 = time.perf_counter()
            commit = self._commit(batch_id)
            dt = self._table()
            if dt is None:
                self._rows_after = rows.num_rows
                write_deltalake(
                    self.path,
                    rows,
                    mode="append",
                    name=self.table,
                    storage_options=self.options(),
                    commit_properties=commit,
                )
            else:
                done = dt.transaction_version(self.app_id)
                if done is not None and done >= batch_id:  # an earlier try committed
                    return self.skipped(partition, rows.num_rows, "already written")
                if rows.num_rows == 0:
                    # Recorded all the same (an empty commit): readers take the last batch's
                    # watermark as the table's cut (closed-window reconciliation).
                    dt.create_write_transaction(
                        [],
                        mode="append",
                        schema=dt.schema(),
                        partition_by=[],
                        commit_properties=commit,
                    )
                    self._rows_after = self._rows(dt)
                    return self.skipped(partition, 0, "empty")
                before = self._rows(dt)
                added = {f.name for f in rows.schema} - {f.name for f in pa.schema(dt.schema())}
                on = " AND ".join(f"t.{_q(k)} = s.{_q(k)}" for k in self.key_columns)
                metrics = (
                    dt.merge(
                        rows,
                        predicate=on,
                        source_alias="s",
                        target_alias="t",
                        merge_schema=bool(added),
                        commit_properties=commit,
                    )
                    .when_matched_update_all()
                    .when_not_matched_insert_all()
                    .execute()
                )
                self._rows_after = before + int(metrics.get("num_target_rows_inserted") or 0)
            return PartitionReport(
                partition, rows.num_rows, rows.num_rows, (time.perf_counter() - t0) * 1000
            )

        report = self._run(f"batch {batch_id}", step)
        hook("partition", batch_id, partition)
        return report

    def commit_batch(self, batch_id: int, reports: Sequence[PartitionReport]) -> None:
        hook("commit", batch_id)  # the merge's commit already carried the app transaction

    def rewind(self, batch_id: int) -> None:
        """Set the app transaction back to ``batch_id`` (an empty commit), so the batches
        after it are merged again when re-executed."""

        def step() -> None:
            dt = self._table()
            if dt is None:
                return
            done = dt.transaction_version(self.app_id)
            if done is None or done <= batch_id:
                return
            dt.create_write_transaction(
                [],
                mode="append",
                schema=dt.schema(),
                partition_by=[],
                commit_properties=self._commit(batch_id),
            )

        self._run(f"rewind to batch {batch_id}", step)

    def read_arrow(self) -> pa.Table:
        """The table's current snapshot."""
        dt = self._table()
        return pa.table({}) if dt is None else dt.to_pyarrow_table()

    def snapshot(self) -> tuple[pa.Table, LedgerEntry | None]:
        """The table and the last batch this sink committed, from one table version (the
        app transaction is in the same commit as the data). Raises LookupError if there is no
        table."""
        dt = self._table()
        if dt is None:
            raise LookupError(f"no Delta table at {self.path}")
        done = dt.transaction_version(self.app_id)
        last = None
        if done is not None:
            when = None
            for commit in dt.history(1):
                if commit.get("timestamp"):
                    when = datetime.fromtimestamp(commit["timestamp"] / 1000, UTC)
            last = LedgerEntry(int(done), 0, when)
        return dt.to_pyarrow_table(), last

    def summary(self) -> SinkSummary | None:
        import duckdb

        def run(sql: str) -> tuple[list[str], list[tuple]]:
            dt = self._table()
            if dt is None:
                raise FileNotFoundError(f"no Delta table at {self.path} yet")
            con = duckdb.connect()
            try:
                con.register("_srt_delta", dt.to_pyarrow_dataset())
                cur = con.execute(sql)
                return [d[0] for d in cur.description], cur.fetchall()
            finally:
                con.close()

        return self.summary_from(run, "_srt_delta", self.path)
