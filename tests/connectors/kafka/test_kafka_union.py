"""``DataStream.union`` of an event-log topic and a Kafka topic (examples/upi_union.py's feeds),
on real Spark and the real broker: one job of two queries downstream of the union (the native
window; a map and the runtime's window operator, a keyed process function, with a late side
output).

One job file serves every assertion, in three runs: a clean run (each input accounted apart;
the watermark the minimum of the inputs'; `srt reconcile` per source), a run with records
behind the watermark on one input (late per source), and a kill -9 trial (every table equals an
oracle computed from the inputs alone). Then the upgrade checks: a union whose inputs are
reordered or cut is refused, by name, before Spark starts.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest
from upi_events import START_MS, events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from tests.helpers import (
    EXAMPLES,
    append_lines,
    kill_group,
    srt,
    srt_background,
    wait_for_commit,
)

pytestmark = pytest.mark.slow

JOB = """
import sys
from datetime import timedelta

sys.path.insert(0, {examples!r})
import upi_union
from dbt_sink import DuckDBUpsertSink
from stateful_runtime import Count, OutputTag, StreamJob, Sum, TumblingEventTimeWindows

DEFAULTS = {{**upi_union.DEFAULTS, "checkpoint.interval_s": 0.5, "parallelism": 2}}
RUPEES = {{"txn_id": str, "merchant_id": str, "rupees": int, "ts_ms": int}}
LATE = OutputTag("late", RUPEES)


