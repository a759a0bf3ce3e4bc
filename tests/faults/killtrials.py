"""kill -9 trials: one input log, one UPI job restarted and killed again and again.

Each trial starts ``srt run`` on the same checkpoint and kills its whole process group (driver,
JVM, Python workers: a machine crash) at a random moment: after a random number ``k`` of new
committed batches (polled in the checkpoint's ``commits/``) plus a random delay, or — ``k = 0``
— at a random moment of start-up or the first batch. After each kill the DuckDB table must equal
the oracle of exactly the records the sink claims (up to the source offsets of the last batch in
its ledger, read from the log and counted independently): nothing lost, nothing counted twice,
at every kill point. Some trials also tear the newest ``commits/N`` after the kill (truncated,
garbage, emptied), as a crash mid-write would, or as a bad disk would one that an earlier run
wrote; the next start must fall back to the previous batch, even twice in a row. A final
``--available-now`` run drains the log: table = oracle of the whole input, dead letters exactly
once.

Seeded: the seed fixes the input, every kill point and every damage; a failure names it.

    python -m tests.faults.killtrials --trials 100 [--seed S]     (platform/fault-trials.sh)
    python -m tests.faults.killtrials --trials 20 --keyed [--operator window]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.faults.harness import (
    JAVA_OPTIONS,
    QUERY,
    TOPIC,
    Comparison,
    LogCopy,
    TrialLog,
    batch_offsets,
    compare,
    damage,
    dead_letters,
    duckdb_counts,
    sink_batch,
    upi_oracle,
)
from tests.helpers import (
    UPI_SCHEMA,
    UpiWorkspace,
    append_lines,
    kill_group,
    srt,
    srt_background,
)

FAULT = "kill -9 of the job's process group"
TORN = "kill -9 + torn newest commits/N"
ROT = "kill -9 + damaged newest commits/N written by an earlier run"
INPUT = "UPI events: 30 merchants, disorder < bound, 1 bad record in 997"
KEYED_JOB = Path(__file__).with_name("upi_keyed_job.py")


@dataclass
class Config:
    trials: int = 20
    seed: int = 0
    cap: int = 2_000  # records per batch: many small batches, many kill points
    partitions: int = 4
    parallelism: int = 2
    max_commits: int = 3  # k in 0..max_commits new committed batches before a kill
    torn_every: int = 5  # about one trial in this many tears the newest commit after its kill
    # False: the UPI example (Spark's native window); True: the same counts computed by the
    # runtime's `operator`, state in the worker's RocksDB (tests/faults/upi_keyed_job.py)
    keyed: bool = False
    operator: str = "process"  # or "window"

    def fault(self, name: str) -> str:
        """A fault's name in the trial records, with the job variant it was tried on."""
        if not self.keyed:
            return name
        what = {"process": "keyed process function", "window": "window operator"}[self.operator]
        return f"{name} ({what}, state in the worker's RocksDB)"

    @property
    def events(self) -> int:
        # The most input a run appends (the log is topped up before each trial, see
        # ``reserve``): enough that the job never runs dry before the last kill.
        return self.cap * (self.trials * (self.max_commits + 1) + 10)

    @property
    def reserve(self) -> int:
        # Records a trial starts with beyond the committed batch: its k batches (each takes at
        # most ``cap``), the replay of a batch in flight and a checkpoint fallback. Kept small,
        # so the final drain reads a few batches' worth, not everything the kills never reached.
        return self.cap * (self.max_commits + 2)


@dataclass
class Trial:
    trial: int
    kill_point: str
    batches_before: int  # committed by this run before the kill
    committed: int
    sink_batch: int
    in_flight: bool
    sink_ahead: bool
    lost: int
    duplicated: int
    result: str
    detail: str = ""
    damage: str = ""
    duration_s: float = 0.0
    fault: str = FAULT


