"""The `srt` command line, run as the real console script."""

from __future__ import annotations

import subprocess

from stateful_runtime.checkpoints.layout import claim
from tests.helpers import EXAMPLES, VENV_BIN, append_lines, srt

UPI = EXAMPLES / "upi_per_minute.py"


def test_cli_config_mistakes_exit_non_zero_with_a_message(tmp_path, srt_env):
    bad_key = srt(["run", str(UPI), "--set", "sink.tabel=x"], srt_env)
    assert bad_key.returncode == 2 and "unknown config key(s) sink.tabel" in bad_key.stderr
    missing = srt(["run", str(tmp_path / "missing.py")], srt_env)
    assert missing.returncode == 2 and "not found" in missing.stderr
    claim(tmp_path / "ck", "someone-else", ["q"])
    owned = srt(["run", str(UPI), "--set", f"checkpoint.dir={tmp_path / 'ck'}"], srt_env)
    assert owned.returncode == 2 and "belongs to job 'someone-else'" in owned.stderr
    no_topic = srt(
        [
            "run",
            str(UPI),
            "--set",
            f"source.log_dir={tmp_path / 'nolog'}",
            "--set",
            f"checkpoint.dir={tmp_path / 'ck2'}",
            "--available-now",
        ],
        srt_env,
    )
    assert no_topic.returncode == 2 and "srt log create upi-payments" in no_topic.stderr


def test_explain_cli_without_spark(tmp_path, srt_env):
    from stateful_runtime.connectors.eventlog import EventLog

    EventLog(tmp_path / "log").create_topic("upi-payments", 2)
    out = srt(
        ["explain", str(UPI), "--no-spark", "--set", f"source.log_dir={tmp_path / 'log'}"], srt_env
    )
    assert out.returncode == 0, out.stderr
    assert "query upi-counts  [path: native; output mode: update]" in out.stdout
    assert "published to the dead-letter topic 'upi-payments-dlq'" in out.stdout


def _closed_pipe_run(args: list[str], env: dict[str, str], read_first: bool) -> tuple[int, str]:
    """Run srt with its stdout a pipe whose reader goes away (`| head -1`): after one line,
    or before srt writes anything."""
    proc = subprocess.Popen(
        [str(VENV_BIN / "srt"), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    if read_first:
        assert proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read().decode()
    return proc.wait(timeout=120), err


def test_a_closed_pipe_ends_srt_quietly(tmp_path, srt_env):
    from stateful_runtime.connectors.eventlog import EventLog

    log = tmp_path / "log"
    EventLog(log).create_topic("t", 1)
    lines = [b'{"n": %d, "pad": "%s"}' % (i, b"x" * 60) for i in range(5_000)]
    append_lines(log, lines, topic="t")
    for args, read_first in (
        (["log", "read", "t", "--log-dir", str(log), "--limit", "5000"], True),
        (["log", "read", "t", "--log-dir", str(log), "--limit", "5000"], False),
        (["log", "info", "t", "--log-dir", str(log)], False),
        (["status", "--json"], False),
    ):
        code, err = _closed_pipe_run(args, srt_env, read_first)
        assert "Traceback" not in err and "BrokenPipe" not in err, (args, err)
        assert err == "" and code == 141, (args, code, err)


def test_durations_and_counts_are_refused_in_the_users_units(tmp_path, srt_env):
    for raw in ("nan", "inf", "-1"):
        out = srt(
            ["explain", str(UPI), "--no-spark", "--set", f"checkpoint.interval_s={raw}"], srt_env
        )
        assert out.returncode == 2, out.stderr
        assert "seconds" in out.stderr and "Traceback" not in out.stderr
        assert "timedelta" not in out.stderr
    for args in (
        ["wait", "j", "--timeout", "nan"],
        ["wait", "j", "--timeout", "-1"],
        ["wait", "j", "--since", "inf"],
        ["stop", "j", "--timeout", "inf"],
        ["stop", "j", "--timeout", "0"],
        ["stop", "j", "--timeout", "100000"],
        ["upgrade", "j", "new.py", "--stop-timeout", "0"],
        ["savepoint", "create", "j", "--timeout", "-5"],
        ["savepoint", "prune", "j", "--max-age", "infd"],
        ["savepoint", "prune", "j", "--max-age=-1d"],
        ["savepoint", "prune", "j", "--keep", "-1"],
        ["log", "read", "t", "--log-dir", str(tmp_path), "--limit", "-3"],
        ["log", "serve", "t", "--log-dir", str(tmp_path), "--port", "70000"],
    ):
        out = srt(args, srt_env)
        assert out.returncode == 2, (args, out.stderr)
        assert "Traceback" not in out.stderr and "give" in out.stderr, (args, out.stderr)