def to_rupees(r):
    return {{"txn_id": r["txn_id"], "merchant_id": r["merchant_id"],
             "rupees": r["amount_paise"] // 100, "ts_ms": r["ts_ms"]}}


def build(config):
    job = StreamJob.from_config("upi-union", config)
    both = upi_union.payments(job, config)
    db = config["sink.database"]
    key = ("merchant_id", "window_start")
    # The example's native window.
    both.key_by("merchant_id").window(TumblingEventTimeWindows.of(timedelta(minutes=1))).aggregate(
        {{"payments": Count(), "amount_paise": Sum("amount_paise")}}, name="per-merchant-minute"
    ).sink_to(DuckDBUpsertSink(db, "native", key=key), name="native")
    # A map, then the runtime's window operator (a keyed process function) with a late output.
    python = (
        both.map(to_rupees, output=RUPEES, name="rupees")
        .key_by("merchant_id")
        .window(TumblingEventTimeWindows.of(timedelta(minutes=1)))
        .side_output_late_data(LATE)
        .aggregate({{"payments": Count(), "rupees": Sum("rupees")}}, name="python-minute")
    )
    python.sink_to(DuckDBUpsertSink(db + ".python", "python", key=key), name="python")
    python.get_side_output(LATE).sink_to(
        DuckDBUpsertSink(db + ".late", "late", key=("txn_id",)), name="late"
    )
    return job
"""


def feed(count: int, **how) -> list[bytes]:
    """UPI payments of 10 merchants (upi_events' default is 50): the runtime's window operator
    calls its Python once per key and batch, so fewer keys make every batch of the run cheaper;
    each assertion here holds for any number of keys above one."""
    return list(events(count, merchants=10, **how))


def _rows(database: Path, sql: str) -> list[tuple]:
    import duckdb

    con = duckdb.connect(str(database), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def _records(stdout: str, query: str) -> dict[str, tuple[int, int, int, int]]:
    """The run's `records of <query> from source <s>` lines: source → (input, output, dead
    letters, late)."""
    pattern = (
        rf"records of {query} from source (\S+) \(this run\): input ([\d,]+) = output "
        r"([\d,]+) \+ dead letters ([\d,]+) \+ late ([\d,]+)"
    )
    return {
        m[0]: tuple(int(v.replace(",", "")) for v in m[1:])  # type: ignore[misc]
        for m in re.findall(pattern, stdout)
    }


def _minute(ts_ms: int) -> datetime:
    return datetime.fromtimestamp(ts_ms // 60_000 * 60, UTC).replace(tzinfo=None)


def _good(lines: list[bytes]) -> list[dict]:
    out = []
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if isinstance(e, dict) and isinstance(e.get("amount_paise"), int):
            out.append(e)
    return out


@pytest.mark.faults
def test_union_of_event_log_and_kafka_accounts_each_input_and_is_exactly_once(
    upi, kafka, srt_env, tmp_path
):
    kafka.create_topic("bank-union", 2)
    job_file = tmp_path / "union_job.py"
    job_file.write_text(JOB.format(examples=str(EXAMPLES)))
    upi.extra.update({"bank.bootstrap_servers": kafka.bootstrap, "bank.topic": "bank-union"})
    db = upi.database

    def run(*more: str):
        out = srt(["run", str(job_file), *upi.sets(), "--available-now", *more], srt_env)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    def bank(lines: list[bytes]) -> None:
        kafka.produce("bank-union", [(b"k%d" % i, line) for i, line in enumerate(lines)])

    # --- run 1: five minutes of each feed, one bad record each --------------------------------
    app1 = [*feed(3000, rate_per_s=10, seed=1), b"{not json"]
    bank1 = [*feed(1500, rate_per_s=5, seed=2), b'{"txn_id": "x", "amount_paise": "ten"}']
    append_lines(upi.log_dir, app1)
    bank(bank1)
    out = run()
    for query in ("native", "python-minute"):
        assert _records(out, query) == {
            "app-payments": (3001, 3000, 1, 0),
            "bank-payments": (1501, 1500, 1, 0),
            "app-payments+bank-payments": (4502, 4500, 2, 0),
        }, out
    # srt status --json: the query's records, and each input's.
    status = json.loads(srt(["status", "upi-union", "--json"], srt_env).stdout)[0]
    records = status["health"]["native"]["records"]
    assert (records["source"], records["input"], records["dead_letters"]) == (
        "app-payments+bank-payments",
        4502,
        2,
    )
    assert [
        (s["source"], s["input"], s["output"], s["dead_letters"], s["late"])
        for s in records["by_source"]
    ] == [("app-payments", 3001, 3000, 1, 0), ("bank-payments", 1501, 1500, 1, 0)]
    # The union's watermark is the smaller of the two: the bank feed's, 30 s behind its
    # largest event time (the app feed's would be 5 s behind its own).
    wm = QueryLayout(upi.checkpoint_dir / "native").committed_offsets()["watermark_ms"]
    bank_max = max(e["ts_ms"] for e in _good(bank1))
    app_max = max(e["ts_ms"] for e in _good(app1))
    assert wm == min(bank_max - 30_000, app_max - 5_000) == bank_max - 30_000
    # Each input's offsets on its own line of offsets/N: the log's four partitions, the topic's two.
    lines = QueryLayout(upi.checkpoint_dir / "native").committed_offsets()["sources"]
    assert sum(lines[0].values()) == 3001 and sum(lines[1].values()) == 1501
    # srt reconcile counts one input of the union (the event log's), named.
    rec = srt(["reconcile", "upi-union", "--query", "native", "--window", "1m", "--json"], srt_env)
    assert rec.returncode != 0 and "app-payments" in rec.stderr and "bank-payments" in rec.stderr
    rec = srt(
        ["reconcile", "upi-union", "--query", "native", "--window", "1m", "--json"]
        + ["--source", "app-payments"],
        srt_env,
    )
    assert rec.returncode == 0, rec.stderr
    counts = json.loads(rec.stdout)
    assert (counts["records"], counts["good"], counts["dead_letters"]) == (3001, 3000, 1)
    # Each input's dead letters went to its own topic.
    assert len(kafka.read("bank-union-dlq")) == 1

    # --- run 2: the bank feed sends records behind the watermark ---------------------------
    late = [
        json.dumps(
            {"txn_id": f"late{i}", "merchant_id": "M1", "amount_paise": 100, "ts_ms": START_MS + i}
        ).encode()
        for i in range(7)
    ]
    app2 = feed(600, rate_per_s=10, seed=3, start_ms=START_MS + 300_000)
    bank2 = [*late, *feed(300, rate_per_s=5, seed=4, start_ms=START_MS + 300_000)]
    append_lines(upi.log_dir, app2)
    bank(bank2)
    out = run()
    assert _records(out, "native") == {
        "app-payments": (600, 600, 0, 0),
        "bank-payments": (307, 300, 0, 7),
        "app-payments+bank-payments": (907, 900, 0, 7),
    }, out
    # The window operator sends them to its late side output, each counted as its input's.
    assert _records(out, "python-minute")["app-payments+bank-payments"] == (907, 900, 0, 7)
    assert _records(out, "python-minute")["bank-payments"] == (307, 300, 0, 7)
    assert _records(out, "python-minute")["app-payments"] == (600, 600, 0, 0)
    assert sorted(r[0] for r in _rows(Path(f"{db}.late"), "SELECT txn_id FROM late")) == sorted(
        f"late{i}" for i in range(7)
    )

    # --- run 3: kill -9 after a commit, then drain: every table equals the oracle -----------
    app3 = feed(3000, rate_per_s=10, seed=5, start_ms=START_MS + 360_000)
    bank3 = feed(1500, rate_per_s=5, seed=6, start_ms=START_MS + 360_000)
    append_lines(upi.log_dir, app3)
    bank(bank3)
    python_dir = upi.checkpoint_dir / "python-minute"
    before = QueryLayout(python_dir).last_committed()
    log = tmp_path / "killed.log"
    proc = srt_background(["run", str(job_file), *upi.sets()], srt_env, log)
    try:
        wait_for_commit(python_dir, before, proc, log)
    finally:
        kill_group(proc)
    run()

    on_time = app1 + app2 + app3 + bank1 + bank2[len(late) :] + bank3
    expected = oracle(on_time)
    native = {
        (m, w): (p, int(a))
        for m, w, p, a in _rows(
            db, "SELECT merchant_id, window_start, payments, amount_paise FROM native"
        )
    }
    assert native == expected
    rupees = {
        (m, w): (p, int(r))
        for m, w, p, r in _rows(
            Path(f"{db}.python"), "SELECT merchant_id, window_start, payments, rupees FROM python"
        )
    }
    by_window: dict = {}
    for e in _good(on_time):
        k = (e["merchant_id"], _minute(e["ts_ms"]))
        n, r = by_window.get(k, (0, 0))
        by_window[k] = (n + 1, r + e["amount_paise"] // 100)
    # The window operator writes a window once the watermark passes its end (no early firing).
    final = QueryLayout(python_dir).committed_offsets()["watermark_ms"]
    closed = {k for k in by_window if k[1].replace(tzinfo=UTC).timestamp() * 1000 + 60_000 <= final}
    assert closed and closed <= set(rupees)
    assert rupees == {k: by_window[k] for k in rupees}

    # --- upgrades: the union's inputs reordered or cut are refused before Spark starts -------
    for changed in ("cut", "reordered"):
        text = JOB.format(examples=str(EXAMPLES))
        if changed == "reordered":
            text = text.replace(
                "both = upi_union.payments(job, config)",
                "both = upi_union.payments(job, config)\n"
                "    both = type(both)(job, type(both.node)(both.node.inputs[::-1]))",
            )
        else:
            text = text.replace(
                "both = upi_union.payments(job, config)",
                "both = upi_union.payments(job, config)\n"
                "    both = type(both)(job, both.node.inputs[0])",
            )
        job_file.write_text(text)
        out = srt(["run", str(job_file), *upi.sets(), "--available-now"], srt_env)
        assert out.returncode != 0
        assert "a union's inputs cannot be" in out.stderr, out.stderr
        assert "query native" in out.stderr
