"""kill -9 of a job calling a service from the stream (``map_async``), the service slow and
failing at random.

``examples/scored_payments.py`` scores payments through a model server on 127.0.0.1 (5-60 ms
an answer, one call in five refused, never twice in a row for an id; ids ending in 7 always
refused) with ``map_async`` into a DuckDB table upserted by txn_id. The job is killed (its
whole process group) at random points, then drained with ``--available-now``: the table must
hold every payment the service scores, with its score, and no other; each always-refused
payment is one dead letter, whatever the kills hit (a batch replayed after a kill calls the
service again and writes the same rows).

Seeded: ``SRT_FAULT_SEED`` replays a run's kill points and the service's luck.
"""

from __future__ import annotations

import json
import os
import random

import pytest

from stateful_runtime.connectors.eventlog import EventLog
from tests.faults.harness import TrialLog, kill_at_random_points
from tests.helpers import EXAMPLES, append_lines, read_topic, srt
from tests.operators.helpers import table
from tests.operators.score_service import ScoreService

pytestmark = pytest.mark.faults

FAULT = "kill -9 of the job's process group (map_async calls in flight, the service flaky)"
KILLS = int(os.environ.get("SRT_FAULT_ASYNC_KILLS", "2"))
T0 = 1_767_225_600_000


def test_a_job_calling_a_flaky_service_killed_at_random_points_drains_to_the_oracle(
    tmp_path, job_env, trials: TrialLog
):
    seed = int(os.environ.get("SRT_FAULT_SEED") or random.randrange(1 << 31))
    service = ScoreService(flaky=random.Random(seed))
    try:
        log_dir, db, ckpt = tmp_path / "log", tmp_path / "out.duckdb", tmp_path / "ck"
        payments = [
            {
                "txn_id": f"t{i}",
                "merchant_id": f"M{i % 7}",
                "amount_paise": 1_000 + i * 13,
                "ts_ms": T0 + i * 100,
            }
            for i in range(1_500)
        ]
        EventLog(log_dir).create_topic("upi-payments", 2)
        append_lines(log_dir, [json.dumps(p).encode() for p in payments])
        sets = {
            "source.log_dir": log_dir,
            "sink.database": db,
            "checkpoint.dir": ckpt,
            "score.url": service.url,
            "checkpoint.interval_s": 0.5,
            "source.max_records_per_batch": 150,
        }
        args = [
            "run",
            str(EXAMPLES / "scored_payments.py"),
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")],
        ]
        points = kill_at_random_points(
            args, job_env, ckpt / "payment-scores", KILLS, random.Random(seed), tmp_path
        )
        final = srt([*args, "--available-now"], job_env, timeout=900)
    finally:
        service.server.shutdown()
        service.server.server_close()
    refused = sorted(p["txn_id"] for p in payments if p["txn_id"].endswith("7"))
    expected = {p["txn_id"]: p["amount_paise"] % 97 for p in payments if p["txn_id"] not in refused}
    got = dict(table(db, "SELECT txn_id, score FROM payment_scores"))
    letters = sorted(json.loads(m.value)["txn_id"] for m in read_topic(log_dir, "upi-payments-dlq"))
    why = [] if final.returncode == 0 else [f"the drain exited {final.returncode}"]
    if got != expected:
        why.append(
            f"table: {len(set(expected) - set(got))} missing, "
            f"{sum(1 for k in got if k in expected and got[k] != expected[k])} wrong, "
            f"{len(set(got) - set(expected))} extra"
        )
    if letters != refused:
        why.append(f"dead letters: {len(letters)} for {len(refused)} refused payments")
    trials.record(
        fault=FAULT,
        input="1,500 payments, 2 partitions, 150 a batch; map_async capacity 100, 3 attempts",
        result="FAIL" if why else "pass",
        seed=seed,
        detail="; ".join(why) or f"killed {'; '.join(points)}; drain = oracle",
    )
    assert not why, f"seed {seed} (replay: SRT_FAULT_SEED={seed}): {why} {final.stderr[-1500:]}"
