"""The ``srt`` connection and its hook, in a fresh interpreter with Airflow (connections
given as ``AIRFLOW_CONN_*`` environment variables, Airflow's own secrets backend). One
interpreter answers every case (Airflow takes seconds to import); each test checks one."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.srt_airflow.helpers import AirflowHome

pytestmark = pytest.mark.airflow

PASSWORD = "s3cret-from-airflow"

_CASES = """
import json
from srt_airflow.errors import SrtAirflowError
from srt_airflow.hooks.srt import SrtHook, config_from_connections

def client(conn_id):
    hook = SrtHook(srt_conn_id=conn_id)
    try:
        c = hook.client
    except Exception as exc:
        return {"error": f"{type(exc).__name__}: {exc}"}
    env = c.environment({"sink.dsn": "postgresql://u@db/x"})
    return {"home": c.home, "work": c.working_directory, "master": c.master,
        "secrets": dict(c.secrets), "hidden": env.get("SRT_SECRET_SETS"),
        "s3": env.get("SRT_S3_ENDPOINT_URL"), "status": hook.status("never-ran")}

def config(ref):
    try:
        return config_from_connections({"sink.password": ref})
    except SrtAirflowError as exc:
        return str(exc)

print(json.dumps({
    "full": client("streams"),
    "legacy": client("legacy"),
    "default": client("srt_default"),
    "missing": client("no_such_conn"),
    "broken": client("broken"),
    "not_json": client("not_json"),
    "from_pg": config("warehouse_pg.password"),
    "no_field": config("warehouse_pg"),
    "no_host": config("warehouse_pg.host"),
}))
"""


@pytest.fixture(scope="module")
def answers(tmp_path_factory: pytest.TempPathFactory, srt_home: Path) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("airflow-hook")
    home = AirflowHome(root=root, srt_home=srt_home, work=root)
    full = {
        "conn_type": "srt",
        "password": PASSWORD,
        "extra": {
            "srt_home": str(srt_home),
            "working_directory": str(root),
            "master": "local[2]",
            "password_key": "kafka.sasl.password",
            "env": json.dumps({"SRT_S3_ENDPOINT_URL": "http://127.0.0.1:9"}),
        },
    }
    legacy = {"conn_type": "srt", "password": PASSWORD, "extra": {"extra__srt__srt_home": "/x"}}
    pg = {"conn_type": "postgres", "login": "srt", "password": PASSWORD}
    found = home.python(
        _CASES,
        AIRFLOW_CONN_STREAMS=json.dumps(full),
        AIRFLOW_CONN_LEGACY=json.dumps(legacy),
        AIRFLOW_CONN_WAREHOUSE_PG=json.dumps(pg),
        AIRFLOW_CONN_BROKEN=json.dumps({"conn_type": "srt", "extra": {"env": "[1, 2]"}}),
        AIRFLOW_CONN_NOT_JSON=json.dumps({"conn_type": "srt", "extra": {"env": "A=1"}}),
        AIRFLOW_CONN_SRT_DEFAULT="",
        SRT_HOME=str(srt_home),
    )
    found["root"] = str(root)
    return found


def test_the_connection_places_srt_and_its_password_fills_the_named_job_key(answers, srt_home):
    got = answers["full"]
    assert got["home"] == str(srt_home) and got["work"] == answers["root"]
    assert got["master"] == "local[2]"
    assert got["secrets"] == {"kafka.sasl.password": PASSWORD}
    assert json.loads(got["hidden"]) == {"kafka.sasl.password": PASSWORD}
    assert got["s3"] == "http://127.0.0.1:9"
    assert got["status"] is None  # the real srt answered: this registry never ran it


def test_the_password_fills_sink_password_by_default_and_older_form_keys_are_read(answers):
    assert answers["legacy"]["secrets"] == {"sink.password": PASSWORD}
    assert answers["legacy"]["home"] == "/x"


def test_without_an_srt_default_connection_the_machines_registry_is_used(answers, srt_home):
    assert answers["default"]["home"] == str(srt_home)
    assert answers["default"]["secrets"] == {}


def test_a_named_connection_that_does_not_exist_fails(answers):
    assert "no_such_conn" in answers["missing"]["error"]


def test_a_connection_with_a_wrong_env_says_what_to_give(answers):
    for case in ("broken", "not_json"):
        assert "'env' must be a JSON object" in answers[case]["error"]
        assert "SRT_S3_ENDPOINT_URL" in answers[case]["error"]


def test_config_from_connections_reads_other_connections_and_says_what_is_wrong(answers):
    assert answers["from_pg"] == {"sink.password": PASSWORD}
    assert "give CONN_ID.FIELD" in answers["no_field"]
    assert "has no 'host'" in answers["no_host"]
