"""The provider's door to the runtime: ``srt ... --json`` as a child process (the real
``srt``), secrets only in its environment, the runtime's errors as typed errors (no Airflow in
this process)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from srt_airflow._client import SrtClient
from srt_airflow.errors import SrtAirflowError, from_process
from stateful_runtime.contract import ErrorKind, Explain
from stateful_runtime.masking import ENV_VAR, holds_secret
from tests.helpers import EXAMPLES

UPI = str(EXAMPLES / "upi_per_minute.py")
SECRET = "hunter2-the-password"

_keys = st.sampled_from(
    [
        "sink.password",
        "kafka.sasl.password",
        "source.api_key",
        "sink.dsn",
        "source.log_dir",
        "sink.database",
        "checkpoint.dir",
        "parallelism",
    ]
)
_values = st.one_of(
    st.text(min_size=1, max_size=12),
    st.builds(
        "postgresql://srt:{}@db:5432/srt".format,
        st.text("abcdefghijklmnopqrstuvwxyz0123456789", min_size=4, max_size=12),
    ),
)


@given(config=st.dictionaries(_keys, _values, max_size=6))
def test_no_secret_reaches_the_command_line_and_every_one_reaches_the_environment(config):
    client = SrtClient(home="/h", working_directory="/w", secrets={"sink.password": SECRET})
    argv = client.command(["launch", UPI, *client.set_args(config)])
    env = client.environment(config)
    hidden = json.loads(env[ENV_VAR])
    for key, value in {"sink.password": SECRET, **config}.items():
        if holds_secret(key, value):
            assert not [a for a in argv if a.startswith(f"{key}=")], key
            assert hidden[key] == value
        else:
            assert f"{key}={value}" in argv
            assert key not in hidden
    assert SECRET not in " ".join(argv)


def test_a_job_config_secret_goes_to_srt_in_its_environment_and_srt_uses_it(
    srt_home: Path, tmp_path: Path
):
    client = SrtClient(home=str(srt_home), working_directory=str(tmp_path))
    config = {"sink.password": SECRET, "source.log_dir": str(tmp_path / "log")}
    args = ["explain", UPI, "--no-spark", *client.set_args(config)]
    assert SECRET not in " ".join(client.command(args))
    plan = Explain.from_json(client.run_json(args, timeout=120, config=config))
    assert plan.job == "upi-per-minute"
    assert SECRET not in plan.text


def test_the_runtimes_error_comes_back_typed_with_its_advice_and_secrets_masked(
    srt_home: Path, tmp_path: Path
):
    client = SrtClient(home=str(srt_home), working_directory=str(tmp_path))
    config = {"sink.password": SECRET, "no.such_key": 1}
    with pytest.raises(SrtAirflowError) as caught:
        client.run_json(
            ["explain", UPI, "--no-spark", *client.set_args(config)], timeout=120, config=config
        )
    assert caught.value.kind is ErrorKind.CONFIG_ERROR
    assert "no.such_key" in str(caught.value)
    assert SECRET not in str(caught.value) and SECRET not in " ".join(caught.value.command)


def test_the_event_loop_variant_answers_the_same(srt_home: Path, tmp_path: Path):
    client = SrtClient(home=str(srt_home), working_directory=str(tmp_path))
    assert asyncio.run(client.arun_json(["status", "never-ran"], timeout=120)) == []
    with pytest.raises(SrtAirflowError) as caught:
        asyncio.run(client.arun_json(["stop", "never-ran"], timeout=120))
    assert caught.value.kind is ErrorKind.JOB_ERROR
    assert "never-ran" in str(caught.value)


def test_an_srt_that_cannot_start_says_where_to_point_the_connection(tmp_path: Path):
    client = SrtClient(home="/h", working_directory=str(tmp_path), executable="/nonexistent/srt")
    with pytest.raises(SrtAirflowError, match="srt_executable") as caught:
        client.run_json(["status"], timeout=10)
    assert caught.value.kind is ErrorKind.PROCESS_ERROR
    with pytest.raises(SrtAirflowError, match="srt_executable"):
        asyncio.run(client.arun_json(["status"], timeout=10))


@given(st.text(max_size=300))
def test_any_stderr_of_a_failed_command_becomes_an_error_never_a_crash(stderr: str):
    error = from_process("srt x", ["srt", "x"], 2, stderr)
    assert isinstance(error, SrtAirflowError) and error.returncode == 2
    if not stderr.strip():
        assert "no output" in str(error)


def test_the_json_error_line_wins_over_a_traceback_before_it():
    line = json.dumps({"error": {"type": "UpgradeError", "message": "m", "stage": "restore"}})
    error = from_process("srt upgrade", ["srt"], 2, f"Traceback...\nboom\n{line}\n")
    assert error.kind is ErrorKind.UPGRADE_ERROR and error.details == {"stage": "restore"}
