"""The UPI job into PostgreSQL, ClickHouse and Delta Lake at once (``sink.kind=postgres,
clickhouse,delta``: one query per warehouse in one job), end to end through the real CLI:

* 200k disordered events, ``--available-now``: every table equals the oracle, no key twice.
* kill -9 of the whole job at five random points and at three forced ones (a sink held by its
  test hook between the data and its ledger entry, between two partitions of a batch, between
  the last partition and the batch's commit), both warehouse servers down for a while mid-run
  (the fifth random kill ends that run), this process appending to the job's topic all the
  while: every table still equals the oracle (ClickHouse with FINAL; its raw copies are
  explained by the replays its ledger records) and each bad record is one dead letter; then a
  batch in PostgreSQL's ledger but not in Spark's commit log is replayed without a write.
"""

from __future__ import annotations

import random
import threading
import time

import pytest
from upi_events import bad_lines, events, oracle

from dbt_sink.partitioned import HOOK_AT, HOOK_DIR
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.connectors.eventlog.ingest import _records
from tests.faults.harness import dead_letters
from tests.helpers import (
    append_lines,
    kill_group,
    read_counts,
    srt,
    srt_background,
    wait_for,
)

pytestmark = pytest.mark.slow

KINDS = ("postgres", "clickhouse", "delta")
# kill -9 at five random moments (the issue asks for >= 5; the last one ends the warehouses'
# outage run), and at the three forced points.
RANDOM_KILLS = 5
QUERIES = {
    "postgres": "upi-counts",
    "clickhouse": "upi-counts-clickhouse",
    "delta": "upi-counts-delta",
}


@pytest.fixture
def warehouses(upi, pg_dsn, ch_url) -> dict[str, str]:
    """Where each warehouse kind writes; the UPI workspace's --set flags point there."""
    where = {
        "postgres": pg_dsn,
        "clickhouse": ch_url,
        "delta": str(upi.root / "delta" / "upi_counts"),
    }
    upi.extra.update(
        {
            "sink.kind": ",".join(KINDS),
            "sink.dsn": pg_dsn,
            "sink.url": ch_url,
            "sink.path": where["delta"],
        }
    )
    return where


