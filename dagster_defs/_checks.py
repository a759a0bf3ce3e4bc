"""Asset checks of a sink table: Great Expectations on the table, and reconciliation.

The table is read into pandas by the ``warehouse`` resource (DuckDB read-only, PostgreSQL in
one snapshot, ClickHouse with ``FINAL``, Delta from one table version) and validated by an
ephemeral GX context with the pandas datasource (GX's Spark extra caps pyspark below 4.2 and its
DuckDB SQL path is broken). GX is imported only when a check runs: importing it takes ~8 s and
must not slow definition load.
"""

import os
from collections.abc import Iterator, Sequence
from typing import Any

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSeverity,
    AssetCheckSpec,
    AssetKey,
    AutomationCondition,
    multi_asset_check,
)

from dagster_defs._health import FRESHNESS, freshness_spec, table_freshness
from dagster_defs._specs import SinkTableSpec, StreamingJobSpec
from dagster_defs._translator import StreamingJobTranslator, identifier

UNIQUE_KEY = "unique_key"
NOT_NULL = "not_null"
VALUE_RANGES = "value_ranges"
RECONCILE = "closed_windows_reconcile"
# Offending values shown per expectation; GX's partial list holds 20.
SHOWN_UNEXPECTED = 10


# Checks run by automation each time the table materialises (the health sensor reports the
# stream's commits as materialisations), once nothing upstream is in progress.
CHECK_AUTOMATION = AutomationCondition.eager()


def check_specs(key: AssetKey, table: SinkTableSpec) -> list[AssetCheckSpec]:
    """The table's checks; each description says what a failure means and what to do."""
    key_cols = ", ".join(table.key)
    specs = [
        AssetCheckSpec(
            UNIQUE_KEY,
            asset=key,
            automation_condition=CHECK_AUTOMATION,
            description=(
                f"({key_cols}) identifies one row (GX). If it fails: the stream upserts by "
                f"this key, so a duplicate comes from rows written another way (a manual "
                f"insert, another job writing the same table) or a key changed in the job but "
                f"not here. The result lists offending keys: delete the extra rows, or make "
                f"the spec's key match the job's sink key."
            ),
        ),
        AssetCheckSpec(
            NOT_NULL,
            asset=key,
            automation_condition=CHECK_AUTOMATION,
            description=(
                f"{', '.join(table.not_null_columns)} are never null (GX). If it fails: key "
                f"columns are NOT NULL in the sink, so nulls there are rows written another "
                f"way; in other columns the job's output changed (an upgrade: `srt savepoint "
                f"check`) or input fields went missing (see the dead-letter topic)."
            ),
        ),
    ]
    if table.min_values:
        specs.append(
            AssetCheckSpec(
                VALUE_RANGES,
                asset=key,
                automation_condition=CHECK_AUTOMATION,
                description=", ".join(f"{c} >= {v:g}" for c, v in table.min_values.items())
                + " (GX). If it fails: records with impossible values passed decoding; look "
                "at the source topic's records (`srt log read`) and add a filter or a stricter "
                "schema to the job.",
            )
        )
    if table.expected_latency is not None:
        specs.append(freshness_spec(key, table.expected_latency.total_seconds()))
    if table.reconcile is not None:
        specs.append(
            AssetCheckSpec(
                RECONCILE,
                asset=key,
                automation_condition=CHECK_AUTOMATION,
                description=(
                    f"closed windows' {table.reconcile.count_column} equals the good source "
                    f"events in them, up to the watermark of the last sink batch. If it fails: "
                    f"the result lists the windows that differ. Fewer in the table: events "
                    f"dropped as late (the job asset's 'late records' plot) or lost; more: "
                    f"counted twice (a sink without its ledger, or a restore from an older "
                    f"savepoint while another writer ran). Dead letters are counted apart."
                ),
            )
        )
    return specs


def _expectations(table: SinkTableSpec) -> list[tuple[str, Any]]:
    """(check name, GX expectation) pairs for the table."""
    import great_expectations.expectations as gxe

    out: list[tuple[str, Any]] = []
    if len(table.key) == 1:
        out.append((UNIQUE_KEY, gxe.ExpectColumnValuesToBeUnique(column=table.key[0])))
    else:
        out.append((UNIQUE_KEY, gxe.ExpectCompoundColumnsToBeUnique(column_list=list(table.key))))
    out += [(NOT_NULL, gxe.ExpectColumnValuesToNotBeNull(column=c)) for c in table.not_null_columns]
    out += [
        (VALUE_RANGES, gxe.ExpectColumnValuesToBeBetween(column=c, min_value=v))
        for c, v in table.min_values.items()
    ]
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return None if value != value else value
    return str(value)


