"""The event log against a model (Hypothesis state machine): any sequence of appends, idempotent
appends, writer reopens and reads keeps offsets dense, records byte-exact, end offsets right and
producer sequences deduplicated."""

from __future__ import annotations

import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from stateful_runtime.connectors.eventlog import EventLog, Record, partition_for

PARTITIONS = 3

records = st.lists(
    st.builds(
        Record,
        value=st.binary(max_size=24),
        key=st.none() | st.binary(max_size=6),
        timestamp_ms=st.integers(0, 2**62),
        headers=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2),
        partition=st.integers(-1, PARTITIONS - 1),
    ),
    max_size=8,
)


class EventLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="srt-log-prop-")
        self.log = EventLog(self.dir)
        self.log.create_topic("t", PARTITIONS)
        self.writer = self.log.writer("t")
        self.reader = None
        self.model: dict[int, list[Record]] = {p: [] for p in range(PARTITIONS)}
        self.sequences: dict[str, int] = {}

    @initialize()
    def open_reader(self) -> None:
        self.reader = self.log.reader("t")

    def _expect(self, batch: list[Record]) -> None:
        for rec in batch:
            p = (
                rec.partition
                if rec.partition >= 0
                else partition_for(rec.key, rec.value, PARTITIONS)
            )
            self.model[p].append(rec)

    @rule(batch=records)
    def append(self, batch: list[Record]) -> None:
        assert self.writer.append(batch) == len(batch)
        self._expect(batch)

    @rule(batch=records, producer=st.sampled_from(["job/q", "job/r"]), sequence=st.integers(-2, 12))
    def append_idempotent(self, batch: list[Record], producer: str, sequence: int) -> None:
        n = self.writer.append(batch, producer_id=producer, sequence=sequence)
        last = self.sequences.get(producer)
        if last is not None and sequence <= last:
            assert n == 0  # a replayed sequence appends nothing
        else:
            assert n == len(batch)
            self._expect(batch)
            self.sequences[producer] = sequence

    @rule()
    def reopen_writer(self) -> None:
        self.writer.close()
        self.writer = self.log.writer("t")
        for producer, sequence in self.sequences.items():
            assert self.writer.producer_sequence(producer) == sequence

    @precondition(lambda self: self.reader is not None)
    @rule(data=st.data(), partition=st.integers(0, PARTITIONS - 1))
    def read_range(self, data: st.DataObject, partition: int) -> None:
        expected = self.model[partition]
        start = data.draw(st.integers(0, len(expected)))
        end = data.draw(st.integers(start, len(expected)))
        self.reader.catch_up()
        got = list(self.reader.read(partition, start, end))
        assert [r.offset for r in got] == list(range(start, end))  # dense, in order
        for rec, want in zip(got, expected[start:end], strict=True):
            assert rec.partition == partition
            assert (rec.value, rec.key, rec.headers) == (want.value, want.key, want.headers)
            if want.timestamp_ms:
                assert rec.timestamp_ms == want.timestamp_ms
        assert self.reader.read_values(partition, start, end) == [
            r.value for r in expected[start:end]
        ]

    @invariant()
    def end_offsets_count_every_appended_record(self) -> None:
        want = {p: len(recs) for p, recs in self.model.items()}
        assert self.writer.end_offsets() == want
        if self.reader is not None:
            assert self.reader.end_offsets() == want

    def teardown(self) -> None:
        self.writer.close()
        if self.reader is not None:
            self.reader.close()
        shutil.rmtree(self.dir, ignore_errors=True)


EventLogMachine.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestEventLog = EventLogMachine.TestCase
