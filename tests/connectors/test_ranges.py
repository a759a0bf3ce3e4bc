"""Micro-batch planning shared by the offset-addressed sources (connectors/ranges.py)."""

from __future__ import annotations

from stateful_runtime.connectors.ranges import FIRST_BATCH_RECORDS, BatchCap


def _size(start, out):
    return sum(out[p] - start.get(p, 0) for p in out)


def test_the_first_batch_with_data_is_small_then_the_configured_cap_applies():
    cap = BatchCap()
    start, ends = {"0": 0, "1": 0}, {"0": 10**6, "1": 10**6}
    # Nothing to read: no batch, the first one is still to come.
    assert cap.limit(start, dict(start), 500_000) == start
    first = cap.limit(start, ends, 500_000)
    assert _size(start, first) == FIRST_BATCH_RECORDS
    assert first["0"] == first["1"]  # shared in proportion to the backlog
    second = cap.limit(first, ends, 500_000)
    assert _size(first, second) == 500_000
    assert cap.limit(second, ends, None) == ends  # no cap: everything available


def test_a_cap_below_the_first_batch_size_and_an_uncapped_reader():
    small = BatchCap()
    assert _size({}, small.limit({}, {"0": 10**6}, 1_000)) == 1_000
    uncapped = BatchCap()
    assert _size({}, uncapped.limit({}, {"0": 10**6}, None)) == FIRST_BATCH_RECORDS
    assert uncapped.limit({"0": FIRST_BATCH_RECORDS}, {"0": 10**6}, None) == {"0": 10**6}


def test_a_listed_end_behind_the_start_never_moves_an_offset_back():
    """A broker can list an end behind what the job read (-1 from a partition whose new
    leader has no offsets yet): the batch leaves that partition where it is, capped or not,
    and the others move on."""
    start = {"0": 5_000, "1": 7_000}
    for max_rows in (None, 100, 10**6):
        cap = BatchCap()
        cap.first = False
        out = cap.limit(start, {"0": -1, "1": 8_000}, max_rows)
        assert out["0"] == 5_000 and 7_000 < out["1"] <= 8_000, max_rows
