"""The tests' own layout: tests/ mirrors the packages, and helpers live in helpers modules.

A test file sits in the directory of the package it tests (tests/test_planner.py for
stateful_runtime/planner.py, tests/checkpoints/ for stateful_runtime/checkpoints/,
tests/dagster_defs/, tests/dbt_sink/ and tests/srt_airflow/ for those packages); tests/faults/
is the fault suite, run on its own (RELIABILITY.md). conftest.py files hold fixtures and hooks
only, which pytest injects by name: nothing imports a conftest or a test module.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import ROOT

TESTS = ROOT / "tests"
TOP_LEVEL_PACKAGES = ("dagster_defs", "dbt_sink", "srt_airflow")


def _package_dir(test_dir: Path) -> Path:
    """The package directory a directory under tests/ stands for."""
    parts = test_dir.relative_to(TESTS).parts
    if parts and parts[0] in TOP_LEVEL_PACKAGES:
        return ROOT.joinpath(*parts)
    return ROOT.joinpath("stateful_runtime", *parts)


def _python_files() -> list[Path]:
    # Not what lies in hidden directories: the benchmarks' peer venvs (`run.py setup`).
    return sorted(
        p
        for base in (TESTS, ROOT / "benchmarks")
        for p in base.rglob("*.py")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    )


def _imported_modules(path: Path) -> list[str]:
    """Every module ``path`` imports, relative imports resolved against its package."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append(base)
            found += [f"{base}.{alias.name}" for alias in node.names]
    return found


def test_every_test_file_sits_in_a_directory_of_the_packages():
    misplaced = [
        str(path.relative_to(ROOT))
        for path in sorted(TESTS.rglob("test_*.py"))
        if path.relative_to(TESTS).parts[0] != "faults" and not _package_dir(path.parent).is_dir()
    ]
    assert not misplaced, f"test files outside the packages' directories: {misplaced}"


def test_nothing_imports_a_conftest_or_a_test_module():
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in _python_files()
        for module in _imported_modules(path)
        if module.split(".")[-1] == "conftest"
        or (module.startswith("tests.") and module.split(".")[-1].startswith("test_"))
    ]
    assert not offenders, "shared test code belongs in a helpers module:\n" + "\n".join(offenders)


def _is_fixture(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return isinstance(target, ast.Attribute) and target.attr == "fixture"


def test_conftest_files_hold_only_fixtures_and_hooks():
    others = []
    for path in sorted(TESTS.rglob("conftest.py")):
        for node in ast.parse(path.read_text(), str(path)).body:
            if isinstance(node, ast.ClassDef):
                others.append(f"{path.relative_to(ROOT)}: class {node.name}")
            elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                if not node.name.startswith("pytest_") and not any(
                    _is_fixture(d) for d in node.decorator_list
                ):
                    others.append(f"{path.relative_to(ROOT)}: def {node.name}")
    assert not others, "helpers belong in a helpers module, not in conftest.py:\n" + "\n".join(
        others
    )
