"""The Dagster tests' fixtures (their helpers are in helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.dagster_defs.helpers import Live, Webserver, live_job, start_webserver
from tests.helpers import free_port, poll


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory, srt_env: dict[str, str]) -> Iterator[Live]:
    with live_job(tmp_path_factory.mktemp("upi-dagster")) as state:
        yield state


@pytest.fixture
def webserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webserver]:
    """A real dagster-webserver on a free port (its instance on SQLite in a tmp dir)."""
    server = start_webserver(tmp_path_factory.mktemp("dagster-webserver"), free_port())
    try:
        poll(
            lambda: server.serving() or server.proc.poll() is not None,
            300,
            "dagster-webserver to serve",
        )
        assert server.proc.poll() is None, server.log.read_text()[-3000:]
        yield server
    finally:
        server.stop()
