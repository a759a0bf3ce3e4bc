"""Stateless Python functions over records (``DataStream.map`` / ``flat_map``), run by
Spark's ``mapInArrow`` on whole Arrow batches: a batch becomes a list of dicts once, the
function runs per record, and the outputs become one Arrow batch again — no per-row pandas
work and no state store.

Columns the function does not see (the event time, and the late-data bound the native window
path counts against) are carried from each input row to its outputs, so every output record
keeps its input's event time, and the watermark (its metadata travels on the event-time
column's field) holds downstream as without the map. So is each record's source partition and
offset, which name a record the function fails on (it is dead-lettered:
:mod:`stateful_runtime.operators.isolation`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa
from pyspark.accumulators import AccumulatorParam

from stateful_runtime._process import freeze_worker_heap
from stateful_runtime.calls import AsyncCall, Caller, Tally
from stateful_runtime.contract import CallStats
from stateful_runtime.job import ErrorPolicy
from stateful_runtime.operators.isolation import SERVICE_FAILING, StepGuard, describe, origins


class MapOperator:
    """The function ``mapInArrow`` calls with a task's batches; pickled to the workers.

    A record the function raises on, or whose outputs are not records its declared output
    can hold, is isolated (:class:`~stateful_runtime.operators.isolation.StepGuard`): no
    output of it goes on, it goes to the dead-letter topic, and the rest of the batch goes on.
    """

    def __init__(
        self,
        name: str,
        function: Callable[[dict[str, Any]], Any],
        flat: bool,
        fields: list[str],
        output: pa.Schema,
        carried: list[str],
        guard: StepGuard | None = None,
    ) -> None:
        self.name, self.function, self.flat = name, function, flat
        self.kind = "flat_map" if flat else "map"
        self.fields, self.output, self.carried = fields, output, carried
        self.guard = guard if guard is not None else StepGuard(name, "?", ErrorPolicy(), None)

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        for batch in batches:
            if batch.num_rows:
                yield self.apply(batch)
        self.guard.stage()  # before the task reports success: a retry writes the same file

    def _outputs(self, records: list[dict[str, Any]]) -> tuple[list[Any], list[int] | None, dict]:
        """The function's outputs of ``records``, the input row of each (None: output ``i``
        is of record ``i``, a failed one's :data:`_FAILED`), and the records it failed on
        (row → why, exception)."""
        fn, out, flat, kind = self.function, [], self.flat, self.kind
        rows: list[int] | None = [] if flat else None
        failed: dict[int, tuple[str, BaseException | None]] = {}
        for i, record in enumerate(records):
            try:
                result = fn(record)
                if flat:
                    produced = list(result) if result is not None else []
                    out.extend(produced)
                    rows.extend([i] * len(produced))  # type: ignore[union-attr]
                else:
                    out.append(result)
            except Exception as exc:
                failed[i] = (f"the {kind} function raised {describe(exc)}", exc)
                if not flat:
                    out.append(_FAILED)  # keeps out[i] the output of records[i]
        return out, rows, failed

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        records = batch.select(self.fields).to_pylist()
        self.guard.seen += len(records)
        out, rows, failed = self._outputs(records)
        kind = self.kind
        if failed or next((r for r in out if not isinstance(r, Mapping)), _NONE) is not _NONE:
            self._not_records(out, rows, failed, kind)
        if failed:
            out, rows = self._without(out, rows, failed, len(records))
        try:
            mapped = pa.RecordBatch.from_pylist(out, schema=self.output)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            for j, bad in _unfit(out, self.output):
                at = j if rows is None else rows[j]
                failed.setdefault(
                    at, (f"an output record does not fit the declared output ({bad})", None)
                )
            out, rows = self._without(out, rows, failed, len(records))
            mapped = pa.RecordBatch.from_pylist(out, schema=self.output)
        if failed:
            self._reject(batch, records, failed)
        carried = batch.select(self.carried)
        if rows is not None:
            carried = carried.take(pa.array(rows, pa.int64()))
        return pa.RecordBatch.from_arrays(
            [*mapped.columns, *carried.columns], schema=_joined(self.output, carried.schema)
        )

    def _not_records(
        self,
        out: list[Any],
        rows: list[int] | None,
        failed: dict[int, tuple[str, BaseException | None]],
        kind: str,
    ) -> None:
        for j, r in enumerate(out):
            if r is not _FAILED and not isinstance(r, Mapping):
                failed.setdefault(
                    j if rows is None else rows[j],
                    (
                        f"the {kind} function returned {type(r).__name__} {r!r:.100}, "
                        f"not a record (a dict)",
                        None,
                    ),
                )

    @staticmethod
    def _without(
        out: list[Any], rows: list[int] | None, failed: dict, n: int
    ) -> tuple[list[Any], list[int] | None]:
        """The outputs of the records not in ``failed``, and (now always) the input row of
        each: a flat_map's record whose outputs fail loses all of them, not some."""
        src = range(n) if rows is None else rows
        kept = [(r, i) for r, i in zip(out, src, strict=True) if i not in failed]
        return [r for r, _ in kept], [i for _, i in kept]

    def _reject(
        self,
        batch: pa.RecordBatch,
        records: list[dict[str, Any]],
        failed: dict[int, tuple[str, BaseException | None]],
    ) -> None:
        parts, offs = origins(batch)
        for i in sorted(failed):
            reason, cause = failed[i]
            self.guard.reject(
                i,
                records[i],
                reason,
                None if parts is None else parts[i],
                None if offs is None else offs[i],
                cause,
            )


