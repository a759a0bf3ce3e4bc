"""The ``srt`` connection and its hook, in a fresh interpreter with Airflow (connections
given as ``AIRFLOW_CONN_*`` environment variables, Airflow's own secrets backend)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.srt_airflow.helpers import AirflowHome

pytestmark = pytest.mark.airflow

PASSWORD = "s3cret-from-airflow"


@pytest.fixture
def airflow(tmp_path: Path, srt_home: Path) -> AirflowHome:
    """Airflow's configuration in a tmp directory (the hook needs no metadata database)."""
    return AirflowHome(root=tmp_path, srt_home=srt_home, work=tmp_path)


def _conn(**fields) -> str:
    return json.dumps({"conn_type": "srt", **fields})


_CLIENT = """
import json
from srt_airflow.hooks.srt import SrtHook
hook = SrtHook(srt_conn_id=%r)
c = hook.client
env = c.environment({"sink.dsn": "postgresql://u@db/x"})
print(json.dumps({"home": c.home, "work": c.working_directory, "master": c.master,
    "secrets": dict(c.secrets), "env": dict(c.env), "hidden": env.get("SRT_SECRET_SETS"),
    "s3": env.get("SRT_S3_ENDPOINT_URL"), "status": hook.status("never-ran")}))
"""


def test_the_connection_places_srt_and_its_password_fills_the_named_job_key(
    airflow: AirflowHome, tmp_path: Path
):
    conn = _conn(
        password=PASSWORD,
        extra={
            "srt_home": str(airflow.srt_home),
            "working_directory": str(tmp_path),
            "master": "local[2]",
            "password_key": "kafka.sasl.password",
            "env": json.dumps({"SRT_S3_ENDPOINT_URL": "http://127.0.0.1:9"}),
        },
    )
    got = airflow.python(_CLIENT % "streams", AIRFLOW_CONN_STREAMS=conn)
    assert got["home"] == str(airflow.srt_home) and got["work"] == str(tmp_path)
    assert got["master"] == "local[2]"
    assert got["secrets"] == {"kafka.sasl.password": PASSWORD}
    assert json.loads(got["hidden"]) == {"kafka.sasl.password": PASSWORD}
    assert got["s3"] == "http://127.0.0.1:9"
    assert got["status"] is None  # the real srt answered: this registry never ran it


def test_the_password_fills_sink_password_by_default_and_older_form_keys_are_read(
    airflow: AirflowHome,
):
    conn = _conn(password=PASSWORD, extra={"extra__srt__srt_home": str(airflow.srt_home)})
    got = airflow.python(_CLIENT % "streams", AIRFLOW_CONN_STREAMS=conn)
    assert got["secrets"] == {"sink.password": PASSWORD}
    assert got["home"] == str(airflow.srt_home)


def test_without_an_srt_default_connection_the_machines_registry_is_used(airflow: AirflowHome):
    got = airflow.python(
        _CLIENT % "srt_default", AIRFLOW_CONN_SRT_DEFAULT="", SRT_HOME=str(airflow.srt_home)
    )
    assert got["home"] == str(airflow.srt_home) and got["secrets"] == {}


def test_a_named_connection_that_does_not_exist_fails(airflow: AirflowHome):
    with pytest.raises(AssertionError, match="isn't defined|not defined|NotFound"):
        airflow.python(_CLIENT % "no_such_conn")


def test_config_from_connections_reads_other_connections_and_says_what_is_wrong(
    airflow: AirflowHome,
):
    pg = json.dumps({"conn_type": "postgres", "login": "srt", "password": PASSWORD})
    got = airflow.python(
        "import json\n"
        "from srt_airflow.hooks.srt import config_from_connections\n"
        "from srt_airflow.errors import SrtAirflowError\n"
        "out = {'ok': config_from_connections({'sink.password': 'warehouse_pg.password'})}\n"
        "for bad in ('warehouse_pg', 'warehouse_pg.host'):\n"
        "    try:\n"
        "        config_from_connections({'sink.password': bad})\n"
        "    except SrtAirflowError as exc:\n"
        "        out[bad] = str(exc)\n"
        "print(json.dumps(out))",
        AIRFLOW_CONN_WAREHOUSE_PG=pg,
    )
    assert got["ok"] == {"sink.password": PASSWORD}
    assert "give CONN_ID.FIELD" in got["warehouse_pg"]
    assert "has no 'host'" in got["warehouse_pg.host"]
