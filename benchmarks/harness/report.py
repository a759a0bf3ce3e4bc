"""The report: targets, tables and plots from one results JSON, as Markdown.

``write(results, bench_dir)`` writes ``BENCHMARKS.md`` and PNG plots: for the ``all`` mode
into ``benchmarks/BENCHMARKS.md`` and ``benchmarks/plots/``, for any other run into
``benchmarks/results/<name>/``; it returns the Markdown text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from harness.systems import SYSTEMS
from harness.workloads import WORKLOADS

PY_OP_STEADY_TARGET = 150_000
STARTUP_TARGET_S = 5.0
P99_TARGET_MS = 1_000
KAFKA_RATIO_TARGET = 0.9


def _rate(x: float | None) -> str:
    if x is None:
        return "–"
    return f"{x / 1000:,.0f}k" if x >= 10_000 else f"{x / 1000:,.1f}k"


def _s(x: float | None) -> str:
    return "–" if x is None else f"{x:.1f} s"


def _mib(x: float | None) -> str:
    return "–" if x is None else f"{x / 2**20:,.0f} MiB"


def _ratio(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}×"


def _span(st: dict[str, Any], fmt) -> str:
    if not st or st.get("median") is None:
        return "–"
    if st.get("n", 1) <= 1 or st["min"] == st["max"]:
        return fmt(st["median"])
    return f"{fmt(st['median'])} ({fmt(st['min'])}–{fmt(st['max'])})"


def targets(res: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    summ = (res.get("throughput") or {}).get("summary") or {}

    def add(name: str, measured: str, met: bool | None, note: str = "") -> None:
        out.append({"target": name, "measured": measured, "met": met, "note": note})

    upi = summ.get("upi", {})
    r = upi.get("ratios_srt_to", {}).get("flink-sql", {})
    if r:
        w, s = r.get("whole_events_per_s"), r.get("steady_events_per_s")
        add("UPI count: whole process ≥ 1.0× Flink SQL", _ratio(w), None if w is None else w >= 1.0)
        add(
            "UPI count: steady state ≥ 1.0× Flink SQL's net job rate",
            _ratio(s),
            None if s is None else s >= 1.0,
        )
    for w, title in (("interval", "Interval join"), ("temporal", "Temporal join")):
        ran = summ.get(w, {}).get("systems", {})
        flink = ran.get("flink-sql")
        mine = ran.get("srt")
        if not mine or not flink:
            continue
        a = mine["steady_events_per_s"]["median"]
        b = flink["steady_events_per_s"]["median"]
        s = a / b if a and b else None
        add(
            f"{title}: steady state ≥ 1.0× Flink SQL's net job rate",
            _ratio(s),
            None if s is None else s >= 1.0,
        )
    py = [w for w in summ if WORKLOADS[w].python_operator]
    if py:
        ratios = {
            w: summ[w].get("ratios_srt_to", {}).get("bytewax", {}).get("whole_events_per_s")
            for w in py
        }
        known = {w: v for w, v in ratios.items() if v is not None}
        if known:
            worst = min(known, key=known.get)  # type: ignore[arg-type]
            add(
                "Python operator path: whole process ≥ 1.0× bytewax (every such workload)",
                f"{_ratio(known[worst])} (lowest, {worst}); "
                + ", ".join(f"{w} {_ratio(v)}" for w, v in known.items()),
                all(v >= 1.0 for v in known.values()),
            )
        steady = {
            w: summ[w]["systems"].get("srt", {}).get("steady_events_per_s", {}).get("median")
            for w in py
        }
        known = {w: v for w, v in steady.items() if v is not None}
        if known:
            worst = min(known, key=known.get)  # type: ignore[arg-type]
            add(
                f"Python operator path: ≥ {PY_OP_STEADY_TARGET // 1000}k events/s steady state",
                f"{_rate(known[worst])}/s (lowest, {worst}); "
                + ", ".join(f"{w} {_rate(v)}" for w, v in known.items()),
                all(v >= PY_OP_STEADY_TARGET for v in known.values()),
            )
    kafka = res.get("kafka") or {}
    if kafka.get("ratio") is not None:
        suspect = kafka["ratio"] > 1.0  # a raw consumer slower than Spark + decode on top
        add(
            f"Kafka source ≥ {KAFKA_RATIO_TARGET}× a raw consumer at "
            f"{kafka.get('events', 0):,} events",
            _ratio(kafka["ratio"])
            + (
                " (suspect: the raw consumer measured slower than the "
                "source; re-run on a quiet machine)"
                if suspect
                else ""
            ),
            None if suspect else kafka["ratio"] >= KAFKA_RATIO_TARGET,
        )
    st = (upi.get("systems", {}).get("srt", {}) or {}).get("startup_s", {})
    if st and st.get("median") is not None:
        add(
            f"Start to first committed batch ≤ {STARTUP_TARGET_S:.0f} s (UPI)",
            _span(st, _s),
            st["median"] <= STARTUP_TARGET_S,
        )
    lat = (res.get("latency") or {}).get("rates", {}).get("20000")
    if lat and lat.get("p99_ms") is not None:
        add(
            f"p99 ≤ {P99_TARGET_MS / 1000:.0f} s at 20k events/s (Kafka, short trigger)",
            f"{lat['p99_ms']:,.0f} ms",
            lat["p99_ms"] <= P99_TARGET_MS,
        )
    return out


def _plots(res: dict[str, Any], out_dir: Path) -> list[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    summ = (res.get("throughput") or {}).get("summary") or {}
    if summ:
        workloads = list(summ)
        systems = [s for s in SYSTEMS if any(s in summ[w]["systems"] for w in workloads)]
        for key, title, fname, scale in (
            (
                "whole_events_per_s",
                "Whole process (spawn to exit), events/s",
                "throughput_whole.png",
                "log",
            ),
            (
                "steady_events_per_s",
                "Steady state, events/s (Flink: net job rate)",
                "throughput_steady.png",
                "log",
            ),
            ("startup_s", "Start to first committed checkpoint, s", "startup.png", "linear"),
            (
                "peak_memory_bytes",
                "Peak memory of the process tree (PSS), MiB",
                "memory.png",
                "linear",
            ),
        ):
            fig, ax = plt.subplots(figsize=(11, 4.2))
            width = 0.8 / max(1, len(systems))
            for i, s in enumerate(systems):
                xs, ys, lo, hi = [], [], [], []
                for j, w in enumerate(workloads):
                    st = summ[w]["systems"].get(s, {}).get(key) or {}
                    if st.get("median") is None:
                        continue
                    div = 2**20 if key == "peak_memory_bytes" else 1
                    xs.append(j + i * width)
                    ys.append(st["median"] / div)
                    lo.append((st["median"] - st["min"]) / div)
                    hi.append((st["max"] - st["median"]) / div)
                ax.bar(xs, ys, width, yerr=[lo, hi], capsize=2, label=SYSTEMS[s].label)
            ax.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(workloads))])
            ax.set_xticklabels(workloads)
            ax.set_yscale(scale)
            ax.set_title(title)
            ax.legend(fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            fig.tight_layout()
            fig.savefig(out_dir / fname, dpi=90)
            plt.close(fig)
            made.append(fname)
    lat = (res.get("latency") or {}).get("rates")
    if lat:
        fig, ax = plt.subplots(figsize=(6, 4))
        rates = sorted(lat, key=int)
        for q in ("p50_ms", "p99_ms"):
            ax.plot(
                [int(r) for r in rates],
                [lat[r].get(q) for r in rates],
                marker="o",
                label=q.replace("_ms", ""),
            )
        ax.axhline(P99_TARGET_MS, color="grey", ls="--", lw=1, label="p99 target")
        ax.set_xlabel("input rate, events/s")
        ax.set_ylabel("event append → visible in sink, ms")
        ax.set_title("Latency on the Kafka source")
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out_dir / "latency.png", dpi=90)
        plt.close(fig)
        made.append("latency.png")
    prof = (res.get("profiles") or {}).get("runs") or {}
    if prof:
        fig, axes = plt.subplots(1, len(prof), figsize=(6 * len(prof), 4), squeeze=False)
        for ax, (w, p) in zip(axes[0], prof.items(), strict=False):
            batches = [b for b in p.get("batches", []) if b.get("duration_ms")]
            parts = ("queryPlanning", "latestOffset", "walCommit", "addBatch", "commitOffsets")
            bottom = [0.0] * len(batches)
            for part in parts:
                ys = [(b["duration_ms"].get(part) or 0) / 1000 for b in batches]
                ax.bar(range(len(batches)), ys, bottom=bottom, label=part)
                bottom = [a + b for a, b in zip(bottom, ys, strict=True)]
            ax.set_title(f"{w}: Spark durationMs per micro-batch")
            ax.set_xlabel("batch")
            ax.set_ylabel("s")
            ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "batches.png", dpi=90)
        plt.close(fig)
        made.append("batches.png")
    return made


def _throughput(th: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    """One throughput run's tables: rates per workload and system, then the ratios."""
    L: list[str] = []
    p = L.append
    summ = th["summary"]
    runs = (
        "one run"
        if th.get("reps") == 1
        else f"median of {th.get('reps')} runs (min–max in brackets)"
    )
    p(
        f"{th.get('events', 0):,} events per stream (seed {th.get('seed')}), {runs}; every "
        f"run is a fresh process tree. "
        f"This runtime: `local[{cfg.get('parallelism')}]`, parallelism "
        f"{cfg.get('parallelism')}, at most {th.get('options', {}).get('batch_size', 0):,} "
        f"records per micro-batch, `--available-now` over the embedded event log. Flink: "
        f"local MiniCluster, parallelism {cfg.get('parallelism')}, RocksDB (incremental), a "
        f"checkpoint every 2 s. bytewax: {cfg.get('parallelism')} processes, recovery "
        f"snapshots every 2 s."
    )
    if th.get("unavailable"):
        p("")
        p("Not run: " + "; ".join(f"{s} ({why})" for s, why in th["unavailable"].items()))
    p("")
    p(
        "| workload | system | whole process ev/s | steady ev/s | start-up | peak memory | "
        "output = oracle |"
    )
    p("|---|---|---|---|---|---|---|")
    for w, ws in summ.items():
        for s, st in ws["systems"].items():
            if st["failed"] == st["runs"]:
                p(
                    f"| {w} | {SYSTEMS[s].label} | failed: "
                    f"{(st['errors'] or [''])[0][:120].replace('|', '/')} | | | | |"
                )
                continue
            ck = st.get("check") or {}
            match = (
                "yes"
                if st["all_matched"]
                else f"**no** ({ck.get('missing')} missing, {ck.get('extra')} extra of "
                f"{ck.get('expected_rows')})"
            )
            p(
                f"| {w} | {SYSTEMS[s].label} | {_span(st['whole_events_per_s'], _rate)} | "
                f"{_span(st['steady_events_per_s'], _rate)} | {_span(st['startup_s'], _s)} | "
                f"{_span(st['peak_memory_bytes'], _mib)} | {match} |"
            )
    p("")
    peers = [
        s for s in SYSTEMS if s != "srt" and any(s in ws["ratios_srt_to"] for ws in summ.values())
    ]
    if peers:
        p("This runtime's rate ÷ each peer's (medians; > 1 means this runtime is faster):")
        p("")
        p(
            "| workload | path | "
            + " | ".join(f"÷ {SYSTEMS[s].label} whole | steady" for s in peers)
            + " |"
        )
        p("|---|---|" + "---|---|" * len(peers))
        for w, ws in summ.items():
            cells = []
            for s in peers:
                r = ws["ratios_srt_to"].get(s, {})
                cells += [_ratio(r.get("whole_events_per_s")), _ratio(r.get("steady_events_per_s"))]
            p(f"| {w} | {WORKLOADS[w].srt_path} | " + " | ".join(cells) + " |")
        p("")
    p(
        "Workloads (same JSON lines for every system; each output is checked against a "
        "Python oracle computed from the generated events — windows are compared once the "
        "final watermark closed them):"
    )
    p("")
    for w in summ:
        wl = WORKLOADS[w]
        p(
            f"* **{w}** — {wl.title}: {wl.what}. This runtime: `benchmarks/jobs/{wl.srt_job}`"
            f" ({wl.srt_path} path)."
        )
    p("")
    return L


