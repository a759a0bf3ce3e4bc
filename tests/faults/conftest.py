"""Fault-injection suite: every trial is compared with an oracle computed from the input.

Trials record their outcome through the ``trials`` fixture into
``tests/artifacts/faults/<run>.json`` (gitignored); ``python -m tests.faults.report`` renders
RELIABILITY.md from those files.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.faults.harness import TrialLog


@pytest.fixture(scope="session")
def trials() -> Iterator[TrialLog]:
    log = TrialLog.open("pytest")
    yield log
    log.close()
