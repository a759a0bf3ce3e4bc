"""The sections after throughput: Kafka source, latency, scale-out, profiles.

* ``kafka`` — ``benchmarks/kafka_throughput.py`` at 1M events: the runtime's Kafka source (read
  + decode, ``--available-now``) against a raw confluent-kafka consumer of the same topic, bare
  and parsing the values with Arrow's JSON reader.
* ``latency`` — the pass-through job ``benchmarks/jobs/latency_passthrough.py`` (Kafka source ->
  Kafka exactly-once sink, 0.2 s trigger) on a Apache Kafka broker; a feeder produces at fixed
  rates (5k, 20k, 50k events/s), each event carrying its produce time; a read_committed
  consumer of the output records when each becomes visible.
* ``scaleout`` — the UPI job on a standalone cluster (master + two workers of one core each, on
  this machine) against ``local[2]``, same events.
* ``profiles`` — the UPI job (native path) and the Q11 job (window operator, Python) once more
  with py-spy on the whole process tree (driver and Spark's Python workers), ``jstat`` on the
  JVM (JIT and GC time) and Spark's per-batch progress, summarised into "where the time goes".
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from harness import data
from harness.systems import BENCH, JOBS, PROJECT_PYTHON, ROOT, SYSTEMS
from harness.workloads import WORKLOADS

# Rough seconds per section, for the progress bar's ETA only.
WEIGHT = {"kafka": 150.0, "latency": 150.0, "scaleout": 150.0, "profiles": 150.0}
LATENCY_RATES = (5_000, 20_000, 50_000)


def run(
    section: str,
    *,
    work: Path,
    cfg: dict[str, Any],
    seed: int,
    options: dict[str, Any],
    progress,
    results: dict[str, Any],
    save,
    keep: bool,
) -> None:
    progress.step(section, WEIGHT[section])
    try:
        out = {"kafka": kafka, "latency": latency, "scaleout": scaleout, "profiles": profiles}[
            section
        ](work=work / section, cfg=cfg, seed=seed, options=options, progress=progress)
        note = out.pop("_note", "")
    except Exception as exc:  # noqa: BLE001 - a failed section must not lose the others
        out = {"error": f"{type(exc).__name__}: {exc}"}
        note = f"FAILED: {out['error'][:200]}"
    results[section] = out
    save()
    progress.done(f"{section}: {note}")
    if not keep:
        shutil.rmtree(work / section, ignore_errors=True)


def _env(rundir: Path) -> dict[str, str]:
    (rundir / "tmp").mkdir(parents=True, exist_ok=True)
    return {
        "SRT_HOME": str(rundir / "srt-home"),
        "TMPDIR": str(rundir / "tmp"),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYSPARK_PYTHON": str(PROJECT_PYTHON),
        "PYSPARK_DRIVER_PYTHON": str(PROJECT_PYTHON),
        "PYTHONPATH": str(ROOT),
    }


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# --------------------------------------------------------------------------------------------
# Kafka source vs raw consumer


def kafka(
    *, work: Path, cfg: dict[str, Any], seed: int, options: dict[str, Any], progress
) -> dict[str, Any]:
    events = 1_000_000 if cfg["events"] >= 1_000_000 else cfg["events"]
    work.mkdir(parents=True, exist_ok=True)
    out = work / "kafka_throughput.json"
    env = {**os.environ, **_env(work)}
    proc = subprocess.run(
        [
            str(PROJECT_PYTHON),
            str(BENCH / "kafka_throughput.py"),
            "--events",
            str(events),
            "--output",
            str(out),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"kafka_throughput.py exit {proc.returncode}: {proc.stderr[-1500:]}")
    r = json.loads(out.read_text())
    src = r["source"]
    return {
        "events": events,
        "source_events_per_s": src["events_per_s"],
        "raw_events_per_s": src["raw_consumer_per_s"],
        "ratio": src["ratio"],
        "decoding_events_per_s": src.get("raw_consumer_decoding_per_s"),
        "ratio_to_decoding": src.get("ratio_to_decoding"),
        "reps": src.get("reps", 1),
        "runs": src.get("runs"),
        "sink": r.get("sink"),
        "raw": r,
        "_note": f"source {src['events_per_s']:,}/s vs raw {src['raw_consumer_per_s']:,}/s"
        f" = {src['ratio']:.2f}x",
    }


# --------------------------------------------------------------------------------------------
# latency on the Kafka source


def latency(
    *, work: Path, cfg: dict[str, Any], seed: int, options: dict[str, Any], progress
) -> dict[str, Any]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    from tests.connectors.kafka.helpers import start_broker

    quick = cfg["events"] < 1_000_000
    measure_s = 10.0 if quick else 20.0
    warm_s, gap_s, drain_s = 10.0, 3.0, 15.0
    rates = [20_000] if quick else list(LATENCY_RATES)
    work.mkdir(parents=True, exist_ok=True)
    broker = start_broker(work / "kafka-data")
    child = None
    try:
        broker.create_topic("latency-in", 2)
        broker.create_topic("latency-out", 2)
        rundir = work / "job"
        rundir.mkdir()
        stop_file = rundir / "STOP"
        cmd = [
            str(PROJECT_PYTHON),
            str(BENCH / "harness" / "srt_child.py"),
            "--job",
            str(JOBS / "latency_passthrough.py"),
            "--master",
            options.get("master", "local[2]"),
            "--result",
            str(rundir / "result.json"),
            "--stop-file",
            str(stop_file),
        ]
        for k, v in {
            "source.bootstrap_servers": broker.bootstrap,
            "checkpoint.dir": str(rundir / "checkpoints"),
            "parallelism": str(options["parallelism"]),
        }.items():
            cmd += ["--set", f"{k}={v}"]
        log = open(rundir / "stderr.log", "wb")
        child = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, **_env(rundir)},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 180
        while not any((rundir / "checkpoints").glob("*/commits/0")):
            if child.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "latency job did not commit its first batch: "
                    + (rundir / "stderr.log").read_bytes()[-1500:].decode()
                )
            time.sleep(0.2)

        seen: dict[str, list[float]] = defaultdict(list)
        stop = threading.Event()

        def consume() -> None:
            c = Consumer(
                {
                    "bootstrap.servers": broker.bootstrap,
                    "group.id": "latency",
                    "enable.auto.commit": False,
                    "isolation.level": "read_committed",
                    "fetch.wait.max.ms": 5,
                    "fetch.min.bytes": 1,
                }
            )
            c.assign([TopicPartition("latency-out", p, 0) for p in range(2)])
            while not stop.is_set():
                for m in c.consume(5000, 0.05):
                    if m.error():
                        continue
                    now = time.time() * 1000
                    v = json.loads(m.value())
                    seen[v["txn_id"].split("-", 1)[0]].append(now - v["ts_ms"])
            c.close()

        consumer = threading.Thread(target=consume, daemon=True)
        consumer.start()
        producer = Producer(
            {"bootstrap.servers": broker.bootstrap, "linger.ms": 2, "enable.idempotence": True}
        )
        produced: dict[str, dict[str, float]] = {}

        def feed(phase: str, rate: int, seconds: float) -> None:
            sent, t0 = 0, time.time()
            while True:
                elapsed = time.time() - t0
                if elapsed >= seconds:
                    break
                due = int(rate * elapsed) - sent
                now_ms = int(time.time() * 1000)
                for i in range(sent, sent + due):
                    value = (
                        f'{{"txn_id":"{phase}-{i}","merchant_id":"M{i % 1000:04d}",'
                        f'"amount_paise":{100 + i % 5000},"ts_ms":{now_ms}}}'
                    )
                    while True:
                        try:
                            producer.produce("latency-in", value=value, key=str(i % 1000))
                            break
                        except BufferError:
                            producer.poll(0.001)
                sent += due
                producer.poll(0)
                time.sleep(0.002)
            producer.flush(30)
            produced[phase] = {"events": sent, "seconds": time.time() - t0}

        feed("warm", rates[0], warm_s)
        time.sleep(gap_s)
        for rate in rates:
            progress.step(f"latency at {rate:,} events/s", 0)
            feed(f"r{rate}", rate, measure_s)
            time.sleep(gap_s)
        deadline = time.monotonic() + drain_s
        while time.monotonic() < deadline and any(
            len(seen[p]) < produced[p]["events"] for p in produced
        ):
            time.sleep(0.2)
        stop.set()
        consumer.join(10)
        stop_file.touch()
        child.wait(120)
        out: dict[str, Any] = {
            "setup": (
                f"`benchmarks/jobs/latency_passthrough.py`: Kafka source → filter → Kafka "
                f"exactly-once sink, trigger 0.2 s, parallelism {options['parallelism']}, "
                f"Apache Kafka broker, 2 partitions in and out. Each event carries its produce "
                f"time; a read_committed consumer (fetch.wait.max.ms 5) records when it "
                f"sees each. {warm_s:.0f} s warm-up at {rates[0]:,}/s (not counted), then "
                f"{measure_s:.0f} s per rate. The feeder and the consumer run in the "
                f"harness process on the same 2 cores."
            ),
            "rates": {},
        }
        for rate in rates:
            p = f"r{rate}"
            lat = seen.get(p, [])
            made = produced.get(p, {"events": 0, "seconds": 1})
            out["rates"][str(rate)] = {
                "events": made["events"],
                "seen": len(lat),
                "achieved_rate": made["events"] / made["seconds"],
                "p50_ms": _percentile(lat, 50),
                "p99_ms": _percentile(lat, 99),
                "max_ms": max(lat) if lat else None,
                "lost": made["events"] - len(lat),
            }
        r = (
            json.loads((rundir / "result.json").read_text())
            if (rundir / "result.json").exists()
            else {}
        )
        durs = [
            b["progress"]["durationMs"].get("triggerExecution")
            for b in r.get("batches", [])
            if b["rows"]
        ]
        out["batch_ms_p50"] = _percentile([d for d in durs if d], 50)
        out["batches"] = len(durs)
        mid = out["rates"].get("20000") or next(iter(out["rates"].values()))
        out["_note"] = (
            f"p50 {mid['p50_ms'] or 0:,.0f} ms, p99 {mid['p99_ms'] or 0:,.0f} ms "
            f"at {mid['achieved_rate']:,.0f}/s"
        )
        return out
    finally:
        if child is not None and child.poll() is None:
            os.killpg(child.pid, 9)
        broker.process.terminate()


# --------------------------------------------------------------------------------------------
# scale-out: standalone cluster with two workers vs local[2]


def _free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class StandaloneCluster:
    """A Spark standalone master and ``workers`` workers of ``cores`` cores, from the venv's
    pyspark (what platform/spark-cluster.sh does for one worker)."""

    def __init__(self, d: Path, workers: int = 2, cores: int = 1, memory: str = "2g") -> None:
        import pyspark

        self.d, self.workers, self.cores, self.memory = d, workers, cores, memory
        self.spark_home = Path(pyspark.__file__).parent
        self.procs: list[subprocess.Popen] = []

    def start(self) -> str:
        d = self.d
        (d / "conf").mkdir(parents=True, exist_ok=True)
        (d / "tmp").mkdir(exist_ok=True)
        env = {
            **os.environ,
            "SPARK_HOME": str(self.spark_home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_LOCAL_HOSTNAME": "127.0.0.1",
            "SPARK_MASTER_HOST": "127.0.0.1",
            "SPARK_CONF_DIR": str(d / "conf"),
            "SPARK_DAEMON_MEMORY": "512m",
            "PYSPARK_PYTHON": str(PROJECT_PYTHON),
            "TMPDIR": str(d / "tmp"),
            "SRT_HOME": str(d / "srt-home"),
            "PYTHONPATH": str(ROOT),
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        }
        ports = _free_ports(2 + 2 * self.workers)
        self.url = f"spark://127.0.0.1:{ports[0]}"
        self.ui = f"http://127.0.0.1:{ports[1]}"
        cls = str(self.spark_home / "bin" / "spark-class")

        def spawn(name: str, args: list[str]) -> None:
            log = open(d / f"{name}.log", "wb")
            self.procs.append(
                subprocess.Popen(
                    [cls, *args],
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

        spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                str(ports[0]),
                "--webui-port",
                str(ports[1]),
            ],
        )
        for i in range(self.workers):
            (d / f"work{i}").mkdir(exist_ok=True)
            spawn(
                f"worker{i}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(ports[2 + 2 * i]),
                    "--webui-port",
                    str(ports[3 + 2 * i]),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(d / f"work{i}"),
                    self.url,
                ],
            )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.ui}/json/", timeout=2) as r:
                    if json.load(r).get("aliveworkers", 0) >= self.workers:
                        return self.url
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"standalone cluster did not come up; logs in {d}")

    def stop(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, 15)
            except ProcessLookupError:
                pass
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)


def scaleout(
    *, work: Path, cfg: dict[str, Any], seed: int, options: dict[str, Any], progress
) -> dict[str, Any]:
    wl = WORKLOADS["upi"]
    work.mkdir(parents=True, exist_ok=True)
    inputs = data.prepare(
        work.parent / "data",
        "upi",
        cfg["events"],
        seed,
        parts=options["parallelism"],
        partitions=options["parallelism"],
    )
    expected = wl.oracle(data.parse(inputs.lines()), inputs.final_watermark_ms)
    srt = SYSTEMS["srt"]
    out: dict[str, Any] = {"runs": {}}
    cluster = StandaloneCluster(work / "cluster", workers=2, cores=1)
    url = cluster.start()
    try:
        for label, master in (
            (f"local[{options['parallelism']}]", options["master"]),
            ("standalone, 2 workers x 1 core", url),
        ):
            progress.step(f"scale-out: UPI on {label}", 0)
            rundir = work / label.split(",")[0].replace("[", "").replace("]", "")
            rundir.mkdir(parents=True, exist_ok=True)
            r = srt.run(
                wl, inputs, rundir, 1, expected=expected, options={**options, "master": master}
            )
            out["runs"][label] = {
                "whole_events_per_s": r.whole_events_per_s,
                "steady_events_per_s": r.steady_events_per_s,
                "startup_s": r.startup_s,
                "wall_s": r.wall_s,
                "matched": r.check.get("matched"),
                "error": r.error,
                "peak_memory_bytes": r.peak_memory_bytes,
            }
    finally:
        cluster.stop()
    (a, b) = out["runs"].values()
    out["setup"] = (
        f"The UPI job over the same {cfg['events']:,} events, once on "
        f"`{options['master']}` and once on a Spark standalone cluster started by "
        f"the harness on this machine (a master and two workers of one core and 2 "
        f"GiB each; the driver runs in the job process). Same parallelism "
        f"({options['parallelism']}), same 2 cores in total."
    )
    if a.get("steady_events_per_s") and b.get("steady_events_per_s"):
        out["ratio_steady"] = b["steady_events_per_s"] / a["steady_events_per_s"]
    if a.get("whole_events_per_s") and b.get("whole_events_per_s"):
        out["ratio_whole"] = b["whole_events_per_s"] / a["whole_events_per_s"]
    out["_note"] = f"cluster / local: steady {out.get('ratio_steady') or 0:.2f}x"
    return out


# --------------------------------------------------------------------------------------------
# profiles


def _jstat(pid: int) -> dict[str, float] | None:
    """JIT compile time and GC time (s) of a JVM, from jstat."""
    try:

        def table(option: str) -> dict[str, str]:
            lines = subprocess.run(
                ["jstat", option, str(pid)], capture_output=True, text=True, timeout=5
            ).stdout.splitlines()
            # The first columns are numbers; -compiler's last ones (failed method) are text.
            return dict(zip(lines[0].split(), lines[1].split(), strict=False))

        c, g = table("-compiler"), table("-gcutil")
        return {
            "compiled": float(c["Compiled"]),
            "jit_s": float(c["Time"]),
            "gc_s": float(g["GCT"]),
        }
    except (OSError, subprocess.SubprocessError, KeyError, ValueError, IndexError):
        return None


def _jvm_of(root: int) -> int | None:
    from harness.procmon import tree

    for pid in tree(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"java" in cmd.split(b"\0")[0] and b"SparkSubmit" in cmd:
            return pid
    return None


def _classify(header: str) -> str:
    """Which part of the job a py-spy process header (``process PID:"cmdline"``) is."""
    if "srt_child" in header:
        return "driver"
    if "pyspark.daemon pyspark.worker" in header:
        return "python_workers"  # UDFs, keyed operators, data source reads
    if "pyspark.sql.worker." in header:
        return "planning_workers"  # Python data source lookup/creation/read planning
    if "python_streaming_source_runner" in header:
        return "source_runner"  # the streaming reader's offsets, in the driver's JVM's pay
    return "other"  # e.g. a worker py-spy found before its exec (jspawnhelper)


def parse_pyspy_raw(path: Path, rate: int) -> dict[str, Any]:
    """py-spy ``--format raw --subprocesses``: one ``process PID:"cmd";frame;...;frame N``
    line per distinct stack. Returns, per process group (driver, Python workers, source
    runner), on-CPU seconds and the top frames by self and by inclusive time."""
    groups: dict[str, dict[str, Any]] = {}
    if not path.exists():
        return groups
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        # With --subprocesses a stack starts with one "process PID:cmd" frame per level of
        # the process tree (driver, spark-submit, JVM, daemon, worker): the last one is it.
        last = max(i for i, f in enumerate(frames) if f.startswith("process "))
        group = _classify(frames[last])
        frames = frames[last:]
        g = groups.setdefault(group, {"samples": 0, "self": Counter(), "incl": Counter()})
        n = int(count)
        g["samples"] += n
        fs = [
            f.split(" (")[0] + (f" ({f.split(' (')[1].split(':')[0]})" if " (" in f else "")
            for f in frames[1:]
        ]
        if fs:
            g["self"][fs[-1]] += n
        for f in set(fs):
            g["incl"][f] += n
    out = {}
    for name, g in groups.items():
        total = g["samples"] or 1
        out[name] = {
            "cpu_s": round(g["samples"] / rate, 2),
            "top_self": [[f, round(c / total, 3)] for f, c in g["self"].most_common(15)],
            "top_inclusive": [[f, round(c / total, 3)] for f, c in g["incl"].most_common(25)],
        }
    return out


def _share(prof: dict[str, Any], group: str, needle: str) -> float | None:
    g = prof.get(group)
    if not g:
        return None
    return sum(s for f, s in g["top_inclusive"] if needle in f) or 0.0


def profiles(
    *, work: Path, cfg: dict[str, Any], seed: int, options: dict[str, Any], progress
) -> dict[str, Any]:
    pyspy = PROJECT_PYTHON.parent / "py-spy"
    rate = 50
    work.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"runs": {}, "rate_hz": rate}
    for w in ("upi", "q5"):
        wl = WORKLOADS[w]
        progress.step(f"profile {w} (py-spy, jstat, Spark progress)", 0)
        inputs = data.prepare(
            work.parent / "data",
            wl.stream,
            cfg["events"],
            seed,
            parts=options["parallelism"],
            partitions=options["parallelism"],
        )
        expected = wl.oracle(data.parse(inputs.lines()), inputs.final_watermark_ms)
        rundir = work / w
        rundir.mkdir(parents=True, exist_ok=True)
        spy: dict[str, Any] = {}
        jvm: dict[str, Any] = {"samples": []}

        def on_start(pid: int, rundir=rundir, spy=spy, jvm=jvm) -> None:
            if pyspy.exists():
                spy["proc"] = subprocess.Popen(
                    [
                        str(pyspy),
                        "record",
                        "--pid",
                        str(pid),
                        "--subprocesses",
                        "--nonblocking",
                        "--rate",
                        str(rate),
                        "--format",
                        "raw",
                        "--output",
                        str(rundir / "pyspy.raw"),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=open(rundir / "pyspy.log", "wb"),
                )

            def poll_jvm() -> None:
                t0 = time.time()
                java = None
                while True:
                    if java is None:
                        java = _jvm_of(pid)
                    if java is not None:
                        s = _jstat(java)  # None while the JVM starts or once it has gone
                        if s is not None:
                            jvm["samples"].append({"t": round(time.time() - t0, 2), **s})
                    try:
                        os.kill(pid, 0)
                    except ProcessLookupError:
                        break
                    time.sleep(1.0)

            threading.Thread(target=poll_jvm, daemon=True).start()

        r = SYSTEMS["srt"].run(
            wl, inputs, rundir, 1, expected=expected, options={**options, "on_start": on_start}
        )
        if "proc" in spy:
            try:
                spy["proc"].wait(60)
            except subprocess.TimeoutExpired:
                spy["proc"].kill()
        prof = parse_pyspy_raw(rundir / "pyspy.raw", rate)
        keep = BENCH / "results" / "profiles"
        keep.mkdir(parents=True, exist_ok=True)
        if (rundir / "pyspy.raw").exists():
            shutil.copy(rundir / "pyspy.raw", keep / f"{w}.pyspy.collapsed.txt")
        batches = r.details.get("batches", [])
        (keep / f"{w}.batches.json").write_text(json.dumps(batches, indent=1))
        out["runs"][w] = {
            "path": wl.srt_path,
            "ok": r.ok,
            "error": r.error,
            "matched": r.check.get("matched"),
            "wall_s": r.wall_s,
            "startup_s": r.startup_s,
            "steady_events_per_s": r.steady_events_per_s,
            "t_interpreter_s": r.details.get("t_interpreter_s"),
            "t_runner_s": r.details.get("t_runner_s"),
            "batches": batches,
            "pyspy": prof,
            "jvm": jvm["samples"][-1:]
            and {"final": jvm["samples"][-1], "at_first_commit": _at(jvm["samples"], r.startup_s)},
        }
    out["decode"] = decode_cost(work.parent / "data", cfg["events"], seed, options)
    out["summary"] = summarise_profiles(out, cfg, options)
    out["_note"] = "; ".join(
        f"{w}: startup {v['startup_s'] or 0:.1f} s" for w, v in out["runs"].items()
    )
    return out


def decode_cost(data_dir: Path, events: int, seed: int, options: dict[str, Any]) -> dict[str, Any]:
    """CPU µs per record of the event-log source's JSON decode (``decode_json``, Arrow) and of
    ``json.loads`` (what the Python peers do) on the same lines, in this process on one core,
    best of 3 over up to 200k records."""
    from stateful_runtime.connectors.formats.json import decode_json, to_struct

    schemas = {
        "upi": {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int},
        "bids": {
            "auction": int,
            "bidder": int,
            "price": int,
            "channel": str,
            "url": str,
            "ts_ms": int,
        },
    }
    out = {}
    for stream, schema in schemas.items():
        inputs = data.prepare(
            data_dir,
            stream,
            events,
            seed,
            parts=options["parallelism"],
            partitions=options["parallelism"],
        )
        lines = inputs.lines()[:200_000]
        struct = to_struct(schema)

        def best(f, lines=lines) -> float:
            times = []
            for _ in range(3):
                t0 = time.process_time()
                f()
                times.append(time.process_time() - t0)
            return min(times) * 1e6 / len(lines)

        out[stream] = {
            "records": len(lines),
            "decode_json_us": round(
                best(lambda lines=lines, struct=struct: decode_json(lines, struct)), 3
            ),
            "json_loads_us": round(best(lambda lines=lines: [json.loads(x) for x in lines]), 3),
        }
    return out


def _at(samples: list[dict], t: float | None) -> dict | None:
    if t is None or not samples:
        return None
    before = [s for s in samples if s["t"] <= t]
    return before[-1] if before else None


def _fmt_ms(x: float | None) -> str:
    return "–" if x is None else f"{x:,.0f} ms"


def summarise_profiles(
    out: dict[str, Any], cfg: dict[str, Any], options: dict[str, Any]
) -> list[str]:
    """The "where the time goes" bullet list for BENCHMARKS.md."""
    lines: list[str] = []
    p = lines.append
    p(
        f"From one more run of each job with py-spy (`--subprocesses`, {out['rate_hz']} Hz, "
        f"on-CPU samples of the driver and Spark's Python workers), `jstat` on the driver JVM "
        f"(JIT and GC time) and Spark's progress per micro-batch; raw stacks (collapsed format, "
        f"opens in speedscope) and per-batch JSON in `benchmarks/results/profiles/`."
    )
    p("")
    for stream, d in (out.get("decode") or {}).items():
        p(
            f"* JSON decode ({stream} lines, one core): the source's `decode_json` (Arrow) "
            f"{d['decode_json_us']:.2f} µs/record ({1e6 / d['decode_json_us']:,.0f}/s), "
            f"`json.loads` (the Python peers' decode) {d['json_loads_us']:.2f} µs/record."
        )
    for w, r in out["runs"].items():
        if r.get("error"):
            p(f"* **{w}**: run failed: {r['error'][:200]}")
            continue
        b = r["batches"]
        data = [x for x in b if x["rows"]]
        nodata = [x for x in b if not x["rows"]]
        first = data[0] if data else None
        rest = data[1:]
        d0 = (first or {}).get("duration_ms") or {}

        def med(key: str, xs=rest) -> float | None:
            vals = [(x.get("duration_ms") or {}).get(key) for x in xs]
            return _percentile([v for v in vals if v is not None], 50)

        commit = [sum(o.get("commitTimeMs") or 0 for o in x.get("state", [])) for x in rest]
        p(
            f"* **{w}** ({r['path']} path): start to first committed batch "
            f"{r['startup_s'] or 0:.1f} s = interpreter + imports {r['t_runner_s'] or 0:.1f} s, "
            f"then Spark session start, source and query start and batch 0 "
            f"({_fmt_ms(d0.get('triggerExecution'))} for {(first or {}).get('rows', 0):,} rows: "
            f"planning {_fmt_ms(d0.get('queryPlanning'))}, addBatch "
            f"{_fmt_ms(d0.get('addBatch'))}; a later batch of the same size takes "
            f"{_fmt_ms(med('triggerExecution'))}, addBatch {_fmt_ms(med('addBatch'))})."
        )
        jvm = r.get("jvm") or {}
        at, fin = jvm.get("at_first_commit"), jvm.get("final")
        if at and fin:
            p(
                f"  * JVM: JIT compilation {at['jit_s']:.1f} s of CPU before the first commit, "
                f"{fin['jit_s'] - at['jit_s']:.1f} s after it (total {fin['jit_s']:.1f} s, "
                f"{fin['compiled']:,.0f} methods); GC {fin['gc_s']:.1f} s in all."
            )
        if nodata:
            x = nodata[-1].get("duration_ms") or {}
            p(
                f"  * Per-batch fixed cost: the final no-data batch (no rows; plans, writes the "
                f"offset log, runs the operators, commits state and the commit log) takes "
                f"{_fmt_ms(x.get('triggerExecution'))}; WAL {_fmt_ms(med('walCommit'))} and "
                f"commit log {_fmt_ms(med('commitOffsets'))} per data batch (median), planning "
                f"{_fmt_ms(med('queryPlanning'))}, offsets {_fmt_ms(med('latestOffset'))}."
            )
        if commit:
            p(
                f"  * State commit (RocksDB, `commitTimeMs` summed over partitions): median "
                f"{_fmt_ms(_percentile(commit, 50))} per batch; sink write median "
                f"{_fmt_ms(_percentile([x['sink_write_ms'] or 0 for x in rest], 50))}."
            )
        prof = r.get("pyspy") or {}
        for group, label in (
            ("driver", "driver (job process)"),
            ("python_workers", "Python workers"),
            ("planning_workers", "Python data-source planning workers"),
            ("source_runner", "streaming source runner"),
        ):
            g = prof.get(group)
            if not g:
                continue
            tops = ", ".join(f"`{f}` {s:.0%}" for f, s in g["top_self"][:6])
            p(f"  * py-spy {label}: {g['cpu_s']:.1f} s of samples; most self time in {tops}.")
        wk = prof.get("python_workers")
        if wk:
            parts = []
            for needle, what in (
                ("decode_json", "JSON decode (`decode_json`)"),
                ("read_values", "log read (`read_values`)"),
                ("_find_and_load", "imports (worker start)"),
                ("handleInputRows", "keyed operator (`handleInputRows`)"),
                ("dump_stream", "Arrow serialisation to the JVM"),
            ):
                s = _share(prof, "python_workers", needle)
                if s:
                    parts.append(f"{what} {s:.0%}")
            if parts:
                p("  * Python workers, inclusive share of their samples: " + ", ".join(parts) + ".")
    return lines
