"""A record a step cannot process, isolated: dead-lettered with the step and the reason while
the rest of its batch goes on, or, where the job's :class:`~stateful_runtime.job.ErrorPolicy`
says so, the job stopped with the record's origin and the command that skips it.

Every step that runs user code in a task (``map`` / ``flat_map``, a keyed process function,
the window operator's functions) holds one :class:`StepGuard` per task; the guard collects the
task's rejects (:class:`~stateful_runtime.connectors.dead_letters.StepRejects`, staged at the
end of the task and published by the job process once the batch commits) and keeps the bound
on how many a step may reject before the job stops instead.

:class:`SkipOperator` is the step ``srt run --skip`` adds right after a source: it passes the
records an operator named (by source partition and offset) to the dead-letter topic.
"""

from __future__ import annotations

import traceback
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime._process import freeze_worker_heap
from stateful_runtime.connectors.dead_letters import StepRejects
from stateful_runtime.exceptions import UserFunctionError
from stateful_runtime.job import FAIL, ErrorPolicy

# The source's partition and offset of a record, carried through every step (no leading
# underscore: Spark's pandas state API renames such columns). Null where unknown.
ORIGIN_PARTITION = "srt_origin_partition"
ORIGIN_OFFSET = "srt_origin_offset"
ORIGIN_COLUMNS = (ORIGIN_PARTITION, ORIGIN_OFFSET)
SKIPPED = "skipped by operator (srt run --skip)"


def describe(exc: BaseException) -> str:
    """An exception as a dead letter's reason: type, message and where it was raised (the
    innermost two frames)."""
    text = f"{type(exc).__name__}: {exc}"
    if len(text) > 500:
        text = text[:500] + "…"
    frames = traceback.extract_tb(exc.__traceback__)[-2:]
    where = " < ".join(f"{Path(f.filename).name}:{f.lineno} in {f.name}" for f in reversed(frames))
    return f"{text} (at {where})" if where else text


def origin(source: str, partition: int | None, offset: int | None) -> str:
    """``<source>:<partition>:<offset>`` as ``srt run --skip`` takes it ("" if unknown)."""
    if partition is None or offset is None:
        return ""
    return f"{source}:{partition}:{offset}"


# What a step's failures mean when it calls a service (map_async, enrich_async), in the
# advice of the bounds' errors.
SERVICE_FAILING = (
    "calls that fail {how} mean the service is down or refusing, not bad records: the job "
    "stops rather than dead-letter the stream, and the batch is replayed when it runs again "
    "(once the service answers)"
)


