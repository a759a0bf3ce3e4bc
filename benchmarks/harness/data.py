"""Seeded event generators and the inputs every system reads.

Streams, each generated once per (stream, events, seed) and written as JSON lines; every
system reads exactly these bytes:

* ``upi`` — UPI payments ``{"txn_id", "merchant_id", "amount_paise", "ts_ms"}``: 1,000
  merchants, 1,000 events per second of event time, each event up to 4 s early (inside the
  jobs' 5 s bound), and 5% exact duplicates of a line from the last 400 (a client retry), so
  the deduplication workload has work to do. Nothing is ever late for a 5 s bound: a duplicate
  is at most 0.4 s + 4 s behind the newest event.
* ``upi200k`` — the same payments over 200,000 merchants (the seeds' FraudCounter scale: a
  merchant pays about once every 200 s of event time, so nearly every payment touches a key's
  state for the first time in its minute).
* ``bids`` — Nexmark-style bids ``{"auction", "bidder", "price", "channel", "url", "ts_ms"}``:
  10,000 bids per second of event time, up to 2 s early, on a 3 ms grid; a new block of
  auctions opens every 5 s and half the bids go to its 10 hot auctions; 100,000 bidders (a
  bidder bids every ~10 s, so 10 s sessions both continue and end); 4 channels.
* ``jpay`` — the joins' payments (same fields as ``upi``, no duplicates): 1,000 merchants, 10
  payments per second of event time (a 30-minute interval holds 18,000 of them, so a run of
  200,000 crosses the interval a dozen times and the joins' state reaches its plateau), up to
  4 s early.
* ``jrefunds`` — refunds ``{"refund_id", "txn_id", "refund_paise", "ts_ms"}`` of ``jpay``'s
  payments (generated from the same events and seed): one payment in ten is refunded, at a time
  from 1 minute before it (never matched) to 40 minutes after it (past 30: not matched), up to
  4 s out of order; ``events`` counts the payments, the stream has about a tenth as many lines.
* ``jtiers`` — the merchants' risk tiers as a changelog of upserts
  ``{"merchant_id", "tier", "ts_ms"}``: every merchant's first tier 10 s before the first
  payment, then one change a second of event time (a merchant's about every 17 minutes) up to
  the last payment, up to 4 s out of order; about a tenth of ``jpay``'s lines. No two versions
  of a merchant share a time (where systems may pick either).

A two-input workload (``Workload.second``) reads ``jpay`` and one of the others, generated from
the same ``events`` and seed.

Inputs per system (``Inputs``): the whole stream as one file, the same lines split into
``parts`` files by a hash of the key (each file spans the whole event time, like a Kafka
partition), and a topic of the embedded event log (``partitions`` partitions keyed by the same
field, appended the way ``srt log append --key-field`` does).
"""

from __future__ import annotations

import json
import random
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
CHANNELS = ("Google", "Facebook", "Baidu", "Apple")
OUT_OF_ORDERNESS_MS = 5_000  # every job's bounded out-of-orderness

STREAM_KEYS = {
    "upi": "merchant_id",
    "upi200k": "merchant_id",
    "bids": "bidder",
    "jpay": "merchant_id",
    "jrefunds": "txn_id",
    "jtiers": "merchant_id",
}
# Each stream's record schema, as its jobs declare it (benchmarks/jobs/): the event log stores
# the records parsed into it at append (a topic with a schema), so the jobs parse no JSON.
_PAYMENT = "txn_id string, merchant_id string, amount_paise bigint, ts_ms bigint"
STREAM_SCHEMAS = {
    "upi": _PAYMENT,
    "upi200k": _PAYMENT,
    "bids": "auction bigint, bidder bigint, price bigint, channel string, url string, ts_ms bigint",
    "jpay": _PAYMENT,
    "jrefunds": "refund_id string, txn_id string, refund_paise bigint, ts_ms bigint",
    "jtiers": "merchant_id string, tier string, ts_ms bigint",
}
# The join streams' topics have one partition. Spark keeps one watermark per source, the
# maximum over its partitions, and a micro-batch splits its records between the partitions by
# count, so at 10 events a second two partitions drift tens of seconds apart in event time and
# records behind the other partition's newest become late (5 tier versions of 3,000 in a first
# run). Flink's file source keeps a watermark per split (file) and reads the two files.
ONE_PARTITION = {"jpay", "jrefunds", "jtiers"}
FRAUD_MERCHANTS = 200_000
JOIN_MERCHANTS = 1_000
JOIN_STEP_MS = 100  # jpay: 10 payments per second of event time
TIERS = ("low", "mid", "high")


