"""A source's rejected records published through the dead-letter protocol while its batches are
planned again with other boundaries: the model both sinks' tests drive.

The source has partitions of ``length`` records, some rejected. A job plans batches of ``cap``
records per partition from its last committed offsets; each batch stages its splits (as the
Spark tasks do), commits, and publishes (as the runner does). Between batches it may be killed
before committing (its staged splits stay behind), crash between publishing and deleting the
staged files (they are staged again), or restart from an older batch (a fallback or a restore
from an older savepoint), after which the same records are planned again with another cap. A
rewind (``srt checkpoint rewind``) restarts from an older batch under a stricter judgement: the
replay rejects records the first run accepted (``Source.stricter``), also below the topic's
mark. Whatever the sequence, the topic must hold every rejected record of the committed ranges
once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from stateful_runtime.connectors import dead_letters
from stateful_runtime.connectors.base import ERROR, OFFSET, PARTITION, RAW

# (op, argument): ("batch", cap), ("killed", cap), ("crash_after_publish", cap),
# ("restore", how many committed batches back), ("rewind", how many committed batches back)
Step = tuple[str, int]


@dataclass
class Source:
    partitions: int
    length: int
    bad: dict[int, set[int]]  # partition -> rejected offsets
    key: Callable[[int], str | int] = str  # the staging key of a partition
    # partition -> offsets accepted until a rewind, rejected by its replay and after
    stricter: dict[int, set[int]] = field(default_factory=dict)

    def split(self, partition: int, start: int, end: int) -> pa.Table:
        """What a Spark task decodes from ``[start, end)``: rejected rows carry an error."""
        offsets = list(range(start, end))
        return pa.table(
            {
                RAW: [f"p{partition}o{o}".encode() for o in offsets],
                ERROR: ["bad record" if o in self.bad[partition] else None for o in offsets],
                PARTITION: [partition] * len(offsets),
                OFFSET: offsets,
            }
        )


@dataclass
class Job:
    source: Source
    staging: Path
    sink: Any
    committed: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, int]] = field(default_factory=list)
    reached: dict[str, int] = field(default_factory=dict)  # the furthest committed offsets
    rewinds: int = 0
    rejected: set[tuple[int, int]] = field(default_factory=set)  # judged bad in a committed batch

    def _stage(self, cap: int) -> dict[str, int]:
        ends = {}
        for p in range(self.source.partitions):
            k = str(self.source.key(p))
            start = self.committed.get(k, 0)
            end = min(start + cap, self.source.length)
            if end > start:
                dead_letters.stage(
                    str(self.staging),
                    self.source.key(p),
                    start,
                    end,
                    self.source.split(p, start, end),
                )
            ends[k] = end
        return ends

    def _commit(self, ends: dict[str, int]) -> None:
        for p in range(self.source.partitions):
            k = str(self.source.key(p))
            start, end = self.committed.get(k, 0), ends.get(k, 0)
            self.rejected |= {(p, o) for o in self.source.bad[p] if start <= o < end}
        self.committed = ends
        self.history.append(ends)
        for k, v in ends.items():
            self.reached[k] = max(self.reached.get(k, 0), v)
        dead_letters.publish(str(self.staging), self.committed, self.sink)

    def step(self, op: str, arg: int) -> None:
        if op == "batch":
            self._commit(self._stage(arg))
        elif op == "killed":
            self._stage(arg)  # staged, never committed: a later plan covers the range again
        elif op == "crash_after_publish":
            ends = self._stage(arg)
            before = {f.name: f.read_bytes() for f in self.staging.glob("*.arrow")}
            self._commit(ends)
            for name, data in before.items():  # the files the crash left behind
                (self.staging / name).write_bytes(data)
            dead_letters.publish(str(self.staging), self.committed, self.sink)
        elif op == "restore" and self.history:
            back = min(arg, len(self.history))
            self.history = self.history[:-back]
            self.committed = dict(self.history[-1]) if self.history else {}
        elif op == "rewind" and self.history:
            back = min(arg, len(self.history))
            history = self.history[:-back]
            committed = dict(history[-1]) if history else {}
            starts = {
                str(self.source.key(p)): committed.get(str(self.source.key(p)), 0)
                for p in range(self.source.partitions)
            }
            self.rewinds += 1
            dead_letters.note_replay(str(self.staging), starts, self.sink, f"rewind-{self.rewinds}")
            self.history, self.committed = history, committed
            for p in range(self.source.partitions):
                start = starts[str(self.source.key(p))]
                # From the replay's start on the stricter judgement holds; before it, nothing
                # is read again.
                stricter = self.source.stricter.get(p, set())
                self.source.bad[p] |= {o for o in stricter if o >= start}
                self.source.stricter[p] = {o for o in stricter if o < start}
        dead_letters.publish(str(self.staging), self.committed, self.sink)  # at every start

    def expected(self) -> list[tuple[int, int]]:
        """Every record rejected by a committed batch (a record a rewind's replay rejects
        counts once read again)."""
        return sorted(self.rejected)


def run(job: Job, steps: Sequence[Step], topic: Callable[[], list[tuple[int, int]]]) -> None:
    """Drive ``steps``, then check the topic's (source partition, source offset) of every dead
    letter against the rejected records of every range ever committed: each exactly once."""
    for op, arg in steps:
        job.step(op, arg)
    got = topic()
    twice = sorted(k for k, n in Counter(got).items() if n > 1)
    expected = job.expected()
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    assert not (twice or missing or extra), (
        f"steps {list(steps)}: {len(missing)} missing {missing[:5]}, {len(twice)} twice "
        f"{twice[:5]}, {len(extra)} never committed {extra[:5]}"
    )
