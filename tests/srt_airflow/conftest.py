"""The Airflow tests' fixtures (their helpers are in helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.srt_airflow.helpers import AirflowHome


@pytest.fixture(scope="module")
def airflow_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowHome]:
    """A migrated Airflow metadata database (SQLite) in a tmp directory, the example DAGs, and
    ``srt_default`` pointing at a registry of its own (the session's holds other tests' jobs
    and savepoints of the same job name); components started by a test are stopped at the end
    of the module."""
    root = tmp_path_factory.mktemp("airflow")
    work = tmp_path_factory.mktemp("airflow-work")
    srt_home = tmp_path_factory.mktemp("airflow-srt-home")
    home = AirflowHome(root=root, srt_home=srt_home, work=work)
    home.airflow("db", "migrate")
    yield home
    home.stop_all()
