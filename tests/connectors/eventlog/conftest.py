"""Fixtures of the event-log tests."""

from __future__ import annotations

import signal
import subprocess

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import VENV_BIN, free_port


@pytest.fixture
def served(tmp_path, srt_env):
    """`srt log serve` on topic ``socket`` (2 partitions, keyed by ``k``): its port and log dir."""
    log_dir = tmp_path / "log"
    EventLog(log_dir).create_topic("socket", 2)
    port = free_port()
    proc = subprocess.Popen(
        [
            str(VENV_BIN / "srt"),
            "log",
            "serve",
            "socket",
            "--port",
            str(port),
            "--key-field",
            "k",
            "--log-dir",
            str(log_dir),
        ],
        env=srt_env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on" in proc.stdout.readline()
        yield port, log_dir
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
