"""Offset-range planning shared by the offset-addressed sources (event log, Kafka).

Offsets are ``{"<partition key>": <next offset>}``: the log source's keys are partition numbers,
Kafka's are ``"<topic>:<partition>"``. Both plan a micro-batch the same way: cap the records of
the batch (shared in proportion to each partition's backlog) and cut each partition's range
into splits of bounded size, one Spark task each.
"""

from __future__ import annotations

from collections.abc import Mapping


def limit_offsets(
    start: Mapping[str, int], ends: Mapping[str, int], max_rows: int
) -> dict[str, int]:
    """Advance each partition from ``start`` toward ``ends`` by at most ``max_rows`` in total.

    The budget is shared in proportion to each partition's backlog (as Spark's Kafka source
    does), so partitions holding the same span of event time stay aligned in event time: an
    even split would let a short partition run ahead, push the watermark past the others and
    make their records late.
    """
    backlog = {p: ends[p] - start.get(p, 0) for p in ends if ends[p] > start.get(p, 0)}
    total = sum(backlog.values())
    if total <= max_rows:
        return dict(ends)
    out = {p: start.get(p, 0) for p in ends}
    out.update(start)
    granted = 0
    for p, n in backlog.items():
        take = n * max_rows // total
        out[p] = start.get(p, 0) + take
        granted += take
    # Rounding leftovers go to the largest backlogs, at least one record overall.
    for p in sorted(backlog, key=lambda q: -backlog[q]):
        if granted >= max(1, max_rows):
            break
        if out[p] < ends[p]:
            out[p] += 1
            granted += 1
    return out


# The first micro-batch a reader plans reads at most this many records: it pays the run's
# one-off costs (cold JVM code, Python workers, state-store opens) on little data, so the first
# commit (a new job's first output, a restart's first progress) comes seconds sooner.
FIRST_BATCH_RECORDS = 20_000


class BatchCap:
    """The record cap of one reader's micro-batches: :data:`FIRST_BATCH_RECORDS` for its
    first batch with data, then ``max_rows`` (None: everything available)."""

    def __init__(self) -> None:
        self.first = True

    def limit(
        self, start: Mapping[str, int], ends: Mapping[str, int], max_rows: int | None
    ) -> dict[str, int]:
        """The batch's end offsets: from ``start`` toward ``ends`` within the cap. A
        partition whose listed end is behind its start stays where it is: a batch never
        moves an offset back (the next batch would start before what it already read)."""
        ends = {p: max(v, start.get(p, v)) for p, v in ends.items()}
        cap = max_rows
        if self.first:
            cap = FIRST_BATCH_RECORDS if cap is None else min(cap, FIRST_BATCH_RECORDS)
        out = {**start, **ends} if cap is None else limit_offsets(start, ends, cap)
        if any(v > start.get(p, 0) for p, v in out.items()):
            self.first = False
        return out


def split_ranges(
    start: Mapping[str, int], end: Mapping[str, int], max_split: int
) -> list[tuple[str, int, int]]:
    """``(partition key, lo, hi)`` ranges covering ``start → end``, each at most ``max_split``
    offsets, so one busy partition still spreads over cores."""
    out = []
    for p, stop in end.items():
        lo = start.get(p, 0)
        while lo < stop:
            hi = min(stop, lo + max_split)
            out.append((p, lo, hi))
            lo = hi
    return out
