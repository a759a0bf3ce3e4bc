"""Side-by-side throughput: every workload on every system, over the same events, in one run.

Runs are interleaved (for each workload and repetition, every system in turn) so that a
change in machine load over time touches every system alike. Each system's figures are the
median of its repetitions with min and max; ratios divide this runtime's median by a peer's.
"""

from __future__ import annotations

import shutil
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import data
from harness.progress import Progress
from harness.systems import SYSTEMS
from harness.workloads import WORKLOADS

# Rough seconds per run, for the progress bar's ETA only.
RUN_WEIGHT = {"srt": 40.0, "flink-sql": 15.0, "flink-ds": 40.0, "bytewax": 10.0}


def weight(workloads: list[str], systems: list[str], reps: int, events: int) -> float:
    scale = max(0.3, events / 1_000_000)
    return sum(RUN_WEIGHT.get(s, 30) * scale * reps for _ in workloads for s in systems)


def _stats(values: list[float | None]) -> dict[str, float | None]:
    xs = [v for v in values if v is not None]
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per workload and system: median/min/max of each figure, whether every run matched the
    oracle; per workload: this runtime's ratios to each peer (medians)."""
    out: dict[str, Any] = {}
    for w in dict.fromkeys(r["workload"] for r in runs):
        per: dict[str, Any] = {}
        for s in dict.fromkeys(r["system"] for r in runs if r["workload"] == w):
            rs = [r for r in runs if r["workload"] == w and r["system"] == s]
            ok = [r for r in rs if r["ok"]]
            per[s] = {
                "runs": len(rs),
                "failed": len(rs) - len(ok),
                "errors": [r["error"] for r in rs if r["error"]][:2],
                "all_matched": bool(ok)
                and len(ok) == len(rs)
                and all(r["check"].get("matched") for r in ok),
                "whole_events_per_s": _stats([r["whole_events_per_s"] for r in ok]),
                "steady_events_per_s": _stats([r["steady_events_per_s"] for r in ok]),
                "startup_s": _stats([r["startup_s"] for r in ok]),
                "wall_s": _stats([r["wall_s"] for r in ok]),
                "peak_memory_bytes": _stats([r["peak_memory_bytes"] for r in ok]),
                "cpu_s": _stats([r["cpu_s"] for r in ok]),
                "check": ok[-1]["check"] if ok else (rs[-1]["check"] if rs else {}),
            }
        ratios: dict[str, Any] = {}
        mine = per.get("srt")
        if mine:
            for s, peer in per.items():
                if s == "srt":
                    continue
                ratios[s] = {}
                for k in ("whole_events_per_s", "steady_events_per_s"):
                    a, b = mine[k]["median"], peer[k]["median"]
                    ratios[s][k] = a / b if a and b else None
        out[w] = {"systems": per, "ratios_srt_to": ratios}
    return out


def run(
    *,
    work: Path,
    workloads: list[str],
    systems: list[str],
    reps: int,
    events: int,
    seed: int,
    options: dict[str, Any],
    progress: Progress,
    keep: bool,
    results: dict[str, Any],
    save,
) -> dict[str, Any]:
    section: dict[str, Any] = {
        "events": events,
        "reps": reps,
        "seed": seed,
        "workloads": workloads,
        "systems": systems,
        "options": {k: v for k, v in options.items() if k != "env"},
        "runs": [],
    }
    results["throughput"] = section
    skipped = {s: SYSTEMS[s].available() for s in systems}
    section["unavailable"] = {s: why for s, why in skipped.items() if why}
    systems = [s for s in systems if not skipped[s]]
    streams = sorted(
        {WORKLOADS[w].stream for w in workloads}
        | {WORKLOADS[w].second for w in workloads if WORKLOADS[w].second}
    )
    inputs: dict[str, data.Inputs] = {}
    parsed: dict[str, list[dict]] = {}
    for stream in streams:
        progress.step(f"generate {events:,} {stream} events", 0)
        inputs[stream] = data.prepare(
            work / "data",
            stream,
            events,
            seed,
            parts=options["parallelism"],
            partitions=options["topic_partitions"],
        )
        parsed[stream] = data.parse(inputs[stream].lines())
        progress.done()
    section["inputs"] = {
        s: {
            "events": i.records,
            "max_ts_ms": i.max_ts_ms,
            "bytes": i.lines_path.stat().st_size,
        }
        for s, i in inputs.items()
    }
    for w in workloads:
        wl = WORKLOADS[w]
        inp = inputs[wl.stream]
        given: Any = parsed[wl.stream]
        if wl.second:
            inp = replace(inp, second=inputs[wl.second])
            given = (given, parsed[wl.second])
        expected = wl.oracle(given, inp.final_watermark_ms)
        for rep in range(1, reps + 1):
            for s in systems:
                if not SYSTEMS[s].runs(wl):
                    continue
                rundir = work / "throughput" / w / s / f"rep{rep}"
                shutil.rmtree(rundir, ignore_errors=True)
                rundir.mkdir(parents=True)
                progress.step(
                    f"{w} · {s} · run {rep}/{reps}",
                    RUN_WEIGHT.get(s, 30) * max(0.3, events / 1_000_000),
                )
                r = SYSTEMS[s].run(wl, inp, rundir, rep, expected=expected, options=options)
                section["runs"].append(r.to_json())
                if r.ok:
                    note = (
                        f"{r.whole_events_per_s:,.0f} ev/s whole"
                        + (
                            f", {r.steady_events_per_s:,.0f} steady"
                            if r.steady_events_per_s
                            else ""
                        )
                        + (
                            ""
                            if r.check.get("matched")
                            else f", MISMATCH (missing {r.check.get('missing')}, extra "
                            f"{r.check.get('extra')})"
                        )
                    )
                else:
                    note = f"FAILED: {(r.error or '')[:200]}"
                progress.done(f"{w} · {s} · run {rep}: {note}")
                if not keep and r.ok and r.check.get("matched"):
                    shutil.rmtree(rundir, ignore_errors=True)  # else kept for its logs
                section["summary"] = summarise(section["runs"])
                save()
    section["summary"] = summarise(section["runs"])
    save()
    return section
