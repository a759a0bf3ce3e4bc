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
    if __STOP__:  # as `srt run` ends its application before the exit handlers run
        from stateful_runtime.runtime.session import stop_application
        stop_application(spark)
""")


# py4j's finalizer thread tells the JVM, over its own connection and on its own schedule, about
# each Java object's Python proxy that is collected. One sent while the JVM is being killed
# failed on receive and py4j logged an ERROR with a traceback (the UPI example: two runs of
# four); which way a send to a dying JVM fails is a matter of timing, so the test checks
# what py4j consults before sending (``garbage_collect_object`` skips a disconnected client).
LATE_GC_SCRIPT = textwrap.dedent("""
    import atexit
    seen = {}
    def after_exit():  # registered before the session's exit handler, so it runs after it
        client = seen["client"]
        print("connected", client.is_connected, flush=True)
        client.garbage_collect_object(seen["proxy"]._target_id, False)
    atexit.register(after_exit)
    from stateful_runtime.runtime.session import build_session
    spark = build_session(1, "local[1]")
    seen["proxy"] = spark._jvm.java.lang.StringBuilder("x")
    seen["client"] = spark.sparkContext._gateway._gateway_client
""")


# A JVM ending under a py4j call once the job is stopping: a signal to the job's process group
# reaches the JVM as well, and py4j reported the call the JVM did not answer with an ERROR and
# a traceback on the root logger, after "stopped by SIGTERM" (found by
# tests/runtime/test_runner_signals.py, a SIGTERM to the group before Spark started). Which way
# a call to a dying JVM fails is a matter of timing, so the test gives py4j's report itself.
JVM_ENDING_SCRIPT = textwrap.dedent("""
    import logging
    from stateful_runtime.runtime.session import jvm_ending
    def report(message):
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            logging.exception(message)  # as py4j's GatewayClient.send_command does
    report("Exception while sending command.")
    jvm_ending()
    report("Exception while sending command.")
    report("another failure")
""")


def _exec(tmp_path, script: str, **env) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path), **env},
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done


def _run(tmp_path, stop: bool = False, **env) -> str:
    done = _exec(tmp_path, SCRIPT.replace("__STOP__", repr(stop)), **env)
    (line,) = [ln for ln in done.stdout.splitlines() if ln.startswith("jvm-exit")]
    return line


@pytest.mark.parametrize("stopped_before", [False, True], ids=["at exit", "stopped before"])
def test_the_jvm_is_killed_once_its_context_stopped(tmp_path, stopped_before):
    """Whether the exit handler stops the context or the job ended its application before
    (``stop_application``, as ``srt run`` does): PySpark's own stop left the handler a context
    it could not tell from one that failed to stop, and the JVM's own shutdown was waited
    for."""
    line = _run(tmp_path, stop=stopped_before)
    assert line == "jvm-exit -9", line
    # Nothing of the JVM or its workers outlived the process: the scratch is gone too.
    assert [p.name for p in (tmp_path / f"srt-spark-{os.getuid()}").iterdir()] == []


def test_proxies_collected_after_the_jvm_is_gone_are_not_sent(tmp_path):
    done = _exec(tmp_path, LATE_GC_SCRIPT)
    assert "connected False" in done.stdout.splitlines(), done.stdout[-2000:]
    assert "Exception while sending command" not in done.stderr, done.stderr[-2000:]


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


def test_a_jvm_ending_under_a_call_is_not_reported_once_the_job_stops(tmp_path):
    done = _exec(tmp_path, JVM_ENDING_SCRIPT)
    # Before the stop, py4j's report shows; after it, only other errors do.
    assert done.stderr.count("ERROR:root:Exception while sending command.") == 1, done.stderr
    assert "ERROR:root:another failure" in done.stderr, done.stderr
