"""Kafka source and sink throughput against raw confluent-kafka in the same run.

    .venv/bin/python benchmarks/kafka_throughput.py --events 300000

Starts Apache Kafka (tests/connectors/kafka/helpers.py), produces N UPI events to a
4-partition topic, then measures:

* source: a Spark query over ``KafkaSource`` at its defaults (read + JSON decode, availableNow,
  count per batch; the first batch of a run reads at most 20,000 records, the rest is one batch)
  against a raw ``confluent_kafka.Consumer`` reading the same topic, ``--reps`` times each, and
  against the same consumer also parsing the values with Arrow's JSON reader (one thread);
  ratio = median source / median raw (one raw read moved between 610k and 843k records/s from
  run to run on this machine, which alone moved a one-run ratio by 0.15). The raw reads run
  before Spark starts: interleaved with the source's runs they shared the cores with the JVM's
  JIT compiling Spark's code and read 331k-592k/s, a ratio that flattered the source;
* sink: ``KafkaSink.write_batch`` of the same rows, exactly-once and at-least-once, against a
  raw idempotent ``Producer`` of the same bytes (ratio = sink / raw).

Writes ``benchmarks/results/kafka_throughput.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def raw_consume(bootstrap: str, topic: str, partitions: int, n: int, decode: bool = False) -> float:
    """Records/s of one consumer reading ``n`` records; ``decode``: each 65,536 values also
    parsed by Arrow's JSON reader, untyped and unchecked (what any decoding reader pays)."""
    import pyarrow.json as pajson
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "bench",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            # librdkafka's default (1 s) holds a partition's next fetch back whenever its
            # queue holds 100,000 records: a loop taking 10,000 at a time then waits on it
            # (178k/s against 756k/s with 10 ms on this machine). The source sets the same.
            "fetch.queue.backoff.ms": 10,
        }
    )
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, t0, quiet = 0, time.perf_counter(), time.monotonic()
    values: list[bytes] = []
    while got < n:
        msgs = c.consume(10_000, 1.0)
        got += sum(1 for m in msgs if not m.error())
        if decode:
            values += [m.value() for m in msgs if not m.error()]
            if len(values) >= 65_536 or got >= n:
                pajson.read_json(io.BytesIO(b"\n".join(values)))
                values = []
        if msgs:
            quiet = time.monotonic()
        elif time.monotonic() - quiet > 30:  # the broker holds fewer than were produced
            c.close()
            raise SystemExit(
                f"raw consumer: {got:,} of {n:,} records read from {topic!r}, "
                "then nothing for 30 s (see the client's errors above)"
            )
    dt = time.perf_counter() - t0
    c.close()
    return n / dt


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=300_000)
    # The source's own default (no cap: a batch reads what is there, as the raw consumer does);
    # with 250,000 records a batch the 1M-record ratio was 0.41 against 0.51 uncapped.
    ap.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="the source's max_records_per_batch (default: the source's, no cap)",
    )
    ap.add_argument("--reps", type=int, default=3, help="runs of each side (median, min-max)")
    ap.add_argument("--output", default=str(ROOT / "benchmarks/results/kafka_throughput.json"))
    args = ap.parse_args()
    from confluent_kafka import Producer
    from upi_events import events

    from stateful_runtime.connectors.base import read_stream
    from stateful_runtime.connectors.kafka.sink import KafkaSink
    from stateful_runtime.connectors.kafka.source import KafkaSource
    from stateful_runtime.runtime.session import build_session
    from tests.connectors.kafka.helpers import start_broker

    work = Path(tempfile.mkdtemp(prefix="srt-kafka-bench-"))
    broker = start_broker(work / "data")
    out: dict = {"events": args.events, "load_before": os.getloadavg()[0]}
    try:
        topic, parts = "bench-in", 4
        broker.create_topic(topic, parts)
        lines = list(events(args.events, merchants=50, rate_per_s=1000, seed=1))
        broker.produce(topic, [(json.loads(x)["merchant_id"].encode(), x) for x in lines])

        raws = [raw_consume(broker.bootstrap, topic, parts, len(lines)) for _ in range(args.reps)]
        decoding = [
            raw_consume(broker.bootstrap, topic, parts, len(lines), decode=True)
            for _ in range(args.reps)
        ]
        spark = build_session(4, "local[2]")
        schema = {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
        src = KafkaSource(broker.bootstrap, topic, schema, max_records_per_batch=args.batch_size)
        counts: list[int] = []

        def run_once(name: str) -> float:
            df = read_stream(spark, *src.data_source())
            t0 = time.perf_counter()
            q = (
                df.writeStream.foreachBatch(lambda d, _: counts.append(d.count()))
                .option("checkpointLocation", str(work / name))
                .trigger(availableNow=True)
                .start()
            )
            q.awaitTermination()
            return len(lines) / (time.perf_counter() - t0)

        run_once("warmup")  # JIT and Python workers, as in the UPI benchmark
        sources = [run_once(f"measured-{rep}") for rep in range(args.reps)]
        raw, source = statistics.median(raws), statistics.median(sources)
        decoded = statistics.median(decoding)
        out["source"] = {
            "events_per_s": round(source),
            "raw_consumer_per_s": round(raw),
            "ratio": round(source / raw, 3),
            "raw_consumer_decoding_per_s": round(decoded),
            "ratio_to_decoding": round(source / decoded, 3),
            "reps": args.reps,
            "runs": {
                "source": [round(x) for x in sources],
                "raw_consumer": [round(x) for x in raws],
                "raw_consumer_decoding": [round(x) for x in decoding],
            },
        }

        import pyarrow as pa

        table = pa.Table.from_pylist([json.loads(x) for x in lines[:100_000]])
        payload = [json.dumps(r, separators=(",", ":")).encode() for r in table.to_pylist()]
        p = Producer(
            {"bootstrap.servers": broker.bootstrap, "enable.idempotence": True, "linger.ms": 20}
        )
        t0 = time.perf_counter()
        for v in payload:
            while True:
                try:
                    p.produce("bench-raw", value=v)
                    break
                except BufferError:
                    p.poll(0.05)
        p.flush(60)
        raw_p = len(payload) / (time.perf_counter() - t0)
        out["sink"] = {"raw_producer_per_s": round(raw_p)}
        for delivery in ("exactly_once", "at_least_once"):
            sink = KafkaSink(broker.bootstrap, f"bench-{delivery}", partitions=4, delivery=delivery)
            sink.open("bench", delivery)
            t0 = time.perf_counter()
            for b in range(0, table.num_rows, 25_000):
                sink.write_batch(table.slice(b, 25_000), b // 25_000)
            rate = table.num_rows / (time.perf_counter() - t0)
            sink.close()
            out["sink"][delivery] = {"rows_per_s": round(rate), "ratio": round(rate / raw_p, 3)}
        spark.stop()
    finally:
        broker.process.terminate()
    out["load_after"] = os.getloadavg()[0]
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(out, indent=2))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
