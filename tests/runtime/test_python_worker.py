"""A job starts on a machine too loaded for a Python worker to import PySpark within Spark's
fixed 10 s wait for it to connect back (``runtime/python_worker.py``).

The load is made exact rather than hoped for: a ``sitecustomize`` on the job's ``PYTHONPATH``
holds the import of the event-log source's streaming runner module (the Python process Spark
starts on its own for every Python source, on the driver) for 12 s, as a machine at a load
average of ~40 a core holds PySpark's ~0.3 s of imports. With the workers run by
``srt-python`` (the default) the runner has connected before it imports, and the job runs to
the end; with ``PYSPARK_PYTHON`` naming a plain interpreter it fails as it did before, and the
job's error says what happened and what to do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import VENV_BIN, append_lines, srt

pytestmark = pytest.mark.slow

RUNNER = "pyspark.sql.streaming.python_streaming_source_runner"
SLOW_IMPORT = f"""
import os
import sys
import time


class SlowRunnerImport:
    def find_spec(self, name, path=None, target=None):
        if name == {RUNNER!r}:
            with open(os.path.join(os.path.dirname(__file__), "held"), "a") as held:
                held.write(str(os.getpid()) + "\\n")
            time.sleep(12)
        return None


sys.meta_path.insert(0, SlowRunnerImport())
"""


def _env(srt_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SLOW_IMPORT)
    paths = [str(site), *filter(None, [srt_env.get("PYTHONPATH")])]
    return {**srt_env, "PYTHONPATH": os.pathsep.join(paths)}


def _job(tmp_path: Path, name: str) -> list[str]:
    log = tmp_path / "log"
    if not log.exists():
        EventLog(log).create_topic("upi-payments", 1)
        lines = [
            json.dumps(
                {
                    "txn_id": f"t{i}",
                    "merchant_id": f"M{i % 5}",
                    "amount_paise": 100,
                    "ts_ms": 1_767_225_600_000 + i * 1_000,
                }
            ).encode()
            for i in range(300)
        ]
        append_lines(log, lines)
    sets = {
        "source.log_dir": log,
        "sink.database": tmp_path / f"{name}.duckdb",
        "checkpoint.dir": tmp_path / f"ck-{name}",
        "parallelism": 2,
    }
    return [
        "run", "examples/upi_per_minute.py", "--available-now",
        *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
    ]  # fmt: skip


def test_a_job_starts_when_its_python_workers_import_slower_than_spark_waits(srt_env, tmp_path):
    env = _env(srt_env, tmp_path)
    assert Path(VENV_BIN / "srt-python").exists(), "srt-python is installed with the project"
    started = srt(_job(tmp_path, "launched"), {**env, "PYSPARK_PYTHON": str(VENV_BIN / "python")})
    assert started.returncode == 0, started.stdout + started.stderr
    assert "input 300 = output 300" in started.stdout, started.stdout
    assert (tmp_path / "site" / "held").read_text().count("\n") >= 1  # the import was held

    # Without it (another interpreter named by PYSPARK_PYTHON), the same start fails, and says
    # why and what to do.
    plain = tmp_path / "python"
    plain.write_text(f'#!/bin/sh\nexec {VENV_BIN / "python"} "$@"\n')
    plain.chmod(0o755)
    failed = srt(_job(tmp_path, "plain"), {**env, "PYSPARK_PYTHON": str(plain)})
    assert failed.returncode != 0
    said = failed.stdout + failed.stderr
    assert "did not connect back within" in said, said
    assert "srt-python" in said, said
