"""A job process's exit: the SparkContext stops cleanly first, then the JVM is killed instead
of waiting for its own shutdown (0.37 s on this machine) when its temporary files are the
process's scratch; a JVM that writes a file as it exits (a class-archive dump, a flight
recording) keeps the orderly exit."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import atexit
    seen = {}
    def report():  # registered first, so it runs after the session's own exit handler
        print("jvm-exit", seen["proc"].returncode, flush=True)
    atexit.register(report)
    from stateful_runtime.runtime.session import build_session
    spark = build_session(1, "local[1]")
    seen["proc"] = spark.sparkContext._gateway.proc
    assert spark.range(0, 100).selectExpr("sum(id) AS s").collect()[0].s == 4950
""")


def _run(tmp_path, **env) -> str:
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "TMPDIR": str(tmp_path), **env})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("jvm-exit")]
    return line


def test_the_jvm_is_killed_once_its_context_stopped(tmp_path):
    line = _run(tmp_path)
    assert line == "jvm-exit -9", line
    # Nothing of the JVM or its workers outlived the process: the scratch is gone too.
    assert [p.name for p in (tmp_path / f"srt-spark-{os.getuid()}").iterdir()] == []


def test_a_class_archive_dump_keeps_the_orderly_exit(tmp_path):
    archive = tmp_path / "dump.jsa"
    line = _run(tmp_path, SRT_CLASS_ARCHIVE_DUMP=str(archive))
    assert line == "jvm-exit 0", line
    assert archive.stat().st_size > 0  # written in the JVM's own shutdown


def test_a_flight_recording_is_written_at_exit(tmp_path):
    recording = tmp_path / "job.jfr"
    line = _run(tmp_path, JAVA_TOOL_OPTIONS=f"-XX:StartFlightRecording=filename={recording}")
    assert line == "jvm-exit 0", line
    assert recording.stat().st_size > 0