@dataclass
class Outcome:
    seed: int
    trials: list[Trial] = field(default_factory=list)
    final: str = ""
    final_ok: bool = False
    events: int = 0  # the input the run appended

    @property
    def failures(self) -> list[Trial]:
        return [t for t in self.trials if t.result != "pass"]

    @property
    def ok(self) -> bool:
        return self.final_ok and not self.failures

    def table(self) -> str:
        rows = [
            ("trial", "seed", "kill point", "batches before", "sink/ckpt batch", "damage", "result")
        ]
        for t in self.trials:
            rows.append(
                (
                    str(t.trial),
                    str(self.seed),
                    t.kill_point,
                    str(t.batches_before),
                    f"{t.sink_batch}/{t.committed}" + (" in flight" if t.in_flight else ""),
                    t.damage or "-",
                    t.result if t.result == "pass" else f"FAIL: {t.detail}",
                )
            )
        rows.append(
            (
                "final",
                str(self.seed),
                "drain --available-now",
                "-",
                "-",
                "-",
                "pass" if self.final_ok else f"FAIL: {self.final}",
            )
        )
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in rows]
        lines.insert(1, "  ".join("-" * w for w in widths))
        passed = sum(t.result == "pass" for t in self.trials)
        lines.append(
            f"\n{passed}/{len(self.trials)} kill trials exact (0 lost, 0 duplicated); "
            f"final drain {'= oracle' if self.final_ok else 'WRONG'}; seed {self.seed}"
        )
        return "\n".join(lines)


def _check(ws: Any, log: LogCopy) -> tuple[int, int, int, str]:
    """The table against the oracle of what the sink's ledger claims, and the dead letters
    against the bad records of the committed input: (ledger batch, lost, duplicated, detail)."""
    from collections import Counter

    qdir = ws.checkpoint_dir / QUERY
    b = sink_batch(ws.database)
    table = duckdb_counts(ws.database)
    cmp = compare(table, log.oracle(batch_offsets(qdir, b)))
    detail = "" if cmp.exact else str(cmp)
    if not cmp.exact:
        # After a checkpoint fallback the sink's ledger is rewound, but its table keeps the
        # rows of the forgotten batches until they run again: it must then equal the oracle
        # of one of those batches' ends exactly (a prefix of the input, nothing twice), as
        # logged in the checkpoint or in the quarantine of the old plan.
        forgotten = []
        for f in [
            *sorted((qdir / "offsets").iterdir()),
            *sorted((ws.checkpoint_dir / "_quarantine").glob(f"*/{QUERY}/offsets/*")),
        ]:
            if f.name.isdigit() and int(f.name) > b:
                ends = {k: int(v) for k, v in json.loads(f.read_text().splitlines()[2]).items()}
                forgotten.append(log.oracle(ends))
        if any(compare(table, o).exact for o in forgotten) or _each_window_at_a_batch_end(
            table, [log.oracle(batch_offsets(qdir, b)), *forgotten]
        ):
            cmp, detail = Comparison(), ""
    # Published once their batch is committed (a commit a fallback later set aside included):
    # never more often than the input read so far holds them.
    read: dict[str, int] = {}
    for f in [
        *(qdir / "offsets").glob("[0-9]*"),
        *(ws.checkpoint_dir / "_quarantine").glob(f"*/{QUERY}/offsets/[0-9]*"),
    ]:
        for k, v in json.loads(f.read_text().splitlines()[2]).items():
            read[k] = max(read.get(k, 0), int(v))
    from upi_events import bad_lines

    extra = Counter(dead_letters(ws.log_dir)) - Counter(bad_lines(log.lines(read)))
    if extra:
        detail += f" {sum(extra.values())} dead letter(s) beyond the committed input's bad records"
    return b, cmp.lost, cmp.duplicated, detail.strip()


def _each_window_at_a_batch_end(table: dict, oracles: list[dict]) -> bool:
    """After two fallbacks in a row the re-run batches overwrite the windows they touch, and the
    windows only a forgotten later batch touched keep that batch's values until it runs again:
    then every window must hold the value it really had at one of the batch ends from the
    ledger's on (below the ledger's is a loss, above every end a double count)."""
    keys = set(table).union(*oracles)
    return all(table.get(k, (0, 0)) in {o.get(k, (0, 0)) for o in oracles} for k in keys)


def _committed(qdir: Path) -> int:
    from stateful_runtime.checkpoints.layout import QueryLayout

    c = QueryLayout(qdir).last_committed()
    return -1 if c is None else c


