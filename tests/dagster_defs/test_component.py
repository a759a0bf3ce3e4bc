"""The streaming-jobs Component: examples/components/upi_per_minute/defs.yaml loads into the
same Definitions as build_definitions makes (assets, checks, sensors, jobs, policies)."""

from __future__ import annotations

import shutil
from datetime import timedelta

import pytest
import yaml
from dagster import AssetKey
from dagster.components.testing import create_defs_folder_sandbox

from dagster_defs.component import StreamingJobsComponent, duration
from stateful_runtime.exceptions import ConfigError
from tests.helpers import EXAMPLES

EXAMPLE = EXAMPLES / "components" / "upi_per_minute" / "defs.yaml"


def test_defs_yaml_example_loads_into_definitions():
    with create_defs_folder_sandbox() as sandbox:
        folder = sandbox.defs_folder_path / "streaming"
        folder.mkdir()
        shutil.copy(EXAMPLE, folder / "defs.yaml")
        # The example's job file, where its relative path points from the sandbox folder.
        shutil.copy(
            EXAMPLES / "upi_per_minute.py",
            sandbox.defs_folder_path.parent.parent / "upi_per_minute.py",
        )
        with sandbox.load_component_and_build_defs(defs_path=folder) as (component, defs):
            assert isinstance(component, StreamingJobsComponent)
            [spec] = component.specs(folder)
            graph = defs.resolve_asset_graph()
            assert graph.get(AssetKey("upi_counts")).parent_keys == {AssetKey("upi_per_minute")}
            checks = {k.name for k in graph.asset_check_keys}
            assert checks == {
                *(
                    "unique_key",
                    "not_null",
                    "value_ranges",
                    "closed_windows_reconcile",
                    "freshness",
                ),
                *("running", "checkpoint_age", "lag", "no_crash_restart", "dead_letters"),
            }
            assert {s.name for s in defs.sensors} == {  # type: ignore[union-attr]
                "streaming_job_health",
                "streaming_job_savepoints",
                "default_automation_condition_sensor",
            }
            assert graph.get(AssetKey("upi_per_minute_savepoints")).parent_keys == {
                AssetKey("upi_per_minute")
            }
            assert "stop_streaming_job" in {j.name for j in defs.jobs}  # type: ignore[union-attr]
            assert defs.resolve_schedule_def("upi_per_minute_savepoint_schedule")
            assert defs.resources["warehouse"].kind == "duckdb"

    assert spec.job_file.endswith("upi_per_minute.py")
    assert spec.restart_policy.max_checkpoint_age == timedelta(minutes=5)
    assert spec.savepoints.max_age == timedelta(days=7)
    [table] = spec.sink_tables
    assert table.key == ("merchant_id", "window_start")
    assert table.reconcile is not None and table.reconcile.window == timedelta(minutes=1)
    assert table.expected_latency == timedelta(seconds=7)
    assert dict(spec.config_from_resources) == {"sink.*": "warehouse.sink_config"}


def test_example_matches_the_python_definitions():
    from tests.dagster_defs.helpers import UPI_JOB

    attrs = yaml.safe_load(EXAMPLE.read_text())["attributes"]
    [job] = StreamingJobsComponent(**attrs).specs(EXAMPLE.parent)
    assert job.name == UPI_JOB.name and job.job_file == UPI_JOB.job_file
    assert job.sink_tables == tuple(UPI_JOB.sink_tables)


def test_durations_are_validated():
    assert duration("90s", "x") == timedelta(seconds=90)
    assert duration("250ms", "x") == timedelta(milliseconds=250)
    assert duration(3, "x") == timedelta(seconds=3)
    with pytest.raises(ConfigError, match="duration"):
        duration("soon", "window")