def markdown(res: dict[str, Any], plot_prefix: str, plots: list[str]) -> str:
    env = res.get("env", {})
    cfg = res.get("config", {})
    L: list[str] = []
    p = L.append
    p("# Benchmarks: this runtime side by side with Flink and bytewax")
    p("")
    p(
        f"Written by `benchmarks/run.py {res.get('mode')}` (started {res.get('started_at')}, "
        f"{(res.get('elapsed_s') or 0) / 60:.0f} min) — do not edit by hand. Machine: "
        f"{env.get('cpus')} CPUs, {env.get('mem_total_gib')} GiB, {env.get('platform')}, "
        f"Python {env.get('python')}, PySpark {env.get('pyspark')}; load average "
        f"{', '.join(f'{x:.1f}' for x in env.get('loadavg_before', []))} at the start, "
        f"{', '.join(f'{x:.1f}' for x in env.get('loadavg_after', []))} at the end. Other work "
        f"shares this machine: compare the ratios within this run, not the absolute rates."
    )
    p("")
    tg = targets(res)
    if tg:
        p("## Targets")
        p("")
        p("| target | measured | met |")
        p("|---|---|---|")
        for t in tg:
            met = "–" if t["met"] is None else ("**yes**" if t["met"] else "no")
            p(f"| {t['target']} | {t['measured']} | {met} |")
        p("")
    th = res.get("throughput") or {}
    if th.get("summary"):
        p("## Throughput, start-up and memory")
        p("")
        L.extend(_throughput(th, cfg))
    for fname, caption in (
        ("throughput_whole.png", "whole process"),
        ("throughput_steady.png", "steady state"),
        ("startup.png", "start-up"),
        ("memory.png", "peak memory"),
    ):
        if fname in plots:
            p(f"![{caption}]({plot_prefix}{fname})")
    if plots:
        p("")
    for other in res.get("throughput_more") or []:
        p(f"## Throughput: {', '.join(other['summary'])} ({other['events']:,} events)")
        p("")
        p(f"_{other['from_run']}_")
        p("")
        L.extend(_throughput(other, other.get("config") or cfg))
    prof = res.get("profiles") or {}
    if prof.get("summary"):
        p("## Where the time goes (this runtime)")
        p("")
        if prof.get("from_run"):
            p(f"_{prof['from_run']}_")
            p("")
        L.extend(prof["summary"])
        p("")
        if "batches.png" in plots:
            p(f"![per-batch durations]({plot_prefix}batches.png)")
            p("")
    lat = res.get("latency") or {}
    if lat.get("rates"):
        p("## Latency (Kafka source, short trigger)")
        p("")
        if lat.get("from_run"):
            p(f"_{lat['from_run']}_")
            p("")
        p(lat.get("setup", ""))
        p("")
        p("| input rate | achieved | events | p50 | p99 | max |")
        p("|---|---|---|---|---|---|")
        for r, v in sorted(lat["rates"].items(), key=lambda kv: int(kv[0])):
            if v.get("error"):
                p(f"| {int(r):,}/s | failed: {v['error'][:100]} | | | | |")
                continue
            p(
                f"| {int(r):,}/s | {_rate(v.get('achieved_rate'))}/s | {v.get('events', 0):,} | "
                f"{v.get('p50_ms', 0):,.0f} ms | {v.get('p99_ms', 0):,.0f} ms | "
                f"{v.get('max_ms', 0):,.0f} ms |"
            )
        p("")
        if "latency.png" in plots:
            p(f"![latency]({plot_prefix}latency.png)")
            p("")
    so = res.get("scaleout") or {}
    if so.get("runs"):
        p("## Scale-out: standalone cluster (two workers) against local[2]")
        p("")
        if so.get("from_run"):
            p(f"_{so['from_run']}_")
            p("")
        p(so.get("setup", ""))
        p("")
        p("| master | whole process ev/s | steady ev/s | start-up | output = oracle |")
        p("|---|---|---|---|---|")
        for label, v in so["runs"].items():
            if v.get("error"):
                p(f"| {label} | failed: {v['error'][:120]} | | | |")
                continue
            p(
                f"| {label} | {_rate(v.get('whole_events_per_s'))} | "
                f"{_rate(v.get('steady_events_per_s'))} | {_s(v.get('startup_s'))} | "
                f"{'yes' if v.get('matched') else 'no'} |"
            )
        if so.get("ratio_steady") is not None:
            p("")
            p(
                f"cluster ÷ local[2]: whole {_ratio(so.get('ratio_whole'))}, steady "
                f"{_ratio(so.get('ratio_steady'))}."
            )
        p("")
    kafka = res.get("kafka") or {}
    if kafka.get("ratio") is not None or kafka.get("error"):
        p("## Kafka source against a raw consumer")
        p("")
        if kafka.get("from_run"):
            p(f"_{kafka['from_run']}_")
            p("")
        if kafka.get("error"):
            p(f"failed: {kafka['error']}")
        else:
            runs = kafka.get("runs") or {}

            def spread(side: str) -> str:
                xs = runs.get(side) or []
                return f" ({_rate(min(xs))}–{_rate(max(xs))})" if len(xs) > 1 else ""

            reps = kafka.get("reps") or 1
            p(
                f"{kafka.get('events', 0):,} events on a Apache Kafka broker "
                f"(`benchmarks/kafka_throughput.py`), "
                + (
                    f"median of {reps} runs of each side (min–max in brackets; the raw ones "
                    f"before Spark starts): "
                    if reps > 1
                    else "one run of each side: "
                )
                + f"the runtime's Kafka source at its defaults (a "
                f"streaming query, availableNow: start, a first batch of 20,000 records, the rest "
                f"in one batch, read + JSON decode) {_rate(kafka.get('source_events_per_s'))}/s"
                f"{spread('source')}, a raw confluent-kafka consumer "
                f"(a bare fetch loop, no decode) "
                f"{_rate(kafka.get('raw_events_per_s'))}/s{spread('raw_consumer')}: "
                f"{_ratio(kafka.get('ratio'))}"
                + (
                    f"; the same consumer also parsing each 65,536 values with Arrow's JSON "
                    f"reader (one thread, untyped, unchecked) "
                    f"{_rate(kafka['decoding_events_per_s'])}/s"
                    f"{spread('raw_consumer_decoding')}: "
                    f"{_ratio(kafka.get('ratio_to_decoding'))}"
                    if kafka.get("decoding_events_per_s")
                    else ""
                )
                + ". Both consumers set `fetch.queue.backoff.ms` 10 as the source does "
                "(librdkafka's 1 s default stalls a loop that takes 10,000 at a time)."
            )
        p("")
    p("## How to run")
    p("")
    p(
        "`.venv/bin/python benchmarks/run.py all` (everything) or `quick` (a few minutes); "
        "see `benchmarks/README.md` for what each figure means."
    )
    return "\n".join(L) + "\n"


def write(res: dict[str, Any], bench: Path) -> str:
    if res.get("publish") or (res.get("mode") == "all" and res.get("name") == "all"):
        md_path, plot_dir, prefix = bench / "BENCHMARKS.md", bench / "plots", "plots/"
    else:
        d = bench / "results" / res.get("name", "run")
        md_path, plot_dir, prefix = d / "BENCHMARKS.md", d, ""
    plots = _plots(res, plot_dir)
    text = markdown(res, prefix, plots)
    md_path.parent.mkdir(parents=True, exist_ok=True)
    md_path.write_text(text)
    return text + f"\n(report: {md_path})"
