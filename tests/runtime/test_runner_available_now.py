"""The UPI job end to end through the real CLI: 200k disordered events → DuckDB = oracle."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from upi_events import events, oracle

from stateful_runtime.connectors.eventlog import EventLog
from stateful_runtime.runtime.session import JIT_ENV
from tests.helpers import append_lines, srt

pytestmark = pytest.mark.slow


def test_200k_events_available_now_equal_oracle(upi, srt_env):
    lines = list(
        events(200_000, merchants=40, rate_per_s=500, disorder_ms=4_500, bad_every=20_011, seed=11)
    )
    append_lines(upi.log_dir, lines)

    # The run's size chooses its JIT (the tests' environment sets one: not here).
    sized = {k: v for k, v in srt_env.items() if k != JIT_ENV}
    result = srt(upi.run_args("--available-now"), sized)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "(a bounded run of 200,000 records: its JVM compiles with C1 only" in result.stdout
    assert "upi-counts batch 0" in result.stdout
    assert "upi_counts in" in result.stdout  # the final summary table

    expected = oracle(lines)
    assert upi.table() == expected
    # The batch that reads the last records moves the watermark to the newest event time less
    # the bound (every partition read to the run's end counts as idle): one batch without data
    # then fires the rest, not two.
    batches = re.findall(
        r"upi-counts batch (\d+) \| rows ([\d,]+) .*?\| watermark (\S+)", result.stdout
    )
    empty = [int(b) for b, rows, _ in batches if rows == "0"]
    assert empty == [len(batches) - 1], batches
    bad = [
        line
        for line in lines
        if line.startswith(b"{not") or b'"ten"' in line or b'"amount_paise"' not in line
    ]
    newest = max(json.loads(line)["ts_ms"] for line in lines if line not in bad)
    final = datetime.fromtimestamp((newest - 5_000) / 1000, UTC)
    assert batches[-1][2] == final.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    # Every bad record is in the dead-letter topic, once, with its reason and origin.
    reader = EventLog(upi.log_dir).reader("upi-payments-dlq")
    dead = [r for p, end in reader.end_offsets().items() for r in reader.read(p, 0, end)]
    assert sorted(r.value for r in dead) == sorted(bad)
    assert f"dead letters: {len(bad):,} in topic upi-payments-dlq" in result.stdout
    assert all(r.headers["error"] and r.headers["source.topic"] == "upi-payments" for r in dead)

    # A second run finds nothing new and changes nothing.
    again = srt(upi.run_args("--available-now"), srt_env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert upi.table() == expected
    status = json.loads(srt(["status", "upi-per-minute", "--json"], srt_env).stdout)[0]
    assert status["state"] == "FINISHED"
    assert status["health"]["upi-counts"]["late_rows_dropped_this_run"] == 0
