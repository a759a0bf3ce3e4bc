"""Apache Kafka fails under the job: one node crashes, or a cluster loses a leader and the
sink's transaction coordinator, while the UPI job reads and writes exactly-once.

* **One node killed** (SIGKILL: a crash), down 30 s (10 s in CI; ``SRT_FAULT_KAFKA_OUTAGE_S``
  overrides) and restarted on its data. Its next start recovers the log segments as the
  process wrote them and aborts or completes the job's open transaction: a crash and restart
  on the same port, as clients see it.
* **A three-node cluster** (each node broker and controller; every topic on all three,
  min.insync.replicas 2): the node leading an input partition is stopped cleanly (a
  controlled shutdown moves its leaderships: a partition leader moved), the job commits on
  the new leaders, and the node comes back; then the node coordinating the sink's
  transactions (leader of the ``__transaction_state`` partition of its first transactional
  id) is killed with SIGKILL mid-stream, the job commits through the new coordinator, and the
  node comes back.

The job reads a 4-partition topic in small batches and writes the exactly-once Kafka sink; the
faults come after two committed batches (a batch in flight or about to be planned), more input
follows. The job rides through both (a source waits up to a minute for a cluster out of reach
or a leadership moving); if it gives up it is started again, as the Dagster restart sensor
would, and the trial says so. The
output, read with read_committed, holds each (window, batch) update once and its last update
per window equals the oracle; each dead letter is in ``<topic>-dlq`` once.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable
from datetime import datetime

import pytest
from upi_events import bad_lines, events, oracle

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.connectors.kafka.sink import BATCH_HEADER
from tests.connectors.kafka.helpers import Client, start_broker, start_cluster
from tests.faults.harness import JOB, QUERY, caught_up, compare
from tests.helpers import srt, srt_background, wait_for_commit

pytestmark = pytest.mark.faults

# 30 s in the full run (platform/fault-trials.sh); CI's budget affords 10 s.
OUTAGE_S = float(
    os.environ.get("SRT_FAULT_KAFKA_OUTAGE_S") or (30 if os.environ.get("SRT_FAULT_FULL") else 10)
)
INPUT = "UPI events on 4 Kafka partitions (1 bad record in 997), Kafka exactly-once sink"
# The sink's transactional ids are "<job>.<query>.<n>" (connectors/kafka/sink.py).
FIRST_TRANSACTIONAL_ID = f"{JOB}.{QUERY}.0"


def _key(line: bytes) -> bytes:
    try:
        return json.loads(line)["merchant_id"].encode()
    except (ValueError, KeyError, TypeError):
        return b"bad"


def _ends(kafka: Client, topic: str) -> dict[str, int]:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
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


def _coordinator_partition(transactional_id: str, partitions: int = 4) -> int:
    """The ``__transaction_state`` partition of a transactional id, as Kafka places it:
    ``Utils.abs(id.hashCode()) % partitions`` (Java's String hash over UTF-16 units)."""
    data, h = transactional_id.encode("utf-16-be"), 0
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def test_the_coordinator_partition_is_kafkas():
    # Java: "a".hashCode() == 97, "upi".hashCode() == 116_014, "ab".hashCode() == 3_105,
    # "polygenelubricants".hashCode() == Integer.MIN_VALUE (Utils.abs makes it 0)
    assert _coordinator_partition("a", 50) == 97 % 50
    assert _coordinator_partition("upi", 50) == 116_014 % 50
    assert _coordinator_partition("polygenelubricants", 7) == 0
    assert _coordinator_partition("ab", 4) == 3_105 % 4


def _trial(
    kafka: Client,
    upi,
    job_env: dict[str, str],
    trials,
    fault: str,
    inject: Callable[[Callable[[], int], Callable[[int], None]], str],
) -> None:
    """The UPI job over ``kafka``; ``inject(progressed, feed)`` makes the faults after two
    commits (``progressed()`` waits for a new committed batch, restarting the job if it gave
    up, and counts the job's exits; ``feed(n)`` appends the next ``n`` records of the second
    half, for a fault that must meet the job writing) and says what it did; the rest of the
    second half follows."""
    topic, out_topic = "upi-outage", "upi-outage-counts"
    kafka.create_topic(topic, 4)
    lines = list(
        events(40_000, merchants=30, rate_per_s=300, disorder_ms=4_000, bad_every=997, seed=31)
    )
    first, second = lines[:24_000], lines[24_000:]
    kafka.produce(topic, [(_key(line), line) for line in first])
    upi.extra.update(
        {
            "source.kind": "kafka",
            "source.bootstrap_servers": kafka.bootstrap,
            "source.topic": topic,
            "sink.kind": "kafka",
            "sink.kafka_topic": out_topic,
            "checkpoint.interval_s": "0.5",
            "source.max_records_per_batch": "2000",
            "parallelism": "2",
        }
    )
    qdir = upi.checkpoint_dir / QUERY
    runs, exits, fed = 0, [], 0
    proc = None

    def feed(n: int) -> None:
        nonlocal fed
        kafka.produce(topic, [(_key(line), line) for line in second[fed : fed + n]])
        fed += len(second[fed : fed + n])

    def start():
        nonlocal runs, proc
        runs += 1
        proc = srt_background(upi.run_args(), job_env, upi.root / f"run-{runs}.log")

    def running() -> None:
        """Start the job again if it gave up (the restart sensor's part)."""
        assert proc is not None
        if proc.poll() is not None:
            exits.append(proc.returncode)
            assert runs < 5, f"the job keeps failing: {exits}"
            start()

    def progressed() -> int:
        """Wait for a new committed batch (restarting the job if it gave up); the job's
        exits so far."""
        at = QueryLayout(qdir).last_committed() or -1
        deadline = time.monotonic() + 300
        while (QueryLayout(qdir).last_committed() or -1) <= at:
            running()
            assert time.monotonic() < deadline, "no batch committed after the fault"
            time.sleep(0.2)
        return len(exits)

    start()
    assert proc is not None
    try:
        wait_for_commit(qdir, None, proc, upi.root / "run-1.log", timeout=300)
        wait_for_commit(
            qdir, QueryLayout(qdir).last_committed(), proc, upi.root / "run-1.log", timeout=300
        )
        at = QueryLayout(qdir).last_committed()
        in_flight = (QueryLayout(qdir).last_planned() or -1) > at
        done_what = inject(progressed, feed)
        running()
        feed(len(second) - fed)
        ends = _ends(kafka, topic)
        deadline = time.monotonic() + 600
        while not caught_up(qdir, ends):
            running()
            assert time.monotonic() < deadline, "the job never read the whole topic"
            time.sleep(0.2)
        stopped = srt(["stop", JOB], job_env, timeout=300)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()

    last, seen = {}, []
    for m in kafka.read(out_topic):
        row = json.loads(m.value())
        k = (row["merchant_id"], datetime.fromisoformat(row["window_start"]))
        seen.append((k, dict(m.headers())[BATCH_HEADER]))
        last[k] = (row["payments"], row["amount_paise"])
    twice = len(seen) - len(set(seen))
    cmp = compare(last, oracle(lines))
    dead = sorted(m.value() for m in kafka.read(f"{topic}-dlq"))
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
        fault=fault,
        input=INPUT,
        result="FAIL" if why else "pass",
        detail="; ".join(why)
        or (
            f"after batch {at} ({'batch in flight' if in_flight else 'idle'}): {done_what}; "
            f"job runs {runs}, exits {exits}; {' | '.join(r[:200] for r in reasons)}"
        ),
        lost=cmp.lost,
        duplicated=cmp.duplicated + twice,
        job_runs=runs,
    )
    assert not why, why


