"""What every fault trial shares: the oracle comparison, damage to a file, the trial record.

The oracle is computed from the input alone (the UPI per-minute counts of every good record,
``examples/upi_events.oracle``), never from the job's own output or checkpoint: a trial reads
the records the job's sink claims to hold (up to the source offsets of the last batch in the
sink's ledger) straight from the event log and counts them itself.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.helpers import read_topic

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts" / "faults"
TOPIC = "upi-payments"
QUERY = "upi-counts"
JOB = "upi-per-minute"

Counts = dict[tuple[str, datetime], tuple[int, int]]
# The job processes the trials start run their driver JVM with C1 only: a JVM killed within
# seconds never profits from C2, whose compile threads take a core of this 2-core machine
# during start-up (start to first commit 34 s instead of 62 s at load ~10). Recovery does not
# depend on the JIT.
JAVA_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


# -- the oracle -----------------------------------------------------------------------------------


def upi_oracle(lines: Iterable[bytes]) -> Counts:
    from upi_events import oracle  # examples/ is on sys.path (tests/helpers.py, the script)

    return oracle(lines)


def log_lines(log_dir: Path, ends: Mapping[str, int] | None, topic: str = TOPIC) -> list[bytes]:
    """The topic's records below ``ends`` ({"partition": next offset}, None: nothing)."""
    from stateful_runtime.connectors.eventlog import EventLog

    if not ends:
        return []
    reader = EventLog(log_dir).reader(topic)
    return [r.value for p, end in sorted(ends.items()) for r in reader.read(int(p), 0, int(end))]


class LogCopy:
    """The input topic's values, each read from the log once: a trial run's checks ask for the
    same prefixes again and again (and the kill trials, for every trial, for a longer one)."""

    def __init__(self, log_dir: Path, topic: str = TOPIC) -> None:
        self.log_dir, self.topic = log_dir, topic
        self.parts: dict[int, list[bytes]] = {}
        self._oracles: dict[frozenset, Counts] = {}

    def lines(self, ends: Mapping[str, int] | None) -> list[bytes]:
        """:func:`log_lines` of ``ends``, reading only offsets not read before."""
        from stateful_runtime.connectors.eventlog import EventLog

        if not ends:
            return []
        reader = None
        out: list[bytes] = []
        try:
            for p, end in sorted(ends.items()):
                have = self.parts.setdefault(int(p), [])
                if len(have) < int(end):
                    reader = reader or EventLog(self.log_dir).reader(self.topic)
                    have += reader.read_values(int(p), len(have), int(end))
                out += have[: int(end)]
        finally:
            if reader is not None:
                reader.close()
        return out

    def oracle(self, ends: Mapping[str, int] | None) -> Counts:
        """:func:`upi_oracle` of :meth:`lines`, computed once per ``ends``."""
        key = frozenset((ends or {}).items())
        if key not in self._oracles:
            self._oracles[key] = upi_oracle(self.lines(ends))
        return self._oracles[key]


def batch_offsets(qdir: Path, batch: int) -> dict[str, int] | None:
    """The source offsets (end of the batch) Spark logged for ``batch``; None for batch -1.
    A batch whose plan a checkpoint fallback moved aside (the sink may still hold it until its
    rewind) is read from the newest quarantine that has it."""
    if batch < 0:
        return None
    path = qdir / "offsets" / str(batch)
    if not path.exists():
        moved = sorted((qdir.parent / "_quarantine").glob(f"*/{qdir.name}/offsets/{batch}"))
        path = moved[-1] if moved else path
    lines = path.read_text().splitlines()
    return {k: int(v) for k, v in json.loads(lines[2]).items()}


def sink_batch(database: Path, job: str = JOB) -> int:
    """The last batch the DuckDB sink's ledger holds (-1: none)."""
    import duckdb

    if not database.exists():
        return -1
    con = duckdb.connect(str(database), read_only=True)
    try:
        has = con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'srt_sink_ledger'"
        ).fetchone()[0]
        if not has:
            return -1
        row = con.execute(
            "SELECT max(batch_id) FROM srt_sink_ledger WHERE job = ?", [job]
        ).fetchone()
    finally:
        con.close()
    return -1 if row[0] is None else int(row[0])


def duckdb_counts(database: Path, table: str = "upi_counts") -> Counts:
    import duckdb

    if not database.exists():
        return {}
    con = duckdb.connect(str(database), read_only=True)
    try:
        if not con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]
        ).fetchone()[0]:
            return {}
        rows = con.execute(
            f"SELECT merchant_id, window_start, payments, amount_paise FROM {table}"
        ).fetchall()
    finally:
        con.close()
    # A native window's start is a naive UTC timestamp, a process function's datetime an aware
    # one (TIMESTAMP WITH TIME ZONE): the oracle's keys are naive UTC.
    return {(m, _naive_utc(w)): (p, a) for m, w, p, a in rows}


def _naive_utc(when: datetime) -> datetime:
    return when if when.tzinfo is None else when.astimezone(UTC).replace(tzinfo=None)