def run_kill_trials(
    root: Path,
    cfg: Config,
    env: dict[str, str],
    on_trial: Callable[[Trial], None] = lambda t: None,
    say: Callable[[str], None] = lambda s: None,
) -> Outcome:
    """Run ``cfg.trials`` kill trials and the final drain in ``root``."""
    # examples/ is on sys.path once tests.helpers is imported
    from upi_events import bad_lines, events

    from stateful_runtime.checkpoints.layout import QueryLayout
    from stateful_runtime.checkpoints.verify import verify
    from stateful_runtime.connectors.eventlog import EventLog

    rng = random.Random(cfg.seed)
    ws = UpiWorkspace(root, partitions=cfg.partitions)
    ws.extra.update(
        {
            "checkpoint.interval_s": "0.5",
            "parallelism": str(cfg.parallelism),
            "source.max_records_per_batch": str(cfg.cap),
        }
    )
    if cfg.keyed:
        ws.job = KEYED_JOB
        ws.extra["operator"] = cfg.operator
    EventLog(ws.log_dir).create_topic(TOPIC, cfg.partitions, schema=UPI_SCHEMA)
    source = events(
        cfg.events,
        merchants=30,
        rate_per_s=300,
        disorder_ms=4_000,
        bad_every=997,
        seed=cfg.seed % 1_000_003,
    )
    lines: list[bytes] = []  # appended so far: a prefix of the seed's input
    env = {**env, "JAVA_TOOL_OPTIONS": JAVA_OPTIONS}
    qdir = ws.checkpoint_dir / QUERY
    first_commit_s: list[float] = []
    out = Outcome(cfg.seed)
    copy = LogCopy(ws.log_dir)  # the input, read from the log once over all the trials
    for i in range(cfg.trials):
        before = _committed(qdir)
        read = sum((batch_offsets(qdir, before) or {}).values())
        if len(lines) - read < cfg.reserve:  # no job runs now: the log's one writer is here
            more = list(itertools.islice(source, cfg.reserve))
            append_lines(ws.log_dir, more)
            lines += more
        # Start-up kills (k = 0) are cheap and hit recovery itself (the in-flight batch's
        # replay, dead letters published at start): as likely as all the others together.
        k = rng.choice([0] * cfg.max_commits + list(range(1, cfg.max_commits + 1)))
        delay = rng.uniform(0, 1.5)
        torn = cfg.torn_every and rng.randrange(cfg.torn_every) == 0
        # k = 0: a moment of start-up or the first batch, spread over how long that has taken.
        early = rng.uniform(0, statistics.median(first_commit_s) if first_commit_s else 20.0)
        log = root / f"run-{i:03d}.log"
        t0 = time.monotonic()
        proc = srt_background(ws.run_args(), env, log)
        try:
            deadline = t0 + 600
            if k == 0:
                point = f"{early:.1f} s after start"
                while time.monotonic() < t0 + early and proc.poll() is None:
                    time.sleep(0.05)
            else:
                point = f"{delay:.2f} s after commit {k} of the run"
                while _committed(qdir) < before + k and proc.poll() is None:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)
                if _committed(qdir) > before and len(first_commit_s) < 50:
                    first_commit_s.append(time.monotonic() - t0)
                time.sleep(delay)  # the random point: not a synchronisation
            exited = proc.poll()
        finally:
            kill_group(proc)
        committed = _committed(qdir)
        planned = QueryLayout(qdir).last_planned()
        b, lost, dup, detail = _check(ws, copy)
        if exited is not None:
            detail = (
                f"the job exited ({exited}) before its kill: {log.read_text()[-1500:]} " + detail
            )
        elif k and committed < before + k:
            detail = f"no commit {k} within 600 s " + detail
        trial = Trial(
            i,
            point,
            committed - before,
            committed,
            b,
            planned is not None and planned > committed,
            b > committed,
            lost,
            dup,
            "FAIL" if detail else "pass",
            detail.strip(),
            duration_s=round(time.monotonic() - t0, 1),
            fault=cfg.fault(FAULT),
        )
        # A torn commits/N is a crash while writing it, when the run just killed wrote it; when
        # an earlier run did (the kill came before this run committed, perhaps after a
        # fallback had already stepped back to it), it is a disk that rots an old file, and
        # the next start falls back once more. Only a sound checkpoint is damaged: a commit
        # torn twice would be quarantined once.
        if torn and committed >= 1 and not detail and not verify(qdir):
            how = rng.choice(["truncate", "garbage", "empty"])
            target = qdir / "commits" / str(committed)
            trial.damage = damage(target, how, rng)
            trial.fault = cfg.fault(TORN if committed > before else ROT)
            named = [p.path for p in verify(qdir)]
            if named != [f"commits/{committed}"]:
                trial.result, trial.detail = "FAIL", f"verify named {named}"
        out.trials.append(trial)
        on_trial(trial)
        say(
            f"trial {i}: {point}, {trial.batches_before} batches before, sink/ckpt "
            f"{b}/{committed}, {trial.damage or 'no damage'}: {trial.result} {trial.detail}"
        )

    # One or two large batches: the drain is the check, not another trial.
    final = srt(
        ws.run_args("--available-now", "--set", "source.max_records_per_batch=1000000"),
        env,
        timeout=1200,
    )
    quarantined = len(list((ws.checkpoint_dir / "_quarantine").glob("*")))
    torn_count = sum(1 for t in out.trials if t.damage)
    cmp = compare(ws.table(), upi_oracle(lines))
    dead = dead_letters(ws.log_dir)
    problems = []
    if final.returncode != 0:
        problems.append(f"drain exited {final.returncode}: {final.stderr[-2000:]}")
    if not cmp.exact:
        problems.append(str(cmp))
    if dead != bad_lines(lines):
        problems.append(f"{len(dead)} dead letters, {len(bad_lines(lines))} bad records")
    if quarantined != torn_count:
        problems.append(f"{torn_count} torn commits, {quarantined} quarantines")
    out.final_ok = not problems
    out.events = len(lines)
    out.final = "; ".join(problems)
    return out