def test_200k_events_into_three_warehouses_equal_oracle(upi, warehouses, srt_env, s3):
    warehouses["delta"] = f"s3://{s3.bucket}/upi/upi_counts"  # Delta on S3 in this one
    upi.extra["sink.path"] = warehouses["delta"]
    lines = list(
        events(200_000, merchants=40, rate_per_s=500, disorder_ms=4_500, bad_every=20_011, seed=11)
    )
    append_lines(upi.log_dir, lines)

    plan = srt(["explain", *upi.run_args()[1:], "--no-spark"], srt_env)
    assert plan.returncode == 0, plan.stderr[-2000:]
    assert "write upi-counts on the executors, 4 partitions by merchant_id" in plan.stdout
    assert "write upi-counts-delta on the driver: a Delta table takes one commit" in plan.stdout
    assert "server 18.16.1 has no insert_deduplication_token" in plan.stdout

    result = srt(upi.run_args("--available-now"), srt_env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    expected = oracle(lines)
    for kind in KINDS:
        assert read_counts(kind, warehouses[kind]) == expected, kind

    again = srt(upi.run_args("--available-now"), srt_env)  # nothing new: nothing changes
    assert again.returncode == 0, again.stderr[-3000:]
    for kind in KINDS:
        assert read_counts(kind, warehouses[kind]) == expected, kind


def _clickhouse_raw_rows_explained(url: str) -> None:
    """Raw rows ≤ Σ over the ledger's attempts (BEFORE rows) of each partition's rows: every
    copy beyond one per key comes from a replay or from a superseded batch, and a merge
    (OPTIMIZE FINAL) leaves exactly one row per key."""
    from dbt_sink.clickhouse import ClickHouseUpsertSink
    from stateful_runtime.ledger import LEDGER_TABLE

    c = ClickHouseUpsertSink(url, "upi_counts", ("merchant_id", "window_start"))._client()
    try:
        raw = c.query("SELECT count() FROM upi_counts")[0][0]
        attempted = c.query(f"SELECT sum(rows) FROM {LEDGER_TABLE} WHERE state = 'BEFORE'")[0][0]
        replays = c.query(
            f"SELECT count() FROM (SELECT batch_id, partition, count() AS n FROM "
            f"{LEDGER_TABLE} WHERE state = 'BEFORE' GROUP BY batch_id, "
            f"partition HAVING n > 1)"
        )[0][0]
        assert raw <= attempted, (raw, attempted)
        c.command("OPTIMIZE TABLE upi_counts FINAL")
        assert (
            c.query("SELECT count() FROM upi_counts")[0][0]
            == c.query("SELECT count() FROM upi_counts FINAL")[0][0]
        )
        print(
            f"clickhouse: {raw} raw rows before merge, {attempted} rows attempted, "
            f"{replays} partition writes replayed"
        )
    finally:
        c.close()


@pytest.mark.faults
@pytest.mark.timeout(1500)
def test_kill_dash_nine_and_warehouse_outage_result_equals_oracle(
    upi, warehouses, srt_env, postgres, clickhouse
):
    rng = random.Random(20261123)
    feed_lines = events(
        10_000_000, merchants=30, rate_per_s=300, disorder_ms=4_000, bad_every=9_973, seed=5
    )
    fed: list[bytes] = []
    stop = threading.Event()

    def feed() -> None:
        # 200 events/s, a chunk every 0.5 s (the job's trigger): every run finds new batches,
        # and the input grows with the test's length only slowly (at 1,000/s a slow machine's
        # longer test fed its own slowness: each run and the drain read more).
        with EventLog(upi.log_dir).writer("upi-payments") as writer:
            while not stop.is_set():
                chunk = [next(feed_lines) for _ in range(100)]
                writer.append(_records(chunk, "merchant_id"))
                fed.extend(chunk)
                stop.wait(0.5)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    qdirs = [upi.checkpoint_dir / q for q in QUERIES.values()]
    # Three queries (one per warehouse) in one job: 2 state and output partitions each keep
    # the per-batch cost low; small batches keep every run short.
    upi.extra.update(
        {
            "checkpoint.interval_s": "0.5",
            "source.max_records_per_batch": "30000",
            "parallelism": "2",
        }
    )

    def committed() -> list[int]:
        return [QueryLayout(q).last_committed() or -1 for q in qdirs]

    def run_and_kill(n: int, hook: str | None) -> None:
        before = committed()
        log = upi.root / f"run-{n}.log"
        env = dict(srt_env)
        hooks = upi.root / f"hooks-{n}"
        if hook:
            env.update({HOOK_DIR: str(hooks), HOOK_AT: hook})
        proc = srt_background(upi.run_args(), env, log)
        try:
            if hook:  # held by the sink at that point: kill it there
                wait_for(
                    lambda: hooks.exists() and any(hooks.iterdir()),
                    proc,
                    log,
                    f"sink held at {hook}",
                )
            else:
                wait_for(
                    lambda: any(a > b for a, b in zip(committed(), before, strict=True)),
                    proc,
                    log,
                    "a new committed batch",
                )
                time.sleep(rng.uniform(0, 1.5))  # the random point: not a synchronisation
        finally:
            kill_group(proc)

    try:
        for n in range(RANDOM_KILLS - 1):
            run_and_kill(n, None)
        for n, point in enumerate(("data", "partition", "commit"), start=RANDOM_KILLS - 1):
            run_and_kill(n, point)

        # Both servers go away for a while mid-run and come back: the sinks retry.
        log = upi.root / "run-outage.log"
        proc = srt_background(upi.run_args(), srt_env, log)
        try:
            before = committed()
            wait_for(
                lambda: all(a > b for a, b in zip(committed(), before, strict=True)),
                proc,
                log,
                "a committed batch in every query",
            )
            postgres.stop()
            clickhouse.stop()
            time.sleep(4)  # the outage's length, not a synchronisation
            postgres.start()
            clickhouse.start()
            after = committed()
            wait_for(
                lambda: all(a > b for a, b in zip(committed(), after, strict=True)),
                proc,
                log,
                "batches committed after the outage",
            )
            time.sleep(rng.uniform(0, 1.5))  # the fifth random kill point: not a synchronisation
        finally:
            kill_group(proc)
    finally:
        stop.set()
        feeder.join()

    # The drain reads the backlog the feed left in one large batch per query (the drain is the
    # check; the killed runs' small batches were for their kill points).
    final = srt(
        upi.run_args("--available-now", "--set", "source.max_records_per_batch=1000000"), srt_env
    )
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-3000:]
    assert len(fed) > 5_000
    expected = oracle(fed)
    for kind in KINDS:
        assert read_counts(kind, warehouses[kind]) == expected, kind
    _clickhouse_raw_rows_explained(warehouses["clickhouse"])
    held = [
        p.name
        for n in range(RANDOM_KILLS - 1, RANDOM_KILLS + 2)
        for p in (upi.root / f"hooks-{n}").iterdir()
    ]
    assert {h.split("-")[0] for h in held} == {"data", "partition", "commit"}, held

    # The crash window between the executor-path sink's ledger commit and Spark's commit log,
    # made deterministic: the drain's batch N in PostgreSQL's ledger, its ``commits/N``
    # removed. The replay must write nothing (the ledger has N) yet still run the batch, so
    # its window state is committed: skipping the batch failed the query (Spark's state store
    # commit validation) and would have left the state at N-1. The batches after it then
    # build on the right state: every table = oracle.
    qdir = upi.checkpoint_dir / QUERIES["postgres"]
    last = QueryLayout(qdir).last_committed()
    assert last is not None and last >= 1
    for name in (str(last), f".{last}.crc"):  # Spark never recorded it; the sink's ledger did
        (qdir / "commits" / name).unlink()
    more = [next(feed_lines) for _ in range(4_000)]
    append_lines(upi.log_dir, more)
    again = srt(upi.run_args("--available-now"), srt_env)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert QueryLayout(qdir).last_committed() > last
    expected = oracle(fed + more)
    for kind in KINDS:
        assert read_counts(kind, warehouses[kind]) == expected, kind
    # Each bad record is one dead letter, whatever the kills and the three queries reading it,
    # the log appended by this process all the while.
    assert dead_letters(upi.log_dir) == bad_lines(fed + more)
