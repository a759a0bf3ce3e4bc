"""dbt models on sink tables, loaded by dagster-dbt in the same code location (optional extra:
``pip install 'stateful-runtime[dbt]'``).

``srt dbt sources JOB_FILE`` generates the dbt sources of a job's sink tables with
``meta.dagster.asset_key`` set to the sink-table assets' keys, so dagster-dbt draws one lineage
graph: job → sink table → dbt models. This module adds what the streaming side needs:

* :class:`StreamingDbtTranslator` — models run by automation (:meth:`AutomationCondition.eager`
  by default: a model runs when the stream's table materialises, which the health sensor
  reports as the job commits; pass ``automation_condition=AutomationCondition.on_cron(...)``
  to batch them), in their own group;
* :func:`prepare_manifest` — the manifest at definition load, without network (``dbt parse``
  only when it is missing or older than a project file).

Example (examples/definitions.py)::

    project = DbtProject(EXAMPLES / "dbt_upi")
    prepare_manifest(project)

    @dbt_assets(manifest=project.manifest_path, project=project,
                dagster_dbt_translator=StreamingDbtTranslator())
    def upi_models(context, dbt: DbtCliResource):
        yield from dbt.cli(["build"], context=context).stream()
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dagster import AssetCheckSpec, AssetSpec, AutomationCondition
from dagster_dbt import (
    DagsterDbtTranslator,
    DagsterDbtTranslatorSettings,
    DbtCliResource,
    DbtProject,
)
from dagster_dbt.dbt_project import DagsterDbtProjectPreparer

EAGER = AutomationCondition.eager()
# A dbt test runs in the same run as its model when automation requests the model. (Dagster
# adds a model's checks to an automated run only if no other requested check has a condition;
# the sink tables' checks do, and share the tick.)
WITH_THE_MODEL = AutomationCondition.any_deps_match(AutomationCondition.will_be_requested())


class StreamingDbtTranslator(DagsterDbtTranslator):
    """dagster-dbt's translator with automation for models downstream of streams.

    Args:
        automation_condition: when models (and seeds, snapshots) run; default
            ``AutomationCondition.eager()``: after any upstream asset — a sink table the
            stream commits to — materialises, once nothing upstream is running. None: by hand.
        group_name: the models' asset group (a model's ``meta.dagster.group`` still wins).
        settings: dagster-dbt's settings (dbt tests are asset checks by default).
    """

    def __init__(
        self,
        *,
        automation_condition: AutomationCondition | None = EAGER,
        group_name: str | None = "analytics",
        settings: DagsterDbtTranslatorSettings | None = None,
    ) -> None:
        # dbt tests on sources (the sink tables) are asset checks of those tables; else each
        # `dbt build` logs them as observations with a warning per test.
        super().__init__(
            settings=settings or DagsterDbtTranslatorSettings(enable_source_tests_as_checks=True)
        )
        self._automation = automation_condition
        self._group = group_name

    def get_automation_condition(
        self, dbt_resource_props: Mapping[str, Any]
    ) -> AutomationCondition | None:
        if dbt_resource_props.get("resource_type") in ("model", "seed", "snapshot"):
            return self._automation
        return super().get_automation_condition(dbt_resource_props)

    def get_asset_check_spec(
        self,
        asset_spec: AssetSpec,
        manifest: Mapping[str, Any],
        unique_id: str,
        project: DbtProject | None,
    ) -> AssetCheckSpec | None:
        spec = super().get_asset_check_spec(asset_spec, manifest, unique_id, project)
        if spec is None:
            return None
        if not spec.description:
            spec = spec._replace(description=describe_test(manifest, unique_id))
        if self._automation is None or spec.automation_condition is not None:
            return spec
        return spec._replace(automation_condition=WITH_THE_MODEL)

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        return super().get_group_name(dbt_resource_props) or self._group


# What a failure of dbt's generic tests means, and what to look at.
_GENERIC = {
    "not_null": "{col} of {model} has no nulls; a failure lists the rows with a null "
    "(compiled SQL in the run's dbt logs).",
    "unique": "{col} of {model} is unique; a failure counts the duplicated values: the same "
    "key written twice.",
    "accepted_values": "{col} of {model} takes only the accepted values.",
    "relationships": "every {col} of {model} exists in the referenced table.",
}


def describe_test(manifest: Mapping[str, Any], unique_id: str) -> str:
    """A dbt test's description: the one the project gives it (``description:``, or
    ``meta.description``), else what a generic test checks, said of its column and model."""
    node = manifest["nodes"].get(unique_id) or {}
    given = node.get("description") or (node.get("meta") or {}).get("description")
    if given:
        return str(given)
    test = node.get("test_metadata") or {}
    kwargs = test.get("kwargs") or {}
    parent = next(iter((node.get("depends_on") or {}).get("nodes") or []), "")
    model = parent.rpartition(".")[2] or "the model"
    col = f"`{kwargs['column_name']}`" if kwargs.get("column_name") else "the row"
    template = _GENERIC.get(str(test.get("name")))
    if template:
        return template.format(col=col, model=model)
    return f"dbt test {node.get('name', unique_id)} on {model}: passes when it returns no rows."


def sink_database(warehouse: Any) -> Path:
    """The DuckDB file a ``warehouse`` resource points sink tables at: what a dbt-duckdb
    profile attaches (:mod:`dbt_sink.dbt_attach`) as the sources' database."""
    kind = getattr(warehouse, "kind", "duckdb")
    if kind != "duckdb":
        from dagster_defs._specs import config_error

        raise config_error(
            f"sink_database: the warehouse is {kind}, not duckdb; point the "
            f"dbt profile at it with that warehouse's own adapter"
        )
    return Path(warehouse.path).resolve()


