"""SIGINT and SIGTERM to a real `srt run`, to its pid or to its process group (what Ctrl-C,
`timeout`, systemd and Kubernetes send), at several moments of its life: while its job file
loads, before Spark is up, with a batch in flight, and a second signal during the stop. Each
ends cleanly: exit 0 (docs/cli.md), no traceback, the registry STOPPED with the signal (which
the Dagster sensor takes for a stop, not a crash), and a restart continues exactly: the sink's
table equals the oracle, each dead letter published once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from upi_events import events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.runtime import registry
from tests.helpers import (
    append_lines,
    kill_group,
    poll,
    srt,
    srt_background,
    wait_for,
    wait_for_commit,
)

pytestmark = pytest.mark.slow

JOB = "upi-per-minute"
QUERY = "upi-counts"
# What a stop must not print (PySpark's, py4j's, the JVM's and Python's ways of dying).
NOISE = ("Traceback", "KeyboardInterrupt", "Exception", "ERROR", "Py4J", "StackOverflowError")

# (signal, to the process group?, moment, a second signal during the stop?)
TRIALS = [
    (signal.SIGTERM, True, "loading", False),
    (signal.SIGINT, False, "before-spark", False),
    (signal.SIGTERM, True, "before-spark", False),
    (signal.SIGTERM, True, "mid-run", True),
    (signal.SIGTERM, False, "mid-run", False),
    (signal.SIGINT, True, "mid-run", True),
]


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (srt run's, from its first moment)."""
    status = Path(f"/proc/{pid}/status").read_text()
    mask = int(next(ln for ln in status.splitlines() if ln.startswith("SigCgt:")).split()[1], 16)
    return bool(mask & (1 << (sig - 1)))


def _registered(pid: int) -> bool:
    """The job process registered itself (its control endpoint up), Spark not started yet."""
    entry = registry.read(JOB) or {}
    return entry.get("pid") == pid and entry.get("state") == "STARTING" and "control" in entry


def _stopped_entry(what: str, pid: int, sig: int) -> None:
    """The registry says STOPPED by ``sig`` for ``pid``, and the Dagster sensor agrees."""
    from dagster_defs import Condition, RestartPolicy, assess

    entry = registry.require(JOB)
    assert entry["pid"] == pid, (what, entry)
    assert (entry["state"], entry.get("stopped_by")) == ("STOPPED", signal.Signals(sig).name)
    health = assess(
        entry, alive=False, queries={}, now=0.0, started_age_s=None, policy=RestartPolicy()
    )
    assert health.condition is Condition.STOPPED, (what, health)


def _send(proc: subprocess.Popen, sig: int, group: bool) -> None:
    (os.killpg if group else os.kill)(proc.pid, sig)


def _trial(upi, srt_env, n: int, sig: int, group: bool, moment: str, twice: bool) -> None:
    qdir = upi.checkpoint_dir / QUERY
    before = QueryLayout(qdir).last_committed()
    log = upi.root / f"run-{n}.log"
    previous = registry.read(JOB)
    proc = srt_background(upi.run_args(), srt_env, log)
    try:
        if moment == "loading":
            wait_for(lambda: _catches(proc.pid, signal.SIGTERM), proc, log, "signal handlers")
        elif moment == "before-spark":
            wait_for(lambda: _registered(proc.pid), proc, log, "registered, STARTING")
        else:
            wait_for_commit(qdir, before, proc, log)
        at_signal = QueryLayout(qdir).last_committed()
        _send(proc, sig, group)
        if twice:
            wait_for(lambda: "stopping" in log.read_text(), proc, log, "stopping")
            _send(proc, sig, group)
        code = proc.wait(timeout=180)
    finally:
        kill_group(proc)
    out = log.read_text()
    what = f"trial {n}: {signal.Signals(sig).name} to the {'group' if group else 'pid'} {moment}"
    assert code == 0, f"{what}: exit {code}\n{out[-3000:]}"
    assert not [w for w in NOISE if w in out], f"{what}:\n{out[-3000:]}"
    if moment == "mid-run" and not twice:
        # The stop let the batch in flight commit, not the backlog behind it (a stop that
        # waited for an idle trigger read all of it first).
        last = QueryLayout(qdir).last_committed()
        assert last is not None and at_signal is not None and last - at_signal <= 2, (what, last)
    if moment == "loading":  # it never registered: the entry stays the last run's
        assert registry.read(JOB) == previous, what
        return
    _stopped_entry(what, proc.pid, sig)


def _launched_trial(upi, srt_env, sig: int) -> None:
    """`srt launch` (as Dagster launches): its STARTING entry names the process from the start;
    a stop before the process registered must not leave it STARTING (the sensor would take it
    for a failed launch and restart the job)."""
    launched = json.loads(srt(["launch", *upi.run_args()[1:], "--json"], srt_env).stdout)
    pid, log = launched["pid"], Path(launched["log_path"])
    poll(lambda: _catches(pid, signal.SIGTERM), 60, "signal handlers")
    os.killpg(pid, sig)
    poll(lambda: not registry.pid_alive(pid), 180, "the launched job to exit")
    # The job's log holds every run of the job in this test session (other tests' runs too):
    # only this launch's part, from the launcher's "launching:" line, is this trial's.
    out = log.read_text()
    out = out[out.rfind(" launching: ") :]
    what = f"launched, {signal.Signals(sig).name} to the group while loading"
    assert not [w for w in NOISE if w in out], f"{what}:\n{out[-3000:]}"
    _stopped_entry(what, pid, sig)


