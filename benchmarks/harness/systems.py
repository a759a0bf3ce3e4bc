"""How each system runs one workload over one generated input, and what is measured.

Every run is a fresh process tree started by the harness (cold: JVM, Python workers, state
backends), so "whole process" includes everything a user would wait for. Measured per run:

* ``wall_s`` — spawn to exit of the process tree; ``whole_events_per_s`` = events / wall_s.
* ``startup_s`` — spawn to the first committed checkpoint: this runtime's first committed
  micro-batch (``BatchCommitted``), Flink's first completed checkpoint (``chk-N/_metadata``
  appearing), bytewax's first sink write (it has no commit to observe from outside; its
  snapshots go to SQLite). ``None`` when a Flink job ended before its first checkpoint.
* ``steady_events_per_s`` — this runtime: events after the first micro-batch ÷ time from the
  first to the last committed data batch; Flink: Flink's net job rate, events ÷ the job's net
  runtime (``JobExecutionResult.getNetRuntime``, the job without client and cluster start);
  bytewax: events ÷ time from its first source read to its last sink write.
* ``peak_memory_bytes`` — peak of the summed PSS of the process tree (sampled every 0.25 s).
* ``cpu_s`` — CPU seconds of the tree (per-process user + system, as last sampled).
* ``check`` — the output against the oracle (``workloads.compare``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from harness.data import Inputs
from harness.procmon import TreeMonitor
from harness.workloads import Workload, compare

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
VENVS = BENCH / ".venvs"
PEERS = BENCH / "peers"
JOBS = BENCH / "jobs"
PROJECT_PYTHON = ROOT / ".venv" / "bin" / "python"
RUN_TIMEOUT_S = 20 * 60

PEER_REQUIREMENTS = {
    "flink": ["apache-flink==2.3.0"],
    "bytewax": ["bytewax==0.21.1"],
}


@dataclass
class RunResult:
    system: str
    workload: str
    rep: int
    events: int
    ok: bool = False
    error: str | None = None
    wall_s: float | None = None
    startup_s: float | None = None
    whole_events_per_s: float | None = None
    steady_events_per_s: float | None = None
    peak_memory_bytes: int | None = None
    cpu_s: float | None = None
    check: dict[str, Any] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def venv_python(name: str) -> Path:
    return VENVS / name / "bin" / "python"


def ensure_venv(name: str, log=print) -> Path:
    """Create ``benchmarks/.venvs/<name>`` with its pinned packages (once)."""
    py = venv_python(name)
    marker = VENVS / name / ".bench-ready"
    want = " ".join(PEER_REQUIREMENTS[name])
    if marker.exists() and marker.read_text() == want:
        return py
    log(f"creating peer venv {VENVS / name} ({want}); a few minutes the first time")
    base = shutil.which("python3.11") or sys.executable
    subprocess.run([base, "-m", "venv", str(VENVS / name)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_REQUIREMENTS[name]], check=True)
    marker.write_text(want)
    return py


def _kill_tree(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap_group(pgid: int) -> None:
    """Kill what is left of a finished run's process group (a JVM whose parent exited without
    stopping it would otherwise keep a core busy)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class Launched:
    t_spawn: float
    t_exit: float
    returncode: int
    peak_memory_bytes: int
    cpu_s: float
    startup_t: float | None
    pid: int


def launch(
    cmd: list[str],
    *,
    rundir: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    startup_probe=None,
    on_start=None,
    timeout: float = RUN_TIMEOUT_S,
) -> Launched:
    """Run ``cmd`` in its own process group; sample its tree; poll ``startup_probe()`` (a
    callable returning True once the system's first commit is visible) while it runs."""
    full_env = {**os.environ, **(env or {})}
    out = open(rundir / "stdout.log", "wb")
    err = open(rundir / "stderr.log", "wb")
    t_spawn = time.time()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=full_env, stdout=out, stderr=err, start_new_session=True
    )
    mon = TreeMonitor(proc.pid).start()
    if on_start is not None:
        on_start(proc.pid)
    startup_t = None
    deadline = time.monotonic() + timeout
    try:
        while proc.poll() is None:
            if startup_t is None and startup_probe is not None and startup_probe():
                startup_t = time.time()
            if time.monotonic() > deadline:
                _kill_tree(proc)
                proc.wait()
                raise TimeoutError(f"{cmd[:3]} ran longer than {timeout:.0f} s")
            time.sleep(0.05)
        t_exit = time.time()
    finally:
        mon.stop()
        _reap_group(proc.pid)
        out.close()
        err.close()
    return Launched(
        t_spawn, t_exit, proc.returncode, mon.peak_bytes, mon.cpu_s, startup_t, proc.pid
    )


