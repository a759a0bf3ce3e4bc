"""Seeded event generators and the inputs every system reads.

Three streams, each generated once per (stream, events, seed) and written as JSON lines; every
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

STREAM_KEYS = {"upi": "merchant_id", "upi200k": "merchant_id", "bids": "bidder"}
FRAUD_MERCHANTS = 200_000


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


GENERATORS = {"upi": upi_events, "upi200k": upi200k_events, "bids": bid_events}


def part_of(line: bytes, key: str, parts: int) -> int:
    """Which peer input file a line goes to: a stable hash of its key field."""
    value = json.loads(line)[key]
    return zlib.crc32(str(value).encode()) % parts


@dataclass(frozen=True)
class Inputs:
    """One generated stream, laid out for every system."""

    stream: str
    events: int
    seed: int
    lines_path: Path  # the whole stream, one JSON object per line
    part_paths: tuple[Path, ...]  # the same lines split by key hash
    log_dir: Path  # embedded event log holding topic ``stream``
    topic: str
    max_ts_ms: int

    @property
    def final_watermark_ms(self) -> int:
        return self.max_ts_ms - OUT_OF_ORDERNESS_MS

    def lines(self) -> list[bytes]:
        return self.lines_path.read_bytes().splitlines()


def prepare(
    root: Path, stream: str, events: int, seed: int, *, parts: int = 2, partitions: int = 2
) -> Inputs:
    """Generate (or reuse) a stream under ``root`` and lay it out for every system."""
    from stateful_runtime.connectors.eventlog import EventLog
    from stateful_runtime.connectors.eventlog.ingest import APPEND_BATCH, _records

    d = root / f"{stream}-{events}-s{seed}-p{parts}-t{partitions}"
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
    EventLog(log_dir).create_topic(stream, partitions)
    with EventLog(log_dir).writer(stream) as w:
        for i in range(0, len(lines), APPEND_BATCH):
            w.append(_records(lines[i : i + APPEND_BATCH], key))
    meta.write_text(
        json.dumps(
            {
                "lines": str(lines_path),
                "parts": [str(p) for p in part_paths],
                "log_dir": str(log_dir),
                "max_ts_ms": max_ts,
            }
        )
    )
    return Inputs(stream, events, seed, lines_path, tuple(part_paths), log_dir, stream, max_ts)


def parse(lines: Sequence[bytes]) -> list[dict]:
    return [json.loads(x) for x in lines]
