"""The dbt glue without running dbt: when definition load would parse the project."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from dagster_dbt import DbtProject

from dagster_defs.dbt import describe_test, stale_manifest
from tests.helpers import EXAMPLES


def test_the_manifest_is_parsed_only_when_missing_or_older_than_the_project(tmp_path: Path):
    project_dir = tmp_path / "dbt_upi"
    shutil.copytree(EXAMPLES / "dbt_upi", project_dir, ignore=shutil.ignore_patterns("target"))
    project = DbtProject(project_dir)
    assert "missing" in (stale_manifest(project) or "")
    project.manifest_path.parent.mkdir(parents=True, exist_ok=True)
    project.manifest_path.write_text("{}")
    assert stale_manifest(project) is None  # made after every file: nothing to parse
    model = project_dir / "models" / "merchant_day.sql"
    later = project.manifest_path.stat().st_mtime + 5
    os.utime(model, (later, later))
    assert stale_manifest(project) == (
        "models/merchant_day.sql changed after manifest.json was made"
    )
    # Files under target/ and dbt's logs never count.
    os.utime(model, (later - 10, later - 10))
    (project_dir / "target" / "compiled.sql").write_text("select 1")
    assert stale_manifest(project) is None


def test_a_dbt_test_without_a_description_gets_one_from_its_generic_test():
    manifest = {
        "nodes": {
            "test.p.not_null_m_c.1": {
                "name": "not_null_m_c",
                "description": "",
                "test_metadata": {"name": "not_null", "kwargs": {"column_name": "c"}},
                "depends_on": {"nodes": ["model.p.m"]},
            },
            "test.p.given.2": {"name": "given", "description": "said by the project"},
        }
    }
    assert describe_test(manifest, "test.p.not_null_m_c.1").startswith("`c` of m has no nulls")
    assert describe_test(manifest, "test.p.given.2") == "said by the project"
