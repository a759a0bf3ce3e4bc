"""Fault-injection suite: every trial is compared with an oracle computed from the input.

Trials record their outcome through the ``trials`` fixture into
``tests/artifacts/faults/<run>.json`` (gitignored); ``python -m tests.faults.report`` renders
RELIABILITY.md from those files.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.harness import JAVA_OPTIONS, TrialLog


@pytest.fixture(scope="session")
def trials() -> Iterator[TrialLog]:
    log = TrialLog.open("pytest")
    yield log
    log.close()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """Keep each test's call report on the item: fixtures that record a test as a trial read
    its outcome after the test (``request.node.rep_call``)."""
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.rep_call = report  # type: ignore[attr-defined]


@pytest.fixture
def job_env(srt_env: dict[str, str]) -> dict[str, str]:
    """``srt_env`` for the job processes of a trial (see ``harness.JAVA_OPTIONS``)."""
    return {**srt_env, "JAVA_TOOL_OPTIONS": JAVA_OPTIONS}
