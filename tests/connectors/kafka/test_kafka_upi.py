"""The UPI job from Kafka into the transactional Kafka sink, killed with kill -9: exact output.

Events are produced to a 4-partition topic throughout; the job is killed (process group,
SIGKILL) at 3 points: 2 random ones after a new committed batch (tests/faults kills the job at
random points 20 times a run), and between them one placed by the sink's test hook exactly
between the Kafka transaction commit and Spark's ``commits/N``. A final
``--available-now`` run drains the topic. A read_committed consumer of the output then sees
each (window, batch) update once, and the last update per window equals the oracle.
"""

from __future__ import annotations

import json
import random
import threading
import time
from datetime import datetime

import pytest
from upi_events import bad_lines, events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.kafka.sink import AFTER_COMMIT_HOOK, BATCH_HEADER
from tests.helpers import kill_group, poll, srt, srt_background, wait_for, wait_for_commit

pytestmark = pytest.mark.slow

KILLS = 3
HOOK_KILL = 1  # the run killed between the Kafka commit and Spark's batch commit
QUERY = "upi-counts"


def _kafka_job(upi, kafka, **extra: str) -> None:
    upi.extra.update(
        {
            "source.kind": "kafka",
            "source.bootstrap_servers": kafka.bootstrap,
            "sink.kind": "kafka",
            **extra,
        }
    )


def _key(line: bytes) -> bytes:
    try:
        return json.loads(line)["merchant_id"].encode()
    except (ValueError, KeyError, TypeError):
        return b"bad"


def _output(kafka, topic):
    """{(merchant, window_start): (payments, amount)} from the last update, and the updates."""
    last, seen = {}, []
    for m in kafka.read(topic):
        row = json.loads(m.value())
        k = (row["merchant_id"], datetime.fromisoformat(row["window_start"]))
        seen.append((k, dict(m.headers())[BATCH_HEADER]))
        last[k] = (row["payments"], row["amount_paise"])
    return last, seen


@pytest.mark.faults
def test_kafka_to_kafka_kill_dash_nine_read_committed_equals_oracle(upi, kafka, srt_env):
    rng = random.Random(5)
    topic, out_topic = "upi-kill", "upi-kill-counts"
    kafka.create_topic(topic, 4)
    _kafka_job(
        upi,
        kafka,
        **{
            "source.topic": topic,
            "sink.kafka_topic": out_topic,
            "checkpoint.interval_s": "0.5",
            "source.max_records_per_batch": "50000",
        },
    )
    feed_lines = events(
        10_000_000, merchants=30, rate_per_s=300, disorder_ms=4_000, bad_every=997, seed=5
    )
    fed: list[bytes] = []
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            chunk = [next(feed_lines) for _ in range(100)]
            kafka.produce(topic, [(_key(line), line) for line in chunk])
            fed.extend(chunk)
            stop.wait(0.1)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    qdir = upi.checkpoint_dir / QUERY
    hook_dir = upi.root / "hook"
    try:
        for kill in range(KILLS):
            before = QueryLayout(qdir).last_committed()
            env = dict(srt_env)
            if kill == HOOK_KILL:
                env[AFTER_COMMIT_HOOK] = str(hook_dir)
            log = upi.root / f"run-{kill}.log"
            proc = srt_background(upi.run_args(), env, log)
            try:
                if kill == HOOK_KILL:
                    wait_for(
                        lambda: any(hook_dir.glob("committed-*")),
                        proc,
                        log,
                        "Kafka commit at the hook",
                    )
                else:
                    wait_for_commit(qdir, before, proc, log)
                    time.sleep(rng.uniform(0, 1.5))  # the random point: not a synchronisation
            finally:
                kill_group(proc)
            if kill == HOOK_KILL:  # Kafka has batch N, Spark's checkpoint does not
                hooked = int(next(hook_dir.glob("committed-*")).name.split("-")[1])
                assert (QueryLayout(qdir).last_committed() or -1) < hooked
        # the kills spanned the feed; a loaded machine feeds slower, so the count is waited for
        poll(lambda: len(fed) >= 5_000, 120, "5,000 events fed")
    finally:
        stop.set()
        feeder.join()

    final = srt(upi.run_args("--available-now"), srt_env)
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-3000:]
    last, seen = _output(kafka, out_topic)
    assert len(seen) == len(set(seen)), "an update was written twice"
    assert last == oracle(fed)
    dead = sorted(m.value() for m in kafka.read(f"{topic}-dlq"))
    assert dead == bad_lines(fed)  # each dead letter exactly once despite the kills
