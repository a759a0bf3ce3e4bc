"""The exception tree drawn in ``stateful_runtime.exceptions``' docstring is the real one: every
error class the four packages define is in it, under its real parent, and nothing else is."""

from __future__ import annotations

import importlib
import pkgutil
import re

from stateful_runtime import exceptions
from stateful_runtime.exceptions import StatefulRuntimeError

PACKAGES = ("stateful_runtime", "dagster_defs", "dbt_sink", "srt_airflow")
# The Airflow provider's errors are all in srt_airflow.errors; its other modules import Airflow,
# which configures logging and creates ~/airflow at import: not in the tests' process.
IMPORTED_ALONE = {"srt_airflow": ("srt_airflow.errors",)}
_LINE = re.compile(r"^(?P<prefix>[ │├└─]*)(?P<name>[A-Z]\w+)(?:\s|$)")
_MODULE = re.compile(r"\[(?P<module>[\w.]+)\]")


def _drawn() -> tuple[dict[str, str | None], dict[str, str]]:
    """Class name -> parent name as the docstring's tree draws them, and class name -> the
    module named in brackets beside it (the classes defined outside the exceptions module)."""
    doc = exceptions.__doc__ or ""
    tree = doc[doc.index("    StatefulRuntimeError") : doc.index("\n\n", doc.index("└──"))]
    parents: dict[str, str | None] = {}
    modules: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    name = ""
    for line in tree.splitlines():
        line = line[4:]
        m = _LINE.match(line)
        if m:
            name = m.group("name")
            depth = len(m.group("prefix"))
            while stack and stack[-1][0] >= depth:
                stack.pop()
            parents[name] = stack[-1][1] if stack else None
            stack.append((depth, name))
        if where := _MODULE.search(line):
            modules[name] = where.group("module")
    return parents, modules


def _defined() -> tuple[dict[str, str | None], dict[str, str]]:
    """Class name -> parent name, and class name -> its module where that is not the
    exceptions module, for every error class the packages define."""
    for package in PACKAGES:
        if package in IMPORTED_ALONE:
            for name in IMPORTED_ALONE[package]:
                importlib.import_module(name)
            continue
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            importlib.import_module(info.name)
    found: dict[str, str | None] = {"StatefulRuntimeError": None}
    modules: dict[str, str] = {}
    todo = [StatefulRuntimeError]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub.__module__.split(".")[0] in PACKAGES:
                found[sub.__name__] = cls.__name__
                if sub.__module__ != exceptions.__name__:
                    modules[sub.__name__] = sub.__module__
                todo.append(sub)
    return found, modules


def test_the_docstring_draws_every_error_class_under_its_parent_and_names_its_module():
    drawn_parents, drawn_modules = _drawn()
    parents, modules = _defined()
    assert drawn_parents == parents
    assert drawn_modules == modules
