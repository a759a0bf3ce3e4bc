"""The Dagster tests' fixtures (their helpers are in helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dagster_defs.helpers import Live, live_job


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, srt_env: dict[str, str]) -> Iterator[Live]:
    with live_job(tmp_path_factory.mktemp("upi-dagster"), srt_env["SRT_HOME"]) as state:
        yield state