@dataclass
class Comparison:
    """A sink's table against the oracle: payments lost and counted twice, and the windows."""

    lost: int = 0
    duplicated: int = 0
    wrong_windows: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.lost and not self.duplicated and not self.wrong_windows

    def __str__(self) -> str:
        head = f"{self.lost} payments lost, {self.duplicated} duplicated"
        return head if self.exact else f"{head}; windows: {'; '.join(self.wrong_windows[:5])}"


def compare(got: Counts, expected: Counts) -> Comparison:
    c = Comparison()
    for key in sorted(set(got) | set(expected)):
        g, e = got.get(key, (0, 0)), expected.get(key, (0, 0))
        if g != e:
            c.lost += max(0, e[0] - g[0])
            c.duplicated += max(0, g[0] - e[0])
            c.wrong_windows.append(f"{key[0]} {key[1]:%H:%M}: {g} != oracle {e}")
    return c


# -- damage ---------------------------------------------------------------------------------------

DAMAGE = ("truncate", "garbage", "empty", "missing")


def damage(path: Path, how: str, rng: random.Random) -> str:
    """Damage one file as a torn write, a bad disk or a lost file would; says what was done."""
    data = path.read_bytes()
    if how == "truncate":
        cut = rng.randint(1, max(1, len(data) - 1))
        path.write_bytes(data[:cut])
        return f"truncated {path.name} to {cut} of {len(data)} bytes"
    if how == "garbage":
        path.write_bytes(bytes(rng.randrange(256) for _ in range(len(data))))
        return f"overwrote {path.name} with {len(data)} random bytes"
    if how == "empty":
        path.write_bytes(b"")
        return f"emptied {path.name}"
    if how == "missing":
        path.unlink()
        return f"deleted {path.name}"
    raise ValueError(how)


# -- trial records --------------------------------------------------------------------------------


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            text=True,
            capture_output=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@dataclass
class TrialLog:
    """One run's trial records, rewritten to ``tests/artifacts/faults/<run>.json`` after each
    record (a run killed half-way keeps what it did)."""

    path: Path
    run: dict[str, Any]
    records: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def open(cls, source: str, directory: Path = ARTIFACTS) -> TrialLog:
        directory.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        run = {
            "run": f"{stamp}-{source}-{os.getpid()}",
            "source": source,
            "commit": _commit(),
            "started_at": stamp,
            "load_average": os.getloadavg()[0],
        }
        return cls(directory / f"{run['run']}.json", run)

    def record(self, *, fault: str, input: str, result: str, **fields: Any) -> dict[str, Any]:
        """One trial: the fault injected, the input class, ``pass``/``FAIL`` and details."""
        rec = {
            "fault": fault,
            "input": input,
            "result": result,
            **fields,
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        self.records.append(rec)
        self._write()
        return rec

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({**self.run, "trials": self.records}, indent=1, default=str))
        os.replace(tmp, self.path)

    def close(self) -> None:
        if self.records:
            self.run["load_average_end"] = os.getloadavg()[0]
            self._write()


# -- an endpoint that can go away ------------------------------------------------------------------


class OutageProxy:
    """A TCP proxy on 127.0.0.1 in front of a real service. :meth:`down` closes its port and
    every open connection (clients get "connection refused", as from a dead endpoint);
    :meth:`up` opens the same port again. The service behind it keeps its data."""

    def __init__(self, target_host: str, target_port: int) -> None:
        import socket
        import threading

        self.target = (target_host, target_port)
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self._lock = threading.Lock()
        self._conns: list[Any] = []
        self._listener: Any = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        import socket
        import threading

        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", self.port))
        s.listen(64)
        self._listener = s
        threading.Thread(target=self._accept, args=(s,), daemon=True).start()

    def down(self) -> None:
        import socket

        listener, self._listener = self._listener, None
        if listener is not None:
            try:
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            listener.close()
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: Any) -> None:
        import socket
        import threading

        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=10)
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    server.close()
                    return
                self._conns += [client, server]
            for a, b, watch in ((client, server, True), (server, client, False)):
                threading.Thread(target=self._pipe, args=(a, b, watch), daemon=True).start()

    def cut_on(self, pattern: bytes) -> None:
        """Go down the moment a client sends a request matching ``pattern`` (a regex), before
        it reaches the service: an outage at a chosen step of a protocol."""
        import re

        self._cut = re.compile(pattern)
        self.cut_hit = None

    def _pipe(self, src: Any, dst: Any, watch: bool) -> None:
        import socket

        try:
            while data := src.recv(65536):
                cut = getattr(self, "_cut", None)
                if watch and cut is not None and (m := cut.search(data)):
                    self._cut, self.cut_hit = None, m.group(0).decode(errors="replace")
                    self.down()
                    return
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


# -- input while the job runs ----------------------------------------------------------------------


def dead_letters(log_dir: Path, topic: str = f"{TOPIC}-dlq") -> list[bytes]:
    """The dead letters' values, sorted ([] if the topic was never made)."""
    return sorted(r.value for r in read_topic(log_dir, topic))


