"""A job's JVM and Python workers keep their temporary files (block manager directories,
unpacked native libraries, fault-handler files) in one scratch directory of the job's process:
nothing of them lands in the temp directory itself, a normal exit removes it, and the next
session removes the scratch of a process that was killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import sys, tempfile, time
    import pandas as pd
    from stateful_runtime.runtime.session import build_session
    spark = build_session(1, "local[1]")
    df = spark.range(0, 10000).repartition(2)  # a shuffle: block manager files
    df.groupBy((df.id % 3).alias("k")).count().collect()
    workers = spark.range(1).mapInPandas(
        lambda it: (pd.DataFrame({"t": [tempfile.gettempdir()]}) for _ in it), "t string")
    print("worker-tmp", workers.collect()[0].t, flush=True)
    if sys.argv[1] == "hang":
        time.sleep(600)
""")


def _listing(tmp) -> list[str]:
    return sorted(str(p.relative_to(tmp)) for p in tmp.rglob("*"))


@pytest.mark.faults  # kill -9 of a session: its scratch goes with the next
def test_spark_scratch_is_one_directory_removed_at_exit_or_by_the_next_session(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    root = tmp_path / f"srt-spark-{os.getuid()}"

    log = tmp_path.parent / f"{tmp_path.name}-hang.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", SCRIPT, "hang"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "worker-tmp" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.2)
        (scratch,) = root.iterdir()
        assert scratch.name.startswith(f"{proc.pid}-")
        worker_tmp = log.read_text().split("worker-tmp ", 1)[1].split()[0]
        assert worker_tmp == str(scratch)  # Python workers write there too
        inside = {p.name.split("-")[0] for p in scratch.iterdir()}
        assert {"blockmgr", "spark"} <= inside, inside
        assert [p.name for p in tmp_path.iterdir() if p.name != root.name] == []
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert scratch.exists()  # a killed JVM removes nothing

    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, "exit"], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert not scratch.exists(), "the killed process's scratch was not removed"
    assert _listing(tmp_path) == [root.name], _listing(tmp_path)  # and its own at exit


def test_an_unusable_temp_directory_leaves_spark_its_own_defaults(tmp_path, monkeypatch):
    from pyspark import SparkContext

    from stateful_runtime.runtime import session

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(blocker))
    monkeypatch.setattr(SparkContext, "_active_spark_context", None)
    assert session._scratch_conf("local[2]") == {}
    assert session._scratch_conf("spark://127.0.0.1:7077") == {}  # executors run elsewhere
