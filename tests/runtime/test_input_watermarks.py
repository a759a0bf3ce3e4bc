"""Each input's watermark across restarts (``runtime/input_watermarks.py``), on
``examples/merchant_tiers.py``: a temporal join holding payments until the tiers' watermark
passes them, and an interval join, over three topics.

The merchant tiers are read to their end in the first run and get nothing after it, so in the
runs after they hold the query's watermark wherever the restart finds it unless their watermark
is kept. The second run makes no batch without data (as a job killed after its last batch with
data); the third has nothing new to read, and must still fire what the watermark passed."""

from __future__ import annotations

import json

import pytest

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines
from tests.operators.example_inputs import TIER_TOPICS, tier_inputs, tier_oracle
from tests.operators.helpers import run, table

pytestmark = pytest.mark.slow

NO_DATA_BATCHES = "spark.sql.streaming.noDataMicroBatches.enabled"


def _tiers(db) -> dict:
    rows = table(db, "SELECT txn_id, tier, tier_since_ms FROM payment_tiers")
    return {txn: (tier, since) for txn, tier, since in rows}


def _pairs(db) -> dict:
    rows = table(db, "SELECT refund_id, txn_id, after_s FROM refund_pairs")
    return {rid: (txn, after) for rid, txn, after in rows}


def test_an_input_read_to_its_end_keeps_its_watermark_across_restarts(spark, tmp_path):
    # Without the records the Spark test makes late on purpose.
    data = {
        topic: [r for r in records if "late" not in (r.get("refund_id"), r.get("tier"))]
        for topic, records in tier_inputs().items()
    }
    log, db = tmp_path / "log", tmp_path / "tiers.duckdb"
    for topic in TIER_TOPICS:
        EventLog(log).create_topic(topic, 1)
    settings = {
        "sink.database": db,
        "source.max_records_per_batch": 25,
    }

    def append(topic: str, records: list[dict]) -> None:
        append_lines(log, [json.dumps(r).encode() for r in records], topic=topic)

    halves = {t: len(data[t]) // 2 for t in TIER_TOPICS}
    append("merchant-tiers", data["merchant-tiers"])  # every tier, the one five hours on too
    for topic in ("upi-payments", "upi-refunds"):
        append(topic, data[topic][: halves[topic]])
    run("merchant_tiers.py", tmp_path, **settings)
    tiers, pairs = tier_oracle(data)
    assert 0 < len(_tiers(db)) < len(tiers)

    for topic in ("upi-payments", "upi-refunds"):
        append(topic, data[topic][halves[topic] :])
    # the run ends after its last batch with data (no batch without, the timer ticks' neither)
    spark.conf.set(NO_DATA_BATCHES, "false")
    try:
        run("merchant_tiers.py", tmp_path, **settings)
    finally:
        spark.conf.unset(NO_DATA_BATCHES)
    query = QueryLayout(tmp_path / "ck" / "merchant_tiers.py" / "tier-as-of")
    batch = query.last_committed()
    assert batch is not None
    # The tiers' watermark counted: the query's is past every payment but the last (its
    # batch's own watermark was not, so payments are still held).
    logged = json.loads(query.commit(batch).read_text().splitlines()[1])["nextBatchWatermarkMs"]
    last = sorted(p["ts_ms"] for p in data["upi-payments"])[-2]
    assert logged > last
    assert len(_tiers(db)) < len(tiers)

    run("merchant_tiers.py", tmp_path, **settings)  # nothing new to read
    assert _tiers(db) == tiers
    assert _pairs(db) == pairs


def test_a_checkpoint_written_before_input_watermarks_runs_on_as_it_was(
    spark, tmp_path, monkeypatch
):
    """A query of several inputs whose checkpoint has no line for the source that starts a
    run's batches (written before the runtime kept each input's watermark) is not refused:
    it runs as it was written, says so, and loses nothing."""
    from dataclasses import replace

    from stateful_runtime.runtime import runner

    data = tier_inputs()
    log, db = tmp_path / "log", tmp_path / "tiers.duckdb"
    for topic in TIER_TOPICS:
        EventLog(log).create_topic(topic, 1)
    settings = {"sink.database": db, "source.max_records_per_batch": 50}

    def append(half: int) -> None:
        for t in TIER_TOPICS:
            lines = [json.dumps(r).encode() for r in data[t]]
            mid = len(lines) // 2
            append_lines(log, lines[:mid] if half == 0 else lines[mid:], topic=t)

    def as_it_was(job):  # the runtime before: no query keeps its inputs' watermarks
        p = planned(job)
        return replace(p, queries=[replace(q, input_watermarks=False) for q in p.queries])

    planned = runner.plan
    append(0)
    with monkeypatch.context() as m:
        m.setattr(runner, "plan", as_it_was)
        run("merchant_tiers.py", tmp_path, **settings)
    query = QueryLayout(tmp_path / "ck" / "merchant_tiers.py" / "tier-as-of")
    lines = len(query.committed_offsets()["sources"])

    append(1)
    out = run("merchant_tiers.py", tmp_path, late=2, **settings)
    assert "written before srt kept each input's watermark" in out, out
    assert len(query.committed_offsets()["sources"]) == lines  # still the old layout
    tiers, pairs = tier_oracle(data)
    assert _tiers(db) == tiers and _pairs(db) == pairs