def record_run(
    trials: TrialLog,
    fault: str,
    input: str,
    ws: Any,
    lines: list[bytes],
    code: int,
    passed: str,
) -> list[str]:
    """Record a run that must end exact (exit 0, the UPI table of workspace ``ws`` = the oracle
    of ``lines``, each bad record one dead letter) as a trial: ``passed`` is its detail when
    it does. Returns what went wrong ([]: nothing)."""
    from upi_events import bad_lines

    cmp = compare(ws.table(), upi_oracle(lines))
    dead = dead_letters(ws.log_dir)
    why = []
    if code != 0:
        why.append(f"the job exited {code}: {(ws.root / 'run.log').read_text()[-1500:]}")
    if not cmp.exact:
        why.append(str(cmp))
    if dead != bad_lines(lines):
        why.append(f"{len(dead)} dead letters for {len(bad_lines(lines))} bad records")
    trials.record(
        fault=fault,
        input=input,
        result="FAIL" if why else "pass",
        detail="; ".join(why) or passed,
        lost=cmp.lost,
        duplicated=cmp.duplicated,
    )
    return why


class Feeder:
    """Appends UPI events to the event log from a thread of the test (the topic's one writer),
    ``chunk`` records every ``every_s``, until :meth:`stop`; ``fed`` is what was appended."""

    def __init__(
        self,
        log_dir: Path,
        *,
        seed: int,
        chunk: int = 200,
        every_s: float = 0.1,
        topic: str = TOPIC,
    ) -> None:
        import threading

        from upi_events import events

        self.lines = events(
            10_000_000, merchants=30, rate_per_s=300, disorder_ms=4_000, bad_every=997, seed=seed
        )
        self.fed: list[bytes] = []
        self.log_dir, self.topic, self.chunk, self.every_s = log_dir, topic, chunk, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from stateful_runtime.connectors.eventlog import EventLog
        from stateful_runtime.connectors.eventlog.ingest import _records

        with EventLog(self.log_dir).writer(self.topic) as writer:
            while not self._stop.is_set():
                chunk = [next(self.lines) for _ in range(self.chunk)]
                writer.append(_records(chunk, "merchant_id"))
                self.fed.extend(chunk)
                self._stop.wait(self.every_s)  # the feed's pace, not a synchronisation

    def stop(self) -> list[bytes]:
        self._stop.set()
        self._thread.join()
        return self.fed


def log_end(log_dir: Path, topic: str = TOPIC) -> dict[str, int]:
    from stateful_runtime.connectors.eventlog import EventLog

    return {str(p): e for p, e in EventLog(log_dir).reader(topic).end_offsets().items()}


def caught_up(qdir: Path, ends: Mapping[str, int]) -> bool:
    """Has the query committed a batch that read everything up to ``ends``?"""
    from stateful_runtime.checkpoints.layout import QueryLayout

    c = QueryLayout(qdir).last_committed()
    if c is None:
        return not any(ends.values())
    done = batch_offsets(qdir, c) or {}
    return all(done.get(p, 0) >= e for p, e in ends.items())


IDLE_S = 20.0


def kill_at_random_points(
    args: list[str], env: dict[str, str], qdir: Path, kills: int, rng: random.Random, logs: Path
) -> list[str]:
    """Start ``srt ARGS`` and kill its process group ``kills`` times on one checkpoint: at a
    random moment of start-up, or a random delay after a random number (1-3) of new batches
    committed in query ``qdir``. Returns the kill points; fails if a run ended on its own."""
    from stateful_runtime.checkpoints.layout import QueryLayout
    from tests.helpers import kill_group, srt_background

    def committed() -> int:
        c = QueryLayout(qdir).last_committed()
        return -1 if c is None else c

    points = []
    for i in range(kills):
        before, k = committed(), rng.choice([0, 1, 2, 3])
        log = logs / f"run-{i}.log"
        proc = srt_background(args, env, log)
        try:
            t0 = time.monotonic()
            if k == 0:
                wait = rng.uniform(0, 15)
                while time.monotonic() < t0 + wait and proc.poll() is None:
                    time.sleep(0.05)
                points.append(f"{wait:.1f} s after start")
            else:
                # A job that has read all its input commits no more: then the kill comes when
                # it has been idle for IDLE_S (the last commit it made).
                seen, since = committed(), time.monotonic()
                while committed() < before + k and proc.poll() is None:
                    assert time.monotonic() < t0 + 600, f"no commit {k} in 600 s"
                    if committed() != seen:
                        seen, since = committed(), time.monotonic()
                    elif seen > before and time.monotonic() - since > IDLE_S:
                        break
                    time.sleep(0.05)
                delay = rng.uniform(0, 1.5)
                time.sleep(delay)  # the random point: not a synchronisation
                points.append(f"{delay:.2f} s after commit {committed() - before}")
            assert proc.poll() is None, log.read_text()[-2000:]
        finally:
            kill_group(proc)
    return points
