"""Spark's Python-worker lines leave the job's stdout for a log file; the job's own lines stay."""

from __future__ import annotations

import stat
import subprocess
import sys
from pathlib import Path

from stateful_runtime.runtime.worker_output import is_worker_line

SCRIPT = """
import subprocess, sys
from stateful_runtime.runtime import worker_output
worker_output.divert(sys.argv[1])
print("[job] batch 0 | rows 10", flush=True)
# A child process (as the JVM and its Python workers are) inherits the diverted stdout.
subprocess.run([sys.executable, "-c", "print('Starting Streaming TransformWithStateInPandas "
                "Python worker.\\\\n'); print('Streaming TransformWithStateInPandas Python worker "
                "Completed execution of UDF: f.\\\\n')"], check=True)
print("[job] batch 1 | rows 5", flush=True)
"""


def test_worker_lines_go_to_the_log(tmp_path: Path):
    log = tmp_path / "job.workers.log"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(log)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[job] batch 0 | rows 10", "[job] batch 1 | rows 5"]
    logged = log.read_text()
    assert "Starting Streaming TransformWithStateInPandas Python worker." in logged
    assert "Completed execution of UDF" in logged
    assert stat.S_IMODE(log.stat().st_mode) == 0o600  # under $SRT_HOME: private like the rest


def test_only_worker_lines_are_recognised():
    assert is_worker_line(b"Streaming TransformWithStateInPandas Python worker finish init")
    assert not is_worker_line(b"[upi-per-minute] upi-counts batch 3 | rows 1,000")