_NONE = object()
_FAILED = object()  # the output of a record whose function raised


def _joined(a: pa.Schema, b: pa.Schema) -> pa.Schema:
    return pa.schema([*a, *b])


def _unfit(out: list[Mapping[str, Any]], schema: pa.Schema) -> Iterator[tuple[int, str]]:
    """The output records Arrow refuses, each with Arrow's reason."""
    for j, record in enumerate(out):
        try:
            pa.RecordBatch.from_pylist([record], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            yield j, str(exc)


class AsyncMapOperator(MapOperator):
    """``map_async`` / ``flat_map_async``: the function is an ``async def``, called for a
    batch's records on the worker's event loop, at most ``call.capacity`` at once, each with
    its timeout and retries (:class:`~stateful_runtime.calls.Caller`); the batch's outputs go
    on once every call of it ended (in input order, or in completion order)."""

    def __init__(
        self,
        name: str,
        function: Callable[[dict[str, Any]], Any],
        flat: bool,
        fields: list[str],
        output: pa.Schema,
        carried: list[str],
        call: AsyncCall,
        guard: StepGuard | None = None,
    ) -> None:
        super().__init__(name, function, flat, fields, output, carried, guard)
        self.call = call
        self.kind += "_async"
        self.guard.failing = SERVICE_FAILING
        # The driver's accumulator of the step's call statistics (runtime/dataframes.py),
        # added to once a task (None: not counted).
        self.stats: Any = None
        self._tally = Tally()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        self._tally = Tally()
        yield from super().__call__(batches)
        if self.stats is not None:
            self.stats.add({self.name: self._tally.stats()})

    def _outputs(self, records: list[dict[str, Any]]) -> tuple[list[Any], list[int] | None, dict]:
        results, done, failures = Caller(self.function, self.call, self._tally).run(records)
        failed: dict[int, tuple[str, BaseException | None]] = {
            i: (
                f"the {self.kind} function failed {f.attempts} time(s), last: {describe(f.last)}",
                f.last,
            )
            for i, f in failures.items()
        }
        order = range(len(records)) if self.call.ordered else done
        if not self.flat:
            mapped = [_FAILED if i in failed else results[i] for i in order]
            return mapped, None if self.call.ordered else list(order), failed
        out: list[Any] = []
        rows: list[int] = []
        for i in order:
            if i in failed:
                continue
            try:
                produced = list(results[i]) if results[i] is not None else []
            except TypeError as exc:
                failed[i] = (f"the {self.kind} function returned {describe(exc)}", exc)
                continue
            out.extend(produced)
            rows.extend([i] * len(produced))
        return out, rows, failed


class CallStatsParam(AccumulatorParam):
    """The accumulator of a query's ``map_async`` steps: step → :class:`CallStats`."""

    def zero(self, value: dict[str, CallStats]) -> dict[str, CallStats]:
        return {}

    def addInPlace(  # noqa: N802 (PySpark's name)
        self, a: dict[str, CallStats], b: dict[str, CallStats]
    ) -> dict[str, CallStats]:
        for step, stats in b.items():
            a[step] = a[step] + stats if step in a else stats
        return a
