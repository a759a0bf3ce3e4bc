"""ARCHITECTURE.md's code map names every module of the four packages, and only modules that
exist: one table per package, each module in backticks, as a path inside its package."""

from __future__ import annotations

import re

from tests.helpers import ROOT

PACKAGES = ("stateful_runtime", "dagster_defs", "dbt_sink", "srt_airflow")
_HEADING = re.compile(r"^### `(?P<package>\w+)/`")
_NAMED = re.compile(r"`(?P<path>[\w/]+\.py)`")


def _mapped() -> dict[str, set[str]]:
    """Package -> the module paths its code-map table names (first column only)."""
    text = (ROOT / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Code map") :]
    section = section[: section.index("\n## ", 1)]
    out: dict[str, set[str]] = {}
    package = None
    for line in section.splitlines():
        if m := _HEADING.match(line):
            package = m.group("package")
            out[package] = set()
        elif package and line.startswith("| `"):
            first = line.split("|")[1]
            out[package] |= {m.group("path") for m in _NAMED.finditer(first)}
    return out


def _modules(package: str) -> set[str]:
    root = ROOT / package
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*.py")
        if p.name != "__init__.py" or p.parent == root
    }


def test_the_code_map_names_every_module_and_nothing_else():
    mapped = _mapped()
    assert sorted(mapped) == sorted(PACKAGES)
    for package in PACKAGES:
        modules = _modules(package)
        assert mapped[package] - modules == set(), f"{package}: named but not there"
        assert modules - mapped[package] == set(), f"{package}: there but not in the code map"
