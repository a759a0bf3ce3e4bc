"""Shared by the Airflow tests: a real Airflow 3 in a tmp directory (metadata database on
SQLite, everything on 127.0.0.1), driven through its own command line and processes, never
imported into the pytest process (Airflow configures logging and its database at import)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.helpers import EXAMPLES, ROOT, VENV_BIN

DAGS = EXAMPLES / "airflow"
# DAGs of the tests themselves (run with airflow dags test -f).
TEST_DAGS = Path(__file__).resolve().parent / "dags"


@dataclass
class AirflowHome:
    """One Airflow installation: ``AIRFLOW_HOME``, its SQLite database, the DAGs, and an
    ``srt_default`` connection (an environment variable) pointing at ``srt_home`` with job
    files and relative paths resolved in ``work``."""

    root: Path
    srt_home: Path
    work: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def dags(self) -> Path:
        """The DAG folder: the example DAGs and the tests' own, linked (a DAG file finds the
        job file through its real path)."""
        folder = self.root / "dags"
        if not folder.is_dir():
            folder.mkdir()
            for path in [*DAGS.glob("*.py"), *TEST_DAGS.glob("*.py")]:
                (folder / path.name).symlink_to(path)
        return folder

    @property
    def database(self) -> Path:
        return self.root / "airflow.db"

    def env(self) -> dict[str, str]:
        from stateful_runtime.runtime.session import JIT_ENV

        env = dict(os.environ)
        env.setdefault(JIT_ENV, "quick")  # the jobs it starts run seconds: C1 only (srt_env)
        connection = {
            "conn_type": "srt",
            "extra": {"srt_home": str(self.srt_home), "working_directory": str(self.work)},
        }
        env.update(
            {
                "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
                # The checkout's packages first (a worktree's srt_airflow, not an installed one).
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p
                ),
                "AIRFLOW_HOME": str(self.root),
                "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
                "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{self.database}",
                "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.root / "logs"),
                "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
                "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
                "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
                "AIRFLOW__API__HOST": "127.0.0.1",
                "AIRFLOW_CONN_SRT_DEFAULT": json.dumps(connection),
                "SRT_HOME": str(self.srt_home),
                "SPARK_LOCAL_IP": "127.0.0.1",
                "PYTHONUNBUFFERED": "1",
            }
        )
        return env

    def airflow(
        self, *args: str, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """``airflow ARGS`` in this installation; fails the test with its output if it fails
        (``check``)."""
        out = subprocess.run(
            [str(VENV_BIN / "airflow"), *args],
            env=self.env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0 or not check, (
            f"airflow {' '.join(args)} exited {out.returncode}:\n"
            f"{out.stdout[-6000:]}\n{out.stderr[-6000:]}"
        )
        return out

    def task_states(self, dag_id: str) -> dict[str, str]:
        """The states of the tasks of ``dag_id``'s latest run."""
        rows = self.query(
            "SELECT task_id, state FROM task_instance WHERE run_id = (SELECT run_id FROM "
            "dag_run WHERE dag_id = ? ORDER BY id DESC LIMIT 1) AND dag_id = ?",
            dag_id,
            dag_id,
        )
        return dict(rows)

    def python(self, code: str, timeout: float = 300, **env: str) -> Any:
        """Run ``code`` in a fresh interpreter of this installation (``env``: more
        environment); it prints one JSON document as its last line, returned."""
        out = subprocess.run(
            [str(VENV_BIN / "python"), "-c", code],
            env={**self.env(), **env},
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert out.returncode == 0, (
            f"exit {out.returncode}:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
        )
        return json.loads(out.stdout.strip().splitlines()[-1])

    def start(self, *args: str) -> subprocess.Popen:
        """``airflow ARGS`` as a long-running component (scheduler, triggerer, dag-processor) in
        a session of its own, its output in ``logs/<command>.out``."""
        log = self.root / f"{args[0]}.out"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [str(VENV_BIN / "airflow"), *args],
                env=self.env(),
                cwd=self.root,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM every component (Airflow's own clean shutdown), SIGKILL what is left."""
        for proc in self.processes:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.processes:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.processes.clear()

    def logs(self) -> str:
        """The components' output (for a failure's message)."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted(self.root.glob("*.out"))
        )

    def query(self, sql: str, *params: Any) -> list[tuple]:
        """Rows of the metadata database (read-only)."""
        con = sqlite3.connect(f"file:{self.database}?mode=ro", uri=True, timeout=30)
        try:
            return con.execute(sql, params).fetchall()
        finally:
            con.close()
