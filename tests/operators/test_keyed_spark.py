"""The seed's keyed process functions on Spark, against independently computed oracles.

Each job runs twice over a growing topic (a restart in the middle): state and pending timers
come back from the checkpoint and every timer fires exactly once.
"""

from __future__ import annotations

import io
import itertools
import json
import random
from collections import defaultdict

import pytest

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.state_reader import inspect
from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.planner import QueryPlan
from tests.helpers import EXAMPLES, append_lines
from tests.operators.helpers import crash_before_commit, run, table
from tests.operators.payments import T0, H, M, assert_deduplicated, dedup_lines, payment

pytestmark = pytest.mark.slow


@pytest.fixture
def log(tmp_path):
    # One partition: with several, a record cap per batch lets partitions drift apart in event
    # time (the watermark is the max over all of them), and timer-driven results would then
    # depend on batch boundaries. See NOTES.md, "per-partition watermarks".
    EventLog(tmp_path / "log").create_topic("upi-payments", 1)
    return tmp_path / "log"


# The crash before Spark's commit: the worker's store is ahead of Spark's commit log, and the
# replayed batch must start from the version before it. The checkpoint as this runtime writes
# it (the timers' batches without input come from the event-time ticks), and as it wrote it
# before the ticks (a deduplication of Spark's that sees no row, the watermark's branch): it
# runs on as it was written.
@pytest.mark.parametrize("written_with", ["ticks", "carrier"])
def test_fraud_counter_resets_per_minute_across_a_restart(
    spark, tmp_path, log, monkeypatch, written_with
):
    lines = _fraud_lines()
    half = len(lines) // 2
    append_lines(log, lines[:half])
    db = tmp_path / "w.duckdb"
    query = QueryLayout(tmp_path / "ck" / "fraud_rate_limit.py" / "fraud-counter")
    with monkeypatch.context() as before_ticks:
        if written_with == "carrier":
            before_ticks.setattr(QueryPlan, "watermark_carrier", property(lambda q: True))
            before_ticks.setattr(QueryPlan, "ticks", property(lambda q: None))
        run(
            "fraud_rate_limit.py",
            tmp_path,
            **{"sink.database": db, "source.max_records_per_batch": 30},
        )
    crash_before_commit(query.root, db)
    append_lines(log, lines[half:])
    run(
        "fraud_rate_limit.py",
        tmp_path,
        **{"sink.database": db, "source.max_records_per_batch": 30},
    )
    assert (_carriers(query), _ticks(query)) == (
        (1, False) if written_with == "carrier" else (0, True)
    )
    assert _fraud_alerts(db) == _fraud_oracle(lines)


def _fraud_lines() -> list[bytes]:
    rng = random.Random(3)
    bursts = []
    # Bursts of 5-20 payments within 10 s, a burst per merchant every 3 minutes for half an
    # hour; merchants interleave so the watermark keeps moving. Timers fire at micro-batch
    # granularity, so batches are capped (30 records span at most ~60 s of event time) below
    # the spacing: ~55 batches, each a Spark micro-batch.
    for minute in range(0, 30, 3):
        for m in range(6):
            n = rng.randint(5, 20)
            start = T0 + minute * M + m * 5_000
            stamps = [start + rng.randint(0, 10_000) for _ in range(n)]
            bursts.append((f"M{m}", stamps))
    # Filler payments every 2 s from one-off merchants keep event time moving between rounds,
    # so every capped batch spans well under the 3-minute spacing.
    filler = [(T0 + k * 2_000, f"F{k}") for k in range(30 * 30)]
    events = sorted([(ts, merchant) for merchant, stamps in bursts for ts in stamps] + filler)
    # Arrival order = time order with a little disorder inside the 5 s bound.
    events.sort(key=lambda e: e[0] + rng.randint(0, 3_000))
    return [payment(i, merchant, ts) for i, (ts, merchant) in enumerate(events)]


def _fraud_oracle(lines: list[bytes]) -> dict:
    """Per merchant, a counter that starts at its first payment (arrival order) and resets
    one minute later; a payment beyond the 10th in that minute trips the alert."""
    expected = {}
    first: dict[str, int] = {}
    count: dict[str, int] = defaultdict(int)
    for line in lines:
        e = json.loads(line)
        m, ts = e["merchant_id"], e["ts_ms"]
        if m in first and ts >= first[m] + M + 5_000:  # the minute has passed the watermark
            del first[m]
            count[m] = 0
        if m not in first:
            first[m] = ts
        count[m] += 1
        if count[m] > 10:
            expected[(m, first[m])] = count[m]
    assert len(expected) > 10
    return expected


