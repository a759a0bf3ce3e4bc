"""Apache Kafka is killed (SIGKILL: a crash), stays down 30 s (10 s in CI) and comes back while
the job runs.

Broker: one KRaft node (tests/connectors/kafka/helpers.py). A SIGKILL leaves its log segments
as the process wrote them, and its next start recovers them (the index rebuilt, an unfinished
transaction of the job's producer aborted or completed by the coordinator): a crash and restart
on the same port, as clients see it.

The UPI job reads a 4-partition topic in small batches and writes the exactly-once Kafka sink.
The broker is killed after two committed batches (a batch in flight or about to be planned), stays
down for 30 s (``platform/fault-trials.sh``; 10 s in CI; ``SRT_FAULT_KAFKA_OUTAGE_S``
overrides) and restarts; more input follows. If the job gives up during the outage it is
started again, as the Dagster restart sensor would. The output, read
with read_committed, holds each (window, batch) update once and its last update per window
equals the oracle; each dead letter is in ``<topic>-dlq`` once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime
from pathlib import Path

import pytest
from upi_events import events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.kafka.sink import BATCH_HEADER
from tests.connectors.kafka.helpers import start_broker
from tests.faults.harness import JOB, QUERY, bad_lines, compare
from tests.helpers import srt, srt_background, wait_for_commit

pytestmark = pytest.mark.faults

# 30 s in the full run (platform/fault-trials.sh); CI's budget affords 10 s.
OUTAGE_S = float(
    os.environ.get("SRT_FAULT_KAFKA_OUTAGE_S") or (30 if os.environ.get("SRT_FAULT_FULL") else 10)
)
FAULT = f"Kafka broker killed (SIGKILL), down {OUTAGE_S:g} s and restarted mid-run"
INPUT = "UPI events on 4 Kafka partitions (1 bad record in 997), Kafka exactly-once sink"


def _key(line: bytes) -> bytes:
    try:
        return json.loads(line)["merchant_id"].encode()
    except (ValueError, KeyError, TypeError):
        return b"bad"


def _ends(broker, topic: str) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            "group.id": "ends",
            "isolation.level": "read_committed",
        }
    )
    try:
        parts = sorted(c.list_topics(timeout=10).topics[topic].partitions)
        return {
            f"{topic}:{p}": c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1]
            for p in parts
        }
    finally:
        c.close()


def _caught_up(qdir: Path, ends: dict[str, int]) -> bool:
    c = QueryLayout(qdir).last_committed()
    if c is None:
        return False
    done = json.loads((qdir / "offsets" / str(c)).read_text().splitlines()[2])
    return all(int(done.get(p, 0)) >= e for p, e in ends.items())


def test_broker_killed_then_back_output_equals_oracle(upi, job_env, tmp_path, trials):
    (tmp_path / "kafka").mkdir()
    broker = start_broker(tmp_path / "kafka" / "data")
    topic, out_topic = "upi-outage", "upi-outage-counts"
    try:
        broker.create_topic(topic, 4)
        lines = list(
            events(40_000, merchants=30, rate_per_s=300, disorder_ms=4_000, bad_every=997, seed=31)
        )
        first, second = lines[:24_000], lines[24_000:]
        broker.produce(topic, [(_key(line), line) for line in first])
        upi.extra.update(
            {
                "source.kind": "kafka",
                "source.bootstrap_servers": broker.bootstrap,
                "source.topic": topic,
                "sink.kind": "kafka",
                "sink.kafka_topic": out_topic,
                "checkpoint.interval_s": "0.5",
                "source.max_records_per_batch": "2000",
                "parallelism": "2",
            }
        )
        qdir = upi.checkpoint_dir / QUERY
        runs, exits = 0, []

        def start():
            nonlocal runs
            runs += 1
            return srt_background(upi.run_args(), job_env, upi.root / f"run-{runs}.log")

        proc = start()
        try:
            wait_for_commit(qdir, None, proc, upi.root / "run-1.log", timeout=300)
            wait_for_commit(
                qdir, QueryLayout(qdir).last_committed(), proc, upi.root / "run-1.log", timeout=300
            )
            at = QueryLayout(qdir).last_committed()
            in_flight = (QueryLayout(qdir).last_planned() or -1) > at
            broker.stop(signal.SIGKILL)
            time.sleep(OUTAGE_S)  # the outage itself, not a synchronisation
            broker.start()
            if proc.poll() is not None:
                exits.append(proc.returncode)
                proc = start()
            broker.produce(topic, [(_key(line), line) for line in second])
            ends = _ends(broker, topic)

            def done() -> bool:
                nonlocal proc
                if proc.poll() is not None:  # gave up after the outage: start again
                    exits.append(proc.returncode)
                    assert runs < 4, f"the job keeps failing: {exits}"
                    proc = start()
                return _caught_up(qdir, ends)

            deadline = time.monotonic() + 600
            while not done():
                assert time.monotonic() < deadline, "the job never read the whole topic"
                time.sleep(0.2)
            stopped = srt(["stop", JOB], job_env, timeout=300)
            proc.wait(timeout=300)
        finally:
            if proc.poll() is None:
                proc.kill()

        last, seen = {}, []
        for m in broker.read(out_topic):
            row = json.loads(m.value())
            k = (row["merchant_id"], datetime.fromisoformat(row["window_start"]))
            seen.append((k, dict(m.headers())[BATCH_HEADER]))
            last[k] = (row["payments"], row["amount_paise"])
        twice = len(seen) - len(set(seen))
        cmp = compare(last, oracle(lines))
        dead = sorted(m.value() for m in broker.read(f"{topic}-dlq"))
        why = [] if stopped.returncode == 0 else [f"stop: {stopped.stderr[-500:]}"]
        if twice:
            why.append(f"{twice} updates written twice")
        if not cmp.exact:
            why.append(str(cmp))
        if dead != bad_lines(lines):
            why.append(f"{len(dead)} dead letters for {len(bad_lines(lines))} bad records")
        reasons = [
            line
            for i in range(1, runs + 1)
            for line in (upi.root / f"run-{i}.log").read_text().splitlines()
            if "failed:" in line or "error:" in line
        ][:3]
        trials.record(
            fault=FAULT,
            input=INPUT,
            result="FAIL" if why else "pass",
            detail="; ".join(why)
            or (
                f"stopped after batch {at} ({'batch in flight' if in_flight else 'idle'}"
                f"); job runs {runs}, exits during/after the outage {exits}; "
                f"{' | '.join(r[:200] for r in reasons)}"
            ),
            lost=cmp.lost,
            duplicated=cmp.duplicated + twice,
            job_runs=runs,
        )
        assert not why, why
    finally:
        broker.stop()