def validate(
    df: Any, name: str, expectations: Sequence[tuple[str, Any]]
) -> dict[str, tuple[bool, list[dict[str, Any]]]]:
    """Run the expectations on a pandas DataFrame; per check: passed, and one summary per
    expectation (type, column(s), counts, a few offending values)."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")  # no network from a check
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    batch = (
        context.data_sources.add_pandas(f"srt_{name}")
        .add_dataframe_asset(name)
        .add_batch_definition_whole_dataframe("snapshot")
        .get_batch(batch_parameters={"dataframe": df})
    )
    suite = gx.ExpectationSuite(name=f"{name}_checks", expectations=[e for _, e in expectations])
    results = batch.validate(suite).results
    out: dict[str, tuple[bool, list[dict[str, Any]]]] = {}
    for (check, expectation), res in zip(expectations, results, strict=True):
        info = res.result or {}
        summary = {
            "expectation": type(expectation).__name__,
            "column": getattr(expectation, "column", None)
            or ", ".join(getattr(expectation, "column_list", None) or []),
            "success": bool(res.success),
            "element_count": info.get("element_count"),
            "unexpected_count": info.get("unexpected_count"),
        }
        if not res.success:
            summary["unexpected"] = _jsonable(
                (info.get("partial_unexpected_list") or [])[:SHOWN_UNEXPECTED]
            )
            error = (res.exception_info or {}).get("exception_message")
            if error:
                summary["error"] = error
        passed, summaries = out.get(check, (True, []))
        out[check] = (passed and bool(res.success), [*summaries, summary])
    return out


def sink_checks(
    spec: StreamingJobSpec, table: SinkTableSpec, translator: StreamingJobTranslator
) -> AssetChecksDefinition:
    """One multi-check per sink table: a single read of the table and one GX import serve all
    checks; each can also run alone."""
    key = translator.get_sink_asset_key(spec, table)

    @multi_asset_check(
        name=f"{identifier(spec.name)}_{identifier(table.table)}_checks",
        specs=check_specs(key, table),
        can_subset=True,
        required_resource_keys={"warehouse", "streaming_runtime"},
    )
    def _checks(context: AssetCheckExecutionContext) -> Iterator[AssetCheckResult]:
        from dagster_defs import _reconcile

        selected = {k.name for k in context.selected_asset_check_keys}
        warehouse = context.resources.warehouse
        runtime = context.resources.streaming_runtime
        if FRESHNESS in selected and table.expected_latency is not None:
            yield _freshness_result(key, runtime, spec, table)
            selected.discard(FRESHNESS)
            if not selected:
                return
        side: Any = None
        try:
            # One read for every check: ClickHouse's with FINAL (one row per key), and the
            # sink's last committed batch read before or with the table.
            read = warehouse.read(table.table, spec.name, table.query)
            df = read.frame
            if RECONCILE in selected and table.reconcile is not None:
                try:
                    side = _reconcile.table_side(read.frame, read.last, table.reconcile)
                except Exception as exc:  # noqa: BLE001 - e.g. a window column missing
                    side = exc
        except Exception as exc:  # noqa: BLE001 - a missing file or table fails every check
            for name in sorted(selected):
                yield AssetCheckResult(
                    asset_key=key,
                    check_name=name,
                    passed=False,
                    description=f"cannot read {table.table}: {exc}",
                )
            return

        gx_checks = [(c, e) for c, e in _expectations(table) if c in selected]
        for check, (passed, summaries) in validate(df, identifier(table.table), gx_checks).items():
            yield AssetCheckResult(
                asset_key=key,
                check_name=check,
                passed=passed,
                metadata={"rows": len(df), "expectations": summaries},
                description=None
                if passed
                else "; ".join(
                    f"{s['expectation']}({s['column']}): {s['unexpected_count']} unexpected"
                    for s in summaries
                    if not s["success"]
                ),
            )

        if RECONCILE in selected and table.reconcile is not None:
            assert side is not None
            yield _reconcile_result(key, runtime, spec, table, side)

    return _checks


def _freshness_result(
    key: AssetKey, runtime: Any, spec: StreamingJobSpec, table: SinkTableSpec
) -> AssetCheckResult:
    """Freshness now, from the job's status (the health sensor reports it every tick too)."""
    from dagster_defs.errors import StatefulRuntimeError

    assert table.expected_latency is not None
    try:
        status = runtime.status(spec.name)
    except StatefulRuntimeError as exc:
        return AssetCheckResult(
            asset_key=key, check_name=FRESHNESS, passed=False, description=f"no status: {exc}"
        )
    if status is None:
        return AssetCheckResult(
            asset_key=key,
            check_name=FRESHNESS,
            passed=False,
            severity=AssetCheckSeverity.WARN,
            description=f"job {spec.name} never ran here: materialise its asset",
        )
    return table_freshness(table.expected_latency.total_seconds(), table.query, status).result(key)


def _reconcile_result(
    key: AssetKey, runtime: Any, spec: StreamingJobSpec, table: SinkTableSpec, side: Any
) -> AssetCheckResult:
    """The table side against the source's window counts, which an ``srt reconcile`` process
    computes (it loads the job file; this process does not)."""
    from dagster_defs import _reconcile
    from dagster_defs.errors import StatefulRuntimeError

    if isinstance(side, Exception):
        return AssetCheckResult(
            asset_key=key,
            check_name=RECONCILE,
            passed=False,
            description=f"cannot reconcile: {side}",
        )
    if side.batch is None:
        return AssetCheckResult(
            asset_key=key,
            check_name=RECONCILE,
            passed=True,
            description="the sink has written no micro-batch yet",
        )
    rec = table.reconcile
    assert rec is not None
    try:
        source = runtime.window_counts(
            spec.name, table.query, window=rec.window, batch=side.batch, source=rec.source
        )
    except StatefulRuntimeError as exc:
        return AssetCheckResult(
            asset_key=key,
            check_name=RECONCILE,
            passed=False,
            description=f"cannot reconcile: {exc}",
        )
    outcome = _reconcile.compare(side, source)
    return AssetCheckResult(
        asset_key=key,
        check_name=RECONCILE,
        passed=outcome.passed,
        description=outcome.description,
        metadata=outcome.metadata,
    )