def _tail(path: Path, n: int = 3000) -> str:
    try:
        return path.read_bytes()[-n:].decode(errors="replace")
    except OSError:
        return ""


def read_json_lines_dir(d: Path) -> list[dict]:
    rows: list[dict] = []
    if not d.exists():
        return rows
    for f in sorted(d.rglob("*")):
        if f.is_file() and not f.name.startswith("."):
            with open(f, "rb") as fh:
                rows.extend(json.loads(line) for line in fh if line.strip())
    return rows


# --------------------------------------------------------------------------------------------


class System:
    name = ""
    label = ""
    kind = ""  # "runtime" or "peer"

    def available(self) -> str | None:
        """None if the system can run here, else why not."""
        return None

    def runs(self, w: Workload) -> bool:
        """Whether the system has a version of workload ``w``."""
        return True

    def run(
        self,
        w: Workload,
        inputs: Inputs,
        rundir: Path,
        rep: int,
        *,
        expected,
        options: dict[str, Any],
    ) -> RunResult:
        res = RunResult(self.name, w.name, rep, inputs.total_records)
        try:
            self._run(w, inputs, rundir, res, options)
            rows = self.outputs(rundir, res)
            res.check = compare(expected, w.normalise(rows, inputs.final_watermark_ms))
            res.ok = res.error is None
        except Exception as exc:  # noqa: BLE001 - one failed run must not end the benchmark
            res.error = f"{type(exc).__name__}: {exc}"
        return res

    def _run(
        self, w: Workload, inputs: Inputs, rundir: Path, res: RunResult, options: dict[str, Any]
    ) -> None:
        raise NotImplementedError

    def outputs(self, rundir: Path, res: RunResult) -> list[dict]:
        return read_json_lines_dir(rundir / "out")

    @staticmethod
    def _fill(res: RunResult, ln: Launched) -> None:
        res.wall_s = ln.t_exit - ln.t_spawn
        res.whole_events_per_s = res.events / res.wall_s
        res.peak_memory_bytes = ln.peak_memory_bytes
        res.cpu_s = round(ln.cpu_s, 2)
        if ln.startup_t is not None:
            res.startup_s = ln.startup_t - ln.t_spawn