class StepGuard:
    """One task's treatment of the records one step cannot process.

    Args:
        step: the step's name (as ``srt explain`` shows it).
        source: the name of the source the step's records come from (for messages).
        errors: the job's error policy.
        rejects: where the task's rejects are collected (None: a test without a checkpoint;
            the rejects are kept in :attr:`rejected_records`).
    """

    def __init__(
        self, step: str, source: str, errors: ErrorPolicy, rejects: StepRejects | None
    ) -> None:
        self.step, self.source, self.errors = step, source, errors
        self.rejects = rejects if rejects is not None else StepRejects(None, step)
        self.seen = 0  # records the step was given in this task
        self.rejected = 0
        # What failing this often means, in the advice of the bounds' errors.
        self.failing = "a function that fails {how} is a bug to fix, not bad data"
        self._run = 0  # rejects in a row
        self._last = -2

    def __getstate__(self) -> dict[str, object]:
        state = dict(self.__dict__)
        state.update(seen=0, rejected=0, _run=0, _last=-2)
        return state

    def reject(
        self,
        position: int,
        record: object,
        reason: str,
        partition: int | None = None,
        offset: int | None = None,
        cause: BaseException | None = None,
    ) -> None:
        """Isolate ``record`` (the step's ``position``-th of the task) for ``reason``, or
        raise :class:`~stateful_runtime.exceptions.UserFunctionError` where the policy or the
        bound on rejects in a row says the job must stop (the share of the task's records is
        checked at its end: :meth:`stage`)."""
        where = origin(self.source, partition, offset)
        if self.errors.policy == FAIL:
            raise UserFunctionError(
                self.step, record, reason, origin=where, advice="The job's errors.policy is 'fail'."
            ) from cause
        self._run = self._run + 1 if position == self._last + 1 else 1
        self._last = position
        self.rejected += 1
        if self._run >= self.errors.max_consecutive:
            raise UserFunctionError(
                self.step,
                record,
                reason,
                origin=where,
                advice=(
                    f"The step rejected {self._run} records in a row "
                    f"(errors.max_consecutive={self.errors.max_consecutive}): "
                    f"{self.failing.format(how='for every record')}; nothing was "
                    f"dead-lettered for this batch. Raise the bound with --set "
                    f"errors.max_consecutive=N if these records are bad."
                ),
                skippable=False,
            ) from cause
        self.rejects.add(record, reason, partition, offset)

    @property
    def rejected_records(self) -> list[tuple[bytes, str, int | None, int | None]]:
        """What was rejected so far: (record as JSON, reason, source partition, offset)."""
        return list(self.rejects.rows)

    def stage(self, batch: int | None = None, partition: int | None = None) -> int:
        """End of the task: stop the job if the step rejected more than ``max_fraction`` of
        the task's records (once it rejected ``min_rejects``), else stage the rejects; how
        many. Checked here, over the whole task, not as rejects come: a keyed task meets a
        key's elements together, and one bad key first is not a bad function. ``batch`` and
        ``partition`` name the staged file (default: the running task's)."""
        errors = self.errors
        if self.rejected >= errors.min_rejects and self.rejected > errors.max_fraction * max(
            self.seen, 1
        ):
            raw, reason, partition, offset = self.rejects.rows[-1]
            raise UserFunctionError(
                self.step,
                raw.decode(errors="replace"),
                reason,
                origin=origin(self.source, partition, offset),
                advice=(
                    f"The step rejected {self.rejected} of the {self.seen} records of one task "
                    f"(errors.max_fraction={errors.max_fraction:g}): "
                    f"{self.failing.format(how='this often')}; nothing was dead-lettered for "
                    f"this batch. Raise the bound with --set errors.max_fraction=F (1: none) if "
                    f"these records are bad."
                ),
                skippable=False,
            )
        return self.rejects.stage(batch, partition)


def origins(batch: pa.RecordBatch) -> tuple[list | None, list | None]:
    """The origin columns of an Arrow batch as Python lists (None where absent)."""
    names = batch.schema.names
    parts = batch.column(ORIGIN_PARTITION).to_pylist() if ORIGIN_PARTITION in names else None
    offs = batch.column(ORIGIN_OFFSET).to_pylist() if ORIGIN_OFFSET in names else None
    return parts, offs


class SkipOperator:
    """``mapInArrow`` right after a source: the records ``srt run --skip`` named go to the
    dead-letter topic (reason :data:`SKIPPED`), the rest pass unchanged."""

    def __init__(
        self, skips: Iterable[tuple[int, int]], fields: list[str], guard: StepGuard
    ) -> None:
        self.skips = set(skips)
        self.fields, self.guard = fields, guard

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        for batch in batches:
            yield self.apply(batch)
        self.guard.stage()

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        offsets = pa.array(sorted({o for _, o in self.skips}), pa.int64())
        candidates = pc.is_in(batch.column(ORIGIN_OFFSET), value_set=offsets)
        if not pc.any(candidates).as_py():
            return batch
        parts, offs = origins(batch)
        assert parts is not None and offs is not None
        keep = []
        for i, (p, o) in enumerate(zip(parts, offs, strict=True)):
            skipped = (p, o) in self.skips
            keep.append(not skipped)
            if skipped:
                record = batch.slice(i, 1).select(self.fields).to_pylist()[0]
                # Named by an operator: never counted against the error bound.
                self.guard.rejects.add(record, SKIPPED, p, o)
        return batch.filter(pa.array(keep))
