"""The `srt` command line, run as the real console script."""

from __future__ import annotations

from stateful_runtime.checkpoints.layout import claim
from tests.helpers import EXAMPLES, srt

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
