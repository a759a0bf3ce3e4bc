"""Finding a poisoned watermark in a query's offset log (`srt checkpoint rewind`); the rewind
itself runs end to end in tests/faults/test_event_time.py."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.recovery import WatermarkBounds

HOUR = 3_600_000
T0 = 1_795_000_000_000


def _log(root: Path, batches: list[tuple[int, int]]) -> QueryLayout:
    (root / "offsets").mkdir(parents=True, exist_ok=True)
    for b, (ts, wm) in enumerate(batches):
        meta = {"batchWatermarkMs": wm, "batchTimestampMs": ts, "conf": {}}
        (root / "offsets" / str(b)).write_text(f'v1\n{json.dumps(meta)}\n{{"0":{b}}}\n')
    return QueryLayout(root)


def test_the_first_watermark_beyond_processing_time_is_found(tmp_path):
    q = _log(
        tmp_path,
        [
            (T0, 0),
            (T0 + 1000, T0 - 5000),
            (T0 + 2000, 4_102_444_795_000),
            (T0 + 3000, 4_102_444_795_000),
        ],
    )
    found = WatermarkBounds(HOUR, None).broken(q)
    assert found is not None and found[0] == 2
    assert "2099-12-31T23:59:55Z is 73.1 years ahead of its processing time" in found[1]
    assert WatermarkBounds(None, None).broken(q) is None  # every bound off: nothing to find


def test_a_watermark_jump_is_found_only_with_the_watermark_bound(tmp_path):
    # A replay of 2019: the watermark lies years behind processing time and moves steadily,
    # then jumps a day.
    old = T0 - 7 * 365 * 24 * HOUR
    q = _log(tmp_path, [(T0, 0), (T0, old), (T0, old + HOUR), (T0, old + 25 * HOUR)])
    assert WatermarkBounds(HOUR, None).broken(q) is None
    found = WatermarkBounds(HOUR, 2 * HOUR).broken(q)
    assert (
        found is not None and found[0] == 3 and "jumped 1 day, 0:00:00 past batch 2's" in found[1]
    )
    assert "max_ahead_of_watermark 2:00:00" in found[1]


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(0, 10 * HOUR), min_size=1, max_size=12),
    st.integers(0, 11),
)
def test_a_log_whose_watermarks_trail_their_batches_is_never_poisoned(tmp_path_factory, lags, at):
    root = tmp_path_factory.mktemp("q")
    batches = [(T0 + i * 1000, T0 + i * 1000 - lag) for i, lag in enumerate(lags)]
    assert WatermarkBounds(HOUR, None).broken(_log(root, batches)) is None
    if at < len(batches):
        batches[at] = (batches[at][0], batches[at][0] + HOUR + 1)
        assert WatermarkBounds(HOUR, None).broken(_log(root, batches))[0] == at  # type: ignore[index]