def test_sigint_and_sigterm_stop_cleanly_at_any_moment_and_restart_exactly(upi, srt_env):
    fed = list(
        events(90_000, merchants=30, rate_per_s=300, disorder_ms=4_000, bad_every=9_973, seed=23)
    )
    append_lines(upi.log_dir, fed)
    upi.extra["checkpoint.interval_s"] = "0.5"
    upi.extra["source.max_records_per_batch"] = "3000"
    _launched_trial(upi, srt_env, signal.SIGINT)
    for n, (sig, group, moment, twice) in enumerate(TRIALS):
        _trial(upi, srt_env, n, sig, group, moment, twice)
    assert QueryLayout(upi.checkpoint_dir / QUERY).last_committed() is not None

    # The drain reads the rest in one large batch: the 3,000-record batches above are for
    # the stops, whose batch in flight must be short; the drain is the check.
    final = srt(
        upi.run_args("--available-now", "--set", "source.max_records_per_batch=1000000"), srt_env
    )
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-3000:]
    assert upi.table() == oracle(fed)
    reader = EventLog(upi.log_dir).reader("upi-payments-dlq")
    dead = sorted(r.value for p, e in reader.end_offsets().items() for r in reader.read(p, 0, e))
    bad = sorted(
        line
        for line in fed
        if line.startswith(b"{not") or b'"ten"' in line or b'"amount_paise"' not in line
    )
    assert dead == bad  # each dead letter exactly once across the stops


HELD_JOB = """
import os, time
from stateful_runtime import LogSink, LogSource, StreamJob, WatermarkStrategy

DEFAULTS = {
    "source.log_dir": "srt-data/log",
    "source.topic": "upi-payments",
    "checkpoint.dir": "srt-data/checkpoints",
    "checkpoint.interval_s": 0.5,
}
PAYMENT = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}


def held(payment):  # in a Python worker: the driver waits in a Java call meanwhile
    open(os.environ["SRT_TEST_REACHED"], "a").close()
    while not os.path.exists(os.environ["SRT_TEST_GATE"]):
        time.sleep(0.05)
    return payment


def build(config):
    job = StreamJob.from_config("held", config)
    payments = job.from_source(
        LogSource.from_config(config, PAYMENT),
        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_field("ts_ms"),
        name="payments",
    )
    payments.map(held).sink_to(LogSink(config["source.log_dir"], "held-out"), name="out")
    return job
"""


def test_a_second_signal_interrupts_the_batch_in_flight_as_a_stop_and_it_is_replayed(
    upi, srt_env, tmp_path
):
    """The second signal stops the query without waiting: Spark interrupts the batch in the
    middle of a Java call of the job's foreachBatch. Spark must take that for a stop (its
    check of the interruption once overflowed the JVM's stack on the traceback's length: a
    StackOverflowError in the log), and the batch is replayed, whole, on restart."""
    fed = list(events(40, merchants=3, rate_per_s=10, disorder_ms=0, seed=5))
    append_lines(upi.log_dir, fed)
    job = tmp_path / "held.py"
    job.write_text(HELD_JOB)
    gate, reached = tmp_path / "gate", tmp_path / "reached"
    env = {**srt_env, "SRT_TEST_GATE": str(gate), "SRT_TEST_REACHED": str(reached)}
    args = ["run", str(job), "--set", f"source.log_dir={upi.log_dir}"]
    args += ["--set", f"checkpoint.dir={tmp_path / 'checkpoints'}"]
    log = tmp_path / "held.log"
    proc = srt_background(args, env, log)
    try:
        wait_for(reached.exists, proc, log, "the batch in the held map")
        _send(proc, signal.SIGINT, True)
        wait_for(lambda: "stopping" in log.read_text(), proc, log, "stopping")
        _send(proc, signal.SIGINT, True)
        code = proc.wait(timeout=180)
    finally:
        kill_group(proc)
    out = log.read_text()
    assert code == 0, out[-3000:]
    assert not [w for w in NOISE if w in out], out[-3000:]
    assert (registry.require("held")["state"], registry.require("held")["stopped_by"]) == (
        "STOPPED",
        "SIGINT",
    )
    gate.touch()
    final = srt([*args, "--available-now"], env)
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-3000:]
    reader = EventLog(upi.log_dir).reader("held-out")
    got = sorted(
        json.loads(r.value)["txn_id"]
        for p, e in reader.end_offsets().items()
        for r in reader.read(p, 0, e)
    )
    assert got == sorted(json.loads(line)["txn_id"] for line in fed)
