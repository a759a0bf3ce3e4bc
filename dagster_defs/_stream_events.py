"""What the health sensor reports besides restarts: sink tables materialising as the stream
commits, and health as numbers Dagster plots.

* :func:`commit_events` — per sink table, one runless :class:`AssetMaterialization` for the
  micro-batches its sink committed since the last report (read from the sink ledger in the
  warehouse, so a materialisation always means rows are in the table): batch range, batches,
  rows written, the job's watermark and the windows it closed since the previous report.
  Downstream automation (the table's checks, dbt models) and freshness policies react to these.
* :func:`plot_metadata` — a job's health as float/int metadata with units in the labels
  (input and processing rates over the run's last batches, rows per batch, lag, checkpoint
  age, batch duration, state size, records in/out/dead letters/late, and each ``map_async``
  step's calls, retries, failures and latency percentiles),
  which the asset page's **Plots** tab graphs over time.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from dagster import AssetMaterialization, MetadataValue

from dagster_defs._specs import SinkTableSpec, StreamingJobSpec
from dagster_defs._translator import StreamingJobTranslator

if TYPE_CHECKING:
    from stateful_runtime.contract import BatchHealth, JobStatus

# Ledger entries read per table per tick; the first report after a long gap sums at most these.
LEDGER_WINDOW = 10_000
CONTROL_HOST = "127.0.0.1"

# a last batch's health (contract.BatchHealth) → (label with unit, type)
# The rates are over the run's last batches (contract.RATE_BATCHES; BatchHealth.recent_*):
# Spark's own are of the last batch alone.
_PLOTTED: tuple[tuple[str, str, type], ...] = (
    ("recent_input_rows_per_s", "input rate (records/s, last batches)", float),
    ("recent_processed_rows_per_s", "processing rate (records/s, last batches)", float),
    ("input_rows", "rows in the last batch (records)", int),
    ("lag_records", "lag (records)", int),
    ("batch_duration_ms", "batch duration (ms)", int),
    ("state_rows", "state (rows)", int),
    ("state_bytes", "state size (bytes)", int),
)
_RECORDS: tuple[tuple[str, str], ...] = (
    ("input", "records input (this run)"),
    ("output", "records output (this run)"),
    ("dead_letters", "dead letters (this run)"),
    ("late", "late records (this run)"),
)


def _batch(batch: BatchHealth | None, field: str) -> Any:
    return None if batch is None else getattr(batch, field)


def _number(value: Any, kind: type) -> MetadataValue | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return MetadataValue.float(float(value)) if kind is float else MetadataValue.int(int(value))
    except (TypeError, ValueError):
        return None


def control_url(status: JobStatus) -> str | None:
    """The job process's control endpoint (health), if it runs one (bearer token required)."""
    port = None if status.control is None else status.control.port
    return f"http://{CONTROL_HOST}:{int(port)}/health" if port else None


def plot_metadata(status: JobStatus) -> dict[str, MetadataValue]:
    """Numeric health of every query, labelled with units (``lag (records)``); with several
    queries each label starts with the query's name."""
    out: dict[str, MetadataValue] = {}
    many = len(status.queries) > 1
    for name, q in sorted(status.queries.items()):
        prefix = f"{name}: " if many else ""
        facts, health = q.checkpoint, status.query_health(name)
        values = {
            "checkpoint age (s)": _number(facts and facts.checkpoint_age_s, float),
            "last committed batch": _number(q.last_committed_batch, int),
        }
        for key, label, kind in _PLOTTED:
            values[label] = _number(_batch(health.batch, key), kind)
        for key, label in _RECORDS:
            values[label] = _number(getattr(health.records, key, None), int)
        behind = _batch(health.batch, "event_time_lag_by_partition") or {}
        for part, ms in sorted(behind.items()):
            values[f"event-time lag of {part} (ms)"] = _number(ms, int)
        for step, calls in sorted((health.calls or {}).items()):
            values[f"{step}: calls (this run)"] = _number(calls.calls, int)
            values[f"{step}: call rate (calls/s, last batch)"] = _number(calls.rate_per_s, float)
            values[f"{step}: retried calls (this run)"] = _number(calls.retries, int)
            values[f"{step}: records failed after retries (this run)"] = _number(calls.failed, int)
            values[f"{step}: call latency p50 (ms)"] = _number(calls.percentile_ms(0.5), float)
            values[f"{step}: call latency p99 (ms)"] = _number(calls.percentile_ms(0.99), float)
        out.update({f"{prefix}{label}": v for label, v in values.items() if v is not None})
    endpoint = control_endpoint(status)
    if endpoint is not None:
        out["control endpoint"] = endpoint
    return out


