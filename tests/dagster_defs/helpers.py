"""Shared by the Dagster tests that drive a real ``srt run`` process: a UPI job on a small
event log, launched through Dagster, killed at the end of the module (the ``live`` fixture in
conftest.py)."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from dagster import AssetKey, Definitions, build_sensor_context, materialize
from upi_events import START_MS, events

from dagster_defs import DuckDBWarehouse, StreamingJobSpec, StreamingRuntime, build_definitions
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.runtime import launcher, registry
from stateful_runtime.runtime.session import JIT_ENV
from tests.helpers import EXAMPLES, ROOT, UpiWorkspace, append_lines, environment

DEFINITIONS = EXAMPLES / "definitions.py"


def example_definitions() -> ModuleType:
    """examples/definitions.py, the file workspace.yaml loads, imported by path."""
    name = "srt_example_definitions"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, DEFINITIONS)
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return sys.modules[name]


UPI_JOB: StreamingJobSpec = example_definitions().UPI_JOB
JOB = UPI_JOB.name
JOB_KEY = AssetKey(["upi_per_minute"])


@dataclass
class Live:
    ws: UpiWorkspace
    defs: Definitions
    resources: dict[str, Any]
    spec: StreamingJobSpec
    pids: list[int] = field(default_factory=list)

    def materialize(self, *keys: AssetKey, raise_on_error: bool = True):
        return materialize(
            [*self.defs.assets, *self.defs.asset_checks],  # type: ignore[list-item]
            selection=list(keys),
            resources=self.resources,
            raise_on_error=raise_on_error,
        )

    def tick(self, cursor: str | None = None):
        sensor = self.defs.resolve_sensor_def("streaming_job_health")
        return sensor(build_sensor_context(resources=self.resources, cursor=cursor))

    @property
    def qdir(self) -> Path:
        return self.ws.checkpoint_dir / "upi-counts"


def feed(ws: UpiWorkspace, count: int, seed: int, start_ms: int = START_MS) -> None:
    # 40 events per second of event time: 6000 events span 150 s, so two 1-minute windows
    # close (the watermark trails the newest event by 5 s).
    append_lines(
        ws.log_dir,
        list(
            events(
                count,
                merchants=8,
                rate_per_s=40,
                disorder_ms=3_000,
                bad_every=499,
                seed=seed,
                start_ms=start_ms,
            )
        ),
    )


def metadata(result, key: AssetKey) -> dict[str, Any]:
    """Metadata values of the run's one materialisation of ``key``."""
    [event] = [e for e in result.get_asset_materialization_events() if e.asset_key == key]
    return {k: v.value for k, v in event.materialization.metadata.items()}


@contextmanager
def live_job(
    root: Path,
    *,
    config: dict[str, Any] | None = None,
    dagster_url: str | None = None,
    **spec: Any,
) -> Iterator[Live]:
    """Definitions for a UPI job on a fresh 2-partition log under ``root`` with 6000 events
    (not launched yet); every process of the job is killed on exit. ``dagster_url``: the
    webserver the job reports its commits to.

    The job has its own SRT_HOME (``root/srt-home``, this process's too while it lives): the
    registry entry, log and default savepoint directory of one job name are then this job's
    only, not those of the same job run by an earlier test in this worker."""
    srt_home = str(root / "srt-home")
    ws = UpiWorkspace(root, partitions=2)
    EventLog(ws.log_dir).create_topic("upi-payments", ws.partitions)
    feed(ws, 6_000, seed=3)
    job_spec = replace(
        UPI_JOB,
        config={
            "source.log_dir": str(ws.log_dir),
            "checkpoint.dir": str(ws.checkpoint_dir),
            "checkpoint.interval_s": 1.0,
            "parallelism": 2,
            **(config or {}),
        },
        **spec,
    )
    resources = {
        "streaming_runtime": StreamingRuntime(
            home=srt_home,
            working_directory=str(ROOT),
            launch_timeout_s=240,
            commit_timeout_s=180,
            dagster_url=dagster_url,
        ),
        "warehouse": DuckDBWarehouse(path=str(ws.database)),
    }
    defs = build_definitions([job_spec], resources=resources)
    state = Live(ws, defs, {**defs.resources}, job_spec)  # type: ignore[arg-type]
    # The jobs Dagster launches inherit this process's environment: they run seconds on a few
    # thousand events, so their JVMs compile with C1 only, as srt_env's (tests/conftest.py).
    settings = {"SRT_HOME": srt_home, JIT_ENV: os.environ.get(JIT_ENV, "quick")}
    with environment(settings):
        try:
            yield state
        finally:
            entry = registry.read(JOB) or {}
            for pid in {*state.pids, entry.get("pid")} - {None}:
                launcher.signal_group(int(pid), signal.SIGKILL)  # type: ignore[arg-type]


@dataclass
class Webserver:
    """A ``dagster-webserver`` process on 127.0.0.1 and its instance's home."""

    url: str
    home: Path
    proc: subprocess.Popen[bytes]
    log: Path

    def serving(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/server_info", timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


def start_webserver(root: Path, port: int) -> Webserver:
    """``dagster-webserver`` over an empty code location, its instance in ``root/home``: what
    a job's pushed commits reach (the external-asset REST API needs no asset definitions)."""
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    defs = root / "empty_defs.py"
    defs.write_text("from dagster import Definitions\n\ndefs = Definitions()\n")
    log = root / "webserver.log"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dagster_webserver",
            "-h",
            "127.0.0.1",
            "-p",
            str(port),
            "-f",
            str(defs),
        ],
        env={**os.environ, "DAGSTER_HOME": str(home)},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    return Webserver(f"http://127.0.0.1:{port}", home, proc, log)