def _fraud_alerts(db) -> dict:
    rows = table(db, "SELECT merchant_id, window_start_ms, payments FROM rate_limit_alerts")
    return {(m, w): n for m, w, n in rows}


def test_the_deduplicator_on_a_topic_placed_by_its_key_runs_without_a_shuffle(
    spark, tmp_path, capsys
):
    """The topic's first append keyed by txn_id placed it by the key groups the job's state
    uses, into as many partitions as the job's: each partition is read, decoded and processed in
    one Python task (no exchange, no mapInArrow in Spark's plan), across a restart, and the
    output equals the oracle's. The TTL cleanups' timer ticks come in as splits of their own:
    each run ends with a batch of ticks alone, whose tasks (one per state partition, the source
    read nothing) run the operator over no records and fire the cleanups. A record placed
    otherwise (an append that names its partition) stops the batch, committing nothing, and says
    why."""
    from stateful_runtime.connectors.eventlog import Record
    from stateful_runtime.connectors.eventlog.ingest import key_topic
    from stateful_runtime.runtime.loader import load_job_file
    from stateful_runtime.runtime.runner import JobRunner

    log = tmp_path / "log"
    EventLog(log).create_topic("upi-payments", 2)
    lines = dedup_lines()
    settings = {
        "source.log_dir": str(log),
        "checkpoint.dir": str(tmp_path / "ck"),
        "parallelism": "2",
        "source.max_records_per_batch": "500",
    }

    records: list = []

    def run_job() -> tuple[int, str, str]:
        out = io.StringIO()
        runner = JobRunner(
            load_job_file(EXAMPLES / "deduplicate_payments.py", settings),
            available_now=True,
            out=out,
        )
        code = runner.run()
        execution = runner.runs[0].query._jsq.streamingQuery().lastExecution()
        plan = execution.executedPlan().toString() if execution is not None else ""
        records.append(runner.runs[0].records)
        return code, plan, out.getvalue()

    # Two records that do not decode (dead letters of the read, counted as read).
    bad = [b"not json", json.dumps({"txn_id": "t-bad", "ts_ms": "soon"}).encode()]
    for part in (lines[:1_500] + bad, lines[1_500:]):
        with EventLog(log).writer("upi-payments") as w:
            key_topic(w, "txn_id", part[0])
        append_lines(log, part, key="txn_id")
        code, plan, out = run_job()
        assert code == 0, out
        # the operator inside the source's read: no exchange, no second Python worker
        assert "MapInArrow" not in plan and "Exchange" not in plan, plan
        # what the run read, as its read tasks counted it (Spark sees the operator's output)
        dead = 2 if part[-1] is bad[-1] else 0
        assert (records[-1].input, records[-1].dead_letters) == (len(part), dead)
    assert EventLog(log).topic("upi-payments").key is not None
    assert_deduplicated(log, lines)
    query = QueryLayout(tmp_path / "ck" / "deduplicator")
    # (a run whose last batch moved the watermark past no cleanup ends without one)
    assert _ticks(query) and _batches_without_data(query) >= 1
    _assert_cleaned_up(query, tmp_path / "ck")

    # The partition that does not own txn t1's key group gets a payment of t1.
    owner = EventLog(log).topic("upi-payments").partition_of(b"t1", b"")
    with EventLog(log).writer("upi-payments") as w:
        w.append([Record(payment(99_999, "M1", T0 + 60 * H, txn="t1"), b"t1", partition=1 - owner)])
    last = query.last_committed()
    code, _, out = run_job()
    said = capsys.readouterr().err  # the job's error goes to stderr
    assert code != 0 and "not placed by the job's key" in said, out + said
    assert query.last_committed() == last


def test_deduplicator_with_event_time_ttl(spark, tmp_path, log):
    lines = dedup_lines()
    for part in (lines[:1_500], lines[1_500:]):
        append_lines(log, part)
        run(
            "deduplicate_payments.py",
            tmp_path,
            **{"source.max_records_per_batch": 500},
        )
    assert_deduplicated(log, lines)