class StreamingRuntime(System):
    """This runtime: the workload's job file under ``benchmarks/jobs/``, run to the end of the
    event log by ``JobRunner`` (``srt run --available-now``) in a child process."""

    name = "srt"
    label = "this runtime"
    kind = "runtime"

    @property
    def root(self) -> Path:
        """The checkout whose runtime runs (its ``.venv``, harness child and job files)."""
        return ROOT

    def extra_sets(self) -> dict[str, str]:
        return {}

    def _run(self, w, inputs, rundir, res, options):
        (rundir / "tmp").mkdir(parents=True, exist_ok=True)
        sets = {
            "source.log_dir": str(inputs.log_dir),
            "source.topic": inputs.topic,
            "source.max_records_per_batch": str(options["batch_size"]),
            "sink.log_dir": str(rundir / "out-log"),
            "sink.topic": "out",
            "checkpoint.dir": str(rundir / "checkpoints"),
            "parallelism": str(options["parallelism"]),
        }
        if inputs.second is not None:
            # The second input's batches cover (a little more than) the same event time as the
            # first's.
            share = 1.2 * inputs.second.records / inputs.records
            sets |= {
                "second.log_dir": str(inputs.second.log_dir),
                "second.topic": inputs.second.topic,
                "second.max_records_per_batch": str(max(1, int(options["batch_size"] * share))),
            }
        sets |= self.extra_sets()
        root = self.root
        python = root / PROJECT_PYTHON.relative_to(ROOT)
        cmd = [
            str(python),
            str(root / "benchmarks" / "harness" / "srt_child.py"),
            "--job",
            str(root / "benchmarks" / "jobs" / w.srt_job),
            "--master",
            options.get("master", "local[2]"),
            "--result",
            str(rundir / "result.json"),
        ]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        env = {
            "SRT_HOME": str(rundir / "srt-home"),
            "TMPDIR": str(rundir / "tmp"),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": str(python),
            "PYSPARK_DRIVER_PYTHON": str(python),
            "PYTHONPATH": str(root),
        }
        env.update(options.get("env", {}))
        ln = launch(cmd, rundir=rundir, env=env, cwd=root, on_start=options.get("on_start"))
        self._fill(res, ln)
        result_path = rundir / "result.json"
        if ln.returncode != 0 or not result_path.exists():
            res.error = f"exit {ln.returncode}: {_tail(rundir / 'stderr.log')}"
            return
        r = json.loads(result_path.read_text())
        batches = [b for b in r["batches"]]
        data = [b for b in batches if b["rows"]]
        res.details["paths"] = {q: v["path"] for q, v in r["queries"].items()}
        res.details["batches"] = [
            {
                "batch": b["batch"],
                "rows": b["rows"],
                "t": round(b["t"] - ln.t_spawn, 3),
                "sink_write_ms": b["sink_write_ms"],
                "duration_ms": b["progress"].get("durationMs"),
                "state": [
                    {
                        k: o.get(k)
                        for k in (
                            "numRowsTotal",
                            "numRowsUpdated",
                            "commitTimeMs",
                            "allUpdatesTimeMs",
                            "allRemovalsTimeMs",
                            "memoryUsedBytes",
                            "numRowsDroppedByWatermark",
                        )
                    }
                    for o in b["progress"].get("stateOperators") or []
                ],
            }
            for b in batches
        ]
        res.details["t_interpreter_s"] = round(r["t_import"] - ln.t_spawn, 3)
        res.details["t_runner_s"] = round(r["t_run"] - ln.t_spawn, 3)
        res.details["t_runner_end_s"] = round(r["t_end"] - ln.t_spawn, 3)
        if batches:
            res.startup_s = batches[0]["t"] - ln.t_spawn
        if len(data) >= 2:
            rows_after = sum(b["rows"] for b in data[1:])
            span = data[-1]["t"] - data[0]["t"]
            res.steady_events_per_s = rows_after / span if span > 0 else None
            trig = sum(b["progress"]["durationMs"]["triggerExecution"] for b in data[1:])
            res.details["in_batch_events_per_s"] = rows_after / trig * 1000 if trig else None
        res.details["first_batch_ms"] = (
            data[0]["progress"]["durationMs"]["triggerExecution"] if data else None
        )

    def outputs(self, rundir, res):
        from stateful_runtime.connectors.eventlog import EventLog

        log = rundir / "out-log"
        if not (log / "out").exists():
            return []
        reader = EventLog(log).reader("out")
        rows = []
        for p, end in reader.end_offsets().items():
            rows += [json.loads(v) for v in reader.read_values(p, 0, end)]
        return rows


class FlinkSQL(System):
    name = "flink-sql"
    label = "Flink 2.3 SQL"
    kind = "peer"
    script = "flink_sql.py"

    def available(self):
        return None if venv_python("flink").exists() else "no Flink venv (run.py setup)"

    def runs(self, w):
        return w.flink

    def _run(self, w, inputs, rundir, res, options):
        ck = rundir / "checkpoints"
        ck.mkdir(parents=True)
        cmd = [
            str(venv_python("flink")),
            str(PEERS / self.script),
            "--workload",
            w.name,
            "--input",
            str(inputs.part_paths[0].parent.resolve()),
            "--output",
            str((rundir / "out").resolve()),
            "--checkpoints",
            str(ck.resolve()),
            "--result",
            str(rundir / "result.json"),
            "--parallelism",
            str(options["parallelism"]),
        ]
        if inputs.second is not None:
            cmd += ["--input2", str(inputs.second.part_paths[0].parent.resolve())]

        def first_checkpoint() -> bool:
            return any(ck.glob("*/chk-*/_metadata"))

        env = {
            "PYTHONPATH": "",
            "PATH": f"{venv_python('flink').parent}:{os.environ.get('PATH', '')}",
        }
        ln = launch(cmd, rundir=rundir, cwd=rundir, startup_probe=first_checkpoint, env=env)
        self._fill(res, ln)
        result_path = rundir / "result.json"
        if ln.returncode != 0 or not result_path.exists():
            res.error = f"exit {ln.returncode}: {_tail(rundir / 'stderr.log')}"
            return
        r = json.loads(result_path.read_text())
        net = r["net_runtime_ms"] / 1000
        res.steady_events_per_s = res.events / net if net > 0 else None
        res.details.update(
            {
                "net_runtime_s": net,
                "t_submit_s": round(r["t_submit"] - ln.t_spawn, 3),
                "t_done_s": round(r["t_done"] - ln.t_spawn, 3),
                "checkpoints": len(list(ck.glob("*/chk-*"))),
            }
        )
        if res.startup_s is None:
            res.details["startup_note"] = "finished before its first checkpoint"


