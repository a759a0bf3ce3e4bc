"""The UPI job over the event log, fed every input class the decoder defines: the job never
fails, the counts equal the oracle's over the good records, and every bad record is in the
dead-letter topic once, byte for byte, with its reason."""

from __future__ import annotations

import json

import pytest
from upi_events import events, oracle

from stateful_runtime.connectors.eventlog import EventLog, Record
from stateful_runtime.connectors.eventlog.ingest import key_of
from stateful_runtime.connectors.formats.json import decode_json, to_struct
from tests.helpers import srt

pytestmark = pytest.mark.slow

PAYMENT = to_struct({"txn_id": str, "merchant_id": str, "amount_paise": int, "ts_ms": int})
GOOD = b'{"txn_id":"h","merchant_id":"M001","amount_paise":100,"ts_ms":1767225600000}'

HOSTILE = [
    b"",  # blank next to ...
    GOOD + GOOD,  # ... two objects: the probe's shifted rows
    b'{"txn_id":"h","merchant_id":' + b"[" * 50_000 + b"]" * 50_000 + b',"x":1}',
    b'{"txn_id":"h\xff","merchant_id":"M001","amount_paise":1,"ts_ms":1767225600000}',
    b'{"txn_id":"\\ud800","merchant_id":"M001","amount_paise":1,"ts_ms":1767225600000}',
    b'{"txn_id":"h","merchant_id":"M001","amount_paise":NaN,"ts_ms":1767225600000}',
    b'{"txn_id":"h","merchant_id":null,"amount_paise":1,"ts_ms":1767225600000}',
    b'{"txn_id":"h","merchant_id":"M001","amount_paise":"1","ts_ms":1767225600000}',
    b'{"txn_id":"h","merchant_id":"M001","amount_paise":1,"ts_ms":10000000000000000}',
    b'{"txn_id":"h","merchant_id":"M001","amount_paise":1,"ts_ms":9223372036854775807}',
    b'{"txn_id":"h","merchant_id":"M001","amount_paise":1,"amount_paise":2,"ts_ms":1}',
    b'{"txn_id":"h\x00","merchant_id":"M001","amount_paise":1,"ts_ms":1767225600000}',
    b"[1,2]",
    b"\xef\xbb\xbf" + GOOD,
    b'{"txn_id":"' + b"a" * (2 << 20) + b'","merchant_id":"M001","amount_paise":1,"ts_ms":1}',
]


def test_hostile_records_never_fail_the_job_and_each_is_dead_lettered_once(upi, srt_env):
    lines = list(events(20_000, merchants=10, rate_per_s=500, disorder_ms=4_000, seed=5))
    mixed = []
    for i, line in enumerate(lines):
        mixed.append(line)
        if i % 997 == 500:
            mixed.extend(HOSTILE)
    # The log takes any bytes, blank ones too (appended directly: `srt log append` skips blank
    # lines and refuses the 2 MiB one), keyed as `srt log append --key-field` would.
    with EventLog(upi.log_dir).writer("upi-payments") as writer:
        writer.append(Record(line, key_of(line, "merchant_id")) for line in mixed)
    result = srt(upi.run_args("--available-now"), srt_env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert upi.table() == oracle(lines)

    reader = EventLog(upi.log_dir).reader("upi-payments-dlq")
    dead = [r for p, end in reader.end_offsets().items() for r in reader.read(p, 0, end)]
    good = set(lines)
    bad = [line for line in mixed if line not in good]
    assert sorted(r.value for r in dead) == sorted(bad)
    expected = {
        row["_raw"]: row["_error"]
        for row in decode_json(HOSTILE, PAYMENT, event_time=("ts_ms", "ms")).to_pylist()
        if row["_error"]
    }
    assert all(r.headers["error"] == expected[r.value] for r in dead)
    assert (
        json.loads(srt(["status", "upi-per-minute", "--json"], srt_env).stdout)[0]["state"]
        == "FINISHED"
    )
