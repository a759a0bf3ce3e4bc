"""A source's event-time policy (issue 23): the bounds a batch's read tasks apply, computed from
the batch's processing time and watermark as Spark logged them, and the decoder's verdict on
either side of each bound, the same on its fast and its per-record paths (Hypothesis)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime.connectors import event_time
from stateful_runtime.connectors.formats.json import TimeBounds, decode_json, to_struct
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.instants import iso_ms
from stateful_runtime.watermarks import EventTimePolicy, WatermarkStrategy

SCHEMA = to_struct({"k": str, "ts": int})
NOW = 1_795_000_000_000  # a batch's processing time (2026-11-18)
HOUR = 3_600_000
WM = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=5)).with_timestamp_field("ts")


def _opts(watermark: WatermarkStrategy = WM, checkpoint: str | None = None) -> dict[str, str]:
    return {"event_time_field": "ts", **event_time.options(watermark, checkpoint)}


def _line(ts: int | float | str, pad: bool = False) -> bytes:
    text = json.dumps({"k": "a", "ts": ts}).encode()
    # A space before the object sends a record to the per-record path (the fast path's screen
    # takes only records that start with '{').
    return b" " + text if pad else text


def _errors(lines: list[bytes], bounds: TimeBounds | None, unit: str = "ms") -> list:
    schema = SCHEMA if unit != "timestamp" else to_struct({"k": str, "ts": str})
    table = decode_json(lines, schema, event_time=("ts", unit), bounds=bounds)
    return table.column("_error").to_pylist()


def test_default_policy_refuses_before_the_epoch_and_an_hour_ahead_of_the_batch():
    b = event_time.bounds(_opts(), NOW, None)
    assert b is not None
    assert (b.floor_ms, b.ceiling_ms) == (0, NOW + HOUR)
    errors = _errors([_line(-1), _line(0), _line(NOW + HOUR), _line(NOW + HOUR + 1)], b)
    assert errors[1:3] == [None, None]
    assert errors[0] == (
        "event time 'ts' 1969-12-31T23:59:59.999Z (-1 ms) is before the floor 1970-01-01T00:00:00Z"
    )
    assert errors[3] == (
        f"event time 'ts' {iso_ms(NOW + HOUR + 1)} ({NOW + HOUR + 1} ms) is 1:00:00.001000 ahead "
        f"of the batch's processing time {iso_ms(NOW)}; max_ahead_of_processing_time 1:00:00"
    )


def test_the_year_2100_reads_in_years():
    b = event_time.bounds(_opts(), NOW, None)
    [error] = _errors([_line(4_102_444_800_000)], b)
    assert error.startswith("event time 'ts' 2100-01-01T00:00:00Z (4102444800000 ms) is 73.")
    assert "years ahead of the batch's processing time" in error


def test_the_watermark_bound_is_off_by_default_and_not_applied_before_a_watermark():
    assert event_time.bounds(_opts(), NOW, NOW - 10 * HOUR).ceiling_ms == NOW + HOUR  # type: ignore[union-attr]
    wm = WM.with_event_time_policy(max_ahead_of_watermark=timedelta(minutes=10))
    # The first batch of a query has watermark 0 (a replay of history after an outage): only
    # the processing-time bound applies.
    assert event_time.bounds(_opts(wm), NOW, 0).ceiling_ms == NOW + HOUR  # type: ignore[union-attr]
    b = event_time.bounds(_opts(wm), NOW, NOW - 10 * HOUR)
    assert b is not None and b.ceiling_ms == NOW - 10 * HOUR + 600_000
    [error] = _errors([_line(NOW)], b)
    assert "ahead of the watermark" in error and "max_ahead_of_watermark 0:10:00" in error


def test_every_bound_can_be_switched_off():
    off = WM.with_event_time_policy(
        floor=None,
        max_ahead_of_processing_time=None,
        max_ahead_of_watermark=None,
        max_ahead_of_stream=None,
    )
    assert event_time.bounds(_opts(off), NOW, NOW) is None
    assert _errors([_line(-5), _line(4_102_444_800_000)], None) == [None, None]


def test_policy_settings_are_checked():
    with pytest.raises(ConfigError, match="non-negative"):
        EventTimePolicy(max_ahead_of_processing_time=timedelta(seconds=-1))
    with pytest.raises(ConfigError, match="datetime"):
        EventTimePolicy(floor="2020-01-01")  # type: ignore[arg-type]
    naive = EventTimePolicy(floor=datetime(2020, 1, 1))
    assert naive.floor == datetime(2020, 1, 1, tzinfo=UTC)


def _offset_log(query: Path, batches: dict[int, tuple[int, int]]) -> None:
    (query / "offsets").mkdir(parents=True, exist_ok=True)
    for b, (ts, wm) in batches.items():
        meta = {"batchWatermarkMs": wm, "batchTimestampMs": ts, "conf": {}}
        (query / "offsets" / str(b)).write_text(f'v1\n{json.dumps(meta)}\n{{"0":{b}}}\n')


def test_a_batch_is_judged_by_its_logged_processing_time_so_a_replay_judges_alike(tmp_path):
    """Two days after batch 1 was planned, its re-run gets the bounds of its first run (a
    clock read in the read tasks, or on the driver, would accept what the first run refused)."""
    two_days_ago = int(datetime.now(UTC).timestamp() * 1000) - 48 * HOUR
    _offset_log(tmp_path, {0: (two_days_ago - 5000, 0), 1: (two_days_ago, two_days_ago - 10)})
    b = event_time.batch_bounds(_opts(checkpoint=str(tmp_path)))
    assert b is not None and b.ceiling_ms == two_days_ago + HOUR
    assert b == event_time.batch_bounds(_opts(checkpoint=str(tmp_path)))


def test_alignment_reads_a_refused_event_time_as_none():
    keep = event_time.plan_filter(_opts())
    now = int(datetime.now(UTC).timestamp() * 1000)
    assert keep(now) == now and keep(None) is None
    assert keep(-1) is None and keep(4_102_444_800_000) is None


# -- properties --------------------------------------------------------------------------------

bounds_st = st.builds(
    lambda floor, ref, ahead: TimeBounds(
        floor_ms=floor,
        floor_why=f"the floor {iso_ms(floor)}" if floor is not None else "",
        ceiling_ms=None if ahead is None else ref + ahead,
        ceiling_from_ms=ref,
        ceiling_from="the batch's processing time",
        ceiling_setting=f"max_ahead_of_processing_time {timedelta(milliseconds=ahead or 0)}",
    ),
    st.none() | st.integers(-(10**13), 10**13),
    st.integers(0, 4 * 10**12),
    st.none() | st.integers(0, 10**11),
)
times_st = (
    st.integers(-(10**13), 10**13)
    | st.sampled_from([0, -1, 1, 4_102_444_800_000, 10**16, 2**63 - 1, -(2**63)])
    | st.integers(-(2**63), 2**63 - 1)
)
OUT_OF_RANGE = "is outside 0001-01-02..9999-01-01"


def _outside(b: TimeBounds, ms: float) -> bool:
    return (b.floor_ms is not None and ms < b.floor_ms) or (
        b.ceiling_ms is not None and ms > b.ceiling_ms
    )


@settings(max_examples=200, deadline=None)
@given(bounds_st, st.lists(times_st, min_size=1, max_size=30))
def test_any_event_time_outside_is_refused_with_its_bound_and_any_inside_passes(b, times):
    fast = _errors([_line(t) for t in times], b)
    slow = _errors([_line(t, pad=True) for t in times], b)
    assert fast == slow  # the fast and the per-record paths agree, record for record
    for t, error in zip(times, fast, strict=True):
        if not -62_135_510_400_000 <= t <= 253_370_764_800_000:  # the decoder's range first
            assert error.endswith(OUT_OF_RANGE)
        elif _outside(b, t):
            assert error == b.reason("ts", t, f"{t} ms")
            assert ("before the floor" in error) == (b.floor_ms is not None and t < b.floor_ms)
        else:
            assert error is None


@settings(max_examples=100, deadline=None)
@given(bounds_st, st.lists(st.integers(-(10**10), 10**10), min_size=1, max_size=20))
def test_seconds_and_timestamp_strings_are_judged_in_ms_alike(b, seconds):
    in_s = _errors([_line(s) for s in seconds], b, unit="s")
    strings = [
        (datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=s)).isoformat().replace("+00:00", "Z")
        for s in seconds
    ]
    as_text = _errors([_line(s) for s in strings], b, unit="timestamp")
    for s, e1, e2 in zip(seconds, in_s, as_text, strict=True):
        assert (e1 is None) == (e2 is None) == (not _outside(b, s * 1000))
        if e1 is not None:
            assert e1 == b.reason("ts", s * 1000, f"{s} s")


@settings(max_examples=50, deadline=None)
@given(st.floats(-1e13, 1e13, allow_nan=False), bounds_st)
def test_a_double_event_time_is_judged_by_its_value(t, b):
    table = decode_json(
        [_line(t)], to_struct({"k": str, "ts": float}), event_time=("ts", "ms"), bounds=b
    )
    [error] = table.column("_error").to_pylist()
    assert (error is not None) == _outside(b, t)
    assert not math.isnan(t)


# -- outliers relative to the stream (issue 41) ---------------------------------------------------

DAY = 24 * HOUR
STREAM = TimeBounds(stream_ms=HOUR)  # the default policy's stream bound, no watermark yet


def _judge(
    times: list[int], b: TimeBounds = STREAM, chunk: int = 7, after: list[int] | None = None
) -> list[str | None]:
    """The errors a split of ``times`` (decoded ``chunk`` records a table, as a read task's
    tables) gets, outliers included."""
    lines = [_line(t) for t in times]
    tables = [
        decode_json(lines[i : i + chunk], SCHEMA, event_time=("ts", "ms"), bounds=b)
        for i in range(0, len(lines), chunk)
    ]
    asked = []

    def more() -> list[int]:
        asked.append(True)
        return after or []

    ms = event_time.event_ms(tables, "ts", "ms")
    out = event_time.refuse_outliers(
        tables, ms, "ts", b, lambda i: pa.array(lines[i * chunk : (i + 1) * chunk]), more
    )
    errors = [e for t in out for e in t.column("_error").to_pylist()]
    # The refused records' event times are gone for what follows (the split's newest).
    assert [math.isnan(t) for t in ms] == [e is not None for e in errors]
    errors = [e for t in out for e in t.column("_error").to_pylist()]
    raws = [r for t in out for r in t.column("_raw").to_pylist()]
    assert [r for r, e in zip(raws, errors, strict=True) if e is not None] == [
        line for line, e in zip(lines, errors, strict=True) if e is not None
    ]
    return errors


def test_a_record_far_ahead_of_the_stream_and_the_watermark_is_refused_with_why():
    times = [NOW + i * 1000 for i in range(40)]
    times[20] = NOW + 60 * DAY
    errors = _judge(times, TimeBounds(stream_ms=HOUR, watermark_ms=NOW - 5000))
    assert [i for i, e in enumerate(errors) if e] == [20]
    assert errors[20] == (
        f"event time 'ts' {iso_ms(NOW + 60 * DAY)} is an outlier: 60.0 days ahead of the "
        f"records after it in its partition (median of the next 8 {iso_ms(NOW + 24_500)}) and "
        f"60.0 days ahead of the watermark {iso_ms(NOW - 5000)}; max_ahead_of_stream 1:00:00"
    )


def test_a_stream_that_moves_on_together_is_not_refused():
    resumed = [NOW + i for i in range(30)] + [NOW + 3 * DAY + i for i in range(30)]
    assert not any(_judge(resumed))
    # A sparse topic's next record hours later, last of its batch: nothing says it is wrong.
    assert not any(_judge([NOW + i for i in range(30)] + [NOW + 5 * HOUR]))
    # A whole batch far ahead of the watermark (a catch-up after days of silence).
    later = [NOW + 5 * DAY + i * 10 for i in range(50)]
    assert not any(_judge(later, TimeBounds(stream_ms=HOUR, watermark_ms=NOW)))
    # Within the bound of the watermark, nothing is judged: the records after it went back.
    near = [NOW + i for i in range(20)]
    near[5] = NOW + HOUR - 1
    assert not any(_judge(near, TimeBounds(stream_ms=HOUR, watermark_ms=NOW)))


def test_a_split_reads_what_follows_it_in_its_batch():
    times = [NOW + i for i in range(20)]
    times[-1] = NOW + 60 * DAY
    assert not any(_judge(times))  # nothing after it: not judged
    refused = _judge(times, after=[NOW + 20 + i for i in range(8)])
    assert [i for i, e in enumerate(refused) if e] == [19]
    # Records after the split that moved on with it.
    assert not any(_judge(times, after=[NOW + 60 * DAY + i for i in range(1, 9)]))
    assert _judge([NOW + 60 * DAY]) == [None]
    assert event_time.stream_outliers(np.array([]), np.array([]), STREAM).size == 0


def test_the_stream_bound_can_be_set_and_switched_off():
    times = [NOW + i for i in range(10)] + [NOW + 2 * HOUR] + [NOW + 10 + i for i in range(10)]
    assert _judge(times)[10] is not None
    assert not any(_judge(times, TimeBounds(stream_ms=3 * HOUR)))
    assert not any(_judge(times, TimeBounds()))
    opts = _opts(WM.with_event_time_policy(max_ahead_of_stream=timedelta(minutes=5)))
    b = event_time.bounds(opts, NOW, NOW - 1)
    assert b is not None and (b.stream_ms, b.watermark_ms) == (300_000, NOW - 1)
    with pytest.raises(ConfigError, match="positive"):
        EventTimePolicy(max_ahead_of_stream=timedelta(0))


def test_a_range_cut_right_after_a_jump_reaches_past_it():
    base = [NOW + i for i in range(30)]
    times = {"0": [*base, NOW + 60 * DAY, *(NOW + 31 + i for i in range(20))]}

    def reach(start: int, end: int, listed: int) -> int:
        def time_at(k: str, o: int) -> int | None:
            return times[k][o] if 0 <= o < len(times[k]) else None

        out = event_time.reach_past_jump({"0": start}, {"0": end}, {"0": listed}, time_at, HOUR)
        return out["0"]

    assert reach(0, 31, 51) == 31 + event_time.STREAM_CONTEXT  # cut right after the jump
    assert reach(0, 31, 31) == 31  # the partition's end: nothing to reach
    assert reach(0, 30, 51) == 30 and reach(0, 40, 51) == 40  # no jump at the cut
    assert reach(30, 31, 51) == 31  # the jump alone in the range: nothing before it to compare


segments_st = st.lists(
    st.tuples(
        st.integers(1, 40),  # records in the segment
        st.integers(2 * HOUR, 30 * DAY),  # the pause before it
    ),
    min_size=1,
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(
    segments_st,
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(HOUR + 1, 90 * DAY)), max_size=6),
    st.integers(0, 10**9),
    st.integers(1, 9),
)
def test_outliers_injected_into_any_stream_are_refused_and_nothing_else(
    segments, injected, seed, chunk
):
    """Streams of segments (out of order within 5 s, after pauses of hours to weeks, a single
    record after a pause too) with records from far ahead injected, never two in a row nor
    last: each outlier refused, every other record kept, with any chunking of the split."""
    rng = np.random.default_rng(seed)
    times: list[int] = []
    t = NOW
    for n, pause in segments:
        t += pause
        steps = np.cumsum(rng.integers(0, 2000, n))
        times += [int(t + s - rng.integers(0, 5000)) for s in steps]
        t += int(steps[-1])
    top = max(times)
    at = sorted({p % len(times) for p, _ in injected})
    at = [p for i, p in enumerate(at) if i == 0 or p > at[i - 1] + 1]  # isolated, never last
    stream = list(times)
    for p, (_, ahead) in reversed(list(zip(at, injected, strict=False))):
        stream.insert(p, top + ahead)
    outliers = [i for i, v in enumerate(stream) if v > top]
    errors = _judge(stream, TimeBounds(stream_ms=HOUR, watermark_ms=NOW), chunk=chunk)
    assert [i for i, e in enumerate(errors) if e] == outliers
    assert all("is an outlier" in errors[i] for i in outliers)  # type: ignore[operator]
