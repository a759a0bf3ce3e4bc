"""Spark's own chatter leaves `srt run`'s terminal for the job's log files: Python-worker lines
from stdout, the JVM's start-up warnings from stderr, Spark's log; the job's lines and errors
stay."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from upi_events import events

from stateful_runtime.runtime.spark_output import is_jvm_line, is_worker_line
from tests.helpers import append_lines, srt

SCRIPT = """
import subprocess, sys
from stateful_runtime.runtime import spark_output
spark_output.divert(sys.argv[1], sys.argv[2])
print("[job] batch 0 | rows 10", flush=True)
# A child process (as the JVM and its Python workers are) inherits the diverted stdout/stderr.
subprocess.run([sys.executable, "-c", "print('Starting Streaming TransformWithStateInPandas "
                "Python worker.\\\\n'); print('Streaming TransformWithStateInPandas Python worker "
                "Completed execution of UDF: f.\\\\n')"], check=True)
subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('WARNING: Using incubator "
                "modules: jdk.incubator.vector\\\\nERROR: a real one\\\\n')"], check=True)
print("[job] batch 1 | rows 5", flush=True)
print("[job] query q failed: boom", file=sys.stderr, flush=True)
"""
# A log4j line of Spark's at WARN, as log4j2.properties prints it on a terminal.
SPARK_WARN = re.compile(r"^\d\d:\d\d:\d\d WARN ", re.MULTILINE)


def test_worker_and_jvm_lines_go_to_the_logs(tmp_path: Path):
    workers, jvm = tmp_path / "job.workers.log", tmp_path / "job.log"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(workers), str(jvm)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[job] batch 0 | rows 10", "[job] batch 1 | rows 5"]
    assert out.stderr.splitlines() == ["ERROR: a real one", "[job] query q failed: boom"]
    logged = workers.read_text()
    assert "Starting Streaming TransformWithStateInPandas Python worker." in logged
    assert "Completed execution of UDF" in logged
    assert jvm.read_text() == "WARNING: Using incubator modules: jdk.incubator.vector\n"
    for log in (workers, jvm):  # under $SRT_HOME: private like the rest
        assert stat.S_IMODE(log.stat().st_mode) == 0o600


def test_only_worker_and_jvm_lines_are_recognised():
    assert is_worker_line(b"Streaming TransformWithStateInPandas Python worker finish init")
    assert not is_worker_line(b"[upi-per-minute] upi-counts batch 3 | rows 1,000")
    assert is_jvm_line(b"WARNING: Using incubator modules: jdk.incubator.vector")
    assert not is_jvm_line(b"[upi-per-minute] query upi-counts failed: boom")
    assert not is_jvm_line(b"Traceback (most recent call last):")


@pytest.mark.slow
def test_srt_run_shows_the_job_and_keeps_sparks_start_up_in_the_jobs_log(upi, srt_env):
    append_lines(upi.log_dir, list(events(500, merchants=4, rate_per_s=50, seed=3)))
    log = Path(srt_env["SRT_HOME"]) / "jobs" / "upi-per-minute.log"
    before = log.stat().st_size if log.exists() else 0

    result = srt(upi.run_args("--available-now"), srt_env)
    terminal = result.stdout + result.stderr

    assert result.returncode == 0, terminal[-3000:]
    assert "upi-counts batch 0" in result.stdout and "upi_counts in" in result.stdout
    assert "Using incubator modules" not in terminal
    assert "spark.local.dir will be overridden" not in terminal
    assert not SPARK_WARN.search(terminal), terminal[-3000:]
    with log.open() as f:
        f.seek(before)
        logged = f.read()
    assert "WARNING: Using incubator modules: jdk.incubator.vector" in logged
    assert "WARN SparkConf: Note that spark.local.dir will be overridden" in logged
    assert stat.S_IMODE(log.stat().st_mode) == 0o600


CLOSED_SCRIPT = """
import sys, time
from stateful_runtime.runtime import spark_output
spark_output.divert(sys.argv[1], sys.argv[2])
print("[job] batch 0", flush=True)
time.sleep(0.5)  # the reader of stdout (`| head -1`) goes away here
for i in range(20_000):  # far more than a pipe holds: a writer must not block
    print(f"[job] batch {i} | " + "x" * 60, flush=True)
print("done", file=sys.stderr, flush=True)
"""


def test_a_closed_terminal_is_drained_not_blocking_and_not_failing(tmp_path: Path):
    """`srt run ... | head`: the copying thread lost its terminal; it keeps draining the pipe
    (so the job, the JVM and the workers never block on it) and prints nothing of it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLOSED_SCRIPT, str(tmp_path / "w.log"), str(tmp_path / "j.log")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stdout.readline() == b"[job] batch 0\n"
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert err == "done\n", err
