"""The seeds' FraudCounter over Kafka: a topic placed by the job's key, read without a shuffle,
against the same records placed by Kafka's partitioner and shuffled, in the same run.

    .venv/bin/python benchmarks/kafka_keyed.py --events 1000000 --reps 2

Starts Apache Kafka (tests/connectors/kafka/helpers.py) and produces N UPI payments over
200,000 merchants twice, to two 2-partition topics: ``placed`` by the key groups of
merchant_id (``key_partition``, what ``KafkaSink(partition_by=...)`` does) and ``hashed`` by
librdkafka's partitioner of the merchant as the record key. Then runs
``benchmarks/jobs/fraud_counter.py`` (``srt run --available-now`` in a child, parallelism 2,
``local[2]``) over each, alternating: ``keyed`` reads ``placed`` with ``source.keyed_by=
merchant_id`` (one task per partition: read, decode and the keyed operator), ``shuffled``
reads ``hashed`` (read and decode, a shuffle, then the operator). Per run: whole-process
events/s (events over the child's wall time), steady events/s (the rows after the first batch
over the time between its commit and the last), the first commit. Medians of ``--reps``.

Writes ``benchmarks/results/kafka_keyed.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

JOB = ROOT / "benchmarks" / "jobs" / "fraud_counter.py"
PARTITIONS = 2


def produce(bootstrap: str, topic: str, lines: list[bytes], placed: bool) -> None:
    from confluent_kafka import Producer

    from stateful_runtime.checkpoints.keyed import key_partition

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "enable.idempotence": True})
    for line in lines:
        merchant = json.loads(line)["merchant_id"]
        extra = {"partition": key_partition(merchant, PARTITIONS)} if placed else {}
        while True:
            try:
                p.produce(topic, key=merchant.encode(), value=line, **extra)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def run_job(bootstrap: str, topic: str, keyed: bool, work: Path, events: int) -> dict:
    from benchmarks.harness.srt_child import run_to_end

    ck = Path(tempfile.mkdtemp(prefix="ck-", dir=work))
    sets = {
        "source.kind": "kafka",
        "source.bootstrap_servers": bootstrap,
        "source.topic": topic,
        "source.keyed_by": "merchant_id" if keyed else "",
        "sink.log_dir": str(ck / "out"),
        "checkpoint.dir": str(ck / "checkpoints"),
        "parallelism": str(PARTITIONS),
    }
    return run_to_end(JOB, sets, work, events)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()

    from benchmarks.harness.data import upi200k_events
    from tests.connectors.kafka.helpers import start_broker

    work = Path(tempfile.mkdtemp(prefix="srt-kafka-keyed-"))
    broker = start_broker(work / "kafka")
    try:
        lines = list(upi200k_events(a.events, 14))
        for topic, placed in (("placed", True), ("hashed", False)):
            broker.create_topic(topic, PARTITIONS)
            produce(broker.bootstrap, topic, lines, placed)
        runs: dict[str, list[dict]] = {"keyed": [], "shuffled": []}
        for rep in range(a.reps):
            for name, topic in (("keyed", "placed"), ("shuffled", "hashed")):
                r = run_job(broker.bootstrap, topic, name == "keyed", work, a.events)
                runs[name].append(r)
                print(f"rep {rep} {name}: {json.dumps(r)}", flush=True)
        summary = {
            name: {k: statistics.median(r[k] for r in rs) for k in ("whole", "steady")}
            for name, rs in runs.items()
        }
        summary["keyed ÷ shuffled"] = {
            k: summary["keyed"][k] / summary["shuffled"][k] for k in ("whole", "steady")
        }
        print(json.dumps(summary, indent=1))
        out = ROOT / "benchmarks" / "results" / "kafka_keyed.json"
        out.write_text(json.dumps({"events": a.events, "runs": runs, "summary": summary}, indent=1))
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
