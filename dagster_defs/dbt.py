"""dbt models on sink tables, loaded by dagster-dbt in the same code location (optional extra:
``pip install 'stateful-runtime[dbt]'``).

``srt dbt sources JOB_FILE`` generates the dbt sources of a job's sink tables with
``meta.dagster.asset_key`` set to the sink-table assets' keys, so dagster-dbt draws one lineage
graph: job → sink table → dbt models. This module adds what the streaming side needs:

* :class:`StreamingDbtTranslator` — models run by automation (:meth:`AutomationCondition.eager`
  by default: a model runs when the stream's table materialises, which the health sensor
  reports as the job commits; pass ``automation_condition=AutomationCondition.on_cron(...)``
  to batch them), in their own group;
* :func:`prepare_manifest` — the manifest at definition load, without network (``dbt parse``,
  only when missing or under ``dagster dev``).

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
        super().__init__(settings=settings)
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
        if spec is None or self._automation is None or spec.automation_condition is not None:
            return spec
        return spec._replace(automation_condition=WITH_THE_MODEL)

    def get_group_name(self, dbt_resource_props: Mapping[str, Any]) -> str | None:
        return super().get_group_name(dbt_resource_props) or self._group


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


def prepare_manifest(project: DbtProject) -> None:
    """Make ``project.manifest_path`` exist at definition load: under ``dagster dev``, parse
    the project again (dagster-dbt's ``prepare_if_dev``: edits show on reload); elsewhere only
    when the manifest is missing (a deployment should ship it: ``dagster-dbt project
    prepare-and-package``). ``dbt parse`` needs no network for a project without packages."""
    preparer = _Preparer()
    preparer.prepare_if_dev(project)
    if not project.manifest_path.exists():
        preparer.prepare(project)