def test_ttl_cleanups_run_in_sparks_batches_and_old_checkpoints_keep_their_sources(
    spark, tmp_path, log, monkeypatch
):
    """On the worker's keyed state a function with event-time timers, its own or TTL's
    cleanups (the Deduplicator), reads its timer ticks (a source whose offset moves when a
    timer is behind the watermark) and no Spark operator of its own: a run ends with the
    batch of the cleanups its final watermark made due, in Spark's tasks, and no value past
    its cleanup time stays stored. A checkpoint keeps the sources it was written with (Spark
    refuses a source added or removed): one written with an ``on_timer`` since removed reads
    its ticks on; one written before TTL-only functions read ticks reads none, and the runner
    fires those cleanups itself as the run ends (a batch it logs without Spark, no
    output)."""
    lines = dedup_lines()
    with_timer = _dedup_variant(
        tmp_path,
        "deduplicate_with_timer",
        "    def process_element(self, payment, ctx):",
        "    def on_timer(self, timestamp, ctx):\n        return iter(())\n\n"
        "    def process_element(self, payment, ctx):",
    )
    settings = {
        "source.max_records_per_batch": 500,
        "checkpoint.dir": str(tmp_path / "ck"),
    }
    query = QueryLayout(tmp_path / "ck" / "deduplicator")
    append_lines(log, lines[:1_000])
    run(str(with_timer), tmp_path, **settings)
    assert _carriers(query) == 0 and _ticks(query)
    # 1,000 minutes of event time: no cleanup (24 h) is due, and no batch ran without input
    assert _batches_without_data(query) == 0
    append_lines(log, lines[1_000:2_000])
    run("deduplicate_payments.py", tmp_path, **settings)
    assert_deduplicated(log, lines[:2_000])
    # the ticks read on: the run ends with the batch of the cleanups its final watermark made
    # due, and none of them is left stored
    assert _ticks(query) and _batches_without_data(query) == 1
    _assert_cleaned_up(query, tmp_path / "ck")

    # Written as it is now (TTL's cleanups read the ticks), and before (no ticks): each run
    # ends with a batch without input, Spark's or the runner's.
    for written_with in ("ticks", "no ticks"):
        fresh = tmp_path / written_with.replace(" ", "-")
        EventLog(fresh / "log").create_topic("upi-payments", 1)
        ck = {**settings, "checkpoint.dir": fresh / "ck"}
        with monkeypatch.context() as before:
            if written_with == "no ticks":
                before.setattr(QueryPlan, "ticks", property(lambda q: None))
            append_lines(fresh / "log", lines[:1_500])
            first = run("deduplicate_payments.py", fresh, **ck)
        append_lines(fresh / "log", lines[1_500:])
        second = run("deduplicate_payments.py", fresh, **ck)
        for out in (first, second):
            fired = "fired the state cleanup timers due at the final watermark" in out
            assert fired == (written_with == "no ticks"), out
        assert_deduplicated(fresh / "log", lines)
        query = QueryLayout(fresh / "ck" / "deduplicator")
        assert _ticks(query) == (written_with == "ticks")
        assert _carriers(query) == 0 and _batches_without_data(query) == 2
        assert len(query.committed_batches()) == 6 + 2  # 3,000 records, 500 a batch; two ends
        _assert_cleaned_up(query, fresh / "ck")


