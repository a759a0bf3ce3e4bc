"""Generate UPI payment events (JSON lines) with bounded disorder, and their exact oracle.

    python examples/upi_events.py --count 100000 | srt log append upi-payments \
        --key-field merchant_id --log-dir srt-data/log
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime

START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def events(
    count: int,
    *,
    merchants: int = 50,
    rate_per_s: int = 1000,
    disorder_ms: int = 4_000,
    bad_every: int = 0,
    seed: int = 7,
    start_ms: int = START_MS,
) -> Iterator[bytes]:
    """``count`` payment lines; event time advances ``1000/rate_per_s`` ms per event and each
    event is shifted back by up to ``disorder_ms`` (inside the job's 5 s bound). With
    ``bad_every=N``, every Nth line is a malformed record instead of a payment."""
    rng = random.Random(seed)
    step = 1000 / rate_per_s
    bad = [
        b"{not json",
        b'{"txn_id": "x", "merchant_id": "M1"}',
        b'{"txn_id": "x", "merchant_id": "M1", "amount_paise": "ten", "ts_ms": 1}',
    ]
    for i in range(count):
        if bad_every and i % bad_every == bad_every - 1:
            yield bad[(i // bad_every) % len(bad)]
            continue
        ts = start_ms + int(i * step) - rng.randint(0, disorder_ms)
        yield json.dumps(
            {
                "txn_id": f"t{seed}-{i}",
                "merchant_id": f"M{rng.randint(1, merchants):03d}",
                "amount_paise": rng.randint(100, 500_000),
                "ts_ms": ts,
            },
            separators=(",", ":"),
        ).encode()


def bad_lines(lines: Iterable[bytes]) -> list[bytes]:
    """The lines the UPI decoder rejects (the three malformed shapes ``events`` makes), sorted:
    what the dead-letter topic must hold, each once."""
    return sorted(
        line
        for line in lines
        if line.startswith(b"{not") or b'"ten"' in line or b'"amount_paise"' not in line
    )


def oracle(lines: Iterable[bytes]) -> dict[tuple[str, datetime], tuple[int, int]]:
    """(merchant_id, window_start UTC naive) → (payments, amount_paise), computed directly."""
    out: dict[tuple[str, datetime], list[int]] = defaultdict(lambda: [0, 0])
    for line in lines:
        try:
            e = json.loads(line)
            merchant, amount, ts = e["merchant_id"], e["amount_paise"], e["ts_ms"]
        except (ValueError, KeyError, TypeError):
            continue
        if not (isinstance(amount, int) and isinstance(ts, int) and isinstance(merchant, str)):
            continue
        start = datetime.fromtimestamp((ts // 60_000) * 60, UTC).replace(tzinfo=None)
        acc = out[(merchant, start)]
        acc[0] += 1
        acc[1] += amount
    return {k: (v[0], v[1]) for k, v in out.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=int, default=100_000)
    p.add_argument("--merchants", type=int, default=50)
    p.add_argument("--rate", type=int, default=1000, help="events per second of event time")
    p.add_argument("--bad-every", type=int, default=0)
    p.add_argument("--seed", type=int, default=7)
    a = p.parse_args()
    out = sys.stdout.buffer
    for line in events(
        a.count, merchants=a.merchants, rate_per_s=a.rate, bad_every=a.bad_every, seed=a.seed
    ):
        out.write(line + b"\n")


if __name__ == "__main__":
    main()
