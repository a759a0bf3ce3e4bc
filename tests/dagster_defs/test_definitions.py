"""The Dagster definitions load without Spark, GX or the runtime's engine, and say what they
hold. How long a load takes is a figure for NOTES.md (a timed assertion here failed whenever
the machine was loaded), not a test."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest
from dagster import AssetKey

from dagster_defs import (
    SavepointPolicy,
    SinkTableSpec,
    StreamingJobSpec,
    StreamingJobTranslator,
    StreamingRuntime,
    WindowReconciliation,
    build_definitions,
)
from dagster_defs.resources import s3_env
from stateful_runtime.exceptions import ConfigError
from tests.helpers import ROOT, VENV_BIN

# Of the runtime, Dagster loads only modules of plain data (what its import contract allows).
PLAIN_DATA = (
    "stateful_runtime",
    "stateful_runtime.contract",
    "stateful_runtime.dbt_sources",
    "stateful_runtime.exceptions",
    "stateful_runtime.ledger",
    "stateful_runtime.masking",
    "stateful_runtime.names",
    "stateful_runtime.sink_kinds",
)


def test_definitions_load_without_importing_spark_or_gx():
    code = (
        "import runpy, sys; d = runpy.run_path('examples/definitions.py'); "
        "assert d['defs'].resources['streaming_runtime'] is not None; "
        "heavy = [m for m in ('pyspark', 'great_expectations', 'duckdb', 'pyarrow', "
        "'dbt_sink.base', 'dbt_sink.duckdb', 'dbt.adapters.duckdb') if m in sys.modules]; "
        "heavy += [m for m in sys.modules if m.split('.')[0] == 'stateful_runtime' "
        f"and m not in {PLAIN_DATA!r}]; "
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_workspace_validates(tmp_path):
    """`dagster definitions validate` on the workspace `dagster dev` loads: the example code
    location loads, by name (its home in the test's own directory, not the checkout)."""
    out = subprocess.run(
        [str(VENV_BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"],
        cwd=ROOT,
        env={**os.environ, "DAGSTER_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = out.stdout + out.stderr
    assert out.returncode == 0, said
    assert "Validation successful for code location definitions.py" in said, said
    assert "All code locations passed validation" in said, said


def test_default_definitions_expose_the_upi_job():
    from tests.dagster_defs.helpers import example_definitions

    defs = example_definitions().defs

    assert {k.to_user_string() for k in defs.resolve_all_asset_keys()} == {
        "upi_per_minute",
        "upi_per_minute_savepoints",
        "upi_counts",
        "merchant_day",
    }
    graph = defs.resolve_asset_graph()
    # One lineage graph: job → sink table → dbt model (the dbt source's meta.dagster.asset_key).
    assert graph.get(AssetKey("upi_counts")).parent_keys == {AssetKey("upi_per_minute")}
    assert graph.get(AssetKey("merchant_day")).parent_keys == {AssetKey("upi_counts")}
    assert graph.get(AssetKey("merchant_day")).automation_condition is not None
    # Freshness is a check that knows idle from stuck, not a time window on materialisations.
    assert graph.get(AssetKey("upi_counts")).freshness_policy is None
    checks = {(k.asset_key.to_user_string(), k.name) for k in graph.asset_check_keys}
    assert {c for a, c in checks if a == "upi_counts"} == {
        "unique_key",
        "not_null",
        "value_ranges",
        "closed_windows_reconcile",
        "freshness",
        # dbt's tests of its source (the table), run with the dbt model
        "upi_counts_unique_key",
        "source_not_null_upi_per_minute_upi_counts_merchant_id",
        "source_not_null_upi_per_minute_upi_counts_window_start",
    }
    assert {c for a, c in checks if a == "upi_per_minute"} == {
        "running",
        "checkpoint_age",
        "lag",
        "no_crash_restart",
        "dead_letters",
    }
    # dbt tests are asset checks of the model.
    assert ("merchant_day", "merchant_day_unique_key") in checks
    # Every check says what it checks; the dbt model's columns carry their types.
    undescribed = [
        k.to_user_string() for k in graph.asset_check_keys if not graph.get(k).description
    ]
    assert not undescribed, undescribed
    columns = graph.get(AssetKey("merchant_day")).metadata["dagster/column_schema"].columns
    assert {c.name: c.type for c in columns} == {
        "merchant_id": "varchar",
        "day": "date",
        "payments": "hugeint",
        "amount_paise": "decimal(38,0)",
        "active_minutes": "bigint",
        "last_window_end": "timestamp",
    }
    for key in graph.asset_check_keys:
        # Run when the stream's commits land (freshness: the health sensor, every tick).
        if key.asset_key == AssetKey("upi_counts") and key.name != "freshness":
            assert graph.get(key).automation_condition is not None
    sensor = defs.resolve_sensor_def("streaming_job_health")
    assert sensor.minimum_interval_seconds == 5  # a commit reaches Dagster within seconds
    automation = defs.resolve_sensor_def("default_automation_condition_sensor")
    assert automation.default_status.value == "RUNNING"
    stop = defs.resolve_job_def("stop_streaming_job")
    assert list(stop.graph.node_dict) == ["stop_streaming_job_op"]
    assert {j.name for j in defs.jobs} == {  # type: ignore[union-attr]
        "stop_streaming_job",
        "savepoint_streaming_job",
        "stop_with_savepoint",
        "upgrade_streaming_job",
        "rescale_streaming_job",
        "streaming_job_crashed",  # launched by the health sensor on a crash (alerts)
        "upi_per_minute_from_savepoint",
    }
    # Restore picks its savepoint as a partition of the job's savepoint list.
    restore = defs.resolve_job_def("upi_per_minute_from_savepoint")
    assert restore.partitions_def.name == "upi_per_minute_savepoints"  # type: ignore[union-attr]
    assert graph.get(AssetKey("upi_per_minute_savepoints")).partitions_def == (
        restore.partitions_def
    )
    # No job uses S3 here: the savepoint jobs' launchpads offer no s3 block.
    for name in ("savepoint_streaming_job", "upgrade_streaming_job", "stop_with_savepoint"):
        [node] = defs.resolve_job_def(name).graph.node_dict.values()
        assert "s3" not in node.definition.required_resource_keys, name
    schedule = defs.resolve_schedule_def("upi_per_minute_savepoint_schedule")
    assert schedule.job_name == "savepoint_streaming_job"
    assert (schedule.cron_schedule, schedule.default_status.value) == ("0 * * * *", "STOPPED")
    assert set(defs.resources) == {"streaming_runtime", "warehouse", "kafka", "s3", "dbt"}
    for key, res in defs.resources.items():  # every field is described for the UI
        fields = type(res).model_fields
        undocumented = [n for n, f in fields.items() if not f.description]
        assert key in ("s3", "dbt") or not undocumented, (key, undocumented)


def test_the_translator_decides_keys_and_groups():
    class Prefixed(StreamingJobTranslator):
        def get_job_asset_key(self, job):
            return AssetKey(["streaming", job.name.replace("-", "_")])

        def get_sink_asset_key(self, job, table):
            return AssetKey(["warehouse", table.table])

        def get_group_name(self, job):
            return "payments"

    spec = StreamingJobSpec(
        "upi-per-minute",
        "examples/upi_per_minute.py",
        sink_tables=[SinkTableSpec("upi_counts", "upi-counts", key=("merchant_id",))],
    )
    defs = build_definitions([spec], translator=Prefixed())
    sink = defs.resolve_assets_def(AssetKey(["warehouse", "upi_counts"]))
    assert sink.asset_deps[sink.key] == {AssetKey(["streaming", "upi_per_minute"])}
    assert sink.group_names_by_key[sink.key] == "payments"
    [checks] = defs.asset_checks  # type: ignore[misc]
    assert {k.name for k in checks.check_keys} == {"unique_key", "not_null"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "upi per minute"}, "job name"),
        ({"config_from_resources": {"sink.database": "warehouse"}}, "resource_key.field"),
        (
            {"config": {"sink.database": "x"}, "config_from_resources": {"sink.database": "w.p"}},
            "both",
        ),
        (
            {"sink_tables": [SinkTableSpec("t", "q", key=("k",))] * 2},
            "repeat a table",
        ),
    ],
)
def test_specs_reject_contradictions_at_load(kwargs, message):
    args = {"name": "j", "job_file": "j.py", **kwargs}
    with pytest.raises(ConfigError, match=message):
        StreamingJobSpec(**args)


def test_build_rejects_config_from_a_missing_resource():
    spec = StreamingJobSpec("j", "j.py", config_from_resources={"source.servers": "broker.hosts"})
    with pytest.raises(ConfigError, match="broker"):
        build_definitions([spec])


def test_reconciliation_window_must_be_positive():
    with pytest.raises(ConfigError, match="window"):
        WindowReconciliation("payments", timedelta(0))


def test_savepoint_policy_is_validated_at_load():
    with pytest.raises(ConfigError, match="keep"):
        SavepointPolicy(keep=0)
    with pytest.raises(ConfigError, match="cron"):
        SavepointPolicy(cron="hourly")


def test_srt_processes_get_the_s3_resource_settings():
    from dagster_aws.s3 import S3Resource

    env = s3_env(S3Resource(endpoint_url="http://127.0.0.1:9000", region_name="ap-south-1"))
    assert env == {
        "SRT_S3_ENDPOINT_URL": "http://127.0.0.1:9000",
        "AWS_REGION": "ap-south-1",
        "AWS_DEFAULT_REGION": "ap-south-1",
    }
    assert s3_env(S3Resource()) == {}  # boto3's own configuration applies
    runtime = StreamingRuntime(home="/tmp/srt-home")
    assert runtime.env(env)["SRT_S3_ENDPOINT_URL"] == "http://127.0.0.1:9000"


def test_schedule_description_says_retention_as_a_person_would():
    defs = build_definitions([StreamingJobSpec("upi-per-minute", "examples/upi_per_minute.py")])
    text = defs.resolve_schedule_def("upi_per_minute_savepoint_schedule").description or ""
    assert "no older than 7 d;" in text and "days," not in text
