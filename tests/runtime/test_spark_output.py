"""Spark's own chatter leaves `srt run`'s terminal for the job's log file: the JVM's start-up
warnings from stderr, Spark's log; the job's lines and errors stay."""

from __future__ import annotations

import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from upi_events import events

from stateful_runtime.runtime.spark_output import RunnerTracebacks, is_jvm_line
from tests.helpers import append_lines, srt

SCRIPT = """
import subprocess, sys
from stateful_runtime.runtime import spark_output
spark_output.divert(sys.argv[1])
print("[job] batch 0 | rows 10", flush=True)
# A child process (as the JVM and its Python workers are) inherits the diverted stderr.
subprocess.run([sys.executable, "-c", "import sys; sys.stderr.write('WARNING: Using incubator "
                "modules: jdk.incubator.vector\\\\nERROR: a real one\\\\n')"], check=True)
print("[job] batch 1 | rows 5", flush=True)
print("[job] query q failed: boom", file=sys.stderr, flush=True)
"""
# A log4j line of Spark's at WARN, as log4j2.properties prints it on a terminal.
SPARK_WARN = re.compile(r"^\d\d:\d\d:\d\d WARN ", re.MULTILINE)


def test_jvm_lines_go_to_the_log(tmp_path: Path):
    jvm = tmp_path / "job.log"
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(jvm)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["[job] batch 0 | rows 10", "[job] batch 1 | rows 5"]
    assert out.stderr.splitlines() == ["ERROR: a real one", "[job] query q failed: boom"]
    assert jvm.read_text() == "WARNING: Using incubator modules: jdk.incubator.vector\n"
    assert stat.S_IMODE(jvm.stat().st_mode) == 0o600  # under $SRT_HOME: private like the rest


def test_only_jvm_lines_are_recognised():
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
spark_output.divert(sys.argv[1])
print("[job] batch 0", file=sys.stderr, flush=True)
time.sleep(0.5)  # the reader of stderr (`2>&1 | head -1`) goes away here
for i in range(20_000):  # far more than a pipe holds: a writer must not block
    print(f"[job] query q failed | " + "x" * 60, file=sys.stderr, flush=True)
print("done", flush=True)
"""


def test_a_closed_terminal_is_drained_not_blocking_and_not_failing(tmp_path: Path):
    """`srt run ... 2>&1 | head`: the copying thread lost its terminal; it keeps draining the
    pipe (so the job, the JVM and the workers never block on it) and prints nothing of it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLOSED_SCRIPT, str(tmp_path / "j.log")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    assert proc.stderr.readline() == b"[job] batch 0\n"
    proc.stderr.close()
    out = proc.stdout.read().decode()
    assert proc.wait(timeout=60) == 0, out
    assert out == "done\n", out


RUNNER_SCRIPT = """
import os, socket, subprocess, sys, tempfile
from stateful_runtime.runtime import spark_output
spark_output.divert(sys.argv[1])
print("[job] stopping", file=sys.stderr, flush=True)
# Spark's source runner as a stop leaves it: the executor's end of its socket closes before
# the runner is killed (its stderr is the JVM's, which is the job's).
path = os.path.join(tempfile.mkdtemp(), "s")
server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
server.bind(path)
server.listen(1)
env = dict(os.environ, PYTHON_WORKER_FACTORY_SOCK_PATH=path)
env.pop("PYTHON_WORKER_FACTORY_SECRET", None)
runner = subprocess.Popen(
    [sys.executable, "-m", "pyspark.sql.streaming.python_streaming_source_runner"], env=env
)
connection, _ = server.accept()
connection.recv(4)  # the runner's pid
connection.close()
assert runner.wait() != 0
# A failure the runner sent the JVM, quoted in a query's error, and the job's own traceback.
print("[job] query q failed: PythonException:", file=sys.stderr)
print(sys.argv[2], file=sys.stderr)
try:
    raise ValueError("the job's own")
except ValueError:
    import traceback
    traceback.print_exc()
print("[job] stopped", file=sys.stderr, flush=True)
"""
QUOTED = """Traceback (most recent call last):
  File "/v/pyspark/sql/streaming/python_streaming_source_runner.py", line 272, in main
    partitions_func(
  File "/srt/connectors/eventlog.py", line 9, in partitions
ValueError: a source's failure"""


def test_the_source_runners_dying_traceback_goes_to_the_log_not_the_terminal(tmp_path: Path):
    """A stop closes the socket of Spark's Python source runner before it is killed: it dies
    with an EOFError and BrokenPipeErrors (the real runner's traceback here), which belong in
    the job's log; a failure it reported (quoted in a query's error) and the job's own
    traceback still reach the terminal, whole and in order."""
    jvm = tmp_path / "job.log"
    out = subprocess.run(
        [sys.executable, "-c", RUNNER_SCRIPT, str(jvm), QUOTED],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    err = out.stderr.splitlines()
    assert err[0] == "[job] stopping" and err[-1] == "[job] stopped", out.stderr
    assert "\n".join(err[1:7]) == "[job] query q failed: PythonException:\n" + QUOTED
    assert err[7] == "Traceback (most recent call last):" and err[-2].endswith("the job's own")
    assert "EOFError" not in out.stderr and "BrokenPipeError" not in out.stderr
    assert out.stderr.count("Traceback") == 2, out.stderr
    logged = jvm.read_text()
    assert "python_streaming_source_runner.py" in logged and "\nEOFError\n" in logged
    assert logged.count("During handling of the above exception") == 2, logged
    assert logged.rstrip().endswith("BrokenPipeError: [Errno 32] Broken pipe"), logged


TRACEBACK_LINES = st.sampled_from(
    [
        "Traceback (most recent call last):",
        '  File "<frozen runpy>", line 198, in _run_module_as_main',
        '  File "/v/pyspark/sql/streaming/python_streaming_source_runner.py", line 265, in main',
        '  File "/srt/job.py", line 3, in <module>',
        "    func_id = read_int(infile)",
        "             ^^^^^^^^^^^^^^^^",
        "",
        "During handling of the above exception, another exception occurred:",
        "The above exception was the direct cause of the following exception:",
        "EOFError",
        "[job] upi-counts batch 3 | rows 1,000",
    ]
)


@given(st.lists(st.one_of(TRACEBACK_LINES, st.text(max_size=30)), max_size=40))
def test_only_the_runners_dying_tracebacks_are_picked(lines: list[str]):
    """Without a frame of the runner's ``<module>``, every line comes out, in order, shown."""
    picker = RunnerTracebacks()
    raw = [line.replace("\n", " ").encode() for line in lines]
    out = [o for line in raw for o in picker.feed(line)] + picker.release()
    assert out == [(line, False) for line in raw]