def upi_events(
    n: int,
    seed: int,
    *,
    merchants: int = 1_000,
    rate_per_s: int = 1_000,
    disorder_ms: int = 4_000,
    dup_share: float = 0.05,
    dup_window: int = 400,
) -> Iterator[bytes]:
    rng = random.Random(seed)
    recent: list[bytes] = []
    step = 1000 / rate_per_s
    made = 0
    for i in range(n):
        if recent and rng.random() < dup_share:
            yield recent[rng.randrange(len(recent))]
            continue
        ts = START_MS + int(i * step) - rng.randint(0, disorder_ms)
        line = (
            f'{{"txn_id":"t{seed}-{made}","merchant_id":"M{rng.randint(1, merchants):04d}",'
            f'"amount_paise":{rng.randint(100, 500_000)},"ts_ms":{ts}}}'
        ).encode()
        made += 1
        recent.append(line)
        if len(recent) > dup_window:
            recent.pop(0)
        yield line


def bid_events(
    n: int, seed: int, *, rate_per_s: int = 10_000, disorder_ms: int = 2_000, bidders: int = 100_000
) -> Iterator[bytes]:
    rng = random.Random(seed)
    step = 1000 / rate_per_s
    for i in range(n):
        t = int(i * step)
        # Multiples of 3 ms: two bids of a bidder are never exactly 10 s apart, where systems
        # disagree on whether touching sessions merge (Flink's TimeWindow.intersects does).
        ts = START_MS + (t - rng.randint(0, disorder_ms)) // 3 * 3
        base = 1_000 + (t // 5_000) * 100  # a new block of auctions every 5 s
        auction = base + (rng.randrange(10) if rng.random() < 0.5 else rng.randrange(1_000))
        price = int(rng.lognormvariate(8, 1.2)) + 1
        channel = CHANNELS[rng.randrange(4)]
        url = f"https://www.nexmark.com/{channel.lower()}/item.htm?query={rng.randrange(100)}"
        yield (
            f'{{"auction":{auction},"bidder":{rng.randint(1, bidders)},"price":{price},'
            f'"channel":"{channel}","url":"{url}","ts_ms":{ts}}}'
        ).encode()


def upi200k_events(n: int, seed: int) -> Iterator[bytes]:
    return upi_events(n, seed, merchants=FRAUD_MERCHANTS)


def _join_payments(n: int, seed: int) -> Iterator[tuple[str, str, int, int]]:
    """(txn_id, merchant_id, amount_paise, ts_ms) of ``jpay``, in order of arrival (the i-th
    arrives at ``START_MS + i * JOIN_STEP_MS``)."""
    rng = random.Random(seed)
    for i in range(n):
        yield (
            f"p{seed}-{i}",
            f"M{rng.randint(1, JOIN_MERCHANTS):04d}",
            rng.randint(100, 500_000),
            START_MS + i * JOIN_STEP_MS - rng.randint(0, 4_000),
        )


def _disordered(rows: list[tuple[int, bytes]], rng: random.Random) -> list[tuple[int, bytes]]:
    """(arrival, line) of lines by event time, each arriving up to 4 s after its time (never
    more than 4 s behind the newest line before it: nothing is late for the 5 s bound)."""
    return sorted((ts + rng.randint(0, 3_999), line) for ts, line in rows)


def jpay_events(n: int, seed: int) -> Iterator[bytes]:
    for txn, merchant, amount, ts in _join_payments(n, seed):
        yield (
            f'{{"txn_id":"{txn}","merchant_id":"{merchant}","amount_paise":{amount},"ts_ms":{ts}}}'
        ).encode()


def jrefunds_arrivals(n: int, seed: int) -> list[tuple[int, bytes]]:
    """(arrival ms, line) of ``jrefunds``, in order of arrival."""
    rng = random.Random(seed + 1)
    end = START_MS + n * JOIN_STEP_MS
    rows = []
    for txn, _, amount, ts in _join_payments(n, seed):
        if rng.random() >= 0.1:
            continue
        at = ts + rng.randint(-60_000, 40 * 60_000)
        if at <= end:
            line = (
                f'{{"refund_id":"r-{txn}","txn_id":"{txn}",'
                f'"refund_paise":{rng.randint(1, amount)},"ts_ms":{at}}}'
            ).encode()
            rows.append((at, line))
    return _disordered(rows, rng)


def jtiers_arrivals(n: int, seed: int) -> list[tuple[int, bytes]]:
    """(arrival ms, line) of ``jtiers``, in order of arrival."""
    rng = random.Random(seed + 2)

    def line(merchant: int, ts: int) -> tuple[int, bytes]:
        tier = TIERS[rng.randrange(len(TIERS))]
        return ts, f'{{"merchant_id":"M{merchant:04d}","tier":"{tier}","ts_ms":{ts}}}'.encode()

    rows = [line(m, START_MS - 10_000 + m) for m in range(1, JOIN_MERCHANTS + 1)]
    rows += [
        line(rng.randint(1, JOIN_MERCHANTS), START_MS + j * 1_000 + 500)
        for j in range(n * JOIN_STEP_MS // 1_000 + 1)
    ]
    return _disordered(rows, rng)


def jrefunds_events(n: int, seed: int) -> Iterator[bytes]:
    return (line for _, line in jrefunds_arrivals(n, seed))


def jtiers_events(n: int, seed: int) -> Iterator[bytes]:
    return (line for _, line in jtiers_arrivals(n, seed))


GENERATORS = {
    "upi": upi_events,
    "upi200k": upi200k_events,
    "bids": bid_events,
    "jpay": jpay_events,
    "jrefunds": jrefunds_events,
    "jtiers": jtiers_events,
}


def part_of(line: bytes, key: str, parts: int) -> int:
    """Which peer input file a line goes to: a stable hash of its key field."""
    value = json.loads(line)[key]
    return zlib.crc32(str(value).encode()) % parts


@dataclass(frozen=True)
class Inputs:
    """One generated stream, laid out for every system; a two-input workload's first stream
    carries its second as ``second``."""

    stream: str
    events: int
    seed: int
    lines_path: Path  # the whole stream, one JSON object per line
    part_paths: tuple[Path, ...]  # the same lines split by key hash
    log_dir: Path  # embedded event log holding topic ``stream``
    topic: str
    max_ts_ms: int
    records: int  # lines in the stream (``events`` for the streams of one input)
    second: Inputs | None = None

    @property
    def final_watermark_ms(self) -> int:
        """The last watermark: of both inputs, the minimum (Flink's and Spark's rule)."""
        ends = [self.max_ts_ms] + ([self.second.max_ts_ms] if self.second else [])
        return min(ends) - OUT_OF_ORDERNESS_MS

    @property
    def total_records(self) -> int:
        """Input records a run reads: both inputs' of a two-input workload."""
        return self.records + (self.second.records if self.second else 0)

    def lines(self) -> list[bytes]:
        return self.lines_path.read_bytes().splitlines()


def prepare(
    root: Path, stream: str, events: int, seed: int, *, parts: int = 2, partitions: int = 2
) -> Inputs:
    """Generate (or reuse) a stream under ``root`` and lay it out for every system."""
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import APPEND_BATCH, _records, key_topic

    if stream in ONE_PARTITION:
        partitions = 1
    d = root / f"{stream}-{events}-s{seed}-p{parts}-t{partitions}-parsed"
    meta = d / "inputs.json"
    key = STREAM_KEYS[stream]
    if meta.exists():
        m = json.loads(meta.read_text())
        return Inputs(
            stream,
            events,
            seed,
            Path(m["lines"]),
            tuple(Path(p) for p in m["parts"]),
            Path(m["log_dir"]),
            stream,
            m["max_ts_ms"],
            m["records"],
        )
    d.mkdir(parents=True, exist_ok=True)
    lines = list(GENERATORS[stream](events, seed))
    lines_path = d / "events.jsonl"
    lines_path.write_bytes(b"\n".join(lines) + b"\n")
    split: list[list[bytes]] = [[] for _ in range(parts)]
    max_ts = 0
    for line in lines:
        rec = json.loads(line)
        max_ts = max(max_ts, rec["ts_ms"])
        split[zlib.crc32(str(rec[key]).encode()) % parts].append(line)
    part_paths = []
    for k, chunk in enumerate(split):
        p = d / "parts" / f"part-{k}.jsonl"
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"\n".join(chunk) + b"\n")
        part_paths.append(p)
    log_dir = d / "log"
    from stateful_runtime.connectors.formats.json import schema_from_ddl

    EventLog(log_dir).create_topic(
        stream, partitions, schema=schema_from_ddl(STREAM_SCHEMAS[stream])
    )
    with EventLog(log_dir).writer(stream) as w:
        key_topic(w, key, lines[0])  # keyed by its key field, as `srt log append` keys it
        for i in range(0, len(lines), APPEND_BATCH):
            w.append(_records(lines[i : i + APPEND_BATCH], key))
    meta.write_text(
        json.dumps(
            {
                "lines": str(lines_path),
                "parts": [str(p) for p in part_paths],
                "log_dir": str(log_dir),
                "max_ts_ms": max_ts,
                "records": len(lines),
            }
        )
    )
    return Inputs(
        stream, events, seed, lines_path, tuple(part_paths), log_dir, stream, max_ts, len(lines)
    )


def parse(lines: Sequence[bytes]) -> list[dict]:
    return [json.loads(x) for x in lines]