def _assert_cleaned_up(query: QueryLayout, checkpoint) -> None:
    """No value of the Deduplicator stored past its cleanup time at the last watermark."""
    last = query.last_committed()
    assert last is not None
    watermark, grain = query.watermark_ms(last), 24 * H // 100  # the cleanups' rounding
    rows = inspect(None, checkpoint, state="seen", limit=10**6)
    assert rows and all(-(-r["value"][1] // grain) * grain > watermark for r in rows)


@pytest.mark.parametrize("written_with", ["ticks", "no ticks"])
def test_a_union_fires_its_cleanup_timers_at_the_final_watermark(
    spark, tmp_path, log, monkeypatch, written_with
):
    """The Deduplicator over a union of two topics (each txn_id on one of them): each run
    ends with the cleanups its final watermark made due fired, as for one input (in Spark's
    batch of ticks, or by the runner for a checkpoint written without them), and the next run
    resumes each input's watermark from the batch before it."""
    lines = dedup_lines()
    union = _dedup_variant(
        tmp_path,
        "deduplicate_union",
        '        name="upi-source",\n    )\n',
        '        name="upi-source",\n    ).union(job.from_source(\n'
        '        LogSource(config["source.log_dir"], "bank-payments", PAYMENT,\n'
        "                  max_records_per_batch=300),\n"
        "        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5))\n"
        '        .with_timestamp_field("ts_ms"), name="bank-source"))\n',
    )
    union.write_text(f"{union.read_text()}\nfrom stateful_runtime import LogSource  # noqa: E402\n")
    EventLog(log).create_topic("bank-payments", 1)
    settings = {"source.max_records_per_batch": 500, "checkpoint.dir": tmp_path / "ck"}
    for n, part in enumerate((lines[:1_500], lines[1_500:])):
        by_topic: dict[str, list[bytes]] = defaultdict(list)
        for line in part:
            txn = json.loads(line)["txn_id"]
            by_topic["bank-payments" if int(txn[1:]) % 2 else "upi-payments"].append(line)
        for topic, rows in by_topic.items():
            append_lines(log, rows, topic=topic)
        with monkeypatch.context() as before:
            if written_with == "no ticks" and n == 0:
                before.setattr(QueryPlan, "ticks", property(lambda q: None))
            out = run(str(union), tmp_path, **settings)
        fired = "fired the state cleanup timers due at the final watermark" in out
        assert fired == (written_with == "no ticks"), out
    assert _ticks(QueryLayout(tmp_path / "ck" / "deduplicator")) == (written_with == "ticks")
    assert_deduplicated(log, lines)
    _assert_cleaned_up(QueryLayout(tmp_path / "ck" / "deduplicator"), tmp_path / "ck")


def _dedup_variant(tmp_path, name: str, old: str, new: str):
    """``examples/deduplicate_payments.py`` with ``old`` replaced by ``new``, as a job file."""
    source = (EXAMPLES / "deduplicate_payments.py").read_text()
    assert old in source
    path = tmp_path / f"{name}.py"
    path.write_text(source.replace(old, new))
    return path


def _carriers(query: QueryLayout) -> int:
    """The query's state operators that are Spark deduplications: the watermark carrier."""
    if not query.state.is_dir():
        return 0
    return sum(
        '"dedupeWithinWatermark"' in meta.read_text()
        for operator in query.operators()
        for meta in query.operator_metadata(operator)
    )


def _ticks(query: QueryLayout) -> bool:
    """Whether the query reads timer ticks (a source whose offsets are ``{"due": ...}``)."""
    offsets = query.committed_offsets()
    return offsets is not None and any(
        isinstance(o, dict) and set(o) == {"due"} for o in offsets["sources"]
    )


def _batches_without_data(query: QueryLayout) -> int:
    """Committed batches whose input (the first source; not the timer ticks) did not move."""
    batches = query.committed_batches()
    inputs = [query.committed_offsets(b)["sources"][0] for b in batches]
    return sum(now == before for before, now in itertools.pairwise(inputs))


def test_session_summaries_with_timer_moves(spark, tmp_path, log):
    rng = random.Random(9)
    lines, i = [], 0
    clock = T0
    for _ in range(400):
        clock += rng.choice([20_000, 60_000, 5 * M, 45 * M])  # 45 min = a session break
        for m in rng.sample(range(4), 2):
            lines.append(
                payment(i, f"M{m}", clock + rng.randint(0, 2_000), amount=rng.randint(1, 99))
            )
            i += 1
    append_lines(log, lines[: len(lines) // 2])
    db = tmp_path / "s.duckdb"
    run(
        "session_summary.py",
        tmp_path,
        **{
            "sink.database": db,
            "source.max_records_per_batch": 100,
        },
    )
    append_lines(log, lines[len(lines) // 2 :])
    run(
        "session_summary.py",
        tmp_path,
        **{
            "sink.database": db,
            "source.max_records_per_batch": 100,
        },
    )

    gap = 30 * M
    sessions: dict[str, list] = defaultdict(list)
    max_ts = 0
    for line in lines:
        e = json.loads(line)
        ts, m = e["ts_ms"], e["merchant_id"]
        max_ts = max(max_ts, ts)
        s = sessions[m]
        if s and ts - s[-1][1] < gap:
            start, last, n, amount = s[-1]
            s[-1] = (min(start, ts), max(last, ts), n + 1, amount + e["amount_paise"])
        else:
            s.append((ts, ts, 1, e["amount_paise"]))
    watermark = max_ts - 5_000
    expected = {
        (m, start): (last + gap, n, amount)
        for m, ss in sessions.items()
        for start, last, n, amount in ss
        if last + gap <= watermark
    }
    got = {
        (m, s): (e, n, a)
        for m, s, e, n, a in table(
            db,
            "SELECT merchant_id, session_start_ms, session_end_ms, payments, amount_paise "
            "FROM merchant_sessions",
        )
    }
    assert got == expected and len(expected) > 50
