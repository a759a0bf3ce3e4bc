"""The example DAGs (examples/airflow) in a real Airflow 3: they import with no errors, fast,
and without loading Spark or a job file (the provider reaches the runtime through ``srt``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.srt_airflow.helpers import DAGS, AirflowHome

pytestmark = pytest.mark.airflow


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory, srt_home: Path) -> AirflowHome:
    """Airflow's configuration in a tmp directory (parsing needs no metadata database)."""
    root = tmp_path_factory.mktemp("airflow-parse")
    return AirflowHome(root=root, srt_home=srt_home, work=root)


EXPECTED = {
    "upi_per_minute_start",
    "upi_per_minute_savepoints",
    "upi_counts_downstream",
    "upi_per_minute_stop",
}

# DagBag as the DAG processor fills it, in a fresh interpreter; what it loaded besides.
_PARSE = """
import json, sys
from airflow.dag_processing.dagbag import DagBag
bag = DagBag(dag_folder=%r)
print(json.dumps({
    "errors": bag.import_errors,
    "dags": sorted(bag.dags),
    "seconds": {s.file: s.duration.total_seconds() for s in bag.dagbag_stats},
    "tasks": {d: sorted(dag.task_ids) for d, dag in bag.dags.items()},
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "duckdb",
        "dagster", "dbt_sink", "upi_per_minute") or m.startswith("stateful_runtime.runtime")
        or m.startswith("stateful_runtime.connectors")),
}))
"""


def test_the_example_dags_import_with_no_errors_and_without_spark(airflow: AirflowHome):
    parsed = airflow.python(_PARSE % str(DAGS))
    assert parsed["errors"] == {}
    assert set(parsed["dags"]) == EXPECTED
    assert parsed["heavy"] == [], "DAG parsing loaded the engine, Spark or a job file"
    assert parsed["tasks"]["upi_per_minute_savepoints"] == ["retention", "savepoint"]
    # What keeps parsing fast is asserted above (nothing heavy imported); the seconds are
    # printed, never asserted (a busy machine is no defect; NOTES.md has the figures).
    print("DAG file import seconds:", parsed["seconds"])
    assert set(parsed["seconds"]) == {
        f"{n}.py" for n in ("upi_start", "upi_savepoints", "upi_counts_downstream", "upi_stop")
    }


def test_airflow_lists_the_provider_and_its_connection_type(airflow: AirflowHome):
    """Registered through the ``apache_airflow_provider`` entry point (pyproject.toml), with
    provider.yaml's fields valid against Airflow's own schema."""
    found = airflow.python(
        "import json, importlib.resources as r, jsonschema\n"
        "from airflow.providers_manager import ProvidersManager\n"
        "from srt_airflow import get_provider_info\n"
        "pm = ProvidersManager()\n"
        "schema = json.loads((r.files('airflow') / 'provider_info.schema.json').read_text())\n"
        "jsonschema.validate(get_provider_info(), schema)\n"
        "pm.initialize_providers_hooks()\n"
        "hook = pm.hooks.get('srt')\n"
        "print(json.dumps({'providers': sorted(pm.providers),\n"
        "  'hook': None if hook is None else hook.hook_class_name,\n"
        "  'hidden': pm.field_behaviours.get('srt', {}).get('hidden_fields'),\n"
        "  'fields': sorted(k for k in pm.connection_form_widgets if 'srt' in k),\n"
        "  'triggers': sorted(t.trigger_class_name for t in pm.trigger)}))"
    )
    assert "stateful-runtime" in found["providers"]
    assert found["hook"] == "srt_airflow.hooks.srt.SrtHook"
    assert found["hidden"] == ["host", "port", "schema", "login"]
    assert "extra__srt__srt_home" in found["fields"]
    assert "srt_airflow.triggers.srt" in found["triggers"]
