"""Decoder throughput on UPI-like records (not a test; run by hand).

    .venv/bin/python tests/connectors/formats/bench_decode.py [--records 200000] [--repeats 7]

Single-threaded CPU time (``time.process_time``) of ``decode_json`` over the records in
65,536-record calls (the sources' ``ARROW_BATCH_ROWS``), best of ``--repeats`` runs; clean
input, and input with one malformed record per 10,000. ``--module PATH`` times another copy of
the decoder (e.g. the previous commit's ``json.py``) in the same process, alternating runs, so a
loaded machine slows both alike.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from examples.upi_events import events  # noqa: E402
from stateful_runtime.connectors.formats import json as decoder  # noqa: E402

ROWS = 65_536


def _load(path: str):
    spec = importlib.util.spec_from_file_location("decoder_under_test", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


def _run(module, lines: list[bytes], schema) -> float:
    t0 = time.process_time()
    for lo in range(0, len(lines), ROWS):
        module.decode_json(lines[lo : lo + ROWS], schema)
    return time.process_time() - t0


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--module",
        action="append",
        default=[],
        help="path of another json.py to time alongside the current one",
    )
    a = p.parse_args()
    schema = decoder.to_struct(
        {"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int}
    )
    clean = list(events(a.records))
    dirty = list(events(a.records, bad_every=10_000))
    modules = {"current": decoder, **{m: _load(m) for m in a.module}}
    best: dict[tuple[str, str], float] = {}
    for _ in range(a.repeats):
        for name, module in modules.items():
            for kind, lines in (("clean", clean), ("1 bad per 10k", dirty)):
                t = _run(module, lines, schema)
                best[name, kind] = min(best.get((name, kind), t), t)
    for (name, kind), t in best.items():
        print(
            f"{name:>40s}  {kind:>14s}  {a.records / t / 1e3:7.0f}k records/s  "
            f"({t * 1e6 / a.records:.2f} us/record)"
        )


if __name__ == "__main__":
    main()
