"""The Dagster definitions load without Spark, GX or network work."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_definitions_load_without_importing_spark():
    code = ("import sys; import dagster_defs.definitions as d; "
            "assert d.defs.resources['streaming_runtime'] is not None; "
            "heavy = [m for m in ('pyspark', 'great_expectations') if m in sys.modules]; "
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == ""


def test_workspace_validates():
    from tests.conftest import VENV_BIN

    out = subprocess.run([str(VENV_BIN / "dagster"), "definitions", "validate", "-w", "workspace.yaml"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
