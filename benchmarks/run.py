"""Side-by-side benchmarks (issue 14): this runtime against Flink 2.3 and bytewax 0.21.

    .venv/bin/python benchmarks/run.py setup    # peer venvs + plotting/profiling tools (once)
    .venv/bin/python benchmarks/run.py quick    # a few minutes: UPI and two Python-operator
                                                #   workloads, one run each, smaller input
    .venv/bin/python benchmarks/run.py all      # everything (see benchmarks/README.md)

    .venv/bin/python benchmarks/run.py throughput --workloads upi,q5 --systems srt,flink-sql
    .venv/bin/python benchmarks/run.py latency | scaleout | profiles | kafka
    .venv/bin/python benchmarks/run.py report   # rewrite the report from the last results

Results: ``benchmarks/results/<mode>.json``; the report (tables, targets, plots) is written
by the harness: ``benchmarks/BENCHMARKS.md`` with plots in ``benchmarks/plots/`` for ``all``,
``benchmarks/results/<mode>/BENCHMARKS.md`` for every other mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path[:0] = [str(BENCH), str(ROOT)]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

from harness import report  # noqa: E402
from harness.progress import Progress  # noqa: E402
from harness.systems import PROJECT_PYTHON, SYSTEMS, ensure_venv  # noqa: E402
from harness.workloads import WORKLOADS  # noqa: E402

RESULTS = BENCH / "results"
ALL_SECTIONS = ("throughput", "kafka", "latency", "scaleout", "profiles")

MODES: dict[str, dict[str, Any]] = {
    "quick": {
        "events": 200_000,
        "reps": 1,
        "batch_size": 100_000,
        "workloads": ["upi", "counter", "q5"],
        "systems": ["srt", "flink-sql", "bytewax"],
        "sections": ["throughput"],
    },
    "all": {
        "events": 1_000_000,
        "reps": 3,
        "batch_size": 250_000,
        "workloads": list(WORKLOADS),
        "systems": list(SYSTEMS),
        "sections": list(ALL_SECTIONS),
    },
}


def setup(log=print) -> None:
    """Peer venvs (benchmarks/.venvs/<peer>) and benchmarks/requirements.txt in the project's
    venv (matplotlib for the plots, py-spy for the profiles), each only if missing."""
    for name in ("flink", "bytewax"):
        ensure_venv(name, log)
    missing = []
    for req in (BENCH / "requirements.txt").read_text().splitlines():
        req = req.split("#")[0].strip()
        if not req:
            continue
        name = req.split(">")[0].split("=")[0].split("<")[0]
        if name == "py-spy":
            present = (PROJECT_PYTHON.parent / "py-spy").exists()
        else:
            present = (
                subprocess.run(
                    [str(PROJECT_PYTHON), "-c", f"import {name}"], capture_output=True
                ).returncode
                == 0
            )
        if not present:
            missing.append(req)
    if missing:
        log(f"installing into the project's venv: {' '.join(missing)}")
        subprocess.run([str(PROJECT_PYTHON), "-m", "pip", "install", "-q", *missing], check=True)


def environment() -> dict[str, Any]:
    import pyspark

    return {
        "python": platform.python_version(),
        "pyspark": pyspark.__version__,
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "mem_total_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "loadavg_before": os.getloadavg(),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 1)[1],
    )
    ap.add_argument("mode", choices=["setup", "quick", "all", "report", *ALL_SECTIONS])
    ap.add_argument("--events", type=int, help="events per stream (default: the mode's)")
    ap.add_argument("--reps", type=int, help="runs per system and workload (median of them)")
    ap.add_argument("--workloads", help=f"comma-separated, of {','.join(WORKLOADS)}")
    ap.add_argument("--systems", help=f"comma-separated, of {','.join(SYSTEMS)}")
    ap.add_argument("--batch-size", type=int, help="this runtime's max records per batch")
    ap.add_argument("--parallelism", type=int, default=2)
    ap.add_argument("--seed", type=int, default=14)
    ap.add_argument("--work", type=Path, help="work directory (default: a temp dir, removed)")
    ap.add_argument("--keep", action="store_true", help="keep every run's directory")
    ap.add_argument("--name", help="results name (default: the mode)")
    ap.add_argument(
        "--merge",
        help="report only: comma-separated results names whose sections "
        "fill the ones this result lacks, and whose throughput tables follow this "
        "result's (each marked with the run it came from)",
    )
    ap.add_argument(
        "--publish",
        action="store_true",
        help="report only: write the report as "
        "benchmarks/BENCHMARKS.md (plots in benchmarks/plots/), as `all` does",
    )
    a = ap.parse_args(argv)

    if a.mode == "setup":
        setup()
        return 0
    name = a.name or a.mode
    out_json = RESULTS / f"{name}.json"
    if a.mode == "report":
        res = json.loads((RESULTS / f"{a.name or 'all'}.json").read_text())
        for other in a.merge.split(",") if a.merge else []:
            o = json.loads((RESULTS / f"{other}.json").read_text())
            from_run = (
                f"From the separate run `{other}` ({o.get('started_at')}, "
                f"{o['config']['events']:,} events)."
            )
            if (res.get("throughput") or {}).get("summary") and (o.get("throughput") or {}).get(
                "summary"
            ):
                # A second throughput run (other workloads, systems or sizes): its own tables.
                res.setdefault("throughput_more", []).append(
                    {**o["throughput"], "config": o["config"], "from_run": from_run}
                )
            for section in ALL_SECTIONS:
                mine = res.get(section) or {}
                if (
                    o.get(section)
                    and not o[section].get("error")
                    and (not mine or mine.get("error"))
                ):
                    res[section] = {**o[section], "from_run": from_run}
        res["publish"] = a.publish
        print(report.write(res, BENCH))
        return 0

    base = MODES["all"] if a.mode in ALL_SECTIONS else MODES[a.mode]
    sections = [a.mode] if a.mode in ALL_SECTIONS else base["sections"]
    cfg = {
        "events": a.events or base["events"],
        "reps": a.reps or base["reps"],
        "batch_size": a.batch_size or base["batch_size"],
        "workloads": a.workloads.split(",") if a.workloads else base["workloads"],
        "systems": a.systems.split(",") if a.systems else base["systems"],
    }
    for w in cfg["workloads"]:
        if w not in WORKLOADS:
            ap.error(f"unknown workload {w!r}")
    for s in cfg["systems"]:
        if s not in SYSTEMS:
            ap.error(f"unknown system {s!r}")
    setup(log=lambda m: print(m, file=sys.stderr))
    work = a.work or Path(tempfile.mkdtemp(prefix="srt-sxs-"))
    work.mkdir(parents=True, exist_ok=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "name": name,
        "mode": a.mode,
        "sections": sections,
        "started_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "config": {**cfg, "parallelism": a.parallelism, "seed": a.seed},
        "env": environment(),
    }
    t0 = time.monotonic()

    def save() -> None:
        results["elapsed_s"] = round(time.monotonic() - t0, 1)
        out_json.write_text(json.dumps(results, indent=1, default=str) + "\n")

    options = {
        "batch_size": cfg["batch_size"],
        "parallelism": a.parallelism,
        "topic_partitions": a.parallelism,
        "master": f"local[{a.parallelism}]",
    }
    from harness import extras, throughput

    total = 0.0
    if "throughput" in sections:
        total += throughput.weight(cfg["workloads"], cfg["systems"], cfg["reps"], cfg["events"])
    total += sum(extras.WEIGHT[s] for s in sections if s in extras.WEIGHT)
    progress = Progress(total)
    progress.say(
        f"{name}: sections {', '.join(sections)}; work directory {work}; results {out_json}"
    )
    try:
        if "throughput" in sections:
            throughput.run(
                work=work,
                workloads=cfg["workloads"],
                systems=cfg["systems"],
                reps=cfg["reps"],
                events=cfg["events"],
                seed=a.seed,
                options=options,
                progress=progress,
                keep=a.keep,
                results=results,
                save=save,
            )
        for section in sections:
            if section in extras.WEIGHT:
                extras.run(
                    section,
                    work=work,
                    cfg=cfg,
                    seed=a.seed,
                    options=options,
                    progress=progress,
                    results=results,
                    save=save,
                    keep=a.keep,
                )
    finally:
        progress.close()
        results["env"]["loadavg_after"] = os.getloadavg()
        save()
        if not a.work and not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(report.write(results, BENCH))
    print(f"\nresults: {out_json}  ({results['elapsed_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
