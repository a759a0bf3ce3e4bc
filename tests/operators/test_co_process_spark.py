"""Connected streams on Spark (``examples/payment_refunds.py``): payments and refunds from two
event-log topics, matched by a keyed co-process function, against an oracle computed from the
inputs alone, with a restart from the checkpoint (its worker store ahead of the commit) and a
savepoint restored at another parallelism, each in the middle of both topics: state written by
one input and read by the other, timers of both, a refund the function raises on dead-lettered
naming its input."""

from __future__ import annotations

import json

import pytest

from stateful_runtime.checkpoints import savepoints
from stateful_runtime.connectors.eventlog import EventLog
from tests.helpers import append_lines, read_topic
from tests.operators.example_inputs import refund_inputs, refund_oracle
from tests.operators.helpers import crash_before_commit, run, table

pytestmark = pytest.mark.slow


def test_refunds_matched_with_payments_across_a_restart_and_a_rescaling_restore(spark, tmp_path):
    log = tmp_path / "log"
    for topic in ("upi-payments", "upi-refunds"):
        EventLog(log).create_topic(topic, 1)
    payments, refunds = refund_inputs()
    lines = {
        "upi-payments": [json.dumps(p).encode() for p in payments],
        "upi-refunds": [json.dumps(r).encode() for r in refunds],
    }
    db = tmp_path / "refunds.duckdb"
    roots = tmp_path / "savepoints"
    settings = {
        "sink.database": db,
        "source.max_records_per_batch": 8,
        "savepoint.dir": roots,
    }

    def append(part: int) -> None:
        for topic, all_lines in lines.items():
            cut = [0, len(all_lines) // 3, 2 * len(all_lines) // 3, len(all_lines)]
            append_lines(log, all_lines[cut[part] : cut[part + 1]], topic=topic)

    append(0)
    run("payment_refunds.py", tmp_path, **settings)
    first = table(db, "SELECT count(*) FROM refund_matches")[0][0]
    # and the worker's store ahead of the commit
    crash_before_commit(tmp_path / "ck" / "payment_refunds.py" / "match-refunds", db)
    append(1)
    run("payment_refunds.py", tmp_path, **settings)
    second = table(db, "SELECT count(*) FROM refund_matches")[0][0]
    sp = savepoints.create(tmp_path / "ck" / "payment_refunds.py", roots)
    append(2)
    rescaled = {**settings, "parallelism": 3, "checkpoint.dir": tmp_path / "ck3"}
    out = run("payment_refunds.py", tmp_path, from_savepoint=sp.id, **rescaled)
    assert "from 2 to 3 partitions" in out, out

    matched, unmatched = refund_oracle(payments, refunds)
    got = {
        rid: (merchant, total, over)
        for rid, merchant, total, over in table(
            db, "SELECT refund_id, merchant_id, refunded_paise, over_refund FROM refund_matches"
        )
    }
    assert 0 < first < second < len(got)  # both restarts in the middle of the matches
    assert got == matched and any(over for _, _, over in matched.values())
    assert {r for (r,) in table(db, "SELECT refund_id FROM unmatched_refunds")} == unmatched
    # The refund the function raised on: in the first input's dead-letter topic (a connected
    # stream's, as a union's), its reason naming the call and the input.
    [letter] = read_topic(log, "upi-payments-dlq")
    bad = json.loads(letter.value)
    # Whole as it came (Spark's pandas batches hold the refunds' integer columns as floats,
    # null in the payments' rows): -5, not -5.0.
    assert bad == next(r for r in refunds if r["refund_id"] == "bad")
    assert isinstance(bad["refund_paise"], int)
    assert letter.headers["step"] == "match-refunds"
    assert letter.headers["error"].startswith(
        "match-refunds: process_element2 (input 2: refunds) raised ValueError: refund of -5"
    )