def control_endpoint(status: JobStatus) -> MetadataValue | None:
    """The control endpoint as text with how to call it: it wants the job's bearer token, so
    a link opened in a browser only answered 401."""
    url = control_url(status)
    if not url or status.control is None:
        return None
    token = status.control.token_file
    return MetadataValue.md(
        f"`{url}` (bearer token in `{token}`):\n\n"
        f'```\ncurl -H "Authorization: Bearer $(cat {token})" {url}\n```\n\n'
        f"or `srt status {status.job} --json`"
    )


def _ledger(warehouse: Any, table: str, job: str, sink: str) -> list[Any]:
    """The sink's newest ledger entries (newest first): DuckDB reads them directly; other
    warehouses give their last committed batch through a table read."""
    committed = getattr(warehouse, "committed_batches", None)
    if committed is None and getattr(warehouse, "kind", None) == "duckdb":
        from dagster_defs.resources import DuckDBWarehouse

        committed = DuckDBWarehouse(path=warehouse.path).committed_batches
    if committed is not None:
        return list(committed(job, sink, newest=LEDGER_WINDOW))
    last = warehouse.read(table, job, sink).last
    return [last] if last is not None else []


def _windows_closed(
    warehouse: Any, table: SinkTableSpec, after: str | None, upto: str | None
) -> int | None:
    """Rows of the table whose window ended in (after, upto]: windows the watermark closed
    between two reports (DuckDB only; None elsewhere or without a window_end column)."""
    if upto is None or getattr(warehouse, "kind", None) != "duckdb":
        return None
    from dagster_defs.resources import DuckDBWarehouse

    column = table.reconcile.window_end_column if table.reconcile else "window_end"
    quoted_table = '"' + table.table.replace('"', '""') + '"'
    quoted_col = '"' + column.replace('"', '""') + '"'
    db = (
        warehouse
        if isinstance(warehouse, DuckDBWarehouse)
        else DuckDBWarehouse(path=warehouse.path)
    )
    try:
        with db.read_only() as con:
            has = con.execute(
                "SELECT count(*) FROM information_schema.columns WHERE "
                "table_name = ? AND column_name = ?",
                [table.table, column],
            ).fetchall()[0][0]
            if not has:
                return None
            lower = after or "1970-01-01T00:00:00"
            row = con.execute(
                f"SELECT count(*) FROM {quoted_table} WHERE {quoted_col} > "
                f"CAST(? AS TIMESTAMP) AND {quoted_col} <= CAST(? AS TIMESTAMP)",
                [_naive(lower), _naive(upto)],
            ).fetchone()
    except Exception:  # noqa: BLE001 - a count for the UI; never fail the sensor over it
        return None
    return int(row[0]) if row else None


def _naive(iso: str) -> str:
    """A watermark (ISO 8601, ``Z``) as the naive UTC timestamp the window columns hold."""
    try:
        t = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return iso
    if t.tzinfo is not None:
        t = t.astimezone(UTC).replace(tzinfo=None)
    return t.isoformat()


# A batch the job process has not reported this long after its commit is the sensor's to
# report (the job gives up on a batch sooner: stateful_runtime.runtime.dagster_push).
PUSH_GRACE_S = 30.0
# Materialisations per table read to know which batches the job reported itself.
PUSHED_WINDOW = 200


def pushed_batches(
    instance: Any, spec: StreamingJobSpec, translator: StreamingJobTranslator
) -> dict[str, set[int]]:
    """Per sink table, the batches the job process reported itself (its newest
    materialisations ``reported by`` the job process: ``first batch`` … ``last batch``)."""
    out: dict[str, set[int]] = {}
    for table in spec.sink_tables:
        covered: set[int] = set()
        records = instance.fetch_materializations(
            translator.get_sink_asset_key(spec, table), limit=PUSHED_WINDOW
        ).records
        for record in records:
            mat = record.asset_materialization
            md = {} if mat is None else mat.metadata
            by = md.get("reported by")
            if by is None or by.value != "job process":
                continue
            first, last = md.get("first batch"), md.get("last batch")
            if first is not None and last is not None:
                covered.update(range(int(first.value), int(last.value) + 1))
        out[table.table] = covered
    return out


