"""Running an example job on the shared SparkSession and reading its DuckDB sink, for the
operators' Spark tests."""

from __future__ import annotations

import io
import random

import duckdb

from stateful_runtime.ledger import BATCH_ID, LEDGER_TABLE
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import JobRunner
from tests.helpers import EXAMPLES


def run(job_file: str, tmp_path, late: int = 0, **overrides) -> str:
    values = {
        "source.log_dir": str(tmp_path / "log"),
        "checkpoint.dir": str(tmp_path / "ck" / job_file),
        "parallelism": "2",
        **{k: str(v) for k, v in overrides.items()},
    }
    jf = load_job_file(EXAMPLES / job_file, values)
    out = io.StringIO()
    runner = JobRunner(jf, available_now=True, out=out)
    assert runner.run() == 0, out.getvalue()
    # Records behind the watermark (dropped, or to a late side output), counted one by one.
    assert sum(r.records.late for r in runner.runs) == late, out.getvalue()
    return out.getvalue()


def table(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql).fetchall()
    finally:
        con.close()


def crash_before_commit(query, db) -> None:
    """As if the job died after its tasks wrote the state of its last data batch and before
    anything committed it (Spark's commit log, the sink's ledger): the batch is replayed, and
    its tasks must start from the version before it, not from the newer state they find (the
    local copies are ahead: they are rebuilt from the checkpoint)."""
    commits = sorted(int(p.name) for p in (query / "commits").iterdir() if p.name.isdigit())
    last = commits[-1]  # the final batch, without data
    assert (query / "keyed").is_dir()
    for name in (str(last), f".{last}.crc"):
        (query / "offsets" / name).unlink(missing_ok=True)
    for batch in (last, last - 1):
        for name in (str(batch), f".{batch}.crc"):
            (query / "commits" / name).unlink(missing_ok=True)
    con = duckdb.connect(str(db))
    try:
        con.execute(f"DELETE FROM {LEDGER_TABLE} WHERE {BATCH_ID} >= ?", [last - 1])
    finally:
        con.close()


# -- payments and refunds (examples/payment_refunds.py) --------------------------------------
M = 60_000
T0 = 1_767_225_600_000


def refund_inputs(n: int = 40) -> tuple[list[dict], list[dict]]:
    """``n`` payments (``examples/payment_refunds.py``), one every 30 s; refunds up to 20
    minutes after their payment (some transactions have two, the second over-refunding),
    refunds of payments that never come, one refund of a negative amount; a payment and a
    refund five hours on close every timer."""
    rng = random.Random(11)
    payments = [
        {
            "txn_id": f"t{i}",
            "merchant_id": f"M{i % 3}",
            "amount_paise": 1_000,
            "ts_ms": T0 + i * 30_000,
        }
        for i in range(n)
    ]
    refunds = []
    for p in payments[::2]:
        for n in range(rng.choice([1, 1, 2])):
            refunds.append(
                {
                    "refund_id": f"r{len(refunds)}",
                    "txn_id": p["txn_id"],
                    "refund_paise": 400 + 300 * n,
                    "ts_ms": p["ts_ms"] + rng.randint(0, 20 * M),
                }
            )
    for k in range(4):
        refunds.append(
            {"refund_id": f"o{k}", "txn_id": f"x{k}", "refund_paise": 100, "ts_ms": T0 + k * 7 * M}
        )
    refunds.append({"refund_id": "bad", "txn_id": "t3", "refund_paise": -5, "ts_ms": T0 + 9 * M})
    refunds.sort(key=lambda r: r["ts_ms"])
    end = T0 + 5 * 60 * M
    payments.append({"txn_id": "end", "merchant_id": "M0", "amount_paise": 1, "ts_ms": end})
    refunds.append({"refund_id": "end", "txn_id": "end", "refund_paise": 1, "ts_ms": end})
    return payments, refunds


def refund_oracle(payments: list[dict], refunds: list[dict]) -> tuple[dict, set]:
    """refund_id -> (merchant, refunded so far, over-refunded) of each matched refund, and the
    unmatched refunds' ids (every refund of a payment comes within 20 minutes of it)."""
    paid = {p["txn_id"]: p for p in payments}
    totals: dict[str, int] = {}
    matched, unmatched = {}, set()
    for r in refunds:  # each transaction's refunds in the refunds topic's order
        if r["refund_paise"] <= 0:
            continue
        p = paid.get(r["txn_id"])
        if p is None:
            unmatched.add(r["refund_id"])
            continue
        totals[r["txn_id"]] = totals.get(r["txn_id"], 0) + r["refund_paise"]
        total = totals[r["txn_id"]]
        matched[r["refund_id"]] = (p["merchant_id"], total, total > p["amount_paise"])
    return matched, unmatched