def _record(log: TrialLog, seed: int, cfg: Config) -> Callable[[Trial], None]:
    def record(t: Trial) -> None:
        log.record(
            fault=t.fault,
            input=INPUT,
            result=t.result,
            trial=t.trial,
            seed=seed,
            kill_point=t.kill_point,
            batches_before=t.batches_before,
            committed_batch=t.committed,
            sink_batch=t.sink_batch,
            in_flight=t.in_flight,
            sink_ahead=t.sink_ahead,
            lost=t.lost,
            duplicated=t.duplicated,
            damage=t.damage,
            detail=t.detail,
            duration_s=t.duration_s,
            cap=cfg.cap,
        )

    return record


def record_final(log: TrialLog, out: Outcome, cfg: Config) -> None:
    log.record(
        fault=cfg.fault("drain after all kills (--available-now)"),
        input=INPUT,
        result="pass" if out.final_ok else "FAIL",
        seed=out.seed,
        detail=out.final,
        trials_before=len(out.trials),
        events=out.events,
    )


def main(argv: list[str] | None = None) -> int:
    import tempfile

    p = argparse.ArgumentParser(description="kill -9 trials of the UPI job against an oracle")
    p.add_argument("--trials", type=int, default=100)
    p.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    p.add_argument("--cap", type=int, default=Config.cap, help="records per batch")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument(
        "--keyed",
        action="store_true",
        help="count with the runtime's keyed operator, state in the worker's RocksDB (default: "
        "the UPI example's native window)",
    )
    p.add_argument("--operator", choices=["process", "window"], default="process")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else random.randrange(1 << 31)
    cfg = Config(trials=a.trials, seed=seed, cap=a.cap, keyed=a.keyed, operator=a.operator)
    root = Path(tempfile.mkdtemp(prefix="srt-kill-trials-"))
    home = root / "home"
    env = {
        **os.environ,
        "SRT_HOME": str(home),
        "PYTHONUNBUFFERED": "1",
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    log = TrialLog.open("fault-trials.sh")
    print(
        f"{cfg.trials} kill -9 trials, seed {seed}, up to {cfg.events:,} events, work dir {root}; "
        f"records in {log.path}",
        flush=True,
    )
    out = run_kill_trials(
        root / "w", cfg, env, _record(log, seed, cfg), say=lambda s: print(s, flush=True)
    )
    record_final(log, out, cfg)
    log.close()
    print()
    print(out.table())
    if not a.keep and out.ok:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 0 if out.ok else 1


if __name__ == "__main__":
    sys.exit(main())