def _left_by_push(
    entries: list[Any], covered: set[int], now: float | None
) -> tuple[list[Any], int | None]:
    """Of ledger entries (oldest first): those the job did not report and will not (older
    than :data:`PUSH_GRACE_S`), and the newest batch up to which every entry is handled (the
    cursor may move there), stopping at the first the job may still report."""
    import time

    now = time.time() if now is None else now
    left: list[Any] = []
    handled = None
    for e in entries:
        if e.batch_id in covered:
            handled = e.batch_id
            continue
        at = e.committed_at
        if at is None or now - _epoch(at) >= PUSH_GRACE_S:
            left.append(e)
            handled = e.batch_id
            continue
        break  # young and not reported yet: the job may still push it
    return left, handled


def _epoch(at: datetime) -> float:
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp()


def commit_events(
    warehouse: Any,
    spec: StreamingJobSpec,
    status: JobStatus,
    translator: StreamingJobTranslator,
    reported: MutableMapping[str, dict[str, Any]],
    log: Any = None,
    *,
    pushed: Mapping[str, set[int]] | None = None,
    now: float | None = None,
) -> list[AssetMaterialization]:
    """Runless materialisations of the job's sink tables for batches committed since the last
    report; ``reported`` (the sensor cursor's, keyed ``job/table``) is updated in place.

    ``pushed``: the job reports its commits itself (:func:`pushed_batches`: per table, the
    batches its materialisations cover); then only batches it left unreported for
    :data:`PUSH_GRACE_S` are reported here, so each batch is reported once."""
    events = []
    for table in spec.sink_tables:
        key = f"{spec.name}/{table.table}"
        before = reported.get(key) or {}
        try:
            entries = _ledger(warehouse, table.table, spec.name, table.query)
        except (FileNotFoundError, LookupError):
            continue  # nothing written yet
        except Exception as exc:  # noqa: BLE001 - a warehouse down must not stop restarts
            if log is not None:
                log.warning(f"{spec.name}: cannot read the ledger of {table.table}: {exc}")
            continue
        last_reported = before.get("batch")
        new = [e for e in entries if last_reported is None or e.batch_id > last_reported]
        batch = status.query_health(table.query).batch if table.query in status.queries else None
        seen = None if batch is None else batch.last_batch
        if status.live and seen is not None:
            # The sink commits a batch before Spark reports it: a batch whose progress (and
            # so watermark) the job has not reported yet waits for the next tick, or its
            # materialisation would carry the previous batch's watermark.
            new = [e for e in new if e.batch_id <= seen]
        new.sort(key=lambda e: e.batch_id)
        handled: int | None = None
        if pushed is not None:
            new, handled = _left_by_push(new, pushed.get(table.table, set()), now)
            if handled is not None and not new:
                reported[key] = {**before, "batch": handled}
        if not new:
            continue
        watermark = None if batch is None else batch.watermark
        if watermark and str(watermark).startswith("1970-01-01T00:00:00"):
            watermark = None  # Spark's "no watermark yet"
        first, last = new[0], new[-1]
        closed = _windows_closed(warehouse, table, before.get("watermark"), watermark)
        metadata: dict[str, Any] = {
            "batches": MetadataValue.text(
                f"{first.batch_id}" if first is last else f"{first.batch_id}–{last.batch_id}"
            ),
            "first batch": MetadataValue.int(first.batch_id),
            "last batch": MetadataValue.int(last.batch_id),
            "batches committed": MetadataValue.int(len(new)),
            "rows written": MetadataValue.int(sum(e.rows for e in new)),
            "committed at": MetadataValue.text(str(last.committed_at)),
            "query": table.query,
        }
        if watermark:
            metadata["watermark"] = MetadataValue.text(str(watermark))
        if closed is not None:
            metadata["windows closed"] = MetadataValue.int(closed)
        events.append(
            AssetMaterialization(
                asset_key=translator.get_sink_asset_key(spec, table),
                description=(
                    f"{spec.name} committed batch"
                    + (
                        f"es {first.batch_id}–{last.batch_id}"
                        if first is not last
                        else f" {last.batch_id}"
                    )
                    + f" to {table.table} ({sum(e.rows for e in new):,} rows)"
                ),
                metadata=metadata,
                tags={"srt/job": spec.name, "srt/batch": str(last.batch_id)},
            )
        )
        reported[key] = {
            "batch": max(last.batch_id, -1 if handled is None else handled),
            "watermark": watermark or before.get("watermark"),
        }
    return events
