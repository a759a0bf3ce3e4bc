"""One watermark per partition (``runtime/input_watermarks.py``, issue 41): which partitions
hold an input's watermark back, and when one stops holding it (idleness, counted in the
batches' logged processing times). The Spark side is tested on Apache Kafka
(``tests/connectors/kafka/test_kafka_watermarks.py``)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stateful_runtime.connectors.accounting import BatchCounts, SplitReport
from stateful_runtime.runtime.input_watermarks import fold, holding

T = 1_767_225_600_000  # a batch's processing time


def test_the_slowest_active_partition_holds_the_watermark():
    parts: dict[int, tuple[int, int]] = {}
    fold(parts, {0: 1_000, 1: 600_000}, T)
    assert holding(parts, T, None) == (1_000, 0)
    fold(parts, {0: 2_000}, T + 500)  # partition 1 has nothing in this batch
    assert parts == {0: (2_000, T + 500), 1: (600_000, T)}
    # Never idle (Kafka without idleness): partition 0 still holds.
    assert holding(parts, T + 500, None) == (2_000, 0)
    # A partition's newest event time never goes back.
    fold(parts, {0: 1_500}, T + 1_000)
    assert parts[0] == (2_000, T + 1_000)


def test_a_partition_without_records_for_the_idleness_stops_holding():
    parts: dict[int, tuple[int, int]] = {}
    fold(parts, {0: 1_000, 1: 50_000}, T)
    fold(parts, {1: 60_000}, T + 20_000)
    assert holding(parts, T + 20_000, 30_000) == (1_000, 0)  # silent 20 s of 30
    fold(parts, {1: 70_000}, T + 40_000)
    assert holding(parts, T + 40_000, 30_000) == (70_000, None)  # silent 40 s: idle
    # The event log and bounded runs: idle at once.
    assert holding(parts, T + 40_000, 0) == (70_000, None)
    # All idle: the newest (the drain's last watermark, Spark's own).
    assert holding(parts, T + 100_000, 0) == (70_000, None)
    # Back: it holds again from its newest.
    fold(parts, {0: 5_000}, T + 100_000)
    # Back, behind the other: it is followed (the watermark itself never goes back).
    assert holding(parts, T + 100_000, 0) == (5_000, 0)


def test_a_partition_read_to_the_end_of_a_bounded_run_is_idle_after_that_batch():
    parts: dict[int, tuple[int, int]] = {}
    fold(parts, {0: 1_000, 1: 50_000, 2: 20_000}, T)
    # Partitions 0 and 2 reached the run's end in this batch, partition 1 did not: it holds.
    assert holding(parts, T, 0, ended={0, 2}) == (50_000, None)
    assert holding(parts, T, 0, ended={1}) == (1_000, 0)
    # The batch that reads the last records of every partition: the newest of all.
    assert holding(parts, T, 0, ended={0, 1, 2}) == (50_000, None)
    assert holding(parts, T, 0) == (1_000, 0)


@given(
    st.lists(
        st.tuples(st.integers(0, 3), st.none() | st.integers(0, 10**12), st.booleans()),
        max_size=12,
    )
)
def test_a_batch_keeps_each_partitions_newest_time_over_its_splits(splits):
    counts = BatchCounts()
    for partition, ms, ends_run in splits:
        counts.add(SplitReport(5, 1, partition, ms, ends_run))
    assert (counts.records, counts.dead_letters) == (5 * len(splits), len(splits))
    timed = [(p, ms, e) for p, ms, e in splits if ms is not None]
    expected = {
        p: (max(ms for q, ms, _ in timed if q == p), any(e for q, _, e in timed if q == p))
        for p in {p for p, _, _ in timed}
    }
    assert counts.partition_times == expected


@given(
    st.lists(
        st.dictionaries(st.integers(0, 15), st.integers(0, 10**12), max_size=16),
        min_size=1,
        max_size=20,
    ),
    st.none() | st.integers(0, 5_000),
)
def test_the_followed_time_is_the_minimum_over_active_partitions(batches, idle):
    parts: dict[int, tuple[int, int]] = {}
    newest: dict[int, int] = {}
    for i, observed in enumerate(batches):
        at = T + i * 1_000
        fold(parts, observed, at)
        for k, t in observed.items():
            newest[k] = max(t, newest.get(k, t))
        if not parts:
            continue
        top, holder = holding(parts, at, idle)
        active = [newest[k] for k, (_, seen) in parts.items() if idle is None or at - seen <= idle]
        assert top == (min(active) if active else max(newest.values()))
        assert holder is None or (parts[holder][0] == top and top < max(newest.values()))
