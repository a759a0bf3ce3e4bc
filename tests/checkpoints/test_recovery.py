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


def test_an_unfinished_write_of_a_batch_log_is_removed_before_a_start(tmp_path):
    """A kill while Spark wrote ``offsets/0`` leaves its temporary file, and Spark 4.3 refuses
    to plan a query's first batch with one there (STATE_STORE_CHECKPOINT_LOCATION_NOT_EMPTY):
    the start removes it, and the logs' real entries stay."""
    from stateful_runtime.checkpoints.layout import CheckpointLayout, claim
    from stateful_runtime.checkpoints.recovery import recover

    ckpt = tmp_path / "ck"
    claim(ckpt, "job", ["first", "second"])
    first = CheckpointLayout(ckpt).query("first")
    first.offset_log.mkdir(parents=True)
    (first.offset_log / ".0.9777aba6.tmp").write_text("v1\n")
    second = _log(ckpt / "second", [(0, 0), (1, 60_000)])
    (second.offset_log / ".2.0f0f.tmp").write_text("v1\n")

    rec = recover(ckpt, ["first", "second"])
    assert not list(first.offset_log.iterdir())
    assert sorted(p.name for p in second.offset_log.iterdir()) == ["0", "1"]
    said = " ".join(rec.notes)
    assert (
        "query first: removed 1 unfinished write(s) of its batch logs (offsets/.0.9777aba6.tmp"
        in said
    )
    assert (
        "query second: removed 1 unfinished write(s) of its batch logs (offsets/.2.0f0f.tmp" in said
    )