class FlinkDataStream(FlinkSQL):
    name = "flink-ds"
    label = "Flink 2.3 Python DataStream"
    script = "flink_datastream.py"

    def runs(self, w):
        return w.flink and w.flink_ds


class Bytewax(System):
    name = "bytewax"
    label = "bytewax 0.21"
    kind = "peer"

    def available(self):
        return None if venv_python("bytewax").exists() else "no bytewax venv (run.py setup)"

    def runs(self, w):
        return w.bytewax

    def _run(self, w, inputs, rundir, res, options):
        py = str(venv_python("bytewax"))
        workers = options["parallelism"]
        rec = rundir / "recovery"
        rec.mkdir(parents=True)
        subprocess.run(
            [py, "-m", "bytewax.recovery", str(rec), str(workers)], check=True, capture_output=True
        )
        marks = rundir / "marks"
        # One source partition: bytewax's event clock is per key and does not take the minimum
        # over its inputs, so two partitions read at different speeds made events late (a
        # wrong q7 maximum in testing). Parsing is then one worker's; the keyed steps use both.
        spec = {
            "workload": w.name,
            "inputs": [str(inputs.lines_path)],
            "output": str(rundir / "out"),
            "marks": str(marks),
        }
        (rundir / "spec.json").write_text(json.dumps(spec))
        cmd = [
            py,
            "-m",
            "bytewax.testing",
            "bytewax_flows:get_flow",
            "-p",
            str(workers),
            "-r",
            str(rec),
            "-s",
            "2",
            "-b",
            "10",
        ]
        ln = launch(
            cmd,
            rundir=rundir,
            cwd=PEERS,
            env={"BENCH_SPEC": str(rundir / "spec.json"), "PYTHONPATH": str(PEERS)},
        )
        self._fill(res, ln)
        if ln.returncode != 0:
            res.error = f"exit {ln.returncode}: {_tail(rundir / 'stderr.log')}"
            return
        src, sink = [], []
        for p in marks.glob("*.json"):
            (src if p.name.startswith("source") else sink).append(json.loads(p.read_text()))
        firsts = [x["first"] for x in sink if x["first"]]
        if firsts:
            res.startup_s = min(firsts) - ln.t_spawn
        t0 = min((x["first"] for x in src if x["first"]), default=None)
        t1 = max((x["last"] for x in sink), default=None)
        if t0 and t1 and t1 > t0:
            res.steady_events_per_s = res.events / (t1 - t0)
        res.details["first_read_s"] = None if t0 is None else round(t0 - ln.t_spawn, 3)


class ReferenceRuntime(StreamingRuntime):
    """This runtime at another checkout, for a before/after in one run (peers and both
    runtimes alternating over the same inputs): ``SRT_BENCH_REFERENCE`` names its directory
    (bootstrapped: ``platform/bootstrap.sh``), ``SRT_BENCH_REFERENCE_SETS`` adds job settings
    (``key=value`` separated by spaces, e.g. ``state.backend=rocksdb_local`` for a checkout
    from before the one engine)."""

    name = "srt-ref"
    kind = "runtime"

    @property
    def label(self) -> str:  # type: ignore[override]
        where = os.environ.get("SRT_BENCH_REFERENCE", "")
        return f"this runtime at {Path(where).name or 'the reference'}"

    @property
    def root(self) -> Path:
        return Path(os.environ.get("SRT_BENCH_REFERENCE", "")).resolve()

    def available(self) -> str | None:
        # Unset, the path would resolve to the working directory: this checkout again.
        if (
            not os.environ.get("SRT_BENCH_REFERENCE")
            or not (self.root / PROJECT_PYTHON.relative_to(ROOT)).exists()
        ):
            return (
                "SRT_BENCH_REFERENCE must name another checkout with its .venv "
                "(platform/bootstrap.sh there)"
            )
        return None

    def extra_sets(self) -> dict[str, str]:
        pairs = os.environ.get("SRT_BENCH_REFERENCE_SETS", "").split()
        return dict(p.split("=", 1) for p in pairs)


SYSTEMS: dict[str, System] = {
    s.name: s
    for s in (
        StreamingRuntime(),
        ReferenceRuntime(),
        FlinkSQL(),
        FlinkDataStream(),
        Bytewax(),
    )
}