def test_broker_killed_then_back_output_equals_oracle(upi, job_env, tmp_path, trials):
    broker = start_broker(tmp_path / "kafka" / "data")

    def crash(progressed: Callable[[], int], feed: Callable[[int], None]) -> str:
        broker.stop(signal.SIGKILL)
        time.sleep(OUTAGE_S)  # the outage itself, not a synchronisation
        broker.start()
        # The job waits the outage out (its source asks a cluster out of reach again, with a
        # new client, for up to a minute): its next batches commit, no restart.
        assert progressed() == 0, "the job stopped while the broker was down"
        return f"broker killed, down {OUTAGE_S:g} s, restarted"

    try:
        _trial(
            broker,
            upi,
            job_env,
            trials,
            f"Kafka broker killed (SIGKILL), down {OUTAGE_S:g} s and restarted mid-run",
            crash,
        )
    finally:
        broker.stop()


def test_cluster_leader_moved_and_coordinator_lost_output_equals_oracle(
    upi, job_env, tmp_path, trials
):
    cluster = start_cluster(tmp_path / "kafka")

    def faults(progressed: Callable[[], int], feed: Callable[[int], None]) -> str:
        moved = cluster.leader("upi-outage", 0)
        cluster.node(moved).stop()  # controlled shutdown: its leaderships move
        # The job rides through a leader's move: its next batches commit, no restart.
        assert progressed() == 0, "the job stopped when a partition's leader moved"
        after = cluster.leader("upi-outage", 0)
        assert after != moved, "the partition's leadership did not move"
        cluster.node(moved).start()
        part = _coordinator_partition(FIRST_TRANSACTIONAL_ID)
        lost = cluster.leader("__transaction_state", part)
        # Records to write while the coordinator is gone: the job may have read all it had.
        feed(4_000)
        cluster.node(lost).stop(signal.SIGKILL)
        progressed()
        cluster.node(lost).start()
        return (
            f"leader of upi-outage:0 moved {moved} -> {after}; transaction coordinator "
            f"(node {lost}, __transaction_state:{part}) killed and restarted"
        )

    try:
        _trial(
            cluster,
            upi,
            job_env,
            trials,
            "Kafka cluster of 3: a partition leader moved, then the sink's transaction "
            "coordinator killed (SIGKILL), mid-run",
            faults,
        )
    finally:
        cluster.stop()