def dbt_executable() -> str:
    """The ``dbt`` installed with this Python (the project's venv), else ``dbt`` on PATH: a
    ``dagster dev`` started by path has no activated venv."""
    exe = Path(sys.executable).with_name("dbt")
    return str(exe) if exe.exists() else "dbt"


def dbt_resource(project: DbtProject, **kwargs: Any) -> DbtCliResource:
    """dagster-dbt's CLI resource for ``project`` with :func:`dbt_executable`."""
    kwargs.setdefault("dbt_executable", dbt_executable())
    return DbtCliResource(project_dir=project, **kwargs)


class _Preparer(DagsterDbtProjectPreparer):
    """dagster-dbt's preparer (a guard against two processes parsing at once, partial parsing)
    with :func:`dbt_executable`."""

    def _prepare_manifest(self, project: DbtProject) -> None:
        dbt_resource(project).cli(
            self._prepare_project_cli_args, target_path=project.target_path
        ).wait()
        self._invalidate_seeds_in_partial_parse(project)


def stale_manifest(project: DbtProject) -> str | None:
    """Why ``project``'s manifest must be parsed again: missing, or older than a file of the
    project (a model, a YAML file, the project or profile file); None if it is current."""
    manifest = project.manifest_path
    if not manifest.exists():
        return f"{manifest} is missing"
    made = manifest.stat().st_mtime
    root = Path(project.project_dir).resolve()
    target = (root / project.target_path).resolve()  # relative to the project, or absolute
    for path in root.rglob("*"):
        if path.suffix in (".sql", ".yml", ".yaml", ".csv", ".py") and target not in path.parents:
            if path.stat().st_mtime > made:
                return f"{path.relative_to(root)} changed after {manifest.name} was made"
    return None


def prepare_manifest(project: DbtProject) -> None:
    """Make ``project.manifest_path`` current at definition load without parsing when it is:
    ``dbt parse`` (no network for a project without packages) runs only when the manifest is
    missing or older than a project file (an edit shows on ``dagster dev``'s reload).
    ``platform/bootstrap.sh dev`` makes it once, so loading the definitions parses nothing
    (dagster-dbt's ``prepare_if_dev`` parsed at every load under ``dagster dev``, in every
    process that loads the code). A deployment ships the manifest (``dagster-dbt project
    prepare-and-package``)."""
    why = stale_manifest(project)
    if why is None:
        return
    import logging

    log = logging.getLogger(__name__)
    log.info("dbt parse of %s: %s", project.project_dir, why)
    if not project.manifest_path.exists():
        _Preparer().prepare(project)
        return
    try:
        _Preparer().prepare(project)
    except Exception as exc:  # noqa: BLE001 - any failure: the manifest there still loads
        # Another process holding the parse lock (dagster dev's processes load the code at
        # once), or a project that does not parse: the manifest there is used as it is.
        log.warning(
            "dbt parse of %s failed (%s); using %s as it is",
            project.project_dir,
            exc,
            project.manifest_path,
        )
